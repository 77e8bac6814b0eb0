"""Note [Specialization limit] (frontend/policy.py): a module global the function reads, rebound
to a new value at every call (a step counter, a float, a string, a new tensor), is a new cache
folder at every call (Note [Function key]); the limit counts per code object and owner across
those folders, so after ``max_specializations`` compiles a new value runs eagerly, with one
warning naming the function and the limit, equal to eager; a value seen before hits its
specialization again. Two models of one class, each jitted as ``trident.jit(m.forward)``, do not
share the count. Every call is compared with eager (``torch.equal``), with exact counts."""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import installed_package

STEP = 0
GAIN = 0.5
MODE = "a"
TABLE = torch.ones(3)


def by_step(x):
    return x * STEP


def by_gain(x):
    return x * GAIN


def by_mode(x):
    return x * len(MODE)


def by_table(x):
    return x + TABLE


def counts(jf) -> dict:
    s = jf.stats
    return dict(hits=s.hits, misses=s.misses, compiles=s.compiles, fallbacks=s.fallbacks,
                traces=s.traces)


def _values(name):
    return {"STEP": [2, 3, 4, 5, 6, 7], "GAIN": [1.5, 2.5, 3.5, 4.5, 5.5, 6.5],
            "MODE": ["ab", "abc", "abcd", "abcde", "abcdef", "abcdefg"]}[name]


@pytest.mark.parametrize("name, fn", [("STEP", by_step), ("GAIN", by_gain), ("MODE", by_mode)])
def test_a_global_rebound_at_every_call_stays_within_the_limit(name, fn):
    """Six new values, a limit of 2: two compiles, then four eager calls with one warning that
    names the function and the limit; every value equal to eager. The first value again: its
    specialization, from its folder, hits (no compile, no warning)."""
    values = _values(name)
    old = globals()[name]
    jf = trident.jit(fn, max_specializations=2)
    x = torch.arange(3.0)
    try:
        with pytest.warns(UserWarning) as record:
            for value in values:
                globals()[name] = value
                assert torch.equal(jf(x), fn(x)), value
        limit = [str(w.message) for w in record if "limit" in str(w.message)]
        assert len(limit) == 1, limit
        assert limit[0].startswith(f"trident: {fn.__qualname__} runs eagerly: reached its limit "
                                   "of 2 compiled specializations in this process (2 by this "
                                   "trident.jit object, 0 by others"), limit
        assert counts(jf) == dict(hits=0, misses=6, compiles=2, fallbacks=4, traces=2)
        globals()[name] = values[0]  # the first value's specialization, from its folder
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(jf(x), fn(x))
            assert torch.equal(jf(x), fn(x))
        assert counts(jf) == dict(hits=2, misses=6, compiles=2, fallbacks=4, traces=2)
        globals()[name] = values[-1]  # past the limit still: eager, no second warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(jf(x), fn(x))
        assert counts(jf) == dict(hits=2, misses=7, compiles=2, fallbacks=5, traces=2)
    finally:
        globals()[name] = old


def test_a_global_tensor_rebound_at_every_call_traces_once():
    """A global tensor (not an argument) makes the function eager at its first trace, with one
    warning: a new tensor at every call neither traces nor compiles again."""
    global TABLE
    jf = trident.jit(by_table, max_specializations=2)
    x = torch.arange(3.0)
    try:
        with pytest.warns(UserWarning) as record:
            for n in range(2, 8):
                TABLE = torch.full((3,), float(n))
                assert torch.equal(jf(x), by_table(x)), n
        eager = [str(w.message) for w in record if "by_table runs eagerly" in str(w.message)]
        assert len(eager) == 1 and "reads a tensor that is not an argument" in eager[0], eager
        assert counts(jf) == dict(hits=0, misses=6, compiles=0, fallbacks=6, traces=1)
    finally:
        TABLE = torch.ones(3)


def test_a_counter_rebound_at_every_call_stops_at_the_default_limit():
    """The default limit (16, config.max_specializations): a counter bumped between the calls
    compiles 16 times, then every call runs eagerly, equal to eager."""
    global STEP
    jf = trident.jit(by_step)
    x = torch.arange(3.0)
    try:
        assert trident.config.max_specializations() == 16
        with pytest.warns(UserWarning, match="limit of 16 compiled specializations") as record:
            for step in range(1, 21):
                STEP = step
                assert torch.equal(jf(x), by_step(x)), step
        assert len([w for w in record if "limit" in str(w.message)]) == 1
        assert counts(jf) == dict(hits=0, misses=20, compiles=16, fallbacks=4, traces=16)
    finally:
        STEP = 0


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, x):
        return x * self.weight * STEP


