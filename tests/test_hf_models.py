"""Hugging Face transformers models through Trident's three front doors, on the CPU.

Tiny random configs (hidden 64, 2 layers) of real architectures: ``trident.jit`` of the module
and of ``model.forward``, ``torch.compile(backend="trident")``, and transformers' own switch
``generation_config.compile_config = CompileConfig(backend="trident")``. Tokens and every
step's logits are compared with ``torch.equal`` (Note [Argument trees] in trident/lower/flatten.py).
"""

from __future__ import annotations

import gc
import os
import warnings

import pytest
import torch

import trident
from _trident_helpers import cache_kw

transformers = pytest.importorskip("transformers")

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"num_key_value_heads": 2, "head_dim": 16}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 64, "n_layer": 2, "n_head": 4,
                                                "n_positions": 64}),
}
NEW_TOKENS = 5


def tiny_model(arch: str):
    config_name, model_name, extra = ARCHS[arch]
    common = {} if arch == "gpt2" else {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64}
    config = getattr(transformers, config_name)(vocab_size=96, **common, **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


def generate(model, ids, **kw):
    return model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                          cache_implementation="static", output_logits=True,
                          return_dict_in_generate=True, **kw)


def trident_warnings(caught) -> list[str]:
    """The warnings that Trident gives (naming it) or that its own code raises (a deprecated
    torch API, which torch's FutureWarning reports at the caller's line)."""
    package = os.path.dirname(trident.__file__) + os.sep
    return [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if "trident" in str(w.message) or w.filename.startswith(package)]


def assert_same_generation(out, ref) -> None:
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.logits) == len(ref.logits) == NEW_TOKENS
    for a, b in zip(out.logits, ref.logits):
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_module_forward_is_served_natively(arch):
    model = tiny_model(arch)
    ids = torch.randint(0, 96, (2, 7))
    with torch.no_grad():
        ref = model(ids)
        jf = trident.jit(model)
        for _ in range(3):
            out = jf(ids)
            assert type(out) is type(ref)
            assert list(out.keys()) == list(ref.keys())
            assert torch.equal(out.logits, ref.logits)
    stats = jf.stats
    assert (stats.compiles, stats.fallbacks, stats.hits) == (1, 0, 2), stats


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma", "gpt2"])
def test_generate_with_a_static_cache_through_jit_of_forward(arch):
    model = tiny_model(arch)
    ids = torch.randint(0, 96, (1, 6))
    ref = generate(model, ids, disable_compile=True)
    jf = trident.jit(model.forward)
    model.forward = jf
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for round in range(2):
            assert_same_generation(generate(model, ids, disable_compile=True), ref)
    stats = jf.stats
    # the prefill (which allocates the cache's tensors and sets them on its layers: Note
    # [Attribute writes] in trident/lower/writes.py) and the decode step compile once each;
    # every other call, the second generate's prefill included, is a hit
    assert (stats.compiles, stats.fallbacks, stats.hits) == (2, 0, 2 * NEW_TOKENS - 2), stats
    assert not trident_warnings(caught)


