"""Adversarial cases of Note [Attribute writes] (trident/lower/writes.py) and of Note [Int
leaves] through torch.compile(backend="trident") (frontend/backend.py): each compares with eager."""

from __future__ import annotations

import warnings

import torch

import trident


class SlotsAndDict:
    __slots__ = ("n", "__dict__")

    def __init__(self):
        self.n = 0


def test_a_write_to_a_slot_of_an_object_with_a_dict_is_done_once():
    # the trace's write to the slot (not in __dict__) was not undone, and the eager fallback
    # wrote it again: n == 6 after one call, not 3
    def step(x, b):
        b.n = b.n + 3
        return x + b.n

    jf = trident.jit(step)
    mine, theirs = SlotsAndDict(), SlotsAndDict()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            x = torch.arange(3.0) + i
            assert torch.equal(jf(x, mine), step(x, theirs))
            assert mine.n == theirs.n
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1, said
    assert (jf.stats.compiles, jf.stats.fallbacks) == (0, 3), jf.stats
