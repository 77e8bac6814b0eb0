"""Faults the adversarial pass of session 40 found, each with a test of its whole kind; every
call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import math
import operator
import types
import warnings

import pytest
import torch

import trident


def counts(jf) -> tuple[int, int, int]:
    s = jf.stats
    return s.compiles, s.hits, s.fallbacks


X = torch.arange(6.0)


# ---- Note [Bound built-in methods] (lower/flatten.py) ------------------------------------------
# A built-in method bound to an object answers from that object's contents, which its ID node
# did not check, and its words were those of the same method of any other object: a dict edited
# in place, or another dict's ``get``, was served the trace's value.

def _dict_get():
    d = {"k": 2.0}
    return (lambda: d.get), lambda: d.__setitem__("k", 3.0), lambda fn, x: x * fn("k")


def _other_dicts_get():
    now = [{"k": 2.0}]
    return (lambda: now[0].get), lambda: now.__setitem__(0, {"k": 7.0}), \
        lambda fn, x: x * fn("k")


def _list_index():
    items = [1.0, 2.0]
    return (lambda: items.index), lambda: items.insert(0, 2.0), lambda fn, x: x * fn(2.0)


def _other_strings_upper():
    now = ["ab"]
    return (lambda: now[0].upper), lambda: now.__setitem__(0, "abc"), \
        lambda fn, x: x * len(fn())


def _method_wrapper_len():
    d = {"a": 1.0}
    return (lambda: d.__len__), lambda: d.__setitem__("b", 2.0), lambda fn, x: x * fn()


@pytest.mark.parametrize("make", [_dict_get, _other_dicts_get, _list_index,
                                  _other_strings_upper, _method_wrapper_len])
def test_builtin_methods_bound_to_objects_run_eagerly(make):
    """Each call equals eager, before and after the bound object changes; each runs eagerly
    (with a warning that names the argument), none is a hit."""
    method, change, f = make()
    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            if i == 2:
                change()
            assert torch.equal(jf(method(), X), f(method(), X))
    assert counts(jf) == (0, 0, 4)
    assert any("argument fn is a built-in method bound to" in str(w.message) for w in caught)


@pytest.mark.parametrize("fn, f", [
    (math.sqrt, lambda g, x: x * g(4.0)),
    (torch.relu, lambda g, x: g(x - 2)),
    (dict.fromkeys, lambda g, x: x * len(g("ab")))], ids=["module", "none", "class"])
def test_builtins_of_modules_and_classes_are_served(fn, f):
    """A built-in bound to a module or a class (or to nothing) is still checked by identity
    and served."""

    jf = trident.jit(f)
    for _ in range(3):
        assert torch.equal(jf(fn, X), f(fn, X))
    assert counts(jf) == (1, 2, 0)


# ---- Note [Objects of one name] (identity.py) ------------------------------------------------
# Two live objects checked by identity that share their words (a function's key, a module's
# name): the dispatcher's tree rejected the second, and the miss path, whose tree had the same
# key, served it the specialization traced with the first.

def _deep(k):
    cfg = {"a": {"b": {"c": {"d": {"e": k}}}}}

    def fn(x):
        return x * cfg["a"]["b"]["c"]["d"]["e"]
    return fn


def _module(k):
    m = types.ModuleType("samename")
    m.k = k
    return m


def _rebindable():
    k = 2.0

    def fn(x):
        return x * k

    def rebind(v):
        nonlocal k
        k = v
    return fn, rebind


def call_fn(fn, x):
    return fn(x) if not isinstance(fn, types.ModuleType) else x * fn.k


@pytest.mark.parametrize("make", [_deep, _module], ids=["closure past the key's depth",
                                                         "module of one name"])
def test_objects_of_one_name_are_told_apart(make):
    """A second object of the first one's words: its own specialization, its own values."""
    first, second = make(2.0), make(3.0)
    jf = trident.jit(call_fn)
    for obj in (first, first, second, second, first):
        assert torch.equal(jf(obj, X), call_fn(obj, X))
    assert counts(jf) == (2, 3, 0)
    assert "another object of the same name" in jf.stats.miss_reasons[-1]