def test_generate_with_the_default_dynamic_cache_is_served_natively():
    """transformers' default DynamicCache assigns each grown key/value tensor (``torch.cat``) to
    its layer at every step: the new tensors are outputs of the graph that the runtime sets on
    the layers (Note [Attribute writes] in trident/lower/writes.py); the cache's length is
    symbolic from the first decode step (Note [Tensors by path] in trident/frontend/ints.py)."""
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 6))
    kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
              return_dict_in_generate=True, disable_compile=True)
    ref = model.generate(ids, **kw)
    jf = model.forward = trident.jit(model.forward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert_same_generation(model.generate(ids, **kw), ref)
    assert not trident_warnings(caught)
    # the prefill, the decode step with the cache's length symbolic (its keys at new paths
    # have the prompt's length, which the decode step's input_ids changed at its path)
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (
        2, 0, 2 * NEW_TOKENS - 2), jf.stats


def test_generate_a_batch_of_two_with_a_static_cache():
    """A batch of 2 (Qwen2: biased q/k/v projections): a decode step's attention output has a
    size-1 dim of another stride, so ``o_proj``'s ``matmul`` folds into ``mm`` only because its
    weight requires grad, a flag the trace's view of it lost (it ran ``bmm``: other logits in
    the last bits; tests/test_matmul_decompositions.py has the whole kind)."""
    model = tiny_model("qwen2")
    ids = torch.randint(0, 96, (2, 6))
    ref = generate(model, ids, disable_compile=True)
    jf = trident.jit(model.forward)
    model.forward = jf
    assert_same_generation(generate(model, ids, disable_compile=True), ref)
    assert (jf.stats.fallbacks, jf.stats.compiles, jf.stats.hits) == (0, 2, NEW_TOKENS - 2)


def test_generate_through_transformers_compile_config():
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 6))
    # Dynamo's graph of the decode step is the reference: its own "eager" backend runs it
    # without compiling (on the CPU it already differs from plain eager in the last ulp)
    def compile_with(backend: str) -> None:
        torch._dynamo.reset()
        model.__dict__.pop("_compiled_call", None)  # generate's compiled forward, if any
        config = transformers.CompileConfig(backend=backend, fullgraph=False)
        config._compile_all_devices = True  # transformers compiles on GPUs only by default
        model.generation_config.compile_config = config

    compile_with("eager")
    ref = generate(model, ids)
    compile_with("trident")
    for _ in range(2):
        assert_same_generation(generate(model, ids), ref)


def test_parameters_are_read_on_every_call():
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 5))
    jf = trident.jit(model)
    with torch.no_grad():
        jf(ids)
        model.lm_head.weight.mul_(2)  # in place
        assert torch.equal(jf(ids).logits, model(ids).logits)
        model.model.norm.weight = torch.nn.Parameter(torch.randn(64))  # replaced
        assert torch.equal(jf(ids).logits, model(ids).logits)
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
        assert torch.equal(jf(ids).logits, model(ids).logits)
    assert (jf.stats.compiles, jf.stats.fallbacks) == (1, 0), jf.stats


def test_a_changed_attribute_recompiles_and_names_its_path():
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 5))
    jf = trident.jit(model)
    with torch.no_grad():
        jf(ids)
        model.model.layers[1].self_attn.scaling = 0.5
        assert torch.equal(jf(ids).logits, model(ids).logits)
    assert jf.stats.compiles == 2
    assert "self.model.layers[1].self_attn.scaling" in jf.stats.miss_reasons[-1]


def generate_as_eager(model, forward, jf, ids, new: int, **kwargs) -> None:
    """A greedy generate of exactly ``new`` tokens (static cache) through ``jf``, its tokens
    and every step's logits equal to eager's (``model.forward`` set to ``forward``)."""
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
              cache_implementation="static", output_logits=True, return_dict_in_generate=True,
              disable_compile=True, **kwargs)
    model.forward = forward
    ref = model.generate(ids, **kw)
    model.forward = jf
    out = model.generate(ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))


