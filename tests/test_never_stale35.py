"""Never stale, by construction (issue 28): each kind of read that a specialization depends on
is guarded or makes the call eager. Each case jits a function, calls it, changes what it reads,
and compares the next calls with eager (``torch.equal``), with exact counts."""

from __future__ import annotations

import builtins
import functools
import sys
import types
import warnings

import pytest
import torch

import trident


class _Base:
    k = 2.0


class _Obj(_Base):
    pass


class _Cfg:
    k = 2.0


def _kwargs_item(x, **kw):
    return x * kw["o"].k


def _args_item(x, *args):
    return x * args[0].k


def _list_item(x, lst):
    return x * lst[0].k


def _dict_item(x, d):
    return x * d["o"].k


def _tuple_item(x, t):
    return x * t[0].k


def _kwargs_get(x, **kw):
    return x * kw.get("o").k


# case -> (function, how it is called with the held value)
ITEM_CASES = {
    "kwargs": (_kwargs_item, lambda fn, x, v: fn(x, o=v)),
    "args": (_args_item, lambda fn, x, v: fn(x, v)),
    "list": (_list_item, lambda fn, x, v: fn(x, [v])),
    "dict": (_dict_item, lambda fn, x, v: fn(x, {"o": v})),
    "tuple": (_tuple_item, lambda fn, x, v: fn(x, (v,))),
    "kwargs.get": (_kwargs_get, lambda fn, x, v: fn(x, o=v)),
}


def _changes(what):
    """(the value held in the container, the change, the undo)."""
    if what == "instance":  # the class attribute of an instance (found on its base)
        return _Obj(), lambda: setattr(_Base, "k", 5.0), lambda: setattr(_Base, "k", 2.0)
    if what == "class":
        return _Cfg, lambda: setattr(_Cfg, "k", 7.0), lambda: setattr(_Cfg, "k", 2.0)
    mod = types.ModuleType("_stale35_unregistered")  # a module no sys.modules entry names
    mod.k = 2.0
    return mod, lambda: setattr(mod, "k", 5.0), lambda: None


@pytest.mark.parametrize("what", ["instance", "class", "module"])
@pytest.mark.parametrize("case", sorted(ITEM_CASES))
def test_an_attribute_read_through_an_item_of_an_argument_is_guarded(case, what):
    # the chains from a parameter did not start at *args / **kwargs nor go through items:
    # kw["o"].k with k a class attribute (or a class's, a module's) was not guarded (stale)
    fn, call = ITEM_CASES[case]
    held, change, undo = _changes(what)

    def changed():
        change()
        return undo

    _assert_recompiles_after(fn, call, held, changed)


def _assert_recompiles_after(fn, call, held, change):
    """``call(jf, x, held)`` equals eager's before and after ``change()`` (which returns its
    undo), the change changing eager's result: one compile each side, two hits."""
    x = torch.ones(3)
    jf = trident.jit(fn)
    before = call(fn, x, held)
    assert torch.equal(call(jf, x, held), before) and torch.equal(call(jf, x, held), before)
    undo = change()
    try:
        after = call(fn, x, held)
        assert not torch.equal(after, before), "the change must change eager's result"
        assert torch.equal(call(jf, x, held), after) and torch.equal(call(jf, x, held), after)
    finally:
        undo()
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (0, 2, 2), s


def _getattr_2(name):
    if name == "k":
        return 2.0
    raise AttributeError(name)


def _getattr_3(name):
    if name == "k":
        return 3.0
    raise AttributeError(name)


_SERVED = types.ModuleType("_stale35_served")


def _reads_served(x):
    return x * _SERVED.k


def _edit_code():
    _getattr_2.__code__, saved = _getattr_3.__code__, _getattr_2.__code__
    return lambda: setattr(_getattr_2, "__code__", saved)


GETATTR_CHANGES = {
    "swapped": lambda: (setattr(_SERVED, "__getattr__", _getattr_3), lambda: None)[1],
    "its code edited": _edit_code,
    "deleted": lambda: (delattr(_SERVED, "__getattr__"), lambda: None)[1],
}


@pytest.mark.parametrize("change", sorted(GETATTR_CHANGES))
def test_a_module_getattr_that_serves_a_read_is_guarded(change, monkeypatch):
    # the state tree held the name as absent but not the module's __getattr__ (PEP 562):
    # a __getattr__ swapped, edited or deleted was not seen (stale; eager raises once deleted)
    monkeypatch.setitem(sys.modules, _SERVED.__name__, _SERVED)
    _SERVED.__getattr__ = _getattr_2
    x = torch.ones(3)
    jf = trident.jit(_reads_served)
    before = _reads_served(x)
    assert torch.equal(jf(x), before) and torch.equal(jf(x), before)
    undo = GETATTR_CHANGES[change]()
    try:
        if change == "deleted":
            for _ in range(2):
                with pytest.raises(AttributeError):
                    jf(x)
            s = jf.stats
            assert (s.fallbacks, s.compiles, s.hits) == (2, 1, 1), s
            return
        after = _reads_served(x)
        assert not torch.equal(after, before), "the change must change eager's result"
        assert torch.equal(jf(x), after) and torch.equal(jf(x), after)
    finally:
        undo()
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (0, 2, 2), s


