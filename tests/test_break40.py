"""Faults the adversarial pass of session 40 found, each with a test of its whole kind; every
call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import math
import numbers
import operator
import types
import warnings

import pytest
import torch

import trident
from _trident_helpers import counts


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
# text now specializes the value; ``type``, ``isinstance`` and ``is`` below.

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


# Note [Questions about symbolic values] (lower/state/questions.py): ``type``, ``isinstance``,
# ``is`` and ``id`` answer for the SymInt with no call torch sees. A user function that ran in a
# symbolic trace and asks one of a value that may be symbolic makes that trace fail: the call is
# traced at exact sizes and ints, where Python answers with ints (and automatic dynamic
# specializes from then on). Each call equals eager; none runs eagerly.

INT_LEAF_QUESTIONS = {
    "type is int": lambda c, x: x * 2 if type(c.n) is int else x,
    "isinstance int": lambda c, x: x * 2 if isinstance(c.n, int) else x,
    "is 0": lambda c, x: x * 2 if operator.is_(c.n, 0) else x,  # (`c.n is 0`)
    "is not 0": lambda c, x: x if operator.is_not(c.n, 0) else x * 2,
    "isinstance of classes": lambda c, x: x * 2 if isinstance(c.n, (int, float)) else x,
    "isinstance Integral": lambda c, x: x * 2 if isinstance(c.n, numbers.Integral) else x,
    "type's name": lambda c, x: x * len(type(c.n).__name__),
    "__class__": lambda c, x: x * 2 if c.n.__class__ is int else x,
    "type of a bool": lambda c, x: x * 2 if type(c.n > 4) is bool else x,
    "id": lambda c, x: x * 2 if id(c.n) == id(0) else x,
    "match": lambda c, x: _matched(c.n, x),
}


def _matched(n, x):
    match n:
        case int():
            return x * 2
    return x


@pytest.mark.parametrize("use", list(INT_LEAF_QUESTIONS), ids=list(INT_LEAF_QUESTIONS))
def test_python_questions_about_an_int_leaf(use):
    fn = INT_LEAF_QUESTIONS[use]

    def f(c, x):
        return fn(c, x)

    jf = trident.jit(f)
    x = torch.arange(12.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no call runs eagerly)
        for n in (3, 4, 5, 0, 1, 6, 5, 0):  # 4 makes c.n a leaf (Note [Int leaves])
            assert torch.equal(jf(Cfg(n), x), f(Cfg(n), x)), n
    assert counts(jf) == (6, 2, 0)  # 4's symbolic trace asked: each int compiles


class Outer:
    def __init__(self, n):
        self.inner = Cfg(n)
        self.name = "outer"


def _is_int(v) -> bool:  # a user helper that asks
    return isinstance(v, int)


def test_a_helper_asks_about_an_int_leaf_of_a_nested_config():
    def f(o, x):
        return x * 2 if _is_int(o.inner.n) else x

    jf = trident.jit(f)
    x = torch.arange(6.0)
    for n in (3, 4, 5, 5, 3):  # 4 makes o.inner.n a leaf
        assert torch.equal(jf(Outer(n), x), f(Outer(n), x)), n
    assert counts(jf) == (3, 2, 0)


SIZE_QUESTIONS = {
    "type is int": lambda x: x * 2 if type(x.size(0)) is int else x,
    "isinstance int": lambda x: x * 2 if isinstance(x.shape[0], int) else x,
    "isinstance Integral": lambda x: x * 2 if isinstance(x.shape[0], numbers.Integral) else x,
    "through a local": lambda x: (lambda n: x * 2 if type(n) in (int,) else x)(x.shape[0] + 1),
    "__class__ of a float": lambda x: x * 2 if (x.shape[0] / 2).__class__ is float else x,
}


@pytest.mark.parametrize("use", list(SIZE_QUESTIONS), ids=list(SIZE_QUESTIONS))
def test_python_questions_about_a_symbolic_size(use):
    fn = SIZE_QUESTIONS[use]

    def f(x):
        return fn(x)

    jf = trident.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 4, 5, 12, 7, 4):  # 4 makes the size symbolic
            x = torch.arange(float(n))
            assert torch.equal(jf(x), f(x)), n
    assert counts(jf) == (5, 1, 0)


# Questions whose answer is the same for a SymInt and an int leave the trace symbolic.
SAME_ANSWERS = {
    "is None": lambda x, y: x * 2 if y is None else x,
    "isinstance of a tensor": lambda x, y: x * 2 if isinstance(x.shape[0], torch.Tensor) else x,
    "isinstance tuple": lambda x, y: x * 2 if isinstance(x.shape[0], tuple) else x,
    "type of a parameter": lambda x, y: x * len(type(y).__name__),
    "type compared with list": lambda x, y: x * 2 if type(x.shape[0]) is list else x,
    "is Ellipsis": lambda x, y: x * 2 if x.shape[0] is ... else x,
}


@pytest.mark.parametrize("use", list(SAME_ANSWERS), ids=list(SAME_ANSWERS))
def test_questions_answered_alike_stay_symbolic(use):
    fn = SAME_ANSWERS[use]

    def f(x, y=None):
        return fn(x, y)

    jf = trident.jit(f)
    for n in (3, 4, 5, 12):  # 4 makes the size symbolic: 5 and 12 hit it
        x = torch.arange(float(n))
        assert torch.equal(jf(x), f(x)), n
    assert counts(jf) == (2, 2, 0)


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
# ``vars``, gave the fake's answer, and every call returned it. A tensor argument is guarded on
# whether it has Python attributes (Note [Tensor types and attributes] in ir/guards.py): a
# lookup on one that has attributes runs eagerly (Note [Python attributes of tensors] in
# lower/tensor_attributes.py); on one that has none it is served, and the call after an attribute
# is set misses, then runs eagerly. ``vars(x)`` and ``x.__dict__`` run eagerly either way. A
# tensor argument with attributes the function does not read still compiles.

TENSOR_ATTRIBUTES = {
    "getattr with a default": lambda x: x * getattr(x, "scale", 2.0),
    "hasattr": lambda x: x * 2 if hasattr(x, "scale") else x,
    "vars": lambda x: x * (len(vars(x)) + 1),
    "__dict__": lambda x: x * x.__dict__.get("scale", 2.0),
    "of a view": lambda x: x * (len(vars(x[:3])) + 1) if x.numel() > 2 else x,
    "try": lambda x: x * _scale_or(x, 2.0),
    "try, any error": lambda x: x * _scale_or(x, 2.0, Exception),
    "without a default": lambda x: x * x.scale,
}


def _scale_or(t, default, catch=AttributeError):
    try:
        return t.scale
    except catch:
        return default


def _attribute_calls(f, calls) -> tuple[tuple, list]:
    """Runs ``f`` jitted over ``calls`` (each: the arguments), each against eager; the counts
    and the warnings."""
    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for args in calls:
            if callable(args):
                args = args()
            if args is None:
                continue
            assert torch.equal(jf(*args), f(*args))
    return counts(jf), [str(w.message) for w in caught]


@pytest.mark.parametrize("use", list(TENSOR_ATTRIBUTES), ids=list(TENSOR_ATTRIBUTES))
@pytest.mark.parametrize("when", ["always", "changed", "set after the first call", "never"])
def test_python_attributes_of_a_tensor_argument(use, when):
    """Each call equals eager: the tensor's attribute as it was at the trace, changed between
    calls, set after the first call, never set. A lookup (getattr, hasattr, ``try``) on a
    tensor with no attributes is compiled and hit; on one with attributes, and ``vars`` and
    ``__dict__`` always, it runs eagerly, with a warning."""
    fn = TENSOR_ATTRIBUTES[use]

    def f(x):
        return fn(x)

    x = torch.arange(6.0)
    if when in ("always", "changed"):
        x.scale = 3.0

    def change():
        if when == "changed":
            x.scale = 5.0
        elif when == "set after the first call":
            x.scale = 4.0

    def later():
        change()
        return (x,)

    if use == "without a default" and when in ("never", "set after the first call"):
        pytest.skip("eager raises AttributeError")
    got, caught = _attribute_calls(f, [(x,), (x,), later, (x,)])
    lookup = use in ("getattr with a default", "hasattr", "try", "try, any error")
    if lookup and when == "never":
        assert got == (1, 3, 0) and not caught, caught
        return
    # set after the first call: a compile and a hit, then the tensor's flag misses and the
    # trace of a tensor with attributes runs eagerly
    assert got == ((1, 1, 2) if lookup and when == "set after the first call" else (0, 0, 4))
    assert any("of a tensor argument" in w or "a tensor's __dict__" in w for w in caught), caught


class Sharded(torch.nn.Module):
    """A layer whose weight carries attributes as libraries set them (a tensor-parallel
    ``is_sharded``, a quantizer's ``quant_state``)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, 4), requires_grad=False)

    def forward(self, x):
        scale = 2.0 if getattr(self.weight, "is_sharded", False) else 1.0
        return (x @ self.weight) * scale


def test_a_parameter_with_attributes_set_as_libraries_set_them():
    m = Sharded()
    x = torch.ones(2, 4)

    def mark():
        m.weight.is_sharded = True
        return (m, x)

    def unmark():
        del m.weight.is_sharded
        return (m, x)

    def f(m, x):
        return m(x)

    with torch.no_grad():
        got, caught = _attribute_calls(f, [(m, x), mark, (m, x), unmark, (m, x)])
    # the weight without attributes: compiled; marked: eager twice; unmarked: hits again
    assert got == (1, 2, 2)
    assert any("'is_sharded' of a tensor argument" in w for w in caught), caught


UNREAD = {
    "attributes not read": lambda x, m: x * 2,
    "a module's attribute with a default": lambda x, m: x * getattr(m, "gain", 2.0),
    "hasattr of a module": lambda x, m: x * 2 if hasattr(m, "gain") else x,
    "vars of a module": lambda x, m: x * len(vars(m)["_parameters"]),
    "vars of a module's attribute": lambda x, m: x * len(vars(m.cfg)),
    "an attribute the function sets": lambda x, m: _set_and_read(x.clone()),
}


def _set_and_read(y):
    y.scale = 3.0
    return y * getattr(y, "scale", 2.0)


@pytest.mark.parametrize("use", list(UNREAD), ids=list(UNREAD))
def test_tensors_with_attributes_the_function_does_not_read_compile(use):
    """A tensor argument's attributes that the function does not read, and reads of other
    objects' attributes, compile and hit as before."""
    fn = UNREAD[use]
    m = torch.nn.Linear(2, 2).requires_grad_(False)

    def f(x, m):
        return fn(x, m)

    x = torch.arange(6.0)
    x.scale = 3.0
    m.weight.is_sharded = True
    m.cfg = types.SimpleNamespace(a=1.0)
    got, caught = _attribute_calls(f, [(x, m)] * 3)
    assert got == (1, 2, 0), caught
