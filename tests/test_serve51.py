"""Padded batches of Qwen2 through a static cache (issue 26, serve51): a new user's requests
(a batch of one, then left-padded batches of two at prompt lengths 9, 5, 12) compile 3 times
through ``trident.jit(model.forward)``, on Llama and on Qwen2, every token and logit equal to
eager's. Qwen2 compiled 5 times before Note [Paths of one tree] compared a path by its own
tree (trident/frontend/ints.py, ``new_paths``).

Why Qwen2 differed: transformers 5.25's ``generate`` passes Qwen2 (whose config has
``layer_types``) its mask as a dict, ``attention_mask['full_attention']``: None for the
unpadded batch of one, a 4-D ``[batch, 1, prompt, capacity]`` tensor for a padded batch. The
padded prefill is another path of the first prefill's argument tree (Note [Paths of one tree]
in trident/frontend/ints.py), whose leaf there was None, so no dim of the mask is compared by
path; and the decode step holds a tensor at that path, so ``new_tensor_dims`` (Note [Tensors
by path]) counted the path as known and skipped it too. The mask's prompt and capacity dims stayed
static (``bool[?, 1, 9, 11]``) and tied the symbolic prompt length to 9 (``input_ids.size(1) >=
9``, ``<= 9``) and later the capacity to 11. Llama's first prefill has no ``attention_mask``
keyword at all, so its padded prefill is a new argument structure, compared by path.
"""

from __future__ import annotations

import pytest
import torch

import trident
from _trident_helpers import generate_as_eager

transformers = pytest.importorskip("transformers")

# (batch, prompt length, max_new_tokens): the user's first four requests; batches of two are
# left-padded in their first row
REQUESTS = [(1, 6, 4), (2, 9, 3), (2, 5, 3), (2, 12, 2)]


def tiny(arch: str):
    config_cls, model_cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                             "llama": ("LlamaConfig", "LlamaForCausalLM")}[arch]
    config = getattr(transformers, config_cls)(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


def padded_sweep(model):
    """The REQUESTS through eager and ``trident.jit(model.forward)``, each asserted equal
    (tokens, logits); returns the JitFunction."""
    forward = model.forward
    jf = trident.jit(forward)
    for i, (batch, length, new) in enumerate(REQUESTS):
        torch.manual_seed(i)
        ids = torch.randint(0, 128, (batch, length))
        mask = torch.ones_like(ids)
        if batch > 1:
            mask[0, :2] = 0
        kw = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  output_logits=True, return_dict_in_generate=True, disable_compile=True,
                  cache_implementation="static")
        generate_as_eager(model, forward, jf, ids, kw, i)
    return jf


def test_padded_batches_of_llama_compile_three_times():
    jf = padded_sweep(tiny("llama"))
    assert (jf.stats.compiles, jf.stats.fallbacks) == (3, 0), jf.stats.miss_reasons


def test_padded_batches_of_qwen2_compile_as_llama_does():
    jf = padded_sweep(tiny("qwen2"))
    assert (jf.stats.compiles, jf.stats.fallbacks) == (3, 0), jf.stats.miss_reasons