def _act(x, b=0.0):
    return x * 2 + b


def _act_other(x, b=0.0):
    return x * 3 - b


class _Holder:
    def __init__(self):
        self.k = 2.0

    def meth(self, x):
        return x * self.k


def _calls_pos(x, fn):
    return fn(x)


def _calls_kw(x, **kw):
    return kw["fn"](x)


def _calls_list(x, fns):
    return fns[0](x)


class _HoldsFn:
    def __init__(self, fn):
        self.fn = fn


def _calls_attr(x, holder):
    return holder.fn(x)


CALLERS = {"pos": (_calls_pos, lambda jf, x, c: jf(x, c)),
           "attr": (_calls_attr, lambda jf, x, c: jf(x, _HoldsFn(c))),
           "kw": (_calls_kw, lambda jf, x, c: jf(x, fn=c)),
           "list": (_calls_list, lambda jf, x, c: jf(x, [c]))}


def _defaults_change():
    _act.__defaults__ = (1.0,)
    return lambda: setattr(_act, "__defaults__", (0.0,))


def _code_change():
    saved, _act.__code__ = _act.__code__, _act_other.__code__
    return lambda: setattr(_act, "__code__", saved)


@pytest.mark.parametrize("change", [_defaults_change, _code_change])
@pytest.mark.parametrize("how", sorted(CALLERS))
def test_a_function_passed_in_and_called_is_guarded(how, change):
    # Note [Callable arguments] in lower/state/callables.py: a function argument was checked by
    # identity only; its __defaults__ or __code__ changed was not seen (stale)
    fn, call = CALLERS[how]
    _assert_recompiles_after(fn, call, _act, change)


@pytest.mark.parametrize("what", ["bound method", "partial"])
@pytest.mark.parametrize("how", sorted(CALLERS))
def test_a_bound_method_or_partial_passed_in_and_called_runs_eagerly(how, what):
    # what a bound method or a partial binds (its object, its keywords) is no argument
    # tree's: a change of it was not seen (stale); the call runs eagerly, with one warning
    fn, call = CALLERS[how]
    holder = _Holder()
    part = functools.partial(_act_other, b=1.0)
    make = (lambda: holder.meth) if what == "bound method" else (lambda: part)
    x = torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(call(jf, x, make()), call(fn, x, make()))
        if what == "bound method":
            holder.k = 4.0
        else:
            part.keywords["b"] = 2.0
        after = call(fn, x, make())
        assert torch.equal(call(jf, x, make()), after)
        assert torch.equal(call(jf, x, make()), after)
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s
    said = [str(w.message) for w in caught if "passed as an argument" in str(w.message)]
    assert len(said) == 1, said


@pytest.mark.parametrize("where", ["its own __builtins__ dict", "the builtins module"])
def test_a_builtin_of_exec_d_code_is_guarded(where, monkeypatch):
    # code exec'd with globals of its own reads builtins from its __builtins__: neither a
    # replacement in its own dict nor one in the builtins module was seen (stale)
    custom = {"abs": lambda v: 2.0}
    g = {"__builtins__": custom} if where.startswith("its own") else {}
    exec("def reads_abs(x):\n    return x * abs(-2.0)", g)
    fn, x = g["reads_abs"], torch.ones(3)
    jf = trident.jit(fn)
    before = fn(x)
    assert torch.equal(jf(x), before) and torch.equal(jf(x), before)
    if where.startswith("its own"):
        custom["abs"] = lambda v: 3.0
    else:
        monkeypatch.setattr(builtins, "abs", lambda v: 3.0)
    after = fn(x)
    assert not torch.equal(after, before), "the change must change eager's result"
    assert torch.equal(jf(x), after) and torch.equal(jf(x), after)
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (0, 2, 2), s


class _Missing(dict):
    def __missing__(self, key):
        return 2.0 if key == "Z" else builtins.__dict__[key]


def test_a_global_that_a_dict_subclass_serves_is_guarded():
    # globals of a dict subclass: LOAD_GLOBAL finds Z through __missing__; the value served
    # is guarded (Z set in the dict later is seen)
    g = _Missing()
    exec("def reads_z(x):\n    return x * Z", g)
    fn, x = g["reads_z"], torch.ones(3)
    jf = trident.jit(fn)
    before = fn(x)
    assert torch.equal(jf(x), before) and torch.equal(jf(x), before)
    g["Z"] = 6.0
    after = fn(x)
    assert not torch.equal(after, before), "the change must change eager's result"
    assert torch.equal(jf(x), after) and torch.equal(jf(x), after)
    s = jf.stats
    # __missing__'s other branch uses builtins.__dict__ with a key no scan reads back: Note
    # [Library containers used whole] makes the call eager (session 49), never stale
    assert (s.fallbacks, s.compiles, s.hits) == (4, 0, 0), s
