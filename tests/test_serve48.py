"""The ``torch.compile(..., backend="trident")`` door and state its frame stores (issue 26).

Note [Stored lengths in graphs] (trident/frontend/frame_state.py): a Dynamo frame that stores
tensors into the attributes of objects that outlive it (a transformers ``DynamicCache``'s
prefill: its layers' ``keys`` were None) stores lengths a server's next calls change; the door
has Dynamo trace such a frame again with those lengths symbolic, and records the dims stored
symbolic, so the frame's next graph (the decode step, which reads the keys back) is symbolic
from its first trace. Every result is compared with eager's (``torch.equal``); compile and
graph counts are exact.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

import trident


def fresh(fn):
    """``fn`` with a code object of its own (``backend_stats`` counts per frame code)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


class State:
    """State a step keeps across calls, as a cache layer does."""

    def __init__(self, buf=None):
        self.buf = buf


def serve(ids, state):
    """A prefill (``state.buf`` None: stores the prompt's rows) or a decode step (grows it by
    one column), as a ``DynamicCache`` layer's ``update`` does."""
    rows = ids.float() * 2
    state.buf = rows if state.buf is None else torch.cat([state.buf, rows], 1)
    return state.buf.sum(1) + ids.shape[1]


def graphs_of(f) -> int:
    return len(trident.backend_graphs(f))


def run(f, fn, calls) -> None:
    """Each call as ``(ids, state)``, through ``f`` and through ``fn`` (eager) on a copy of
    the state; results and the stored state compared."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for ids, state in calls:
            mirror = State(None if state.buf is None else state.buf.clone())
            got, want = f(ids, state), fn(ids, mirror)
            assert torch.equal(got, want) and torch.equal(state.buf, mirror.buf)
    assert not [w for w in caught if "trident" in str(w.message)]


def test_a_frame_that_stores_a_prompts_length_is_traced_with_it_symbolic():
    """Requests of prompts of 5, 7 and 9 tokens (batch 2), each a prefill into a fresh state
    then two decode steps. Before: the prefill at exact sizes, its decode step at exact sizes
    and again symbolic (the buffer grew), the prefill again at the second length: 4 graphs, 4
    compiles. The prefill stores ``[2, 5]`` where the state held None, and 5 is ``ids``' length:
    traced again with it symbolic, and the buffer's dim recorded dynamic: 2 graphs."""
    torch._dynamo.reset()
    f = torch.compile(fresh(serve), backend="trident")
    calls = []
    for n in (5, 7, 9):
        state = State()
        calls += [(torch.arange(2 * n).reshape(2, n), state)]
        calls += [(torch.ones(2, 1, dtype=torch.long), state)] * 2
    run(f, serve, calls)
    s = trident.backend_stats(f)
    assert (graphs_of(f), s.compiles, s.fallbacks, s.hits) == (2, 2, 0, 7), s


def test_a_frame_that_grows_a_held_tensor_is_traced_with_its_length_symbolic():
    """Decode steps only, the state made before (the prefill eager, as transformers'
    ``CompileConfig`` compiles only the decode step): the first step stores ``[2, 4]`` where
    the state held ``[2, 3]``. Before: a graph at exact sizes, then one with the length
    symbolic (2 graphs, 2 compiles); the door traces the first again with that dim symbolic: 1."""
    torch._dynamo.reset()
    f = torch.compile(fresh(serve), backend="trident")
    state = State(torch.zeros(2, 3))
    run(f, serve, [(torch.ones(2, 1, dtype=torch.long), state)] * 5)
    s = trident.backend_stats(f)
    assert (graphs_of(f), s.compiles, s.fallbacks, s.hits) == (1, 1, 0, 4), s


def test_a_capacity_the_object_holds_is_not_a_length():
    """A buffer allocated at an int the object holds (a static cache's ``max_cache_len``) is
    no length of the call: a request of that many tokens by coincidence is traced at exact
    sizes, as before (its prefill, then symbolic at the next length: 2 graphs for the prefill;
    the steps write in place and store no tensor)."""
    def fill(ids, state):
        if state.buf is None:
            state.buf = torch.zeros(ids.shape[0], state.capacity)
        state.buf[:, :ids.shape[1]] = ids.float()
        return state.buf.sum(1)

    torch._dynamo.reset()
    f = torch.compile(fresh(fill), backend="trident")
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    for n in (6, 4, 5):
        state, mirror = State(), State()
        state.capacity = mirror.capacity = 6
        ids = torch.arange(2 * n).reshape(2, n)
        assert torch.equal(f(ids, state), fill(ids, mirror))
        assert torch.equal(state.buf, mirror.buf)
    s = trident.backend_stats(f)
    graphs = counters["stats"]["unique_graphs"] - before
    assert (graphs, s.compiles, s.fallbacks, s.hits) == (2, 2, 0, 1), (graphs, s)