def test_a_closure_rebound_after_its_words_were_fixed():
    """Two closures of one ``def`` whose cells hold equal floats share a specialization; once
    the second's cell is rebound, it gets its own."""
    fn1, _ = _rebindable()
    fn2, rebind2 = _rebindable()
    jf = trident.jit(call_fn)
    for fn in (fn1, fn1, fn2, fn2):
        assert torch.equal(jf(fn, X), call_fn(fn, X))
    assert counts(jf) == (1, 3, 0)
    rebind2(5.0)
    for fn in (fn2, fn1, fn2):
        assert torch.equal(jf(fn, X), call_fn(fn, X))
    assert counts(jf) == (2, 5, 0)


def test_a_lambda_per_call_over_equal_values_is_one_specialization():
    """A new lambda at every call over a local of equal value (new cells) behaves alike: one
    compile, hits after it."""
    jf = trident.jit(call_fn)
    for _ in range(4):
        k = 2.0
        assert torch.equal(jf(lambda t: t * k, X), call_fn(lambda t: t * k, X))
    assert counts(jf) == (1, 3, 0)


# ---- a TypeError while flattening (lower/flatten.py) -------------------------------------------
# An argument's own code raising TypeError while it was flattened (a class given a
# __getattribute__ that answers every name: vars() finds no __dict__) was taken for the
# binding's TypeError: the call ran eagerly without a warning and without being counted.

def test_a_type_error_while_flattening_is_a_counted_fallback():
    class Cfg:
        pass

    def f(o, x):
        return x * o.k

    o = Cfg()
    o.k = 2.0
    jf = trident.jit(f)
    for _ in range(2):
        assert torch.equal(jf(o, X), f(o, X))
    Cfg.__getattribute__ = lambda self, name: 7.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert torch.equal(jf(o, X), f(o, X))
    assert counts(jf) == (1, 1, 2)
    assert any("cannot be flattened" in str(w.message) for w in caught)


# ---- symbolic values seen by Python code (Note [Symbolic values as text], source_lines.py) ------
# A trace runs the function's Python on torch.SymInt where an int is symbolic: an object's int
# attribute made a leaf (automatic dynamic: Note [Int leaves] in frontend/policy.py), or a
# tensor's size under automatic dynamic shapes. Python code that asks what the int is, rather
# than computing with it, got the SymInt's answer (``str`` gives its expression "s0"), the trace
# baked it, and every hit of the symbolic specialization returned what eager never does. Its
# text now specializes the value; ``type``, ``isinstance`` and ``is`` still answer for the
# SymInt (strict xfails below: Dynamo answers them for SymInts, make_fx does not).

class Cfg:
    def __init__(self, n):
        self.n = n


INT_LEAF_TEXT = {
    "str": lambda c, x: x * len(str(c.n)),
    "f-string": lambda c, x: x * len(f"{c.n}"),
    "repr": lambda c, x: x * len(repr(c.n)),
    "text of a bool": lambda c, x: x * len(str(c.n > 4)),
}


@pytest.mark.parametrize("use", list(INT_LEAF_TEXT), ids=list(INT_LEAF_TEXT))
def test_text_of_an_int_leaf(use):
    fn = INT_LEAF_TEXT[use]

    def f(c, x):
        return fn(c, x)

    jf = trident.jit(f)
    x = torch.arange(12.0)
    for n in (3, 4, 4, 12, 12, 4):  # 4 makes c.n a leaf (Note [Int leaves])
        assert torch.equal(jf(Cfg(n), x), f(Cfg(n), x)), n
    assert counts(jf) == (3, 3, 0)  # 3; 4 (specialized by its text); 12


def test_text_of_a_symbolic_size():
    def f(x):
        return x * len(str(x.shape[0]))

    jf = trident.jit(f)
    for n in (3, 4, 4, 12, 12, 4):  # 4 makes the size symbolic
        x = torch.arange(float(n))
        assert torch.equal(jf(x), f(x)), n
    assert counts(jf) == (3, 3, 0)