def test_new_prompt_lengths_and_token_counts_do_not_compile_again():
    """A server never sees the same prompt twice: each generate builds a static cache sized by
    its prompt and max_new_tokens (at least the largest before: ``_previous_max_cache_length``),
    whose ints (``max_cache_len``, ``batch_size``) become leaves after one change and whose
    tensors' lengths become symbolic (Note [Int leaves] in trident/frontend/policy.py): two
    compiles for batch 1 at any length, every token and logit as eager's."""
    model = tiny_model("llama")
    model.config.max_position_embeddings = 256
    forward = model.forward
    jf = trident.jit(forward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length, new in [(6, 4), (9, 3), (20, 5), (13, 2), (3, 7)]:
            generate_as_eager(model, forward, jf, torch.randint(0, 96, (1, length)), new)
    stats = jf.stats
    # the first generate's prefill compiles with its capacity an int leaf (Note [Capacities of
    # written state] in trident/frontend/ints.py), its decode step symbolic at once, the
    # second's prefill with the prompt's length symbolic; every later call hits (4 before that
    # Note: the first decode step at exact sizes, then again)
    assert (stats.compiles, stats.fallbacks) == (3, 0), stats
    assert not trident_warnings(caught)
    assert stats.hits == sum((4, 3, 5, 2, 7)) - 3, stats


SWEEP = [(2, 7, 3), (2, 11, 4), (4, 5, 2), (2, 20, 3), (4, 9, 1), (1, 6, 3), (1, 13, 2),
         (4, 3, 3)]  # (batch, prompt length, max_new_tokens) of each generate


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2-sliding", "gemma2", "gemma3"])
def test_a_serving_sweep_of_lengths_and_batches_compiles_a_bounded_number_of_times(arch):
    """A server's generates: new prompt lengths, token counts and batches (2, 4, then 1), a
    static cache per request (Mistral's default ``sliding_window=4096`` makes it a
    ``StaticSlidingWindowLayer`` cache). The first generate compiles the prefill with its
    capacity symbolic and the decode step symbolic; the second the prefill with the lengths and
    the batch symbolic (Note [Batch dims]
    in trident/frontend/batch.py), so the batch of 4 hits, and so do the prefill and the decode
    step of a batch of one (the prefill's ``lm_head`` of the last position runs ``mm`` for a
    batch of one and ``bmm`` for others, chosen by ATen at call time: Note [Kept products] in
    trident/lower/decompositions.py); every other call hits, every token and logit as eager's."""
    model = tiny_model(arch) if arch in ARCHS else sliding_model(arch)
    model.config.max_position_embeddings = 64
    if arch == "mistral":
        model.config.sliding_window = 4096
    forward = model.forward
    jf = trident.jit(forward)
    compiles = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch, length, new in SWEEP:
            ids = torch.randint(0, 96, (batch, length))
            generate_as_eager(model, forward, jf, ids, new, attention_mask=torch.ones_like(ids))
            compiles.append(jf.stats.compiles)
    assert not trident_warnings(caught)
    # the first generate: its prefill (capacity an int leaf: Note [Capacities of written
    # state] in trident/frontend/ints.py) and decode step; the second: its prefill (the
    # prompt's length); 4 before that Note (the decode step again at the second capacity)
    assert compiles == [2, 3, 3, 3, 3, 3, 3, 3], (compiles, jf.stats.miss_reasons)
    assert jf.stats.fallbacks == 0
    assert jf.stats.hits == sum(new for _, _, new in SWEEP) - 3


def backend_sweep(model, cache: str | None):
    """The sweep through ``torch.compile(model.forward, backend="trident")`` (``cache``: the
    ``cache_implementation``, None for transformers' default ``DynamicCache``), every token and
    logit as Dynamo's ``eager`` backend's (the references first: Dynamo's recompile limit counts
    every backend's graphs of a code object); the compile count after each generate and the
    door's counters, less those of earlier tests' freed graphs."""
    model.config.max_position_embeddings = 64
    forward = model.forward
    kw = dict(do_sample=False, output_logits=True, return_dict_in_generate=True,
              disable_compile=True)
    if cache is not None:
        kw["cache_implementation"] = cache
    calls = [torch.randint(0, 96, (batch, length)) for batch, length, _ in SWEEP]
    torch._dynamo.reset()
    model.forward = torch.compile(forward, backend="eager")
    refs, lengths = [], []
    for ids, (_, _, new) in zip(calls, SWEEP):
        lengths.append(getattr(model, "_previous_max_cache_length", -1))
        refs.append(model.generate(ids, max_new_tokens=new, min_new_tokens=new,
                                   attention_mask=torch.ones_like(ids), **kw))
    torch._dynamo.reset()
    model.forward = served = torch.compile(forward, backend="trident")
    gc.collect()
    # the counts of earlier tests' freed graphs of transformers' wrapper (Note [Backend graphs])
    base = trident.backend_stats(served)
    compiles = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for ids, (_, _, new), ref, length in zip(calls, SWEEP, refs, lengths):
            model._previous_max_cache_length = length  # the cache its reference had
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new,
                                 attention_mask=torch.ones_like(ids), **kw)
            assert torch.equal(out.sequences, ref.sequences)
            assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
            compiles.append(trident.backend_stats(served).compiles - base.compiles)
    assert not trident_warnings(caught)
    s = trident.backend_stats(served)
    for field in ("hits", "traces", "fallbacks"):
        setattr(s, field, getattr(s, field) - getattr(base, field))
    return compiles, s, len(trident.backend_graphs(served))


