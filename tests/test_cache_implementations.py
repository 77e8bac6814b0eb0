"""``generate(cache_implementation=...)``: the caches transformers offers, served through
``trident.jit(model.forward)`` (docs/huggingface.md, "Other cache implementations").

One test per name of transformers' ``ALL_CACHE_IMPLEMENTATIONS`` (the same ten in 5.17 and
5.25; ``test_every_cache_implementation_has_a_test`` fails on a version that adds one), and
the default (no ``cache_implementation``: a ``DynamicCache``). A tiny Mistral at its default
``sliding_window=4096``, three generates of new prompt lengths, tokens and every step's logits
equal to eager's (``torch.equal``). ``offloaded``, ``offloaded_static`` and the
``offloaded_hybrid`` pair need CUDA (skipped on the CPU; they run eagerly, deliberately: Note
[Unflattenable values] in trident/lower/flatten.py); ``quantized`` needs optimum-quanto or hqq
(skipped where neither is importable).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import trident

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 4


def tiny_mistral(device: str = "cpu", **extra):
    config = transformers.MistralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config).eval().to(device)


def generate_three(model, cache: str, device: str = "cpu", **kw):
    """Three generates (prompts of 6, 9 and 12 tokens) through eager and ``trident.jit``:
    returns the JitFunction and Trident's warnings."""
    forward = model.forward
    jf = trident.jit(forward)
    ours = []
    for length in (6, 9, 12):
        ids = torch.randint(0, 96, (1, length), device=device)
        args = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                    cache_implementation=cache, output_logits=True,
                    return_dict_in_generate=True, disable_compile=True, **kw)
        model.forward = forward
        ref = model.generate(ids, **args)
        model.forward = jf
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model.generate(ids, **args)
        ours += [str(w.message) for w in caught if "trident" in str(w.message)]
        assert torch.equal(out.sequences, ref.sequences)
        assert len(out.logits) == NEW_TOKENS
        assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
    model.forward = forward
    return jf, ours


# cache_implementation: compiles over the three generates. A StaticCache (``static`` and the
# deprecated names that make one): the prefill with its capacity (``max_cache_len``) an int
# leaf from its first compile, as it allocates the cache (Note [Capacities of written state]
# in trident/frontend/ints.py; its prompt's length exact), the decode step symbolic at once,
# the prefill again with the prompt's length symbolic at the second generate; before that
# Note, 4 (the prefill and the decode step at exact sizes, then both symbolic). A
# DynamicCache (the default, ``dynamic``, and ``hybrid``, which 5.25's generate unsets): the
# prefill with the prompt's length symbolic from its first call (it stores the cache, whose
# layers held None: Note [Lengths of written state] in trident/frontend/ints.py), the decode
# step with the cache's length symbolic from its first call (Note [Tensors by path]); before
# the first Note, 3 (the prefill at exact sizes, then symbolic at the second generate). Every
# later call (the second and third generates' prefills included) hits.
SERVED = {"static": 3, "sliding_window": 3, "hybrid_chunked": 3, "hybrid": 2, "dynamic": 2,
          None: 2}
CUDA_EAGER = {"offloaded": "DynamicCache", "offloaded_static": "StaticCache",
              "offloaded_hybrid": "StaticCache", "offloaded_hybrid_chunked": "StaticCache"}


def test_every_cache_implementation_has_a_test():
    from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS

    assert set(ALL_CACHE_IMPLEMENTATIONS) == (set(SERVED) - {None}) | set(CUDA_EAGER) | {
        "quantized"}


@pytest.mark.parametrize("cache", list(SERVED), ids=str)
def test_cache_implementations_are_served_natively(cache):
    """Hits after the warm-up, no fallback, no warning, every token and logit as eager's."""
    jf, ours = generate_three(tiny_mistral(), cache)
    assert not ours, ours
    compiles = SERVED[cache]
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == \
        (compiles, 0, 3 * NEW_TOKENS - compiles), jf.stats


QUANTO_EAGER = ("a QuantizedCache's layers assign their quantized keys and values "
                "(optimum-quanto's WeightQBitsTensor, a tensor subclass) to themselves: the "
                "prefill's write cannot be replayed and the decode step's argument tree holds "
                "a value the native guards do not read, so every call runs eagerly "
                "(docs/design.md, Limits today)")


def _quantized(cache_config):
    """Three generates with a quantized cache (optimum-quanto's, groups of 16: quanto's
    default of 64 must divide heads * tokens * head_dim, which a prompt of 9 tokens does not,
    in eager too) of a full-attention Mistral (a QuantizedCache raises ValueError for a
    sliding layer)."""
    pytest.importorskip("optimum.quanto", reason="cache_implementation='quantized' needs "
                        "optimum-quanto (or hqq), which is not installed")
    return generate_three(tiny_mistral(sliding_window=None), "quantized",
                          cache_config=cache_config)


def test_a_quantized_cache_runs_eagerly_with_one_warning():
    """Where optimum-quanto is installed (not on this project's machines by default; measured
    with optimum-quanto 0.2.7 in a side folder): tokens and logits as eager's, every call
    eager, one warning per reason, each naming the path and the class: the prefill assigns
    the layer's ``_quantized_keys`` (traced twice, at two prompt lengths, then eager for that
    argument structure at any size), and the decode step's argument tree holds it (a
    ``WeightQBitsTensor``, never traced)."""
    jf, ours = _quantized({"q_group_size": 16})
    assert len(ours) == 2 and all("cache.layers[0]._quantized_keys" in w for w in ours), ours
    assert "QuantoQuantizedLayer" in ours[0] and "WeightQBitsTensor" in ours[1], ours
    assert (jf.stats.compiles, jf.stats.traces, jf.stats.hits) == (0, 2, 0), jf.stats
    assert jf.stats.fallbacks == 3 * NEW_TOKENS, jf.stats