def test_two_models_of_one_class_do_not_share_the_limit():
    """Each model's ``forward`` jitted on its own instance counts its own compiles: the second
    model compiles as many as the first did (its own values of the global), where a count per
    code object would have run it eagerly. A second trident.jit over the first model's
    forward shares the first's count."""
    global STEP
    first, second = Scaled(), Scaled()
    j1 = trident.jit(first.forward, max_specializations=2)
    j2 = trident.jit(second.forward, max_specializations=2)
    x = torch.arange(3.0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for jf, model, steps in ((j1, first, (2, 3)), (j2, second, (5, 6))):
                for step in steps:
                    STEP = step
                    assert torch.equal(jf(x), model(x)), step
        assert counts(j1) == counts(j2) == dict(hits=0, misses=2, compiles=2, fallbacks=0,
                                                traces=2)
        STEP = 4
        for jf, model in ((j1, first), (j2, second)):
            with pytest.warns(UserWarning, match="limit of 2 compiled specializations"):
                assert torch.equal(jf(x), model(x))
            assert counts(jf) == dict(hits=0, misses=3, compiles=2, fallbacks=1, traces=2)
        again = trident.jit(first.forward, max_specializations=2)
        with pytest.warns(UserWarning, match=r"\(0 by this trident.jit object, 2 by others"):
            assert torch.equal(again(x), first(x))
        assert counts(again) == dict(hits=0, misses=1, compiles=0, fallbacks=1, traces=0)
    finally:
        STEP = 0


# ---- Note [Interrupts] (lower/state/recording.py) -------------------------------------------
# Code the interpreter runs between the function's instructions, that the function did not call:
# the finalizers of garbage the collector frees (``__del__``, ``weakref.finalize``), run here by
# a library's ``gc.collect()`` inside the function (the caller's instruction is a CALL). Each
# rewrites a module global at every run; its reads are not the function's (guarded, they made
# every call recompile) and its writes are not the function's (recorded as user code, they made
# every call eager). The garbage is made before each call with the collector off (as garbage
# made during the compile is: the heap made before it is frozen, config.frozen_heap).

LIBNAME = "trident_fakelib42"
_LIB42 = '''
import gc

DELS = 0


class Noisy:
    def __del__(self):
        global DELS
        DELS = DELS + 1


def bump():
    global DELS
    DELS = DELS + 1


def collect():
    gc.collect()
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("site"), LIBNAME,
                           {"__init__": _LIB42}) as module:
        yield module


USER_DELS = 0


class UserNoisy:
    def __del__(self):
        global USER_DELS
        USER_DELS = USER_DELS + 1


class Box:
    pass


def _garbage(lib, kind: str) -> None:
    """One unreachable cycle whose finalizer bumps a counter when the collector frees it."""
    if kind == "library __del__":
        n = lib.Noisy()
    elif kind == "user __del__":
        n = UserNoisy()
    else:  # a weakref.finalize callback of the library's
        n = Box()
        import weakref
        weakref.finalize(n, lib.bump)
    n.me = n


@pytest.mark.parametrize("kind", ["library __del__", "user __del__", "weakref.finalize"])
def test_a_finalizer_the_collector_runs_during_the_trace_is_not_the_functions_code(lib, kind):
    """One compile, then hits while the finalizer's counter changes between the calls; every
    value equal to eager. The garbage is freed by the trace's ``gc.collect()`` (the counters
    say the finalizers ran: once per garbage made)."""
    import gc

    def f(x):
        lib.collect()
        return x + 1

    jf = trident.jit(f)
    x = torch.arange(3.0)
    before = lib.DELS + USER_DELS
    enabled = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for n in range(4):
                _garbage(lib, kind)
                out = jf(x)
                if n == 0:  # the trace's collection ran the finalizer
                    assert lib.DELS + USER_DELS == before + 1
                _garbage(lib, kind)
                assert torch.equal(out, f(x))
    finally:
        if enabled:
            gc.enable()
    assert counts(jf) == dict(hits=3, misses=1, compiles=1, fallbacks=0, traces=1), jf.stats
    assert lib.DELS + USER_DELS == before + 8  # each garbage freed once, by a collection


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (its refusal
def test_a_finalizer_the_function_starts_is_its_code(lib):  # raised inside __del__)
    """A finalizer that the function's own code runs, by dropping the last reference to an
    object it made (refcounting, not the collector), is the function's code, as eager runs it
    at every call: its write to a global of the user's makes the call eager, as a write in the
    function's body does."""
    def f(x):
        n = UserNoisy()
        del n
        return x + 1

    jf = trident.jit(f)
    x = torch.arange(3.0)
    with pytest.warns(UserWarning, match="writes to global USER_DELS"):
        for _ in range(3):
            before = USER_DELS
            assert torch.equal(jf(x), x + 1) and USER_DELS == before + 1
    assert counts(jf) == dict(hits=0, misses=3, compiles=0, fallbacks=3, traces=1), jf.stats