transformers = pytest.importorskip("transformers")


def test_the_backend_doors_default_cache_compiles_each_structure_once_per_batch_kind():
    """A new user's door, default settings: ``torch.compile(model.forward, backend="trident")``,
    transformers' default ``DynamicCache``, ``generate`` calls of (batch, prompt length)
    (1, 6), (1, 9), (1, 20), (2, 7), (1, 13). Before: 6 graphs and 6 compiles (the prefill
    and the decode step at exact sizes, the decode step at the next cache length, the prefill
    at the next prompt length, then both at a batch of 2, which Dynamo, having specialized the
    batch of one, saw change only there: ``input_ids size mismatch at index 0``). The prefill
    stores the prompt's length in the cache (Note [Stored lengths in graphs]): the prefill and
    the decode step are symbolic from their first graphs, 4 in all (a batch of one is a graph
    of its own: Dynamo specializes a size 1); every token and logit as Dynamo's own ``eager``
    backend's."""
    from torch._dynamo.utils import counters

    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    forward = model.forward
    kw = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, output_logits=True,
              return_dict_in_generate=True, disable_compile=True)
    calls = []
    for i, (batch, length) in enumerate([(1, 6), (1, 9), (1, 20), (2, 7), (1, 13)]):
        torch.manual_seed(i)
        ids = torch.randint(0, 96, (batch, length))
        calls.append((ids, torch.ones_like(ids)))
    torch._dynamo.reset()
    model.forward = torch.compile(forward, backend="eager")
    refs = [model.generate(ids, attention_mask=mask, **kw) for ids, mask in calls]
    torch._dynamo.reset()
    model.forward = served = torch.compile(forward, backend="trident")
    base, graphs = trident.backend_stats(served), counters["stats"]["unique_graphs"]
    compiles = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for (ids, mask), ref in zip(calls, refs):
            out = model.generate(ids, attention_mask=mask, **kw)
            assert torch.equal(out.sequences, ref.sequences)
            assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
            compiles.append(trident.backend_stats(served).compiles - base.compiles)
    model.forward = forward
    assert not [w for w in caught if "trident" in str(w.message)]
    s = trident.backend_stats(served)
    graphs = counters["stats"]["unique_graphs"] - graphs
    assert (compiles, graphs, s.fallbacks - base.fallbacks) == ([2, 2, 2, 4, 4], 4, 0), \
        (compiles, graphs, s.miss_reasons)


def literal_buffer(ids, state):
    """A buffer of a literal size (no attribute of the object: no capacity) filled with the
    prompt: a prompt of 6 tokens stores a size 6 as a length would."""
    if state.buf is None:
        state.buf = torch.zeros(ids.shape[0], 6)
    state.buf[:, :ids.shape[1]] = ids.float()
    return state.buf.sum(1)


def test_a_retrace_that_takes_another_path_is_not_a_crash():
    """Note [Restarts take another path]: the prompt of 6 tokens looks like a stored length,
    so the door has Dynamo trace the frame again with it symbolic, and the retrace's slice
    takes another path through the bytecode than the first: Dynamo raised
    ``SpeculationLogDivergence`` into the call. The door clears Dynamo's speculation log
    before the restart: every call served, as eager computes it. The retraced graph holds a
    prompt of 6 only (the slice into the buffer of 6 ties the symbol to it), the next length
    is a graph with it symbolic, as automatic dynamic makes it: 2 graphs."""
    torch._dynamo.reset()
    f = torch.compile(fresh(literal_buffer), backend="trident")
    for n in (6, 4, 5, 6):
        state, mirror = State(), State()
        ids = torch.arange(2 * n).reshape(2, n)
        assert torch.equal(f(ids, state), literal_buffer(ids, mirror))
        assert torch.equal(state.buf, mirror.buf)
    s = trident.backend_stats(f)
    assert (len(trident.backend_graphs(f)), s.compiles, s.fallbacks, s.hits) == (2, 2, 0, 2), s
