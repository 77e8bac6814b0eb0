"""Faults the adversarial pass of session 44 found, each with a test of its whole kind: every
call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, installed_package


def _calls(jf, fn, n: int, reset, state):
    """``n`` calls of ``jf`` then, from ``reset()``, ``n`` of ``fn`` (eager), each on
    ``torch.ones(2)``: (jitted results and final ``state()``, eager's, the warnings)."""
    x = torch.ones(2)
    reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [jf(x).clone() for _ in range(n)], state()
    reset()
    want = [fn(x).clone() for _ in range(n)], state()
    return got, want, [str(w.message) for w in caught]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ---- Note [Tensors written outside] (lower/trace_writes.py) ------------------------------------
# An op whose tensors are all real (a global buffer) runs for real in make_fx's fake mode; one
# that writes it wrote the buffer in the trace, then the call ran eagerly and wrote it again:
# the first result was eager's plus one. The write now refuses the trace before it runs.

BUF = torch.zeros(2)

TENSOR_WRITES = {
    "in-place method": "def f(x):\n    BUF.add_(1)\n    return x * BUF\n",
    "out=": "def f(x):\n    torch.add(BUF, 1, out=BUF)\n    return x * BUF\n",
    "through the class": "def f(x):\n    torch.Tensor.add_(BUF, 1)\n    return x * BUF\n",
    "copy_ of itself": "def f(x):\n    BUF.copy_(BUF + 1)\n    return x * BUF\n",
    "a list of tensors written": "def f(x):\n    torch._foreach_add_([BUF], 1)\n"
                                 "    return x * BUF\n",
}
_LIB44 = "import torch\n\nBUF = torch.zeros(2)\n\n\n" + "\n\n".join(
    src.replace("def f(", f"def f{i}(") for i, src in enumerate(TENSOR_WRITES.values()))


@pytest.mark.parametrize("where", ["user code", "library code"])
@pytest.mark.parametrize("kind", list(TENSOR_WRITES), ids=list(TENSOR_WRITES))
def test_a_write_to_a_tensor_outside_the_call_runs_eagerly_and_writes_once(tmp_path, kind, where):
    if where == "user code":
        g = {"torch": torch, "BUF": BUF}
        exec(TENSOR_WRITES[kind], g)
        fn, owner = g["f"], g
    else:
        lib = installed_package(tmp_path, "trident_fakelib44", {"__init__": _LIB44})
        owner = vars(lib.__enter__())
        fn = owner[f"f{list(TENSOR_WRITES).index(kind)}"]
    try:
        jf = trident.jit(fn)
        got, want, caught = _calls(jf, fn, 3, lambda: owner["BUF"].zero_(),
                                   lambda: [owner["BUF"].clone()])
    finally:
        if where != "user code":
            lib.__exit__(None, None, None)
    assert _same(got[0], want[0]) and _same(got[1], want[1]), (got, want)
    assert counts(jf) == (0, 0, 3)
    assert sum("writes a tensor that is not an argument" in w for w in caught) == 1, caught


# ---- Note [Context variables] (lower/trace_writes.py) -------------------------------------------
# A ContextVar set and left set: in a library's code (its state taken as fixed) each hit
# returned the trace's value and set nothing; in user code the trace set it, then the call ran
# eagerly and set it again. The function's run in the trace is now in a copy of the context.

_CONTEXT_LIB = '''
import contextvars

VAR = contextvars.ContextVar("trident_var44", default=0)


def bump(x):
    VAR.set(VAR.get() + 1)
    return x * VAR.get()


def balanced(x):
    token = VAR.set(3)
    try:
        return x * VAR.get()
    finally:
        VAR.reset(token)
'''


@pytest.mark.parametrize("where", ["user code", "library code"])
def test_a_context_variable_left_set_runs_eagerly_and_sets_it_once(tmp_path, where):
    if where == "user code":
        g: dict = {}
        exec(_CONTEXT_LIB, g)
        lib = None
    else:
        lib = installed_package(tmp_path, "trident_ctxlib44", {"__init__": _CONTEXT_LIB})
        g = vars(lib.__enter__())
    try:
        jf = trident.jit(g["bump"])
        got, want, caught = _calls(jf, g["bump"], 3, lambda: g["VAR"].set(0),
                                   lambda: [torch.tensor(g["VAR"].get())])
    finally:
        if lib is not None:
            lib.__exit__(None, None, None)
    assert _same(got[0], want[0]) and _same(got[1], want[1]), (got, want)
    assert [float(t[0]) for t in got[0]] == [1.0, 2.0, 3.0]
    assert counts(jf) == (0, 0, 3)
    assert sum("sets the context variable trident_var44" in w for w in caught) == 1, caught


def test_a_library_context_variable_set_and_reset_is_served_natively(tmp_path):
    with installed_package(tmp_path, "trident_ctxlib44b", {"__init__": _CONTEXT_LIB}) as lib:
        jf = trident.jit(lib.balanced)
        got, want, caught = _calls(jf, lib.balanced, 3, lambda: None,
                                   lambda: [torch.tensor(lib.VAR.get())])
    assert _same(got[0], want[0]) and _same(got[1], want[1]) and not caught, (got, want, caught)
    assert counts(jf) == (1, 2, 0)


# ---- Note [Writes through wrappers] (lower/state/wrappers.py) -----------------------------------
# A functools.partial of a mutating function, method or user helper, and an
# operator.methodcaller of a mutating method, write when called, from C: no bytecode names the
# write, so each hit returned the trace's value and wrote nothing (user and library code).

_WRAPPERS_SRC = '''
import functools
import operator

MEMO = {}
LOG = []


def push(lst, v):
    lst.append(v)


BUMP = functools.partial(operator.setitem, MEMO, "n")
APPEND = functools.partial(LOG.append)
PUSH = functools.partial(push, LOG)
CALLER = operator.methodcaller("append", 1)


def partial_made(x):
    functools.partial(operator.setitem, MEMO, "n")(MEMO.get("n", 0) + 1)
    return x * MEMO["n"]


def partial_held(x):
    BUMP(MEMO.get("n", 0) + 1)
    return x * MEMO["n"]


def partial_of_a_method(x):
    APPEND(1)
    return x * len(LOG)


def partial_of_a_helper_made(x):
    functools.partial(push, LOG)(1)
    return x * len(LOG)


def partial_of_a_helper_held(x):
    PUSH(1)
    return x * len(LOG)


def methodcaller_made(x):
    operator.methodcaller("append", 1)(LOG)
    return x * len(LOG)


def methodcaller_held(x):
    CALLER(LOG)
    return x * len(LOG)


def wrappers_of_a_fresh_list(x):
    fresh = []
    functools.partial(fresh.append)(1)
    operator.methodcaller("append", 2)(fresh)
    functools.partial(push, fresh)(3)
    return x * len(fresh)
'''
WRAPPED = ["partial_made", "partial_held", "partial_of_a_method", "partial_of_a_helper_made",
           "partial_of_a_helper_held", "methodcaller_made", "methodcaller_held"]


@pytest.fixture(params=["user code", "library code"])
def wrappers_module(request, tmp_path):
    if request.param == "user code":
        g: dict = {"__name__": "trident_user_wrappers44"}
        exec(compile(_WRAPPERS_SRC, "<trident_user_wrappers44>", "exec"), g)
        yield g
    else:
        with installed_package(tmp_path, "trident_wrapperlib44",
                               {"__init__": _WRAPPERS_SRC}) as lib:
            yield vars(lib)


@pytest.mark.parametrize("use", WRAPPED)
def test_a_write_through_a_wrapper_runs_eagerly(wrappers_module, use):
    g = wrappers_module
    fn = g[use]
    jf = trident.jit(fn)

    def reset():
        g["MEMO"].clear()
        g["LOG"].clear()

    got, want, caught = _calls(jf, fn, 3, reset, lambda: [torch.tensor(len(g["LOG"])),
                                                          torch.tensor(g["MEMO"].get("n", 0))])
    assert _same(got[0], want[0]) and _same(got[1], want[1]), (got, want)
    assert [float(t[0]) for t in got[0]] == [1.0, 2.0, 3.0]
    assert counts(jf) == (0, 0, 3)
    assert len(caught) == 1 and "writes" in caught[0], caught


def test_wrappers_of_a_fresh_object_are_served_natively(wrappers_module):
    fn = wrappers_module["wrappers_of_a_fresh_list"]
    jf = trident.jit(fn)
    got, want, caught = _calls(jf, fn, 3, lambda: None, lambda: [])
    assert _same(got[0], want[0]) and not caught, caught
    assert counts(jf) == (1, 2, 0)
