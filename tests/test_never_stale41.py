"""Library code's own values (Note [Library values] in lower/state/library.py): a number, flag,
string, enum member or tuple of those that an installed package's code reads from its module
globals (or at the end of a module attribute chain) in a branch, rebound after the first call,
is what the next call sees: a recompile, equal to eager; left alone, or rebound to an equal
value, the calls hit. The "library" is a package in a folder on ``sys.path`` that holds a
``*.dist-info`` (as ``pip install --target`` makes it: not user code by Trident's rules,
``frames.user_file``). Every call is compared with eager (``torch.equal``), with exact counts."""

from __future__ import annotations

import sys

import pytest
import torch

import trident
from _trident_helpers import counts, installed_package

NAME = "trident_fakelib41"
LIB = None  # the package, for a user function that reads it as a global

_SUB = "DEPTH = 3\n"

_LIB = '''
import enum
import logging
import math

import torch

from . import sub

LOG = logging.getLogger(__name__)


class Kind(enum.Enum):
    A = 1
    B = 2


FLAG = False
COUNT = 2
GAIN = 1.5
MODE = "add"
RAW = b"ab"
NOTHING = None
KIND = Kind.A
SHAPE = (2, ("x", 1.0))
NAMES = frozenset({"a"})
SIGN = 0.0
DTYPE = torch.float32


def flag(x):
    if FLAG:
        return x - 1
    return x + 1


def count(x):
    for _ in range(COUNT):
        x = x + 1
    return x


def gain(x):
    return x * GAIN


def mode(x):
    return x + 1 if MODE == "add" else x * 3


def raw(x):
    return x + len(RAW)


def nothing(x):
    return x if NOTHING is None else x * NOTHING


def kind(x):
    return x + 1 if KIND is Kind.A else x - 1


def shape(x):
    return x * SHAPE[0] + SHAPE[1][1]


def names(x):
    return x + 1 if "a" in NAMES else x - 1


def sign(x):
    return x * math.copysign(1.0, SIGN)


def depth(x):
    return x + sub.DEPTH


def dtype(x):
    return x.to(DTYPE) * 2


def logged(x):
    if LOG.isEnabledFor(logging.DEBUG):
        LOG.debug("logged")
    return x + 1


def outer(x):
    return flag(x) * 2
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("site"), NAME,
                           {"__init__": _LIB, "sub": _SUB}) as module:
        yield module


# function of the library -> (the global it reads, its value after the first calls); the
# global's owner is the package unless named ("sub": its submodule, a module attribute chain)
CHANGES = {
    "flag": ("FLAG", True),
    "count": ("COUNT", 3),
    "gain": ("GAIN", 2.5),
    "mode": ("MODE", "mul"),
    "raw": ("RAW", b"abc"),
    "nothing": ("NOTHING", 2.0),
    "kind": ("KIND", "B"),  # (Kind.B)
    "shape": ("SHAPE", (2, ("x", 4.0))),
    "names": ("NAMES", frozenset({"b"})),
    "sign": ("SIGN", -0.0),  # a float by its bit pattern: -0.0 == 0.0
    "depth": ("sub.DEPTH", 7),
    "dtype": ("DTYPE", torch.float64),
    "outer": ("FLAG", True),  # read by library code that library code called
}


def _owner_and_name(lib, target: str):
    if target.startswith("sub."):
        return lib.sub, target[4:]
    return lib, target


def _user(lib, fn_name: str):
    fn = getattr(lib, fn_name)

    def f(x):
        return fn(x) + 0.5
    return f


@pytest.mark.parametrize("fn_name", sorted(CHANGES))
def test_a_library_value_rebound_after_the_first_call_is_seen(lib, fn_name):
    target, new = CHANGES[fn_name]
    owner, name = _owner_and_name(lib, target)
    if new == "B":
        new = lib.Kind.B
    old = getattr(owner, name)
    f = _user(lib, fn_name)
    jf = trident.jit(f)
    x = torch.tensor([1.0, -2.0, 3.5])
    before = f(x)
    try:
        for _ in range(2):
            assert torch.equal(jf(x), before)
        assert counts(jf) == (1, 1, 0)
        setattr(owner, name, new)
        eager = f(x)
        assert eager.dtype != before.dtype or not torch.equal(eager, before)
        got = jf(x)
        assert torch.equal(got, eager) and got.dtype == eager.dtype
        assert counts(jf) == (2, 1, 0), jf.stats  # a recompile, not the old result
        assert name in jf.stats.miss_reasons[-1], jf.stats.miss_reasons
        assert torch.equal(jf(x), eager)
        assert counts(jf) == (2, 2, 0)
    finally:
        setattr(owner, name, old)
    assert torch.equal(jf(x), before)  # set back: the first specialization again
    assert torch.equal(jf(x), before)
    assert counts(jf) == (2, 4, 0)


# global -> a value equal to its own, another object (a guard compares values, not objects)
EQUAL = {
    "MODE": lambda: "".join(["a", "dd"]),
    "GAIN": lambda: float("1.5"),
    "SHAPE": lambda: (2, ("x", float("1.0"))),
    "NAMES": lambda: frozenset(["a"]),
    "RAW": lambda: bytes([97, 98]),
}


def test_a_library_value_rebound_to_an_equal_value_keeps_the_hits(lib):
    def f(x):
        return lib.mode(x) + lib.gain(x) + lib.shape(x) + lib.names(x) + lib.raw(x)

    jf = trident.jit(f)
    x = torch.tensor([1.0, -2.0])
    want = f(x)
    assert torch.equal(jf(x), want)
    saved = {k: getattr(lib, k) for k in EQUAL}
    try:
        for k, make in EQUAL.items():
            value = make()
            assert value == saved[k] and (value is not saved[k] or k == "NAMES")
            setattr(lib, k, value)
            assert torch.equal(jf(x), want)
    finally:
        for k, v in saved.items():
            setattr(lib, k, v)
    assert torch.equal(jf(x), want)
    assert counts(jf) == (1, len(EQUAL) + 1, 0), jf.stats


def test_a_nan_keeps_its_bit_pattern_and_its_hits(lib):
    """A float by its bit pattern: a NaN rebound to another NaN object of the same bits hits
    (NaN != NaN), and 0.0 after -0.0 recompiles (-0.0 == 0.0)."""
    f = _user(lib, "gain")
    jf = trident.jit(f)
    x = torch.tensor([1.0, -2.0])
    old = lib.GAIN
    try:
        lib.GAIN = float("nan")
        assert torch.equal(jf(x).isnan(), f(x).isnan())
        lib.GAIN = float("nan")  # another object, the same bits
        assert torch.equal(jf(x).isnan(), f(x).isnan())
        assert counts(jf) == (1, 1, 0)
        lib.GAIN = -0.0
        assert torch.equal(jf(x), f(x)) and torch.equal(jf(x).signbit(), f(x).signbit())
        lib.GAIN = 0.0
        assert torch.equal(jf(x).signbit(), f(x).signbit())
        assert counts(jf) == (3, 2, 0), jf.stats
    finally:
        lib.GAIN = old


def test_unchanged_library_values_hit_with_exact_counts(lib):
    """Every kind read at once, nothing rebound; another global of the package changing
    (its dict's version tag moves) keeps the hits."""
    fns = [getattr(lib, name) for name in sorted(CHANGES)]

    def f(x):
        out = x
        for fn in fns:
            out = out + fn(x).float()
        return out

    jf = trident.jit(f)
    x = torch.tensor([1.0, -2.0, 3.5])
    want = f(x)
    for _ in range(4):
        assert torch.equal(jf(x), want)
    lib.UNREAD = 1
    lib.sub.UNREAD = 2
    try:
        for _ in range(2):
            assert torch.equal(jf(x), want)
    finally:
        del lib.UNREAD, lib.sub.UNREAD
    assert counts(jf) == (1, 5, 0), jf.stats


def test_a_library_logger_and_its_level_are_not_guarded(lib):
    """A logger is mutable state that changes outside any model (Note [Library values]): its
    level changed keeps the hits; what the function logs is decided by the write analysis
    (``LOG.debug`` is a logging call, eager when it runs)."""
    import logging

    f = _user(lib, "logged")
    jf = trident.jit(f)
    x = torch.tensor([1.0, 2.0])
    assert torch.equal(jf(x), f(x))
    level = lib.LOG.level
    try:
        lib.LOG.setLevel(logging.WARNING)
        assert torch.equal(jf(x), f(x))
        lib.LOG.setLevel(logging.ERROR)
        assert torch.equal(jf(x), f(x))
    finally:
        lib.LOG.setLevel(level)
    assert counts(jf) == (1, 2, 0), jf.stats


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="no dict version tags: every node")
def test_library_values_cost_a_hit_no_check_of_their_own(lib):
    """The values are lookups in the library modules' dicts by constant names, proven by their
    version tags (Python 3.11) or their watchers (3.12: Note [Watched state]): reading them
    adds state tree nodes, and no node that a hit checks."""
    def checked(f):
        jf = trident.jit(f)
        x = torch.tensor([1.0, 2.0])
        for _ in range(3):
            assert torch.equal(jf(x), f(x))
        made, proofs, again, _, _ = jf._quiet_state()
        assert made == 1 and proofs > 0 and counts(jf) == (1, 2, 0), jf._quiet_state()
        return again, {n.path for n in jf._state.nodes}

    global LIB  # (a global: a closure's cell is read at every call, and what is read through it)
    LIB = lib
    few = checked(lambda x: LIB.flag(x))
    more = checked(lambda x: LIB.depth(LIB.sign(LIB.names(LIB.shape(LIB.kind(LIB.mode(
        LIB.gain(LIB.count(LIB.flag(x))))))))))
    values = {f"{NAME}.{k}" for k in ("FLAG", "COUNT", "GAIN", "MODE", "KIND", "SHAPE",
                                      "NAMES", "SIGN")} | {f"{NAME}.sub.DEPTH"}
    assert f"{NAME}.FLAG" in few[1] and values <= more[1], (few, more)
    assert more[0] == few[0], (few, more)


def test_a_library_value_that_changes_at_every_call_recompiles_at_every_new_value(lib):
    """A counter that code outside the trace bumps between calls, read by library code in the
    trace: each new value a recompile, equal to eager, up to the specialization limit, which
    counts per code object whatever the state (Note [Specialization limit]); past it, a new
    value runs eagerly with one warning. A value seen before is served by its specialization
    again, with no compile (the state tree names it by the same words)."""
    f = _user(lib, "count")
    jf = trident.jit(f, max_specializations=2)
    x = torch.tensor([1.0, 2.0])
    old = lib.COUNT
    try:
        with pytest.warns(UserWarning, match="limit of 2 compiled specializations"):
            for n in (2, 3, 4):
                lib.COUNT = n
                assert torch.equal(jf(x), f(x))
        assert counts(jf) == (2, 0, 1), jf.stats
        for n in (3, 2, 2):
            lib.COUNT = n
            assert torch.equal(jf(x), f(x))
        assert counts(jf) == (2, 3, 1), jf.stats
    finally:
        lib.COUNT = old



def test_a_gc_callback_that_runs_during_the_trace_is_not_the_functions_library_code():
    """A gc callback runs from whatever frame allocates, the trace's too; what it reads is not
    what the function read. hypothesis registers one for the rest of a process
    (``gc_cumulative_time``: it rewrites its module's ``_gc_start`` at every collection), and
    in CI it made HF models' calls recompile or run eagerly after a property test."""
    junkdrawer = pytest.importorskip("hypothesis.internal.conjecture.junkdrawer")
    junkdrawer.gc_cumulative_time()  # registers its callback (once per process)

    def f(m, x):
        x = m(x)
        junk = [[i] for i in range(5000)]  # gen-0 collections, run by the allocations
        return m(x) + len(junk) * 0

    m = torch.nn.Linear(4, 4)
    jf = trident.jit(f)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(jf(m, x), f(m, x))
    assert counts(jf) == (1, 2, 0), jf.stats
