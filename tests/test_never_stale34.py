"""Never stale, by construction (issue 28): each kind of read that a specialization depends on
is guarded or makes the call eager. Each case jits a function, calls it, changes what it reads,
and compares the next calls with eager (``torch.equal``), with exact counts."""

from __future__ import annotations

import abc
import itertools
import logging
import warnings

import pytest
import torch

import trident
from _trident_helpers import counting


def _classes():
    """Classes with no importable name (``<locals>``), and an ``abc.ABC``."""
    class Base:
        K = 2.0

        def __init__(self):
            self.a = 3.0

    class Sub(Base):
        pass

    class Abstract(abc.ABC):
        K = 2.0

        def __init__(self):
            self.a = 3.0

    return Base, Sub, Abstract


def reads_k(x, cfg):
    return x * cfg.K


def reads_a(x, cfg):
    return x * cfg.a


def reads_maybe_b(x, cfg):
    return x * (cfg.b if hasattr(cfg, "b") else 1.0)


def reads_type_k(x, cfg):
    return x * type(cfg).K


# case -> (function, the class instantiated, the change: (classes) -> None)
CLASS_CASES = {
    "a <locals> class attribute": (reads_k, 0, lambda b, s, a: setattr(b, "K", 5.0)),
    "a <locals> class attribute through type()": (reads_type_k, 0,
                                                  lambda b, s, a: setattr(b, "K", 5.0)),
    "a <locals> subclass shadowing its base": (reads_k, 1, lambda b, s, a: setattr(s, "K", 7.0)),
    "an ABC class attribute": (reads_k, 2, lambda b, s, a: setattr(a, "K", 5.0)),
    "a property on a <locals> class shadowing the instance": (
        reads_a, 0, lambda b, s, a: setattr(b, "a", property(lambda self: 11.0))),
    "a property on a <locals> base shadowing the instance": (
        reads_a, 1, lambda b, s, a: setattr(b, "a", property(lambda self: 11.0))),
    "a property on an ABC shadowing the instance": (
        reads_a, 2, lambda b, s, a: setattr(a, "a", property(lambda self: 11.0))),
    "an ABC class attribute for a name the instance lacks": (
        reads_maybe_b, 2, lambda b, s, a: setattr(a, "b", 13.0)),
    "a __getattr__ added to a <locals> class": (
        reads_maybe_b, 0, lambda b, s, a: setattr(b, "__getattr__", lambda self, n: 9.0)),
}


@pytest.mark.parametrize("case", sorted(CLASS_CASES))
def test_a_class_without_an_importable_name_is_guarded(case):
    # Note [Instance lookups] in lower/state/instances.py: a <locals> class and an ABC were
    # skipped, so a class change that changes the lookup was not seen (a stale hit)
    fn, which, change = CLASS_CASES[case]
    classes = _classes()
    cfg, x = classes[which](), torch.ones(2)
    jf = trident.jit(fn)
    before = fn(x, cfg)
    assert torch.equal(jf(x, cfg), before) and torch.equal(jf(x, cfg), before)
    change(*classes)
    after = fn(x, cfg)
    assert not torch.equal(after, before), "the change must change eager's result"
    assert torch.equal(jf(x, cfg), after) and torch.equal(jf(x, cfg), after)
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (0, 2, 2), s


class BigHolder:
    items = [float(i) for i in range(100)]  # more than a guard checks of a class used whole
    table = {i: float(i) for i in range(65)}


def _pick_big():
    return BigHolder


def _reads_big(x):
    c = _pick_big()  # a class returned by a call: used whole (Note [State guards])
    return x * c.items[7] + c.table[3]


