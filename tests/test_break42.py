"""Faults the adversarial pass of session 42 found, each with a test of its whole kind; every
call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import builtins
import collections
import functools
import operator
import pickle
import sys
import warnings
import weakref

import pytest
import torch

import trident
from _trident_helpers import counts


# ---- Note [Questions about symbolic values], the builtins (lower/state/questions.py) -----------
# A builtin that takes a symbolic size itself (not its __index__, __float__ or text) answers for
# the torch.SymInt: the symbolic specialization baked that answer and every hit of it returned
# what eager never does (pickle.dumps(n) pickled the SymInt: 2873 bytes, not 5).

SIZE_BUILTINS = {
    "pickle.dumps": lambda x, n: x * len(pickle.dumps(n)),
    "sys.getsizeof": lambda x, n: x * (2 if sys.getsizeof(n) < 40 else 1),
    "dir": lambda x, n: x * (2 if "node" in dir(n) else 1),
    "hasattr": lambda x, n: x * (2 if hasattr(n, "node") else 1),
    "getattr __class__": lambda x, n: x * (2 if getattr(n, "__class__") is int else 1),
    "type.__call__": lambda x, n: x * (2 if type.__call__(type, n) is int else 1),
    "int.__instancecheck__": lambda x, n: x * (2 if int.__instancecheck__(n) else 1),
    "map(type)": lambda x, n: x * (2 if list(map(type, [n])) == [int] else 1),
    # (``sorted(key=id)``: Note [Identity questions] makes any call of it run eagerly, an int's
    # or a tensor's: tests/test_break48.py)
    "weakref.ref": lambda x, n: x * _weakly(n),
    "getattr(builtins, 'type')": lambda x, n: x * (2 if getattr(builtins, "type")(n) is int
                                                   else 1),
    "operator.attrgetter": lambda x, n: x * (2 if operator.attrgetter("__class__")(n) is int
                                             else 1),
    "functools.partial": lambda x, n: x * (2 if functools.partial(isinstance)(n, int) else 1),
    "a parameter's default": lambda x, n, t=type: x * (2 if t(n) is int else 1),
    "str.format of an attribute": lambda x, n: x * len("{0.__class__}".format(n)),
    # a callee taken by a constant key from a container the code names (Note [Questions about
    # symbolic values]: the scan did not know it, and the specialization baked its answer)
    "vars(builtins)['type']": lambda x, n: x * (2 if vars(builtins)["type"](n) is int else 1),
    "builtins.__dict__['type']": lambda x, n: x * (2 if builtins.__dict__["type"](n) is int
                                                   else 1),
    "[type][0]": lambda x, n: x * (2 if [type][0](n) is int else 1),
    "{'t': type}['t']": lambda x, n: x * (2 if {"t": type}["t"](n) is int else 1),
    "vars(builtins)['getattr']": lambda x, n: x * (2 if vars(builtins)["getattr"](n, "__class__")
                                              is int else 1),
}


def _weakly(n) -> int:
    try:
        weakref.ref(n)
        return 2
    except TypeError:  # an int has no weak references
        return 1


@pytest.mark.parametrize("use", list(SIZE_BUILTINS), ids=list(SIZE_BUILTINS))
def test_builtins_asked_about_a_symbolic_size(use):
    fn = SIZE_BUILTINS[use]

    def f(x):
        return fn(x, x.shape[0])

    jf = trident.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no call runs eagerly)
        for n in (3, 4, 5, 12, 7, 4):  # 4 makes the size symbolic: its trace asks, and fails
            x = torch.arange(float(n))
            assert torch.equal(jf(x), f(x)), n
    assert counts(jf) == (5, 1, 0)


Pair = collections.namedtuple("Pair", "a b")

# Builtins whose answer is the int's keep the trace symbolic.
INT_ANSWERS = {
    "max": lambda x, n: x * max(n, 2),
    "a namedtuple": lambda x, n: x[: Pair(n, 1).a - 1],  # (its __new__ calls tuple.__new__)
    "torch.full": lambda x, n: x + torch.full((n,), 2.0),
}


@pytest.mark.parametrize("use", list(INT_ANSWERS), ids=list(INT_ANSWERS))
def test_builtins_that_answer_as_for_an_int_stay_symbolic(use):
    fn = INT_ANSWERS[use]

    def f(x):
        return fn(x, x.shape[0])

    jf = trident.jit(f)
    for n in (3, 4, 5, 12):  # 4 makes the size symbolic: 5 and 12 hit it
        x = torch.arange(float(n))
        assert torch.equal(jf(x), f(x)), n
    assert counts(jf) == (2, 2, 0)


# ---- Note [Python attributes of tensors], the other spellings (lower/state/questions.py) -------
# ``vars`` under another name, ``getattr(x, "__dict__")``, ``dir(x)``, ``object.__getattribute__``
# and ``x.__getattribute__`` (which raise without calling ``__getattr__``, the hook) read the
# fake tensor's attributes: hits returned the trace's answer after the attribute was set.

_VARS = vars


def _getattribute(t, get):
    try:
        return get(t)
    except AttributeError:
        return 1.0


TENSOR_DICT_SPELLINGS = {
    "vars under another name": lambda x: x * _VARS(x).get("scale", 1.0),
    "getattr __dict__": lambda x: x * getattr(x, "__dict__").get("scale", 1.0),
    "dir": lambda x: x * (2.0 if "scale" in dir(x) else 1.0),
    "object.__getattribute__": lambda x: x * _read(x),
    "x.__getattribute__": lambda x: x * _read_method(x),
}


def _read(x):
    try:
        return object.__getattribute__(x, "scale")
    except AttributeError:
        return 1.0


def _read_method(x):
    try:
        return x.__getattribute__("scale")
    except AttributeError:
        return 1.0


@pytest.mark.parametrize("use", list(TENSOR_DICT_SPELLINGS), ids=list(TENSOR_DICT_SPELLINGS))
@pytest.mark.parametrize("when", ["changed", "set after the first call"])
def test_a_tensor_argument_read_through_other_spellings(use, when):
    """Each call equals eager; each runs eagerly, with a warning."""
    fn = TENSOR_DICT_SPELLINGS[use]

    def f(x):
        return fn(x)

    x = torch.arange(6.0)
    if when == "changed":
        x.scale = 3.0
    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            if i == 2:
                x.scale = 5.0
            assert torch.equal(jf(x), f(x)), i
    assert counts(jf) == (0, 0, 4)
    assert any("a tensor's __dict__" in str(w.message) for w in caught), caught


# ---- Note [Library code that ran]: gc callbacks of every kind (lower/state/library.py) ---------
# A gc callback's frame was skipped only where the callback was a function or a bound method: a
# library's ``functools.partial`` or callable object that bumps its module's counter at every
# collection made each call recompile ("N changed since the last call"), without bound.

_GCLIB = '''
import functools
N = 0


def _bump(tag, phase, info):
    global N
    N += 1


class Bump:
    def __call__(self, phase, info):
        global N
        N += 1


def callback(kind):
    return functools.partial(_bump, 1) if kind == "partial" else Bump()
'''


@pytest.mark.parametrize("kind", ["partial", "callable object"])
def test_a_gc_callback_of_a_library_is_not_the_functions_code(tmp_path, kind):
    import gc
    import importlib

    name = "trident_gclib42"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(_GCLIB)
    (tmp_path / f"{name}-1.0.dist-info").mkdir()
    (tmp_path / f"{name}-1.0.dist-info" / "METADATA").write_text(f"Name: {name}\n")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    module = importlib.import_module(name)
    cb = module.callback(kind)
    threshold = gc.get_threshold()
    gc.callbacks.append(cb)
    try:
        def f(x):
            junk = [[i] for i in range(200)]  # gen-0 collections, run by the allocations
            return x * 2 + len(junk) * 0

        jf = trident.jit(f)
        x = torch.arange(4.0)
        gc.set_threshold(5)
        for _ in range(3):
            assert torch.equal(jf(x), f(x))
        gc.set_threshold(*threshold)
        assert module.N > 0
        assert counts(jf) == (1, 2, 0), jf.stats
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(cb)
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
