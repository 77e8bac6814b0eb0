"""The hot operators' calls: typed (unboxed) calls (Note [Unboxed calls] in unboxed.cpp), the
same dispatcher and kernel as a boxed call, so every result equals eager's bit for bit; and
intermediate buffers reused across calls on CUDA, on the stream that made them (Note [Buffer
reuse] in plan.py)."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

import trident
from trident import build, runtime
from trident.codegen import render as codegen
from trident.lower import passes, plan

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


def chain(x, w):
    h = torch.sin(x @ w) * torch.relu(x @ w) * 2
    return (h + x) @ w


def test_cuda_buffers_are_reused_on_the_stream_that_made_them_codegen(trident_runtime,
                                                                      tmp_path):
    f = trident.jit(chain)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    assert torch.equal(f(x, w), chain(x, w))
    spec = copy.deepcopy(f._specs[0])  # as if traced on cuda:0
    spec.guards = [dataclasses.replace(g, value={"device_type": 1, "device_index": 0}[g.field])
                   if g.field in ("device_type", "device_index") else g for g in spec.guards]
    for step in spec.plan.steps:
        step.out_overload = ""
    passes.reuse_buffers(spec.plan, "CPU")  # a CPU build of torch has no CUDA kernels to ask
    reused = [s.qualified_name for s in spec.plan.steps if s.out_overload]
    # mm (matmul's C++ body): a CUDA .out kernel; relu and mul by a Python scalar: their .out
    # overloads are torchgen's (the functional op, then a copy): no kernel of their own
    assert reused == ["aten::mm", "aten::sin", "aten::mm", "aten::mul.Tensor",
                      "aten::add.Tensor"]  # the last mm is the output: a new tensor
    units = codegen.render(spec, "chain").sources
    source = "\n".join(units)
    assert "if (rt->cuda_stream(0, &stream))" in source
    assert "f->reuse = !env->inference_mode && stream == buffer_stream;" in source
    # each reused buffer is written under the prologue's `reuse`, in the frame the parts share
    # (trident_steps.h; Note [Parallel C build])
    assert len(re.findall(r"trt_call_into\(rt, [^;]*&buffer\d+, f->reuse, ", source)) == 5
    module = build.build(units, tmp_path / "cuda-build")
    assert module.lib.scm_init(runtime.load().api_address()) == 0


def intermediates(x, w):  # mm: not composite; sin, mul, add: .out kernels of their own on CUDA
    return torch.mm(torch.sin(torch.mm(x, w)).mul(w).add(x), w)


@pytest.mark.gpu
def test_cuda_buffers_are_reused_on_one_stream_and_not_across_streams(trident_runtime):
    f = trident.jit(intermediates, cuda_graphs=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w = (torch.randn(64, 64, device="cuda", generator=g) for _ in range(2))
    assert torch.equal(f(x, w), intermediates(x, w))  # makes the buffers

    def allocations(fn):
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        out = fn()
        torch.cuda.synchronize()
        return out, torch.cuda.memory_stats()["allocation.all.allocated"] - before

    for _ in range(3):
        x = torch.randn(64, 64, device="cuda", generator=g)
        got, made = allocations(lambda: f(x, w))
        assert torch.equal(got, intermediates(x, w)) and made == 1  # the output alone
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # another stream: fresh intermediates, same values
        got, made = allocations(lambda: f(x, w))
        side.synchronize()
    assert torch.equal(got, intermediates(x, w)) and made > 1
    assert f.stats.hits == 4
