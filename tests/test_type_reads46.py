"""Note [Classes no traced tensor is] (lower/state/bytecode.py): ``isinstance(x, C)`` of a
tensor, ``C`` a strict subclass of ``torch.Tensor`` that no traced tensor is, answers False on
the trace's fake and in eager, so it is served; where the answer could differ it runs eagerly.
Found on the GPU machine: liger-kernel 0.8's ``LigerRMSNormFunction.forward`` tests
``isinstance(X, DTensor)``, and every liger-patched model ran eagerly. Each call is compared
with eager, with exact counts."""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, installed_package, said

_LIB = '''
import torch
from torch._subclasses.fake_tensor import FakeTensor


class Gathered(torch.Tensor):  # as DTensor: a tensor subclass that answers by its class
    pass


class _Asks(type(torch.Tensor)):
    def __instancecheck__(cls, obj):
        return getattr(obj, "tagged", False)


class Tagged(torch.Tensor, metaclass=_Asks):  # answers by an attribute, as nn.Parameter does
    pass


def norm(x):
    if isinstance(x, Gathered):
        x = x * 0
    return x * 2


def norm_tagged(x):
    return x * (3 if isinstance(x, Tagged) else 2)


def norm_fake(x):  # a class of the fake itself
    return x * (3 if isinstance(x, FakeTensor) else 2)


def norm_computed(x):  # a class the code computes: the bytecode does not say which
    from torch._subclasses.fake_tensor import FakeTensor as computed
    return x * (3 if isinstance(x, computed) else 2)
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("typelib46"), "trident_typelib46",
                           {"__init__": _LIB}) as package:
        yield package


def _calls(jf, f, xs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in xs:
            got, want = jf(x), f(x)
            assert torch.equal(got, want) and type(got) is type(want), (got, want)
    return said(caught, "trident")


@pytest.mark.parametrize("where", ["library", "user"])
def test_isinstance_of_a_class_no_traced_tensor_is_is_served(lib, where):
    f = lib.norm if where == "library" else (
        lambda x: x * (3 if isinstance(x, lib.Gathered) else 2))
    jf = trident.jit(lambda x: f(x) + 1)
    assert _calls(jf, lambda x: f(x) + 1, [torch.ones(2), torch.randn(2), torch.ones(2)]) == []
    assert counts(jf) == (1, 2, 0), jf.stats
    gathered = torch.ones(2).as_subclass(lib.Gathered)  # an instance: eager, as any subclass
    warned = _calls(jf, lambda x: f(x) + 1, [gathered])
    assert len(warned) == 1 and "native guards do not read" in warned[0], warned
    assert counts(jf) == (1, 2, 1), jf.stats


@pytest.mark.parametrize("reader", ["norm_tagged", "norm_fake", "norm_computed"])
def test_isinstance_that_may_answer_otherwise_runs_eagerly(lib, reader):
    f = getattr(lib, reader)
    jf = trident.jit(lambda x: f(x) + 1)
    warned = _calls(jf, lambda x: f(x) + 1, [torch.ones(2), torch.ones(2)])
    assert len(warned) == 1 and "reads a tensor's Python type" in warned[0], warned
    assert counts(jf) == (0, 0, 2), jf.stats
