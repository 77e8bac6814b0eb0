"""Adversarial cases of Note [Attribute writes] (trident/lower/writes.py) and of Note [Int
leaves] through torch.compile(backend="trident") (frontend/backend.py): each compares with eager."""

from __future__ import annotations

import warnings

import pytest
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


def _negated(x, n):
    return x * 2, -n, x * -n


def _modulo(x, n):
    return x * 2, n % 4


@pytest.mark.parametrize("fn", [_negated, _modulo])
def test_an_int_dynamo_made_symbolic_negated_or_modulo_is_compiled_once(fn):
    # -n and n % 4 reached the plan as aten::neg.int and aten::fmod.int (Torch-MLIR's import of
    # Python's %), no size step: the symbolic trace failed, silently, and every new n compiled
    torch._dynamo.reset()
    f = torch.compile(fn, backend="trident")
    x = torch.arange(4.0)
    for n in (3, 5, -7, 9, 11, -2):
        out, ref = f(x, n), fn(x, n)
        assert len(out) == len(ref)
        for a, b in zip(out, ref):
            assert torch.equal(a, b) if isinstance(b, torch.Tensor) else \
                (type(a) is type(b) and a == b), (n, out, ref)
    s = trident.backend_stats(f)
    assert (s.compiles, s.fallbacks) == (2, 0), s  # n = 3 a constant to Dynamo, then a symbol
    assert s.hits == 4, s
