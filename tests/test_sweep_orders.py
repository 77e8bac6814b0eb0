"""A serving sweep in several request orders: what the compile count depends on.

The same six ``generate`` requests (batch, prompt length, ``max_new_tokens``), with a batch of
one first, a batch of four first, or a one-token prompt first, through ``model.forward =
trident.jit(model.forward)``: a tiny Llama with a static cache and a tiny Qwen2 with the
default dynamic cache (tiny random configs, on the CPU). Each served call is compared with
eager's (``torch.equal`` on every token and logit), the compile count is asserted exactly,
and no call runs eagerly.

With a static cache the count is ``S + E``: each of the ``S`` argument structures the
requests make compiles once with its lengths and batch symbolic, and each of the ``E`` met
before the first change of a length, an int or the batch compiled once before, at exact sizes
(automatic dynamic, as torch.compile's: nothing is symbolic before something changed). A
structure met after the first change is symbolic at once: Note [Batch dims]
(trident/frontend/batch.py: a batch of one is a symbol of range >= 1) and Note [Ints by path]
(trident/frontend/ints.py: a new argument structure starts from what the others made
symbolic, and its new tensors' dims of the size of an int that changed are symbolic). ``S``
is 3 (the prefill, a one-token prompt's prefill, which is passed a 4-D mask, and the decode
step). The first prefill allocates the cache, so its capacity is an int leaf from its first
compile (Note [Capacities of written state] in trident/frontend/ints.py) and the decode step
symbolic at its first: ``E`` is 1 where the first prompt is longer than one token (its length
at exact sizes first), 0 where it is a one-token prompt (whose prefill serves one-token
prompts only): so the count depends on the order, through ``E`` only. A count equal in every
order would need the first prompt's length traced symbolic too, which a static cache's prefill
stores in no tensor of that length. The dynamic cache's first prefill is that first request traced symbolic:
it stores the cache its arguments hold (a ``DynamicCache``'s layers held None), so the lengths
it stores are symbolic from its first compile (Note [Lengths of written state] in
trident/frontend/ints.py: traced twice, at exact sizes, then symbolic), and each structure
compiles once (``MODELS``), in every order: a one-token prompt first stores a cache of length
1, a length too (a symbol of range >= 1, as a batch of one is), read back symbolic by the
decode step, whose one specialization serves a cache of any length, 1 included.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import generate_as_eager

transformers = pytest.importorskip("transformers")

# (batch, prompt length, max_new_tokens): a batch of one, of two and of four, new lengths,
# one-token prompts (a prefill of one token, which a static cache's generate passes a 4-D
# mask), a generate with no decode step (max_new_tokens=1)
A, B, C, D, E, F = (1, 5, 3), (1, 9, 2), (2, 7, 3), (4, 6, 1), (2, 1, 2), (1, 1, 2)
ORDERS = {"batch 1 first": [A, B, C, F, D, E], "batch 4 first": [D, C, A, E, B, F],
          "1-token prompt first": [F, C, D, A, E, B]}
MODELS = {  # (config, model class, cache, (compiles, traces) by order)
    # Traces: since Note [Writes probe] (trident/frontend/tracing.py) a first prefill's writes
    # are found by a run with no graph, so its exact trace below no longer runs where the
    # symbolic one succeeds: one trace fewer than the comments count.
    # S = 3: the prefill, the one-token prefill, the decode step. The first prefill allocates
    # the cache, sized by its capacity (``max_cache_len``): traced at exact sizes, then with
    # the capacity an int leaf (Note [Capacities of written state] in
    # trident/frontend/ints.py: one trace more than compiles), so the decode step is symbolic
    # at its first compile and no capacity compiles again; E = 1 where the first prompt is
    # longer than one token (its length, no capacity, at exact sizes, then symbolic at the
    # next length), 0 where it is one token (the one-token prefill serves one-token prompts
    # only: a path of its own). Before that Note: 5, 4 and 5 (the first decode step at
    # exact sizes, then again at the next capacity)
    "llama": ("LlamaConfig", "LlamaForCausalLM", "static",
              {"batch 1 first": (4, 4), "batch 4 first": (4, 4), "1-token prompt first": (3, 3)}),
    # a dynamic cache: the first prefill symbolic (Note [Lengths of written state] in
    # trident/frontend/ints.py: it stores the cache; traced at exact sizes, then again with
    # the prompt's length and the batch symbolic, one trace more than compiles), its decode
    # step symbolic at once (the keys the prefill stored with a symbolic dim 2, a symbol of
    # range >= 1: the same Note; Note [Tensors by path]), serving the one-token prompts' decode
    # steps too (a cache of length 1), and a one-token prompt's prefill (transformers' SDPA
    # takes another path for one query: ``is_causal = q_length > 1 and ...``) once, batch
    # symbolic: 3 in every order (4 before: the one-token decode step its own; 6 where the
    # one-token prompt came first). A one-token prompt first: traced at exact sizes, then with
    # its length of one and the batch symbolic, which fails in SDPA (``is_causal`` a SymBool),
    # then with the batch alone; the decode step reads the cache's length back symbolic (the
    # exact trace stored it: ``stored_lengths``): 2 traces more than compiles
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "dynamic",
              {"batch 1 first": (3, 3), "batch 4 first": (3, 3), "1-token prompt first": (3, 4)}),
}


def tiny_model(arch: str):
    config_name, model_name, _, _ = MODELS[arch]
    config = getattr(transformers, config_name)(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_a_serving_sweep_compiles_once_per_structure_and_early_structure(arch, order):
    """The sweep, then the same requests in reverse order, which compile nothing more: the
    symbolic specializations serve every request, whatever the order that made them."""
    model = tiny_model(arch)
    cache, (expected, traces) = MODELS[arch][2], MODELS[arch][3][order]
    forward = model.forward
    jf = trident.jit(forward)
    kw = dict(do_sample=False, cache_implementation=cache, output_logits=True,
              return_dict_in_generate=True, disable_compile=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        requests = ORDERS[order] + ORDERS[order][::-1]
        for i, (batch, length, new) in enumerate(requests):
            if i == len(ORDERS[order]):
                first = jf.stats.compiles
            torch.manual_seed(i)
            ids = torch.randint(0, 96, (batch, length))
            call = dict(kw, max_new_tokens=new, min_new_tokens=new,
                        attention_mask=torch.ones_like(ids))
            # a static cache is as long as the longest before it: eager's reference starts
            # from the length the served call starts from
            before = getattr(model, "_previous_max_cache_length", None)
            generate_as_eager(model, forward, jf, ids, call, i, restore=None if before is None
                              else lambda: setattr(model, "_previous_max_cache_length", before))
    assert not [w for w in caught if "trident" in str(w.message)]
    stats = jf.stats
    assert (first, stats.compiles, stats.fallbacks) == (expected, expected, 0), \
        stats.miss_reasons
    assert stats.traces == traces


# A server's padded batches, a one-token prompt first (issue 26's sweep, ``sweep_hf ARCH 50
# CACHE jit padded 0 1``, in small): each row but the first left-padded to a length of its own,
# so a batch of two or four passes a mask with zeros, and a batch of one (its mask all ones,
# which 5.25's ``generate`` drops) none: two argument structures beside the one-token prefill
PADDED = [(2, 1, 4), (2, 30, 5), (4, 20, 3), (1, 25, 4), (1, 12, 2), (2, 9, 3)]
PADDED_COUNTS = {  # (compiles, traces; the exact traces below run no more: Note [Writes probe])
    # a static cache (``generate`` makes the 4-D masks): the one-token prefill (passed a mask,
    # as the padded prefill: SDPA packs one query's heads, ``pack_gqa``, and repeats the others'
    # keys), traced at exact sizes then with its capacity an int leaf and the batch symbolic
    # (Note [Capacities of written state] in trident/frontend/ints.py); the decode step,
    # symbolic at once (the keys the prefill stored with a symbolic capacity); the padded
    # prefill and the unmasked one, symbolic at once: 4 (5 before that Note: the decode step at
    # the first capacity, then again at the second)
    "llama": (4, 4),
    # a dynamic cache: the one-token prefill (traced at exact sizes, with its length of one
    # symbolic, which SDPA refuses, then with its batch alone: Note [Lengths of written
    # state]), the unmasked decode step, the padded prefill and decode step, the unmasked
    # prefill of longer prompts: 5, one per path eager takes (SDPA with a mask; without, causal
    # for a longer prompt and not for one token), none at exact sizes then again
    "qwen2": (5, 6),
    # a Qwen2 with a static cache: as the Llama, but its masks are a dict
    # (``attention_mask['full_attention']``), None for the unmasked prefill: the same argument
    # tree as the other prefills, another path of it, whose dims are compared with theirs by
    # path (Note [Paths of one tree] in trident/frontend/ints.py); 5 before that Note (the
    # unmasked prefill at exact sizes, then again at its second length)
    "qwen2 static": (4, 4),
}


@pytest.mark.parametrize("arch", sorted(PADDED_COUNTS))
def test_a_padded_sweep_with_a_one_token_prompt_first_compiles_once_per_path(arch):
    arch, _, cache = arch.partition(" ")
    model = tiny_model(arch)
    forward = model.forward
    jf = trident.jit(forward)
    kw = dict(do_sample=False, cache_implementation=cache or MODELS[arch][2], output_logits=True,
              return_dict_in_generate=True, disable_compile=True, pad_token_id=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (batch, length, new) in enumerate(PADDED + PADDED[::-1]):
            if i == len(PADDED):
                first = jf.stats.compiles
            torch.manual_seed(i)
            rows = [length] + [int(n) for n in torch.randint(1, length + 1, (batch - 1,))]
            mask = torch.stack([torch.arange(length) >= length - n for n in rows]).long()
            ids = torch.randint(1, 96, (batch, length)) * mask
            call = dict(kw, max_new_tokens=new, min_new_tokens=new, attention_mask=mask)
            before = getattr(model, "_previous_max_cache_length", None)
            generate_as_eager(model, forward, jf, ids, call, i, restore=None if before is None
                              else lambda: setattr(model, "_previous_max_cache_length", before))
    assert not [w for w in caught if "trident" in str(w.message)]
    stats = jf.stats
    expected, traces = PADDED_COUNTS[f"{arch} {cache}".strip()]
    assert (first, stats.compiles, stats.fallbacks) == (expected, expected, 0), \
        stats.miss_reasons
    assert stats.traces == traces


def test_the_backend_doors_padded_prefill_after_a_one_token_prompt_is_one_graph():
    """``torch.compile(model.forward, backend="trident")``, a tiny Qwen2 (1 layer) with the
    default cache, padded batches after a one-token prompt: the one-token prefill and its
    decode step (a cache of length 1, which Dynamo specializes) are graphs at exact sizes;
    the padded prefill's ``attention_mask`` is an input Dynamo never saw, static, which ties
    the prompt's length (symbolic since the decode step) to its size, so the padded prefill was
    a graph of that length, then again symbolic at the next (5 graphs, 5 compiles). Note [Tied
    dims] (trident/frontend/frame_state.py): Dynamo traces it again with the mask's length
    dynamic, one graph for every padded prompt: 4 graphs, 4 compiles; every token and logit as
    Dynamo's ``eager`` backend's."""
    from torch._dynamo.utils import counters

    config = transformers.Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    forward = model.forward
    kw = dict(do_sample=False, output_logits=True, return_dict_in_generate=True,
              disable_compile=True, pad_token_id=0, max_new_tokens=2, min_new_tokens=2)
    calls = []
    for i, (batch, length) in enumerate([(2, 1), (2, 9), (2, 7), (2, 12)]):
        torch.manual_seed(i)
        rows = [length] + [int(n) for n in torch.randint(1, length + 1, (batch - 1,))]
        mask = torch.stack([torch.arange(length) >= length - n for n in rows]).long()
        calls.append((torch.randint(1, 96, (batch, length)) * mask, mask))
    torch._dynamo.reset()
    model.forward = torch.compile(forward, backend="eager")
    refs = [model.generate(ids, attention_mask=mask, **kw) for ids, mask in calls]
    torch._dynamo.reset()
    model.forward = served = torch.compile(forward, backend="trident")
    base, graphs = trident.backend_stats(served), counters["stats"]["unique_graphs"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for (ids, mask), ref in zip(calls, refs):
            out = model.generate(ids, attention_mask=mask, **kw)
            assert torch.equal(out.sequences, ref.sequences)
            assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
    model.forward = forward
    assert not [w for w in caught if "trident" in str(w.message)]
    s = trident.backend_stats(served)
    graphs = counters["stats"]["unique_graphs"] - graphs
    assert (graphs, s.compiles - base.compiles, s.fallbacks - base.fallbacks) == (4, 4, 0), \
        (graphs, s.miss_reasons)
