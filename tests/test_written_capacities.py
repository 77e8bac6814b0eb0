"""Note [Capacities of written state] (trident/frontend/ints.py): a first compile whose trace
allocates the state it keeps (where its object held none) sized by an int attribute that object
had (a static cache layer's ``max_cache_len``) is traced again with that int, and every int
constant of its value, as int leaves: the next request's capacity hits, and so does the step
that reads the state back. Values against eager with ``torch.equal``, exact compile and trace
counts.
"""

from __future__ import annotations

import torch

import trident


class Slots:  # a static cache layer: its capacity an int, its keys allocated by the first step
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.keys = None
        self.filled = torch.tensor(0)


class Owner:  # generate's model: holds the capacity of the last request as well
    def __init__(self):
        self.last_capacity = 0


def step(owner, slots, x):
    """``x``: ``[batch, n, 4]``; writes its sums at the slots' fill level, returns what is
    held (``[batch, capacity]``)."""
    if slots.keys is None:
        slots.keys = torch.zeros(x.shape[0], slots.capacity)
    at = torch.arange(x.shape[1]) + slots.filled
    slots.filled.add_(x.shape[1])
    slots.keys.index_copy_(1, at, x.sum(2))
    return slots.keys * 2


def serve(fn, requests):
    """A request per (batch, prompt length, new tokens): fresh slots of capacity prompt + new,
    the prompt, then one-token steps; every result and the slots compared with eager's."""
    owner, ref_owner = Owner(), Owner()
    for batch, length, new in requests:
        torch.manual_seed(length)
        owner.last_capacity = ref_owner.last_capacity = length + new
        ours, ref = Slots(length + new), Slots(length + new)
        for n in [length] + [1] * (new - 1):
            x = torch.randn(batch, n, 4)
            assert torch.equal(fn(owner, ours, x), step(ref_owner, ref, x))
            assert torch.equal(ours.keys, ref.keys)


def test_a_function_that_allocates_its_state_compiles_its_capacity_symbolic():
    jf = trident.jit(step)
    serve(jf, [(2, 5, 3), (2, 7, 4), (2, 3, 3), (2, 6, 2)])
    # the first step: run once with no graph (Note [Writes probe] in frontend/tracing.py: its
    # writes), then traced with the capacity as an int leaf (x's length, no size of the keys,
    # stays 5), with no exact trace; the decode step: its keys' capacity read back symbolic
    # at once; then the prompt's length at the second request (automatic dynamic): 3
    # compiles, not 5 (the first step and the decode step at the first capacity, both again
    # at the second); every later capacity hits
    stats = jf.stats
    assert (stats.compiles, stats.traces, stats.fallbacks) == (3, 3, 0), stats.miss_reasons
    assert stats.hits == (3 + 4 + 3 + 2) - 3
    first, decode, prefill = jf.specializations
    assert "slots.capacity=8" in first and "x: float32[2, 5, 4]" in first, first
    assert "slots.keys: float32[?, ?]" in decode and "x: float32[?, 1, 4]" in decode, decode
    assert "slots.capacity=11" in prefill and "x: float32[2, ?, 4]" in prefill, prefill


def test_a_constant_capacity_compiles_once_per_structure():
    """One capacity for every request: one compile per structure, one trace each (the
    first step's writes found by a run with no graph: Note [Writes probe])."""
    jf = trident.jit(step)
    owner, ref_owner = Owner(), Owner()
    for _ in range(3):
        ours, ref = Slots(9), Slots(9)
        for n in [5, 1, 1]:
            x = torch.randn(2, n, 4)
            assert torch.equal(jf(owner, ours, x), step(ref_owner, ref, x))
    stats = jf.stats
    assert (stats.compiles, stats.traces, stats.fallbacks, stats.hits) == (2, 2, 0, 7)
