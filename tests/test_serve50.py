"""A sliding window shorter than the prompts (issue 26, serve50): a serving sweep of Gemma 3
(text) and Mistral at ``sliding_window=4`` compiles within the sweep's bound, every token and
logit equal to eager's; miss reasons name a leaf's value (docs/huggingface.md,
"Sliding-window and hybrid caches").

A ``StaticSlidingWindowLayer`` whose window is full (every prompt here is longer than it)
takes another path at each decode step than a layer that is not: ``roll`` the window, then
``new_keys[:, :, index] = key_states``. torch's binding of that assignment asked whether the
value's leading dim, the symbolic batch, is 1 (Note [Leading ones of a stored value] in
trident/lower/setitem.py): a batch of one compiled the decode step once more.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import generate_as_eager

transformers = pytest.importorskip("transformers")

# (batch, prompt length, max_new_tokens); the batch of one comes after the symbolic compiles
REQUESTS = [(2, 9, 3), (2, 12, 2), (4, 7, 3), (1, 10, 3), (1, 6, 2), (4, 11, 2)]
WINDOW = 4


def tiny(arch: str):
    extra = {"sliding_window": WINDOW} if arch != "llama" else {}
    if arch == "gemma3":  # a hybrid cache: a sliding layer and a full-attention one
        extra.update(head_dim=16, layer_types=["sliding_attention", "full_attention"])
    config_cls, model_cls = {"gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
                             "mistral": ("MistralConfig", "MistralForCausalLM"),
                             "llama": ("LlamaConfig", "LlamaForCausalLM")}[arch]
    config = getattr(transformers, config_cls)(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


def sweep(model, requests):
    """Each request (batch, prompt length, new tokens, and a ``cache_implementation``: static
    where not given; None: the default cache) through eager, then ``trident.jit(model.forward)``
    from the same ``_previous_max_cache_length``; returns the JitFunction and the compiles
    after each."""
    forward = model.forward
    jf = trident.jit(forward)
    compiles = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (batch, length, new, *cache) in enumerate(requests):
            torch.manual_seed(i)
            ids = torch.randint(0, 96, (batch, length))
            kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new,
                      min_new_tokens=new, do_sample=False, output_logits=True,
                      return_dict_in_generate=True, disable_compile=True)
            cache = cache[0] if cache else "static"
            if cache:
                kw["cache_implementation"] = cache
            before = model.__dict__.get("_previous_max_cache_length")

            def restore(before=before):  # (absent before a first static-cache generate)
                model.__dict__.pop("_previous_max_cache_length", None)
                if before is not None:
                    model._previous_max_cache_length = before

            generate_as_eager(model, forward, jf, ids, kw, i, restore=restore)
            compiles.append(jf.stats.compiles)
    assert not [w for w in caught if "trident" in str(w.message)]
    return jf, compiles


# Compiles after each request. Mistral (every layer sliding): the first prefill (its prompt's
# length exact; the window's capacity, 4, an int leaf: Note [Capacities of written state] in
# trident/frontend/ints.py), its decode step; at the second request the prefill again with
# the prompt's length symbolic and ``_previous_max_cache_length`` (no layer's capacity here,
# so a constant until it changed) a leaf, and the decode step again for that leaf; then every
# batch and length hits. Gemma 3 with a full-attention layer: that layer's capacity is
# ``_previous_max_cache_length``, a leaf from the first prefill, so the decode step compiles
# once. Before Note [Leading ones of a stored value]: one more at the first batch of one
# (``input_ids.size(0) != 1 is false``).
EXPECTED = {"mistral": [2, 4, 4, 4, 4, 4], "gemma3": [2, 3, 3, 3, 3, 3]}


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_a_window_shorter_than_the_prompts_compiles_within_the_bound(arch):
    jf, compiles = sweep(tiny(arch), REQUESTS)
    assert compiles == EXPECTED[arch], (compiles, jf.stats.miss_reasons)
    assert jf.stats.fallbacks == 0, jf.stats


def test_a_miss_reason_names_the_value_of_a_new_leaf():
    """Note [Leaf values in words] in trident/ir/trees.py: the miss that made
    ``_previous_max_cache_length`` an int leaf names the call's value, not just "a leaf"."""
    model = tiny("mistral")
    jf, _ = sweep(model, REQUESTS[:2])
    # the caches the two requests sized: prompt + new tokens - 1 (transformers 5.17-5.25)
    first, second = 9 + 3 - 1, 12 + 2 - 1
    reasons = [r for r in jf.stats.miss_reasons if "_previous_max_cache_length" in r]
    assert reasons, jf.stats.miss_reasons
    assert f"self._previous_max_cache_length: int {second} (a leaf) where int {first} was " \
        "compiled" in reasons[0], reasons[0]


@pytest.mark.xfail(strict=True, reason="the argument tree checks the model's __dict__ keys: "
                   "generate adds _previous_max_cache_length at the first static-cache "
                   "generate, which no forward reads (only generate's _prepare_static_cache), "
                   "so the default cache's specializations compiled before it miss and "
                   "compile again (docs/design.md, Limits today)")
def test_a_default_cache_after_a_static_one_reuses_what_was_compiled():
    """Mixing caches in one process: default (a ``DynamicCache``), static, default again.
    The third ``generate`` is the first's structure and should hit what the first compiled;
    it compiles its prefill and decode step again (``self: '_previous_max_cache_length'
    added``), 6 compiles where 4 would do."""
    jf, compiles = sweep(tiny("llama"), [(1, 6, 3, None), (1, 7, 3, "static"), (1, 8, 3, None)])
    assert compiles == [2, 4, 4], (compiles, jf.stats.miss_reasons)


def put_last(dst, index, value):
    """A rolling window's step: the value written at ``index`` of dim 1, as
    ``StaticSlidingWindowLayer`` writes a full window's last position."""
    dst[:, index] = value
    return dst * 2


@pytest.mark.parametrize("index", [torch.tensor([-1]), torch.tensor([0, 2])], ids=["one", "two"])
def test_an_indexed_assignment_serves_a_batch_of_one(index):
    """Note [Leading ones of a stored value]: batches of 2 and 4 (exact, then symbolic), then
    3 and 1 hit; before, the binding's question ``batch != 1`` was a guard and a batch of one
    compiled once more. Every result and written ``dst`` equal to eager's."""
    jf = trident.jit(put_last)
    for batch in (2, 4, 3, 1, 1):
        torch.manual_seed(batch)
        dst, value = torch.zeros(batch, 5, 3), torch.randn(batch, len(index), 3)
        mine, theirs = dst.clone(), dst.clone()
        assert torch.equal(jf(mine, index, value), put_last(theirs, index, value))
        assert torch.equal(mine, theirs)
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 3, 0), jf.stats