def test_the_backend_doors_serving_sweep_compiles_four_times():
    """The sweep through ``torch.compile(model.forward, backend="trident")``: Dynamo traces the
    prefill and the decode step at exact sizes, then (Note [Door batch dims] in
    trident/frontend/frame_state.py) with the lengths and the batch symbolic, so the batch of 4
    is served by the second graphs. Dynamo makes a batch of one graphs of its own (it
    specializes a size 1), the symbolic ones with the constant 1 for the batch: the symbolic
    graphs' JitFunctions serve them (Note [Graphs of constants]), whose specializations hold a
    batch of one. Four compiles."""
    compiles, s, graphs = backend_sweep(tiny_model("llama"), "static")
    # torch 2.11's trace of the symbolic prefill graph keeps a guard `position_ids.size(0) != 1`
    # (2.13's does not): the first batch of one compiles that graph once more, soundly
    extra = int(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13))
    assert compiles == [2, 4, 4, 4, 4] + [4 + extra] * 3, (compiles, s.miss_reasons)
    assert (s.traces, s.fallbacks, graphs) == (4 + extra, 0, 4), s
    assert s.hits == sum(new for _, _, new in SWEEP) - 4 - extra, s


SLIDING = {  # transformers' defaults: sliding_window=4096 (StaticSlidingWindowLayer)
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16}),
    "qwen2-sliding": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": True,
                                                          "max_window_layers": 1}),
}


def sliding_model(arch: str):
    config_name, model_name, extra = SLIDING[arch]
    config = getattr(transformers, config_name)(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


@pytest.mark.parametrize("arch", sorted(SLIDING))
def test_sliding_window_and_hybrid_caches_are_served_natively(arch):
    """Mistral, Gemma 2, Gemma 3 and Qwen2 with ``use_sliding_window`` at their default configs:
    transformers' ``StaticSlidingWindowLayer`` counts its tokens in a Python int that every
    step assigns (``cumulative_length_int += 1``), and the prefill allocates every layer's
    tensors and sets them on it. Both writes are outputs of the graph that the runtime sets on
    the layers (Note [Attribute writes] in trident/lower/writes.py); the count is a symbolic
    int after one change, the prompt length a symbolic size at the second length."""
    model = sliding_model(arch)
    forward = model.forward
    jf = trident.jit(forward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length in (6, 9, 12):
            ids = torch.randint(0, 96, (1, length))
            model.forward = forward
            ref = generate(model, ids, disable_compile=True)
            model.forward = jf
            before = (jf.stats.misses, jf.stats.hits)
            assert_same_generation(generate(model, ids, disable_compile=True), ref)
    stats = jf.stats
    # compiles: the prefill, run once with no graph (its writes: Note [Writes probe] in
    # trident/frontend/tracing.py) then traced with its capacity (max_cache_len, the
    # model's _previous_max_cache_length) an int leaf (Note [Capacities of written state] in
    # trident/frontend/ints.py), and the decode step, symbolic at once (the count the prefill
    # wrote is an int leaf of the decode step from its first call: Note [Batch dims] in
    # trident/frontend/batch.py); at the second length the prefill with the prompt length and
    # the batch symbolic; the decode step hits; at the third length every call is a hit, the
    # prefill's included (4 compiles before that Note: the decode step again at the second)
    assert (stats.compiles, stats.traces, stats.fallbacks) == (3, 3, 0), stats
    assert (stats.misses, stats.hits) == (before[0], before[1] + NEW_TOKENS) == (3, 12), stats
    assert not trident_warnings(caught)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "qwen2-sliding"])
