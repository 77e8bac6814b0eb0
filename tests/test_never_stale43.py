"""Faults of issue 28 found by session 43, each with a test of its whole kind: every call is
compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import functools
import operator
import sys
import types
import warnings

import pytest
import torch

import trident
from _trident_helpers import WRITING_LIBRARY, counts, installed_package


# ---- Note [Library code that writes its state] (lower/state/library_writes.py) -----------------
# An installed package's code that the function runs and that writes state of its own (a module
# global, an item or attribute of an object a global holds, another module's attribute through
# sys.modules, globals(), a closure cell, an object passed on to a helper that writes it): the
# write ran once, in the trace, and each hit returned the trace's value and left the state as
# it was. Each call now runs eagerly, with a warning, and writes once.

NAME = "trident_fakelib43"
_LIB = WRITING_LIBRARY

STATE_WRITES = ["count", "memo", "attribute", "append", "through_sys_modules",
                "through_globals", "through_an_alias", "through_a_helper", "closure"]


@pytest.fixture
def lib(tmp_path):
    with installed_package(tmp_path, NAME, {"__init__": _LIB}) as module:
        yield module


@pytest.mark.parametrize("use", STATE_WRITES)
def test_library_code_that_writes_its_own_state_runs_eagerly(lib, use):
    fn = getattr(lib, use)

    def f(x):
        return fn(x)

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [jf(x) for _ in range(4)]
    assert [g.tolist() for g in got] == [[float(n)] * 2 for n in (1, 2, 3, 4)]  # eager's
    assert counts(jf) == (0, 0, 4)
    assert sum("writes its own state" in str(w.message) for w in caught) == 1, \
        [str(w.message) for w in caught]


def test_a_library_write_that_runs_once_is_refused_once(lib):
    """A write in a branch that only the first call takes (a registration done once): the
    first call runs eagerly and writes, once; the argument structure stays eager (the trace
    refused is not repeated, as for a user function's write), each call equal to eager's."""
    def f(x):
        return lib.once(x)

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            assert torch.equal(jf(x), f(x))
    assert lib.SEEN == {"x"}
    assert counts(jf) == (0, 0, 4)
    assert jf.stats.traces == 1
    assert any("SEEN" in str(w.message) for w in caught)


def test_library_code_whose_write_does_not_run_is_served_natively(lib):
    """The write's branch not taken in the trace (already registered): no refusal."""
    lib.SEEN.add("x")

    def f(x):
        return lib.once(x)

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert torch.equal(jf(x), f(x))
    assert counts(jf) == (1, 2, 0)


# ---- Note [Modules used whole] (lower/state/wholes.py) ------------------------------------------
# A user module handed on as a value (to a C function, into a list, through a helper) was checked
# by identity alone: a rebound attribute that the code read through it was stale.

@pytest.fixture
def mod():
    m = types.ModuleType("trident_user43")
    m.K = 2.0

    class Cfg:
        K = 2.0
    Cfg.__module__ = "trident_user43"
    m.Cfg = Cfg
    sys.modules["trident_user43"] = m
    yield m
    del sys.modules["trident_user43"]


def _first(t):
    return t[0]


MODULE_SPELLINGS = {  # name: (read, what changes)
    "attrgetter": (lambda x, m: x * operator.attrgetter("K")(m), "K"),
    "attrgetter dotted": (lambda x, m: x * operator.attrgetter("Cfg.K")(m), "Cfg.K"),
    "functools.reduce(getattr)": (lambda x, m: x * functools.reduce(getattr, ["Cfg", "K"], m),
                                  "Cfg.K"),
    "mod.__getattribute__": (lambda x, m: x * m.__getattribute__("K"), "K"),
    "[mod][0].K": (lambda x, m: x * [m][0].K, "K"),
    "a helper's result": (lambda x, m: x * _first((m,)).K, "K"),
    "sys.modules[name].K": (lambda x, m: x * sys.modules["trident_user43"].K, "K"),
    "vars(mod)[K]": (lambda x, m: x * vars(m)["K"], "K"),
}


@pytest.mark.parametrize("use", list(MODULE_SPELLINGS), ids=list(MODULE_SPELLINGS))
def test_a_user_module_read_through_other_spellings(mod, use):
    read, name = MODULE_SPELLINGS[use]
    owner = mod.Cfg if name == "Cfg.K" else mod
    M = mod  # (a global of the closure: the module itself is read by the chain of M)

    def f(x):
        return read(x, M)

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no call runs eagerly)
        for k, value in enumerate((2.0, 5.0, 5.0, 2.0)):
            setattr(owner, "K", value)
            assert torch.equal(jf(x), f(x)), (k, value)
    assert counts(jf) == (2, 2, 0)


