"""An adversarial pass over odd inputs and Python state that changes between calls (CPU machine,
session 50): each fault found is a test of its whole kind, against eager, with exact compile,
hit and fallback counts."""

from __future__ import annotations

import functools
import operator
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import trident
from _trident_helpers import assert_same, counts


# ---- Note [Tensor methods and operators] (lower/state/tensor_methods.py) -----------------------
# A method of torch.Tensor replaced between calls and reached otherwise than by an attribute
# load in user code (an operator, a builtin, library code) was not read: every hit after the
# patch returned the trace's result (``torch.Tensor.__add__ = ...`` then ``x + 1``).

def _rotate_half(x):
    from transformers.models.llama.modeling_llama import rotate_half
    return rotate_half(x) * 1.0


# name: (the function, its patch of torch.Tensor's method)
OPERATORS = {
    "__add__": (lambda x: x + 1, lambda s, o: torch.sub(s, o)),
    "__radd__": (lambda x: 1 + x, lambda s, o: torch.sub(s, o)),
    "__iadd__": (lambda x: _iadd(x), lambda s, o: torch.sub(s, o)),
    "__mul__": (lambda x: x * 2, lambda s, o: torch.add(s, o)),
    "__matmul__": (lambda x: x @ x, lambda s, o: torch.dot(s, s) * 3),
    "__truediv__": (lambda x: x / 2, lambda s, o: torch.mul(s, o)),
    "__pow__": (lambda x: x ** 2, lambda s, o: torch.mul(s, 5.0)),
    "__neg__": (lambda x: -x, lambda s: torch.abs(s)),
    "__abs__": (lambda x: abs(x), lambda s: torch.neg(s)),
    "__invert__": (lambda x: ~(x > 1), lambda s: torch.logical_and(s, s)),
    "__getitem__": (lambda x: x[1:], lambda s, i: torch.neg(s)),
    "__lt__": (lambda x: x < 2, lambda s, o: torch.gt(s, o)),
    "__eq__": (lambda x: x == 2, lambda s, o: torch.ne(s, o)),
    # library code the function runs: transformers' rotate_half computes -x2
    "__neg__ in a library": (_rotate_half, lambda s: torch.abs(s)),
    # and F.normalize computes input / denom, with input.norm(...)
    "__truediv__ in torch": (lambda x: F.normalize(x, dim=0), lambda s, o: torch.mul(s, o)),
    "norm in torch": (lambda x: F.normalize(x, dim=0), lambda s, *a, **k: torch.full((), 2.0)),
    # a builtin: sum() adds 0 + x first (x.__radd__), then x + x
    "__radd__ in sum()": (lambda x: sum([x, x]), lambda s, o: torch.mul(s, 3.0)),
    # the operator module's functions, called by C code for the function
    "__mul__ in reduce()": (lambda x: functools.reduce(operator.mul, [x, x, x]),
                            lambda s, o: torch.add(s, o)),
    "__neg__ in map()": (lambda x: torch.stack(list(map(operator.neg, [x, x]))),
                         lambda s: torch.abs(s)),
}


def _iadd(x):
    y = x.clone()
    y += 1
    return y


def _set_method(name: str, value) -> None:
    """``torch.Tensor.<name>`` set to ``value``; None: torch's own (a method of
    ``torch._C.TensorBase``'s unless ``torch.Tensor`` defines one)."""
    if value is not None:
        setattr(torch.Tensor, name, value)
    elif name in _OWN:
        setattr(torch.Tensor, name, _OWN[name])
    elif name in vars(torch.Tensor):
        delattr(torch.Tensor, name)


_OWN = {name: vars(torch.Tensor)[name] for name in [*OPERATORS, "sigmoid"]
        if name in vars(torch.Tensor)}


@pytest.mark.parametrize("case", OPERATORS)
@pytest.mark.parametrize("when", ["after the trace", "before the trace"])
def test_a_tensor_operator_patched_between_calls_is_seen(case, when):
    fn, patch = OPERATORS[case]
    name = case.split()[0]
    x = torch.arange(1.0, 5.0)
    at_trace, then = (patch, None) if when == "before the trace" else (None, patch)
    jf = trident.jit(fn)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no eager fallback
            _set_method(name, at_trace)
            first = fn(x)
            assert_same(jf(x), first)
            assert_same(jf(x), first)
            _set_method(name, then)
            second = fn(x)
            assert not torch.equal(first, second) or first.dtype != second.dtype
            assert_same(jf(x), second)
            assert_same(jf(x), second)
            assert counts(jf) == (2, 2, 0), jf.stats
            _set_method(name, at_trace)  # back as at the trace: the first specialization
            assert_same(jf(x), first)
    finally:
        _set_method(name, None)
    assert counts(jf) == (2, 3, 0), jf.stats


def _graph_calls(x):
    return (x.sigmoid() + 1) * -x


@pytest.mark.parametrize("name, patch", [("sigmoid", lambda s: torch.neg(s)),
                                         ("__add__", lambda s, o: torch.sub(s, o)),
                                         ("__neg__", lambda s: torch.abs(s))])
def test_a_tensor_method_patched_under_the_backend_door_is_seen(name, patch):
    """Dynamo guards no method of torch.Tensor; the graph's own reads of them do."""
    fn = types.FunctionType(_graph_calls.__code__.replace(), globals(), name)  # (own frame code:
    torch._dynamo.reset()  # backend_stats counts per frame code)
    cf = torch.compile(fn, backend="trident")
    x = torch.arange(1.0, 5.0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first = fn(x)
            assert_same(cf(x), first)
            setattr(torch.Tensor, name, patch)
            second = fn(x)
            assert not torch.equal(first, second)
            assert_same(cf(x), second)
            assert_same(cf(x), second)
            _set_method(name, None)
            assert_same(cf(x), first)
    finally:
        _set_method(name, None)
    s = trident.backend_stats(fn)
    assert (s.compiles, s.hits, s.fallbacks) == (2, 2, 0), s


@pytest.mark.xfail(strict=True, reason="a torch.Tensor dunder that C code other than the "
                   "operators, builtins and operator functions calls (math.prod's __mul__) is "
                   "not read: docs/design.md, Limits today")
def test_a_tensor_operator_math_prod_calls_is_seen():
    import math
    fn = lambda x: math.prod([x, x, x])  # noqa: E731
    x = torch.arange(1.0, 5.0)
    jf = trident.jit(fn)
    try:
        assert_same(jf(x), fn(x))
        _set_method("__mul__", lambda s, o: torch.add(s, o))
        assert_same(jf(x), fn(x))
    finally:
        _set_method("__mul__", None)