@pytest.mark.xfail(strict=True, reason=QUANTO_EAGER)
def test_a_quantized_cache_is_served_natively():
    """``quantized`` (a ``QuantizedCache``, optimum-quanto's by default) needs a package that
    is no dependency: skipped where it is missing (not run on the machines of this project
    so far). Where present: tokens and logits as eager's, no fallback, no warning, and calls
    after the warm-up hit."""
    jf, ours = _quantized({"q_group_size": 16})
    assert not ours, ours
    assert jf.stats.fallbacks == 0 and jf.stats.hits >= NEW_TOKENS, jf.stats


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloaded caches need CUDA")
@pytest.mark.parametrize("cache, cls", list(CUDA_EAGER.items()))
def test_offloaded_caches_run_eagerly_with_one_warning_on_cuda(cache, cls):
    """An offloaded cache moves each layer's tensors between the GPU and pinned host memory on
    a side stream around every layer's forward, its order kept by ``prefetch_stream`` (a
    ``torch.Stream``), which no trace records: every call runs eagerly, deliberately, with one
    warning naming the cache's class and the reason; nothing is traced, and no call flattens
    the model again (Note [Unflattenable values] in trident/lower/flatten.py). Tokens and
    logits as eager's. ``sliding_window=None``: with transformers 5.17's sliding layers (every
    layer at the default 4096) the static offloaded cache offloads no layer, and eager
    ``generate`` fails in its ``prefetch``."""
    jf, ours = generate_three(tiny_mistral("cuda", sliding_window=None), cache, device="cuda")
    assert len(ours) == 1, ours
    assert f"torch.Stream of a {cls}:" in ours[0] and ".prefetch_stream" in ours[0], ours[0]
    stats = jf.stats
    # three generates of NEW_TOKENS forward calls each, every one eager
    assert (stats.compiles, stats.traces, stats.hits) == (0, 0, 0), stats
    assert stats.fallbacks == stats.misses == 3 * NEW_TOKENS, stats


def test_a_cache_holding_a_stream_runs_eagerly_and_another_cache_natively():
    """The CPU's view of the offloaded caches' path: a ``DynamicCache`` holding the
    ``prefetch_stream`` that ``offloading=True`` sets (a CPU stream here; offloading itself
    needs CUDA) runs eagerly, one warning naming the class and the reason over three generates,
    tokens and logits as eager's; a later generate with a cache without one is served
    natively (the eager decision tests the stream's path, Note [Unflattenable values] in
    trident/lower/flatten.py)."""
    model = tiny_mistral()
    forward = model.forward
    jf = trident.jit(forward)
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
              output_logits=True, return_dict_in_generate=True, disable_compile=True)
    ours = []
    for length, stream in ((6, True), (9, True), (12, True), (7, False), (7, False)):
        ids = torch.randint(0, 96, (1, length))
        outs = []
        for fn in (forward, jf):
            cache = transformers.DynamicCache(config=model.config)
            if stream:
                cache.prefetch_stream = torch.Stream("cpu")
            model.forward = fn
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outs.append(model.generate(ids, past_key_values=cache, **kw))
            ours += [str(w.message) for w in caught if "trident" in str(w.message)]
        assert torch.equal(outs[1].sequences, outs[0].sequences)
        assert all(torch.equal(a, b) for a, b in zip(outs[1].logits, outs[0].logits))
    model.forward = forward
    assert len(ours) == 1, ours
    assert "torch.Stream of a DynamicCache:" in ours[0] and ".prefetch_stream" in ours[0], ours
    stats = jf.stats
    assert stats.fallbacks == 3 * NEW_TOKENS, stats
    # the caches without a stream: the prefill and the decode step compile once each (the
    # decode step with the cache's length symbolic: Note [Tensors by path]), then every call
    # hits
    assert (stats.compiles, stats.hits) == (2, 2 * NEW_TOKENS - 2), stats


def test_a_padded_default_cache_after_a_static_one_stays_symbolic():
    """Note [Fixed operands of symbolic ops] in trident/lower/importer.py: one jitted forward
    serving a static cache (prompts of 5 and 9 tokens), then a padded batch of two with the
    default cache. The padded prefill's value checks multiply a symbolic length by the batch
    the trace fixed (a plain int); Torch-MLIR failed on it (AttributeError), the symbolic
    compile was given up and automatic dynamic with it, for the rest of the process: every new
    length compiled at exact sizes (the decode step at each cache length), and a process that
    used both caches reached the limit of 8 (issue 27). Now the counts are the structures'
    (docs/huggingface.md): 2 and 1 for the static cache, 2 for the padded prefill and its
    decode step, 1 for the mask's length (fixed at the first padded call, symbolic from the
    second), 0 for a third padded length; every token and logit equal to eager's."""
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    forward = model.forward
    jf = trident.jit(forward)
    compiles = []
    for cache, batch, length in (("static", 1, 5), ("static", 1, 9), (None, 2, 9),
                                 (None, 2, 13), (None, 2, 17)):
        ids = torch.randint(1, 96, (batch, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones_like(ids)
        if batch == 2:  # left-padded
            mask[0, :3] = 0
            ids[0, :3] = 0
        args = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                    output_logits=True, return_dict_in_generate=True, disable_compile=True)
        if cache:
            args["cache_implementation"] = cache
        model.forward = forward
        ref = model.generate(ids, **args)
        model.forward = jf
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no limit
            out = model.generate(ids, **args)
        assert torch.equal(out.sequences, ref.sequences)
        assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
        compiles.append(jf.stats.compiles)
    model.forward = forward
    assert compiles == [2, 3, 5, 6, 6], compiles
    assert jf.stats.fallbacks == 0