def test_a_class_used_whole_with_a_container_too_big_to_guard_runs_eagerly():
    # its containers of more than 64 items were skipped: a constant of the trace, stale once
    # an item changed
    jf = trident.jit(_reads_big)
    x = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            assert torch.equal(jf(x), _reads_big(x))
            BigHolder.items[7] = -1.0
            BigHolder.table[3] = 30.0
            assert torch.equal(jf(x), _reads_big(x)) and torch.equal(jf(x), _reads_big(x))
        finally:
            BigHolder.items[7], BigHolder.table[3] = 7.0, 3.0
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits, s.traces) == (3, 0, 0, 1), s  # decided once
    said = [str(w.message) for w in caught if "more than the 64 a guard checks" in str(w.message)]
    assert len(said) == 1, said


class _Box:
    def __init__(self):
        self.it = counting()


ITERATORS = {"GEN": counting(), "COUNT": itertools.count(1), "BOX": _Box()}


def _get_gen():
    return ITERATORS["GEN"]


def _get_count():
    return ITERATORS["COUNT"]


def _get_box():
    return ITERATORS["BOX"]


def _next_of_a_call(x):
    return x * next(_get_gen())


def _next_of_a_c_iterator(x):
    return x * next(_get_count())


def _next_of_an_attribute_of_a_call(x):
    return x * next(_get_box().it)


def _loop_over_a_call(x):
    for v in _get_gen():
        return x * v


@pytest.mark.parametrize("fn", [_next_of_a_call, _next_of_a_c_iterator,
                                _next_of_an_attribute_of_a_call, _loop_over_a_call])
def test_a_global_iterator_returned_by_a_call_runs_eagerly_and_is_not_advanced_by_a_trace(fn):
    # the write walk did not name the iterator: the trace advanced it once (the first call
    # returned x * 2), then the state tree refused it; now the write walk follows what the
    # called function returns, and the call runs eagerly before any trace
    ITERATORS.update(GEN=counting(), COUNT=itertools.count(1), BOX=_Box())
    jf = trident.jit(fn)
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for want in (1.0, 2.0, 3.0):
            assert torch.equal(jf(x), x * want), want
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s


LOG = logging.getLogger("test_never_stale34")


def _logs_through_a_global(x):
    LOG.info("step of %d", x.shape[0])
    return x + 1


def _logs_through_get_logger(x):
    logging.getLogger("test_never_stale34").warning("step")
    return x + 2


@pytest.mark.parametrize("fn", [_logs_through_a_global, _logs_through_get_logger])
def test_a_logging_call_runs_eagerly_and_logs_at_every_call(fn):
    # Note [Logging calls] in lower/state/writes.py: the trace logged once and hits never
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep()
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    try:
        jf = trident.jit(fn)
        x = torch.ones(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(3):
                assert torch.equal(jf(x), fn(x))
    finally:
        LOG.removeHandler(handler)
    assert len(records) == 6, records  # three calls each, jitted and eager
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s


def _asks_function_mode(x):
    return x * 2 if torch._C._is_torch_function_mode_enabled() else x * 3


def _asks_function_stack(x):
    return x * 2 if torch._C._len_torch_function_stack() > 0 else x * 3


def _asks_fx_tracing(x):
    return x * 2 if torch.fx._symbolic_trace.is_fx_tracing() else x * 3


def _asks_compiling(x):
    return x * 2 if torch.compiler.is_compiling() or torch.jit.is_scripting() or \
        torch.jit.is_tracing() or torch._C._get_tracing_state() is not None else x * 3


@pytest.mark.parametrize("fn, eager", [(_asks_function_mode, True), (_asks_function_stack, True),
                                       (_asks_fx_tracing, True), (_asks_compiling, False)])
def test_reads_of_the_traces_own_state_answer_as_in_eager(fn, eager):
    # Note [Trace state] in lower/state/recording.py: the trace's answer (a TorchFunctionMode
    # and FX's tracer are active) was baked: x * 2 where eager gives x * 3. Those calls run
    # eagerly; is_compiling() and the others answer in the trace as in eager and compile
    jf = trident.jit(fn)
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            assert torch.equal(jf(x), fn(x)) and torch.equal(fn(x), x * 3)
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == ((3, 0, 0) if eager else (0, 1, 2)), s
