"""``generate(cache_implementation=...)``: the caches transformers offers, served through
``trident.jit(model.forward)`` (docs/huggingface.md, "Other cache implementations").

A tiny Mistral at its default ``sliding_window=4096``, three generates of new prompt lengths,
tokens and every step's logits equal to eager's (``torch.equal``). ``offloaded`` and
``offloaded_static`` need CUDA (skipped on the CPU); ``quantized`` needs optimum-quanto or hqq
(skipped where neither is importable).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import trident

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 4


def tiny_mistral(device: str = "cpu"):
    config = transformers.MistralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
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


@pytest.mark.parametrize("cache", ["static", "sliding_window", "hybrid", "hybrid_chunked",
                                   "dynamic"])
def test_cache_implementations_are_served_natively(cache):
    """The prefill and the decode step at exact sizes, then both with the lengths symbolic;
    every later call (the third generate's prefill included) hits."""
    jf, ours = generate_three(tiny_mistral(), cache)
    assert not ours, ours
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (4, 0, 8), jf.stats


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloaded caches need CUDA")
@pytest.mark.parametrize("cache", ["offloaded", "offloaded_static"])
def test_offloaded_caches_are_served_natively_on_cuda(cache):
    """An offloaded cache moves each layer's tensors between the GPU and pinned host memory
    around every layer's forward: tokens and logits as eager's, and no call runs eagerly."""
    jf, ours = generate_three(tiny_mistral("cuda"), cache, device="cuda")
    assert not ours, ours
    assert jf.stats.fallbacks == 0, jf.stats
    assert jf.stats.hits >= 8, jf.stats
