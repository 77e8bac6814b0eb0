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
    # Python's %), no size step: the symbolic trace failed, silently, and every new n compiled.
    # Both are checked size steps (Note [Checked size steps]: a zero divisor runs eagerly)
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


class Counter:
    def __init__(self, n):
        self.n = n


def test_an_int_written_past_int64_is_eager_python_int():
    # the symbolic int's product was computed in C in int64 and wrapped around silently: now
    # checked (Note [Checked size steps] in codegen/render.py), the call past int64 runs eagerly
    def grow(x, c):
        c.n = c.n * 1000003
        return x + 1

    jf = trident.jit(grow)
    mine, theirs = Counter(7), Counter(7)
    for _ in range(5):
        x = torch.ones(2)
        assert torch.equal(jf(x, mine), grow(x, theirs))
        assert type(mine.n) is int and mine.n == theirs.n, (mine.n, theirs.n)


def test_an_int_dynamo_made_symbolic_returned_past_int64_is_exact():
    # 2**62 * 4 came back as 0; checked, the call runs eagerly and returns 2**64
    def scaled(x, n):
        return x + 1, n * 4

    torch._dynamo.reset()
    f = torch.compile(scaled, backend="trident")
    x = torch.ones(2)
    for n in (3, 5, 2**62, 2**62 + 1):
        out, ref = f(x, n), scaled(x, n)
        assert torch.equal(out[0], ref[0]) and out[1] == ref[1], (n, out[1], ref[1])


def test_a_float_written_from_a_size_does_not_compile_per_call():
    # b.f = len / 2 was a float constant of the next call's tree: every new length compiled.
    # Now a float the trace writes is a leaf it traces as a symbol, unguarded where no trace
    # reads it (Note [Float leaves] in frontend/policy.py), and the quotient is computed in C
    def halve(x, b):
        b.f = x.shape[0] / 2
        return x + 1

    jf = trident.jit(halve)
    mine, theirs = Counter(0), Counter(0)
    for i in range(6):
        x = torch.ones(2 + i)
        assert torch.equal(jf(x, mine), halve(x, theirs))
        assert type(mine.f) is float and mine.f == theirs.f
    # the first call's exact trace, then the tree with b.f for every length
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 4, 0), jf.stats


class Pair:
    def __init__(self):
        self.n = 0
        self.t = torch.zeros(2)


def test_an_attribute_deleted_and_set_again_moves_to_the_end_as_in_eager():
    # eager's __dict__ is (t, z, n); the trace's undo put n back at the end before the replay
    # added z after it: (t, n, z)
    def readd(x, b):
        del b.n
        b.z = 1
        b.n = x.shape[0]
        return x + 1

    jf = trident.jit(readd)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            x = torch.ones(2 + i)
            mine, theirs = Pair(), Pair()
            assert torch.equal(jf(x, mine), readd(x, theirs))
            assert list(vars(mine)) == list(vars(theirs)), (vars(mine), vars(theirs))
            assert mine.n == theirs.n and mine.z == theirs.z
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1 and "which a specialization cannot replay" in said[0], said
    assert (jf.stats.compiles, jf.stats.fallbacks) == (0, 3), jf.stats


def test_an_int_counter_beside_a_float_written_from_it_becomes_a_leaf():
    # b.r changed with b.n: the trees differed in a float too, so n never became a leaf and
    # every call compiled
    def step(x, b):
        b.n = b.n + 1
        b.r = b.n / 2
        return x + 1

    jf = trident.jit(step)
    mine, theirs = Counter(0), Counter(0)
    for _ in range(6):
        x = torch.ones(2)
        assert torch.equal(jf(x, mine), step(x, theirs))
        assert (mine.n, mine.r) == (theirs.n, theirs.r) and type(mine.r) is float
    # n = 0, n = 1 (ints 0 and 1 stay constants, as in torch.compile), then any n
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (3, 3, 0), jf.stats


def _run(fn, sizes, start: float):
    jf = trident.jit(fn)
    mine, theirs = Counter(0), Counter(0)
    mine.f = theirs.f = start
    for n in sizes:
        x = torch.arange(float(n))
        assert torch.equal(jf(x, mine), fn(x, theirs)), n
        assert type(mine.f) is float and mine.f == theirs.f, (mine.f, theirs.f)
    return jf.stats


def test_a_float_written_then_read_in_a_branch_next_call_is_guarded_by_value():
    # the call writes b.f and the next call's Python branches on it: a float the trace reads
    # is guarded by value (Note [Float leaves]), never a stale branch
    def branch(x, b):
        y = x * 2 if b.f > 1.2 else x - 1
        b.f = x.shape[0] / 2
        return y

    s = _run(branch, (2, 3, 2, 3, 2, 3, 4), 0.5)
    # b.f at the calls: 0.5, 1.0, 1.5, 1.0, 1.5, 1.0, 1.5 (each value compiled once)
    assert (s.compiles, s.hits, s.fallbacks) == (3, 4, 0), s


def test_a_float_read_as_data_by_a_tensor_op_is_guarded_by_value():
    # x * b.f bakes b.f into the plan: guarded by value, each value compiled once
    def scale(x, b):
        return x * b.f

    jf = trident.jit(scale)
    mine, theirs = Counter(0), Counter(0)
    for f in (0.5, 1.5, 0.5, 2.5, 1.5, 2.5):
        mine.f = theirs.f = f
        x = torch.arange(3.0)
        assert torch.equal(jf(x, mine), scale(x, theirs)), f
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (3, 3, 0), jf.stats


def test_a_float_written_from_a_size_and_fed_to_an_op_is_exact():
    # the quotient of a symbolic size feeds an op: no plan takes it (size_steps.first), so
    # that trace fails once and the sizes are specialized, as after any failed dynamic trace
    def spread(x, b):
        b.f = x.shape[0] / 2
        return x * b.f

    s = _run(spread, (2, 3, 2, 3, 2, 3), 0.5)
    # (size, b.f): (2, 0.5), (3, 1.0), (2, 1.5), then those of calls 2 and 3 again
    assert (s.compiles, s.hits, s.fallbacks) == (3, 3, 0), s


def test_a_float_passed_on_unchanged_is_read():
    # b.g = b.f stores the symbol itself: a read (its placeholder is used), guarded by value
    def copy(x, b):
        b.g = b.f
        b.f = x.shape[0] / 2
        return x + 1

    s = _run(copy, (2, 3, 2, 3, 2), 0.5)
    # b.f at the calls: 0.5, 1.0, 1.5, 1.0, 1.5 (b.g, only written, is a leaf no trace reads)
    assert (s.compiles, s.hits, s.fallbacks) == (3, 2, 0), s
