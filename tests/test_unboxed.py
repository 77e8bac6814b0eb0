"""Typed (unboxed) calls of the hot operators (Note [Unboxed calls] in runtime.cpp): the same
dispatcher and kernel as a boxed call, so every result equals eager's bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import trident

HOT = [("aten::mm", ""), ("aten::mm", "out"), ("aten::bmm", ""), ("aten::addmm", ""),
       ("aten::addmm", "out"), ("aten::linear", ""), ("aten::matmul", ""),
       ("aten::add", "Tensor"), ("aten::add", "out"), ("aten::sub", "Tensor"),
       ("aten::mul", "Tensor"), ("aten::mul", "Scalar"), ("aten::mul", "out"),
       ("aten::div", "Tensor"), ("aten::relu", ""), ("aten::silu", ""), ("aten::where", "self"),
       ("aten::_softmax", ""), ("aten::add_", "Tensor"), ("aten::copy_", ""),
       ("aten::empty", "memory_format"), ("aten::empty_like", "")]


@pytest.mark.parametrize("name, overload", HOT)
def test_hot_operators_are_called_unboxed(trident_runtime, name, overload):
    assert trident_runtime.unboxed_signature(name, overload) is not None


def test_other_signatures_stay_boxed(trident_runtime):
    assert trident_runtime.unboxed_signature("aten::cat", "") is None  # Tensor[]
    assert trident_runtime.unboxed_signature("aten::max", "dim") is None  # two returns


def hot_ops(x, w, b, i, out):
    h = F.linear(x, w, b) + F.linear(x, w)  # linear with and without bias
    h = torch.addmm(b, x, w.t(), beta=0.5, alpha=2) - h.mul(0.25)  # Scalar: float
    h = h.add(x @ w.t(), alpha=3) / torch.relu(h).add(1)  # Scalar: int
    k = (i * 3 + i).where(i > 2, i - 7)  # int64 tensors, int Scalars
    e = torch.empty(2, 3, dtype=torch.float64).fill_(1.5) + torch.empty_like(x[:, :3]).fill_(2)
    out.copy_(torch.softmax(h, -1))
    out.mul_(True).add_(h, alpha=2)
    return h, k, e, torch.bmm(h.unsqueeze(0), w.unsqueeze(0))


def test_hot_ops_equal_eager_bit_for_bit(trident_runtime):
    f = trident.jit(hot_ops)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, w, b = (torch.randn(2, 5, generator=g), torch.randn(5, 5, generator=g),
                   torch.randn(5, generator=g))
        i = torch.randint(-5, 5, (7,), generator=g)
        out_a, out_b = torch.empty(2, 5), torch.empty(2, 5)
        got, want = f(x, w, b, i, out_a), hot_ops(x, w, b, i, out_b)
        assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(got, want))
        assert torch.equal(out_a, out_b)
    assert (f.stats.hits, f.stats.compiles) == (2, 1)