INT_LEAF_QUESTIONS = {
    "type is int": lambda c, x: x * 2 if type(c.n) is int else x,
    "isinstance int": lambda c, x: x * 2 if isinstance(c.n, int) else x,
    "is 0": lambda c, x: x * 2 if operator.is_(c.n, 0) else x,  # (`c.n is 0`)
}


@pytest.mark.parametrize("use", list(INT_LEAF_QUESTIONS), ids=list(INT_LEAF_QUESTIONS))
def test_python_questions_about_an_int_leaf(use):
    fn = INT_LEAF_QUESTIONS[use]

    def f(c, x):
        return fn(c, x)

    jf = trident.jit(f)
    x = torch.arange(12.0)
    for n in (3, 4, 5, 0, 1, 6):  # 4 makes c.n a leaf (Note [Int leaves])
        assert torch.equal(jf(Cfg(n), x), f(Cfg(n), x)), n


SIZE_QUESTIONS = {
    "type is int": lambda x: x * 2 if type(x.size(0)) is int else x,
    "isinstance int": lambda x: x * 2 if isinstance(x.shape[0], int) else x,
}


@pytest.mark.parametrize("use", list(SIZE_QUESTIONS), ids=list(SIZE_QUESTIONS))
def test_python_questions_about_a_symbolic_size(use):
    fn = SIZE_QUESTIONS[use]

    def f(x):
        return fn(x)

    jf = trident.jit(f)
    for n in (3, 4, 5, 12, 7):  # 4 makes the size symbolic
        x = torch.arange(float(n))
        assert torch.equal(jf(x), f(x)), n


# ---- Note [Tensors as text] (lower/source_lines.py) ---------------------------------------------
# repr, str and format of a tensor the function holds give its values in eager and the fake
# tensor's description in a trace: every call, the first included, returned what the trace's
# text made.

AS_TEXT = {
    "repr": lambda x: x * len(repr(x)),
    "str": lambda x: x * len(str(x)),
    "f-string": lambda x: x * len(f"{x}"),
    "format spec": lambda x: x * len(format(x[:2], "")),
    "branch on text": lambda x: x * 2 if "e+" in str(x) else x,
}


@pytest.mark.parametrize("use", list(AS_TEXT), ids=list(AS_TEXT))
def test_a_tensor_turned_into_text_runs_eagerly(use):
    fn = AS_TEXT[use]

    def f(x):
        return fn(x)

    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in (X, X + 0.5, X * 1e9):  # texts of other lengths, the last in e+ notation
            assert torch.equal(jf(x), f(x))
    assert counts(jf) == (0, 0, 3)
    assert any("turns a tensor into text" in str(w.message) for w in caught)


# ---- a tensor's Python attributes in a trace ---------------------------------------------------
# The trace runs the function on fake tensors, whose ``__dict__`` is the fake's own (its mode,
# its device...), not the real tensor's: an attribute the user set on a tensor argument
# (``w.scale``, a quantizer's metadata) read with a default, or asked with ``hasattr`` or
# ``vars``, gives the fake's answer, and every call returns it. (Read without a default, the
# trace fails and the call runs eagerly, as it should.) The argument tree does not check a
# tensor leaf's ``__dict__``, so carrying the real attributes into the fake needs a guard too.

TENSOR_ATTRIBUTES = {
    "getattr with a default": lambda x: x * getattr(x, "scale", 2.0),
    "hasattr": lambda x: x * 2 if hasattr(x, "scale") else x,
    "vars": lambda x: x * (len(vars(x)) + 1),
}


@pytest.mark.parametrize("use", list(TENSOR_ATTRIBUTES), ids=list(TENSOR_ATTRIBUTES))
def test_python_attributes_of_a_tensor_argument(use):
    fn = TENSOR_ATTRIBUTES[use]

    def f(x):
        return fn(x)

    x = torch.arange(6.0)
    x.scale = 3.0
    jf = trident.jit(f)
    for _ in range(2):
        assert torch.equal(jf(x), f(x))
