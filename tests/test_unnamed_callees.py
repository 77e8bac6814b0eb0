"""Never stale (issue 28): a user function that the trace reaches through a callee the bytecode
does not name (an item of a list or dict, ``getattr`` with a computed name, a returned
function, a ``functools.partial``, ``map``, a module in a list, a bound method in a list) and
that writes Python state outside the call's arguments, prints or warns, is refused when its
frame starts, before its body runs (Note [Writes at entry] in trident/lower/state/writes.py):
the trace writes nothing, the call runs eagerly and writes once, as eager does."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

import trident

LOG: list = []


class Cfg:
    items: list = []


def push(lst, v=1.0):
    lst.append(v)
    return 2.0


def log_global():
    LOG.append(1.0)
    return 2.0


def remember(x, seen=[]):  # noqa: B006 (the default is the state)
    seen.append(1.0)
    return x * len(seen)


def _counter():
    n = 0

    def inc():
        nonlocal n
        n += 1
        return float(n)
    return inc


class Box:
    def __init__(self):
        self.items = []

    def add(self, v):
        self.items.append(v)
        return 2.0


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


def shout():
    print("called")  # noqa: T201 (the output is what is compared)
    return 2.0


BOX = Box()
INC = [_counter()]
FNS = [push, log_global, remember, shout, lambda v: LOG.append(v) or 2.0]
TABLE = {"p": push}
METHODS = [BOX.add]
MODELS = [Counter()]
NAME = "push"
P = functools.partial(push, LOG)


def make():
    return push


def through_a_list(x):
    return x * FNS[0](LOG) * len(LOG)


def through_a_dict(x):
    return x * TABLE["p"](LOG) * len(LOG)


def through_getattr(x):
    return x * getattr(sys.modules[__name__], NAME)(LOG) * len(LOG)


def returned(x):
    return x * make()(LOG) * len(LOG)


def a_partial(x):
    return x * P() * len(LOG)


def through_map(x):
    return x * sum(map(push, [LOG])) * len(LOG)


def a_class_attribute(x):
    return x * FNS[0](Cfg.items) * len(Cfg.items)


def writes_a_global(x):
    return x * FNS[1]() * len(LOG)


def a_default(x):
    return FNS[2](x) + 1


def a_closure_cell(x):
    return x * INC[0]()


def prints(x):
    return x * FNS[3]()


def a_lambda(x):
    return x * FNS[4](1.0) * len(LOG)


def a_bound_method(x):
    return x * METHODS[0](1.0) * len(BOX.items)


def a_module(x):
    return MODELS[0](x) + 1


def caught(x):
    try:
        k = FNS[0](LOG)
    except BaseException:  # noqa: B036 (a refusal the user's code catches)
        k = 0.0
    return x * k * len(LOG)


CASES = [through_a_list, through_a_dict, through_getattr, returned, a_partial, through_map,
         a_class_attribute, writes_a_global, a_default, a_closure_cell, prints, a_lambda,
         a_bound_method, a_module, caught]


def _reset():
    LOG.clear()
    Cfg.items.clear()
    remember.__defaults__[0].clear()
    INC[0] = _counter()
    BOX.items.clear()
    MODELS[0].calls = 0


def _state():
    return (list(LOG), list(Cfg.items), list(remember.__defaults__[0]), INC[0](),
            list(BOX.items), MODELS[0].calls)


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_unnamed_callees_that_write_outside_run_eagerly_before_they_run(fn, capsys):
    """Each call's result, the state written (a global list, a class attribute, a default, a
    closure cell, a bound method's ``self``, a module's attribute) and what was printed equal
    eager's, call by call: the trace stopped the callee before its body ran (a write the trace
    had made would show twice). Every call runs eagerly, with one warning; nothing compiles."""
    _reset()
    want = [fn(torch.ones(2)) for _ in range(3)]
    want_state, want_out = _state(), capsys.readouterr().out
    _reset()
    jf = trident.jit(fn)
    try:
        with pytest.warns(UserWarning) as caught_warnings:
            got = [jf(torch.ones(2)) for _ in range(3)]
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
        assert _state() == want_state
        assert capsys.readouterr().out == want_out
        assert (jf.stats.fallbacks, jf.stats.compiles) == (3, 0), jf.stats
        messages = [str(w.message) for w in caught_warnings]
        assert sum("runs eagerly" in m for m in messages) == 1, messages
        assert any("writes to" in m or "prints or warns" in m for m in messages), messages
    finally:
        _reset()


def into_a_fresh_list(x):
    acc = []
    FNS[0](acc)
    return x * len(acc)


def test_an_unnamed_callee_that_writes_what_the_call_made_compiles():
    """A list the function made itself, written by a callee it reaches through a list, is
    not outside: the function compiles once and then hits."""
    jf = trident.jit(into_a_fresh_list)
    for _ in range(3):
        assert torch.equal(jf(torch.ones(2)), into_a_fresh_list(torch.ones(2)))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 2, 0), jf.stats