def test_sliding_window_models_with_the_default_cache_are_served_natively(arch):
    """Gemma 2, Gemma 3 and Qwen2 with ``use_sliding_window`` at their default configs with
    transformers' default cache (no ``cache_implementation``: a ``DynamicCache`` of
    ``DynamicSlidingWindowLayer``s, whose ``cumulative_length`` the prefill writes; Mistral's
    is in tests/test_cache_implementations.py), the serving sweep's batches (2, 4, then 1):
    the prefill with the lengths and the batch symbolic from its first call (it stores the
    cache: Note [Lengths of written state] in trident/frontend/ints.py), the decode step once
    for every cache length and batch; every later call hits (``sweep_hf ARCH 50 default``: 2
    compiles, 2,875 hits)."""
    model = sliding_model(arch)
    forward = model.forward
    jf = trident.jit(forward)
    kw = dict(do_sample=False, output_logits=True, return_dict_in_generate=True,
              disable_compile=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (batch, length, new) in enumerate(SWEEP[:6]):
            torch.manual_seed(i)
            ids = torch.randint(0, 96, (batch, length))
            call = dict(kw, max_new_tokens=new, min_new_tokens=new,
                        attention_mask=torch.ones_like(ids))
            outs = []
            for fn in (forward, jf):
                model.forward = fn
                outs.append(model.generate(ids, **call))
            assert torch.equal(outs[1].sequences, outs[0].sequences)
            assert all(torch.equal(a, b) for a, b in zip(outs[1].logits, outs[0].logits))
    model.forward = forward
    assert not trident_warnings(caught)
    stats = jf.stats  # (the prefill's writes found with no exact trace: Note [Writes probe])
    assert (stats.compiles, stats.traces, stats.fallbacks) == (2, 2, 0), stats.miss_reasons
    assert stats.hits == sum(new for _, _, new in SWEEP[:6]) - 2, stats


def _layer_state(layer) -> list:
    """A cache layer's Python state: each attribute's name, type and value (tensors by value,
    with their own Python attributes)."""
    out = []
    for k, v in vars(layer).items():
        if isinstance(v, torch.Tensor):
            out.append((k, type(v), v.dtype, v.shape, v.tolist(), dict(vars(v))))
        else:
            out.append((k, type(v), v))
    return out


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_a_prefill_leaves_the_cache_as_eager_leaves_it(arch):
    """The prefill's writes, replayed by the runtime, leave every layer of a fresh static cache
    with the attributes eager leaves, in the same order, of the same types and values (ints,
    bools, the device, the new key and value tensors; ``_dynamo_static_input_type``, which
    ``torch._dynamo.mark_static_address`` sets on them): a hit at a new prompt length too."""
    model = tiny_model(arch)
    model.config.sliding_window = 4096 if arch == "mistral" else None
    jf = trident.jit(model.forward)
    for length in (5, 7, 9, 9):
        ids = torch.randint(0, 96, (1, length))
        caches = [transformers.StaticCache(config=model.config, max_cache_len=16)
                  for _ in range(2)]
        with torch.no_grad():
            ref = model(input_ids=ids, **{cache_kw(model): caches[0]}, use_cache=True)
            out = jf(input_ids=ids, **{cache_kw(model): caches[1]}, use_cache=True)
        assert torch.equal(out.logits, ref.logits)
        assert out.past_key_values is caches[1]
        for a, b in zip(caches[0].layers, caches[1].layers):
            assert _layer_state(a) == _layer_state(b)
    # at exact sizes, then the prompt length symbolic; the third and fourth prompts hit
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (2, 0, 2), jf.stats


class _LoggedLayer(transformers.StaticLayer):
    """A static cache layer whose class sets attributes itself: writes no specialization
    replays (Note [Attribute writes] in trident/lower/writes.py)."""

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)