class _Obj:
    pass


_CFG = _Obj()


def test_a_c_method_of_an_object_reads_it_whole():
    """``cfg.__getattribute__("K")``: the method-wrapper is made anew at each access; its
    object is guarded whole (it compiled again at every call)."""
    def f(x):
        return x * _CFG.__getattribute__("K")

    jf = trident.jit(f)
    x = torch.ones(2)
    for value in (2.0, 2.0, 5.0, 5.0):
        _CFG.K = value
        assert torch.equal(jf(x), f(x))
    assert counts(jf) == (2, 2, 0)


# A module or class parameter read through getattr with a computed name raised TypeError
# (``_resolve_calls`` given four arguments) where it must run eagerly with a warning.
COMPUTED = {
    "reduce(lambda)": lambda x, m: x * functools.reduce(lambda o, n: getattr(o, n), ["K"], m),
    "helper": lambda x, m: x * _named(m, "".join(["K"])),
}


def _named(o, n):
    return getattr(o, n)


@pytest.mark.parametrize("use", list(COMPUTED), ids=list(COMPUTED))
@pytest.mark.parametrize("owner", ["module", "class"])
def test_a_computed_name_on_a_module_or_class_parameter_runs_eagerly(mod, use, owner):
    read = COMPUTED[use]
    target = mod if owner == "module" else mod.Cfg

    def f(x):
        return read(x, target)

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for value in (2.0, 5.0, 3.0):
            target.K = value
            assert torch.equal(jf(x), f(x))
    assert counts(jf) == (0, 0, 3)
    assert any("computed at run time" in str(w.message) for w in caught), caught


# ---- A tensor's gradient (Note [Python attributes of tensors]'s neighbour, source_lines.py) ---
# ``x.grad`` of an argument read in the function or in library code it runs: the trace's fake
# tensor has none, no guard checks it, and a gradient set between calls was stale.

GRAD_READS = {
    "x.grad is None": lambda x: x * (1.0 if x.grad is None else 2.0),
    "getattr(x, 'grad')": lambda x: x * (1.0 if getattr(x, "grad") is None else 2.0),
    "x._grad": lambda x: x * (1.0 if x._grad is None else 2.0),
    "library code": "grad",
}

_GRADLIB = '''
def grad(t):
    return t * (1.0 if t.grad is None else 2.0)
'''


@pytest.mark.parametrize("use", list(GRAD_READS), ids=list(GRAD_READS))
def test_a_tensor_arguments_gradient_read_runs_eagerly(tmp_path, use):
    with installed_package(tmp_path, "trident_gradlib43", {"__init__": _GRADLIB}) as gradlib:
        fn = GRAD_READS[use] if use != "library code" else gradlib.grad

        def f(x):
            return fn(x)

        jf = trident.jit(f)
        x = torch.ones(2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k in range(4):
                if k == 2:
                    x.grad = torch.ones(2)
                assert torch.equal(jf(x), f(x)), k
        assert counts(jf) == (0, 0, 4)
        assert any("grad" in str(w.message) for w in caught), caught
