"""Hugging Face transformers models through Trident's three front doors, on the CPU.

Tiny random configs (hidden 64, 2 layers) of real architectures: ``trident.jit`` of the module
and of ``model.forward``, ``torch.compile(backend="trident")``, and transformers' own switch
``generation_config.compile_config = CompileConfig(backend="trident")``. Tokens and every
step's logits are compared with ``torch.equal`` (Note [Argument trees] in trident/lower/flatten.py).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import trident

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
    # per generate: the prefill lazily allocates the cache's tensors (Python state the
    # specialization cannot replay) and runs eagerly, warned once; every decode step is a hit
    assert stats.fallbacks == 2 and stats.compiles == 1, stats
    assert stats.hits == 2 * (NEW_TOKENS - 1) - 1, stats
    assert sum("runs eagerly" in str(w.message) for w in caught) == 1


def test_generate_with_the_default_dynamic_cache_runs_eagerly_and_says_why():
    """transformers' default DynamicCache assigns each grown key/value tensor to its layer (a
    specialization cannot replay that): every step runs eagerly, as eager computes it, and the
    warning names the static cache (the fresh user found no hint where it was needed)."""
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 6))
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True,
              return_dict_in_generate=True, disable_compile=True)
    ref = model.generate(ids, **kw)
    model.forward = trident.jit(model.forward)
    with pytest.warns(UserWarning, match=r"assigns to .*layers\[0\]\.keys.*"
                                         r"cache_implementation=\"static\""):
        out = model.generate(ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
    assert model.forward.stats.compiles == 0


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the prefill's fallback
        assert_same_generation(generate(model, ids, disable_compile=True), ref)
    assert (jf.stats.fallbacks, jf.stats.compiles, jf.stats.hits) == (1, 1, NEW_TOKENS - 2)


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the prefill's fallback
        for i, (length, new) in enumerate([(6, 4), (9, 3), (20, 5), (13, 2), (3, 7)]):
            ids = torch.randint(0, 96, (1, length))
            kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
                      cache_implementation="static", output_logits=True,
                      return_dict_in_generate=True, disable_compile=True)
            model.forward = forward
            ref = model.generate(ids, **kw)
            model.forward = jf
            out = model.generate(ids, **kw)
            assert torch.equal(out.sequences, ref.sequences)
            assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
    stats = jf.stats
    # per generate the prefill runs eagerly (one fallback); the first generate's decode steps
    # compile with exact sizes, the second's with symbolic lengths; the rest hit
    assert (stats.compiles, stats.fallbacks) == (2, 5), stats
    assert stats.hits == sum(new - 1 for new in (4, 3, 5, 2, 7)) - 2, stats


def test_a_sliding_window_cache_fails_its_trace_once_per_reason_not_per_step():
    """Mistral at its default config (``sliding_window=4096``): transformers'
    ``StaticSlidingWindowLayer`` counts its tokens in a Python int that each step assigns, which
    a specialization cannot replay. The decode step's trace fails at the first step and, with
    that int a leaf (Note [Int leaves]), at the second; every later step, and every step of the
    next generate of the same lengths, runs eagerly without a trace; one warning per reason
    names the class."""
    model = tiny_model("mistral")
    forward = model.forward
    jf = trident.jit(forward)
    calls = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length in (6, 6, 9):
            ids = torch.randint(0, 96, (1, length))
            model.forward = forward
            ref = generate(model, ids, disable_compile=True)
            model.forward = jf
            assert_same_generation(generate(model, ids, disable_compile=True), ref)
            calls += NEW_TOKENS
    stats = jf.stats
    # traces: the first prefill, the first two decode steps; at a new length, the prefill and
    # the first decode step (its cache length, an int not seen changing before, is a leaf now)
    assert (stats.compiles, stats.traces, stats.fallbacks, stats.hits) == (0, 5, calls, 0), stats
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 2, said
    assert "cumulative_length_int" in said[1] and "StaticSlidingWindowLayer" in said[1]