def test_a_cache_whose_writes_cannot_be_replayed_runs_eagerly_with_one_warning():
    """A cache class that falls back (here a layer class with its own ``__setattr__``, whose
    prefill assigns its tensors lazily): each prefill runs eagerly, over every generate, with
    one warning naming the path and the class, never one per call; the decode steps, which
    write nothing, are served natively."""
    model = tiny_model("llama")
    forward = model.forward
    jf = trident.jit(forward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length in (6, 9, 12):
            ids = torch.randint(0, 96, (1, length))
            outs = []
            for fn in (forward, jf):
                cache = transformers.StaticCache(config=model.config, max_cache_len=32)
                for layer in cache.layers:
                    layer.__class__ = _LoggedLayer
                model.forward = fn
                outs.append(model.generate(ids, past_key_values=cache, max_new_tokens=NEW_TOKENS,
                                           do_sample=False, output_logits=True,
                                           return_dict_in_generate=True, disable_compile=True))
            assert_same_generation(outs[1], outs[0])
    ours = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(ours) == 1, ours
    assert "_LoggedLayer" in ours[0] and "layers[0]" in ours[0], ours[0]
    assert jf.stats.fallbacks == 3, jf.stats
    # the decode step compiles once (exact sizes: every cache holds 32 positions), then hits
    assert (jf.stats.compiles, jf.stats.hits) == (1, 3 * (NEW_TOKENS - 1) - 1), jf.stats
    # the failed trace is not repeated at every prefill: once at exact sizes, once with the
    # prompt length symbolic (the same failure at two sizes), never again; plus the decode step
    assert jf.stats.traces == 3, jf.stats


def test_the_backend_door_serves_a_sliding_window_with_the_default_cache():
    """Gemma 2 at its default config with transformers' default cache through
    ``torch.compile(model.forward, backend="trident")``: the sliding layers'
    ``DynamicSlidingWindowLayer.get_mask_sizes`` takes ``max(cumulative_length - sliding_window
    + 1, 0)``, a ``torch.sym_max`` node in Dynamo's graph once the length is symbolic. Trident's
    graph calls Python's ``max`` (Note [Size choices in graphs] in trident/frontend/choices.py),
    which guards the choice: four compiles as the other architectures' (before it the decode
    step's symbolic trace failed to import and each cache length compiled until the limit:
    ``dynamic dims ... not compiled``). The first generate compiles the prefill and the decode
    step symbolic (the prefill stores the prompt's length in the cache: Note [Stored lengths in
    graphs] in trident/frontend/frame_state.py; before, both at exact sizes, the decode step
    again at the next cache length and the prefill at the second generate's length: 4). The
    first batch of one compiles its prefill once more: the sliding layers' int
    ``cumulative_length``, a constant 0 of the first prefill graph, is a symbolic input of the
    batch-one graph (Dynamo saw it change in the decode steps), so that graph is no constant
    version of the first (Note [Graphs of constants]); its decode step is one: 3."""
    compiles, s, graphs = backend_sweep(sliding_model("gemma2"), None)
    assert compiles == [2] * 5 + [3] * 3, (compiles, s.miss_reasons)
    assert not any("dynamic dims" in r for r in s.miss_reasons), s.miss_reasons
    assert (s.traces, s.fallbacks) == (3, 0), s
    assert s.hits == sum(new for _, _, new in SWEEP) - 3, s
