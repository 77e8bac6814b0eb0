"""A serving sweep over transformers' default cache (no ``cache_implementation``: a
``DynamicCache``), with a server's left-padded ``attention_mask``: compile counts asserted
exactly (Note [Tensors by path] in trident/frontend/ints.py; docs/huggingface.md).

A tiny Qwen2 (hidden 64, 2 layers, random weights, the CPU) through ``model.forward =
trident.jit(model.forward)``, seven greedy ``generate`` calls of batches 2, 4 and 1, prompts of 5
to 12 tokens and 2 or 3 new tokens, each row of a batch but the first left-padded to a shorter
prompt; then the same requests in reverse order, which compile nothing. Every token and every
step's logits equal to eager's (``torch.equal``), no fallback, no warning.

The count: the prefill compiles once, with the prompt's length and the batch symbolic from its
first call (it stores the cache, whose layers held None: Note [Lengths of written state] in
trident/frontend/ints.py; traced at exact sizes, then again symbolic: one trace more than
compiles), its decode step once with the cache's length and the batch symbolic (the keys the
prefill stored with a symbolic dim 2, the same Note; the decode step's ``input_ids`` is the
prefill's path at another length: Note [Tensors by path]); then every batch and length hits. A
batch of one has no padding: transformers 5.25's ``generate`` drops an all-ones mask, so its
forward gets no ``attention_mask``, another argument structure whose prefill and decode step
compile once each, symbolic at once (4 in all: the issue's bound); transformers 5.17 passes the
mask, one structure, whose all-ones mask the trace drops as eager does (a value check: Note
[Value reads] in trident/lower/values.py), so again 4. Before Note [Lengths of written state]: 5 (the first prefill at
exact sizes, then symbolic at the second request); before Note [Tensors by path]: 3 compiles
for the first request and 4 for each later argument structure (exact sizes first).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import trident
from _trident_helpers import generate_as_eager, tiny_causal_lm

transformers = pytest.importorskip("transformers")

# (batch, prompt length, max_new_tokens)
REQUESTS = [(2, 9, 3), (2, 12, 2), (4, 7, 3), (1, 10, 3), (1, 6, 2), (4, 11, 2), (2, 5, 3)]


def padded_request(i: int, batch: int, length: int):
    """Prompts of ``length`` tokens, row ``k`` left-padded to ``length - 2k`` (at least 1)."""
    torch.manual_seed(i)
    ids = torch.randint(1, 96, (batch, length))
    mask = torch.stack([torch.arange(length) >= min(2 * k, length - 1)
                        for k in range(batch)]).long()
    return ids * mask, mask


def test_a_dynamic_cache_sweep_compiles_each_structure_once_symbolic():
    model = tiny_causal_lm("Qwen2", max_position_embeddings=64)
    forward = model.forward
    masks_seen = set()

    @functools.wraps(forward)  # (generate reads the forward's signature)
    def recorded(*args, **kwargs):  # eager's forward: which argument structures generate makes
        mask = kwargs.get("attention_mask")  # and which values it reads of the mask (Note
        masks_seen.add(None if mask is None else bool(mask.all()))  # [Value reads])
        return forward(*args, **kwargs)

    jf = trident.jit(forward)
    counts = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (batch, length, new) in enumerate(REQUESTS + REQUESTS[::-1]):
            ids, mask = padded_request(i % len(REQUESTS), batch, length)
            kw = dict(attention_mask=mask, pad_token_id=0, max_new_tokens=new,
                      min_new_tokens=new, do_sample=False, output_logits=True,
                      return_dict_in_generate=True, disable_compile=True)
            generate_as_eager(model, recorded, jf, ids, kw, i)
            counts.append(jf.stats.compiles)
    assert not [w for w in caught if "trident" in str(w.message)]
    stats = jf.stats
    # 2 on transformers 5.25 (a batch of one: no mask) and on 5.17 (a batch of one: a mask of
    # ones, which the trace drops as eager does: a value check, Note [Value reads])
    structures = len(masks_seen)
    # the first request: the prefill and the decode step, each symbolic at once
    assert counts[0] == 2, stats.miss_reasons
    assert counts[1] == 2, stats.miss_reasons  # the second prompt's length: a hit
    expected = 2 * structures  # the first prefill traced twice (exact sizes, then symbolic)
    assert (counts[len(REQUESTS) - 1], stats.compiles, stats.traces, stats.fallbacks) == \
        (expected, expected, expected + 1, 0), stats.miss_reasons
    calls = sum(new for _, _, new in REQUESTS) * 2
    assert stats.hits == calls - expected
