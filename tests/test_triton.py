"""Triton kernels inside ``@trident.jit`` functions, without a GPU.

On CPU tensors the SCM calls back into Python and runs each captured launch through Triton's
interpreter (``stats.interpreted_launches``). For CUDA, the code generator is exercised without a
device: a CPU-traced plan is retargeted to ``cuda:0``, compiled for sm_90 with
``trident.lower.cubins.compile_cuda`` and rendered and built into a module that is never launched.

TRITON_INTERPRET is not set in this process, so eager Triton launches on CPU tensors fail
("0 active drivers"): references are plain torch expressions (exact where the kernel does one
fp32 operation per element).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import re
import warnings

import pytest
import torch
from torch.utils._sympy.functions import FloorDiv

import trident
from trident.ir import sizes
from trident.ir.launch import ConstexprParam, ScalarParam, TensorParam, TritonLaunch
from trident.ir.plan import TritonStep

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from _trident_helpers import fresh_imports  # noqa: E402
from _triton_kernels import add_kernel  # noqa: E402


# ---- kernels ----------------------------------------------------------------------------------


@triton.jit
def sub_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask),
             mask=mask)


@triton.jit
def strided_add_kernel(x_ptr, y_ptr, out_ptr, n, x_stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * x_stride, mask=mask)
    tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def axpb_inplace_kernel(x_ptr, n, a, b, BLOCK: tl.constexpr):
    """x = x * a + b, in place (x_ptr is read and written)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * a + b, mask=mask)


@triton.jit
def _twice(v):
    return v + v


@triton.jit
def double_with_helper_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, _twice(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def accumulate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_add(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


# BLOCK from n: a quarter of the next power of two (n=100 -> 32, n=1000 -> 256)
heuristic_add = triton.heuristics(
    {"BLOCK": lambda args: triton.next_power_of_2(args["n"]) // 4})(add_kernel)

AUTOTUNE_CONFIGS = [triton.Config({"BLOCK": 32}, num_warps=2, num_stages=2),
                    triton.Config({"BLOCK": 128}, num_warps=8, num_stages=4),
                    triton.Config({"BLOCK": 256}, num_warps=4, num_stages=3)]
autotuned_add = triton.autotune(configs=AUTOTUNE_CONFIGS, key=["n"])(add_kernel)

# autotune over heuristics: as in Triton, the inner heuristic overrides the config's BLOCK
# (Heuristics.run sets it after Autotuner.run added the config's kwargs); num_warps stays
autotuned_heuristic_sub = triton.autotune(
    configs=[triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=4)],
    key=["n"])(triton.heuristics({"BLOCK": lambda args: 64})(sub_kernel))

# Triton runs a config's pre_hook before every launch of that config (Autotuner.run, 3.6)
zeroing_accumulate = triton.autotune(
    configs=[triton.Config({"BLOCK": 64}, pre_hook=lambda nargs: nargs["out_ptr"].zero_()),
             triton.Config({"BLOCK": 128}, pre_hook=lambda nargs: nargs["out_ptr"].zero_())],
    key=["n"])(accumulate_kernel)


# ---- helpers ----------------------------------------------------------------------------------


def _language_namespaces() -> list:
    """What Triton's interpreter patches (``_patch_lang`` in triton/runtime/interpreter.py)."""
    return [tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base]


@pytest.fixture(autouse=True)
def _restore_triton_language():
    """Undo interpreter patches of ``triton.language`` that a test leaves behind, so one leak
    (test_interpreted_helpers_leave_triton_language_unpatched) cannot break Triton compiles in
    later tests."""
    saved = [(obj, dict(vars(obj))) for obj in _language_namespaces()]
    yield
    for obj, attrs in saved:
        now = dict(vars(obj))
        for name in now.keys() - attrs.keys():
            delattr(obj, name)
        for name, value in attrs.items():
            if now.get(name) is not value:
                setattr(obj, name, value)


def counts(jf) -> dict:
    s = jf.stats
    return {"hits": s.hits, "misses": s.misses, "compiles": s.compiles, "fallbacks": s.fallbacks,
            "traces": s.traces, "interpreted": s.interpreted_launches}


def triton_steps_of(spec) -> list:
    return [s for s in spec.plan.steps if isinstance(s, TritonStep)]


def triton_steps(jf, spec: int = 0) -> list:
    return [s for s in jf._specs[spec].plan.steps if isinstance(s, TritonStep)]


def param(launch: TritonLaunch, name: str):
    (p,) = [p for p in launch.params if p.name == name]
    return p


def randn(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


# ---- 1. own kernels: grids, torch ops around the launch, stats, specializations ---------------


def add_tuple_grid(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 32),)](x, y, out, n, BLOCK=32)
    return out


def add_callable_grid(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, BLOCK=64)
    return out


@pytest.mark.parametrize("fn,block", [(add_tuple_grid, 32), (add_callable_grid, 64)],
                         ids=["tuple-grid", "callable-grid"])
def test_add_kernel_equals_torch_and_counts_launches(fn, block):
    f = trident.jit(fallback=False)(fn)
    x, y = randn(1000, seed=1), randn(1000, seed=2)
    out = f(x, y)
    assert torch.equal(out, x + y)
    assert counts(f) == dict(hits=0, misses=1, compiles=1, fallbacks=0, traces=1, interpreted=1)
    for call in range(2, 5):
        out = f(x, y)
        assert torch.equal(out, x + y)
        assert counts(f) == dict(hits=call - 1, misses=1, compiles=1, fallbacks=0, traces=1,
                                 interpreted=call)
    (step,) = triton_steps(f)
    assert step.launch.kernel == "add_kernel"
    assert step.launch.device == "cpu"
    assert step.launch.grid == (triton.cdiv(1000, block), 1, 1)
    assert param(step.launch, "BLOCK") == ConstexprParam("BLOCK", block)
    assert param(step.launch, "n") == ScalarParam("n", 1000)
    assert [type(p) for p in step.launch.params] == [TensorParam] * 3 + [ScalarParam,
                                                                        ConstexprParam]


def mixed(x, y):
    h = torch.relu(x) * 2.0
    out = torch.empty_like(h)
    n = h.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](h, y, out, n, BLOCK=128)
    return torch.relu(out), out.sum(), out


def test_torch_ops_before_and_after_the_kernel():
    f = trident.jit(fallback=False)(mixed)
    x, y = randn(4, 300, seed=3), randn(4, 300, seed=4)
    for _ in range(3):
        r, s, raw = f(x, y)
        want = torch.relu(x) * 2.0 + y
        assert torch.equal(raw, want)
        assert torch.equal(r, torch.relu(want))
        assert s.shape == () and torch.allclose(s, want.sum(), rtol=1e-5, atol=1e-4)
    assert counts(f) == dict(hits=2, misses=1, compiles=1, fallbacks=0, traces=1, interpreted=3)
    ops = [s.launch.kernel if isinstance(s, TritonStep) else s.op
           for s in f._specs[0].plan.steps]
    assert ops.index("aten::relu") < ops.index("add_kernel") < ops.index("aten::sum")


def test_second_shape_makes_the_launch_symbolic():
    """Note [Symbolic launches]: after a size-only miss, ``n`` and the grid are computed from the
    size at each call; the kernel's Triton specialization class of ``n`` (divisible by 16 or
    not) is guarded, so 240 misses where 237 hits."""
    f = trident.jit(fallback=False)(add_callable_grid)
    for size, seed in ((100, 5), (231, 7), (237, 9), (240, 11), (256, 13)):
        a, b = randn(size, seed=seed), randn(size, seed=seed + 1)
        assert torch.equal(f(a, b), a + b), size
    assert counts(f) == dict(hits=2, misses=3, compiles=3, fallbacks=0, traces=3, interpreted=5)
    assert f.specializations == ["add_callable_grid(x: float32[100] cpu, y: float32[100] cpu)",
                                 "add_callable_grid(x: float32[?] cpu, y: float32[?] cpu)",
                                 "add_callable_grid(x: float32[?] cpu, y: float32[?] cpu)"]
    assert "% 16" in f.stats.miss_reasons[-1]
    assert triton_steps(f, 0)[0].launch.grid == (2, 1, 1)  # cdiv(100, 64)
    (launch,) = [s.launch for s in triton_steps(f, 1)]
    n = sizes.place("size", 1, 0)  # Note [Size expressions]: x.size(0)
    assert launch.grid[0] == FloorDiv(63 + n, 64) and launch.grid[1:] == (1, 1)
    assert param(launch, "n").size == n
    assert "trt_floordiv(63LL + a[1].sizes[0], 64LL)" in f.source()


def two_launches(x, y):
    t = torch.empty_like(x)
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 64),)](x, y, t, n, BLOCK=64)
    sub_kernel[(triton.cdiv(n, 32),)](t, x, out, n, BLOCK=32)  # (x + y) - x
    return out, t


def test_two_launches_per_call_count_two():
    f = trident.jit(fallback=False)(two_launches)
    x, y = randn(257, seed=9), randn(257, seed=10)
    for call in range(1, 4):
        out, t = f(x, y)
        assert torch.equal(t, x + y)
        assert torch.equal(out, (x + y) - x)
        assert f.stats.interpreted_launches == 2 * call
    assert [s.launch.kernel for s in triton_steps(f)] == ["add_kernel", "sub_kernel"]


def keyword_launch(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    # keywords out of parameter order: the tensors must still bind by name
    sub_kernel[(triton.cdiv(n, 64),)](out_ptr=out, BLOCK=64, n=n, y_ptr=x, x_ptr=y)
    return out


def test_keyword_arguments_bind_by_name():
    f = trident.jit(fallback=False)(keyword_launch)
    x, y = randn(150, seed=11), randn(150, seed=12)
    assert torch.equal(f(x, y), y - x)
    assert torch.equal(f(x, y), y - x)
    assert f.stats.hits == 1


def helper_call(x):
    out = torch.empty_like(x)
    double_with_helper_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out


def test_kernel_calling_a_triton_jit_helper():
    f = trident.jit(fallback=False)(helper_call)
    x = randn(100, seed=13)
    assert torch.equal(f(x), x + x)
    assert torch.equal(f(x), x + x)
    assert counts(f)["interpreted"] == 2


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr, tl.sum(tl.load(x_ptr + offs), axis=0))  # tl.sum: a @triton.jit helper


def row_sum(x):
    out = torch.empty(1)
    row_sum_kernel[(1,)](x, out, BLOCK=32)
    return out * 1.0


def test_interpreted_helpers_leave_triton_language_unpatched(tmp_path, monkeypatch):
    from trident.lower import cubins, kernels

    before = {name: getattr(tl.core, name) for name in ("program_id", "arange", "load", "store")}
    f = trident.jit(fallback=False)(row_sum)
    x = randn(32, seed=40)
    assert torch.allclose(f(x), x.sum().reshape(1), rtol=1e-5, atol=1e-5)
    assert f.stats.interpreted_launches == 1
    # compiling still works afterwards (a fresh Triton cache: a cached compile skips the front
    # end) ...
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    (step,) = triton_steps(f)
    launch = dataclasses.replace(step.launch, device="cuda:0")
    try:
        cubins.compile_cuda(row_sum_kernel, launch, (9, 0))
        compiled = None
    except Exception as e:  # noqa: BLE001 (reported below)
        compiled = f"{type(e).__name__}: {str(e).splitlines()[-1]}"
    # ... and triton.language is as it was
    patched = [name for name, value in before.items() if getattr(tl.core, name) is not value]
    assert (patched, compiled) == ([], None)


# ---- 2. heuristics and autotune --------------------------------------------------------------


def heuristic_call(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    heuristic_add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out


def test_heuristics_fix_constexpr_from_arguments():
    f = trident.jit(fallback=False)(heuristic_call)
    for i, (n, block) in enumerate([(100, 32), (1000, 256)]):
        x, y = randn(n, seed=14), randn(n, seed=15)
        assert torch.equal(f(x, y), x + y)
        (step,) = triton_steps(f, i)
        assert param(step.launch, "BLOCK") == ConstexprParam("BLOCK", block)
        assert step.launch.grid == (triton.cdiv(n, block), 1, 1)
    assert counts(f)["interpreted"] == 2


def autotuned_call(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    autotuned_add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out * 1.0


def test_autotune_uses_first_config_on_cpu():
    f = trident.jit(fallback=False)(autotuned_call)
    x, y = randn(1000, seed=16), randn(1000, seed=17)
    assert torch.equal(f(x, y), x + y)
    assert torch.equal(f(x, y), x + y)
    assert counts(f) == dict(hits=1, misses=1, compiles=1, fallbacks=0, traces=1, interpreted=2)
    (step,) = triton_steps(f)
    first = AUTOTUNE_CONFIGS[0]
    assert param(step.launch, "BLOCK").value == first.kwargs["BLOCK"] == 32
    assert step.launch.options["num_warps"] == first.num_warps == 2
    assert step.launch.options["num_stages"] == first.num_stages == 2
    assert step.launch.grid == (triton.cdiv(1000, 32), 1, 1)  # the grid saw the config


def autotuned_heuristic_call(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    autotuned_heuristic_sub[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out


def test_autotune_over_heuristics():
    f = trident.jit(fallback=False)(autotuned_heuristic_call)
    x, y = randn(200, seed=18), randn(200, seed=19)
    assert torch.equal(f(x, y), x - y)
    (step,) = triton_steps(f)
    assert param(step.launch, "BLOCK").value == 64
    assert step.launch.options["num_warps"] == 1
    assert step.launch.grid == (4, 1, 1)


def prehook_call(x):
    out = torch.ones_like(x)
    accumulate_kernel_grid = (triton.cdiv(x.numel(), 64),)
    zeroing_accumulate[accumulate_kernel_grid](x, out, x.numel())
    return out


def test_autotune_config_pre_hook_is_replayed_or_rejected():
    f = trident.jit(fallback=False)(prehook_call)
    x = randn(100, seed=20)
    try:
        out = f(x)
    except trident.TridentError as e:
        assert "pre" in str(e) and "hook" in str(e)
        return
    assert torch.equal(out, x)  # pre_hook zeroes out, then out += x


# ---- 3. launch options -----------------------------------------------------------------------


def warps_call(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64, num_warps=2, num_stages=1)
    return out


def test_num_warps_at_launch_is_a_launch_option():
    f = trident.jit(fallback=False)(warps_call)
    x, y = randn(300, seed=21), randn(300, seed=22)
    assert torch.equal(f(x, y), x + y)
    (step,) = triton_steps(f)
    assert step.launch.options == {"num_warps": 2, "num_stages": 1}
    # options are not kernel parameters
    assert [p.name for p in step.launch.params] == ["x_ptr", "y_ptr", "out_ptr", "n", "BLOCK"]
    assert torch.equal(f(x, y), x + y)
    assert counts(f)["interpreted"] == 2


# ---- 4. kernels that mutate their inputs -----------------------------------------------------


def inplace_then_torch(x, a):
    before = x * 3.0
    axpb_inplace_kernel[(triton.cdiv(x.numel(), 64),)](x, x.numel(), a, 1.0, BLOCK=64)
    return x + before, before


def test_kernel_mutates_callers_tensor_in_place():
    f = trident.jit(fallback=False)(inplace_then_torch)
    x0 = randn(3, 50, seed=23)
    for call in range(1, 4):
        x = x0.clone()
        ptr = x.data_ptr()
        out, before = f(x, 0.5)
        want_x = x0 * 0.5 + 1.0
        assert x.data_ptr() == ptr
        assert torch.allclose(x, want_x, rtol=1e-6, atol=1e-6), "the caller's tensor"
        # ops after the launch see the mutation; ops before it do not
        assert torch.equal(before, x0 * 3.0)
        assert torch.equal(out, x + x0 * 3.0)
        assert counts(f)["interpreted"] == call
    assert f.stats.hits == 2


def inplace_view(x):
    v = x[:, 2:]  # a strided view: the kernel treats it as flat, so pass rows separately
    for i in range(v.shape[0]):
        axpb_inplace_kernel[(1,)](v[i], v.shape[1], 2.0, -1.0, BLOCK=64)
    return x


def test_kernel_mutates_a_view_of_the_input_and_returns_the_input():
    f = trident.jit(fallback=False)(inplace_view)
    x0 = randn(3, 10, seed=24)
    x = x0.clone()
    out = f(x)
    want = x0.clone()
    want[:, 2:] = want[:, 2:] * 2.0 - 1.0
    assert torch.allclose(x, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(x[:, :2], x0[:, :2])  # untouched columns stay bit-identical
    assert torch.equal(out, x)
    assert counts(f)["interpreted"] == 3


# ---- 5. Liger-Kernel's Triton kernels through the interpreter -------------------------------

try:
    from liger_kernel.transformers import functional as liger_functional
except ImportError:  # pragma: no cover
    liger_functional = None

needs_liger = pytest.mark.skipif(liger_functional is None, reason="needs liger-kernel")


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_block(q, k, cos, sin):
    q = q * 0.5
    q_rot, k_rot = liger_functional.liger_rope(q, k, cos, sin)
    return q_rot + 1.0, k_rot.sum(-1)


@needs_liger
def test_liger_rope():
    f = trident.jit(fallback=False)(rope_block)
    B, H, KH, S, HD = 2, 4, 2, 8, 16
    q, k = randn(B, H, S, HD, seed=25), randn(B, KH, S, HD, seed=26)
    cos = randn(1, S, HD // 2, seed=27).repeat(1, 1, 2)
    sin = randn(1, S, HD // 2, seed=28).repeat(1, 1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    qh = q * 0.5
    want_q = (qh * c + _rotate_half(qh) * s) + 1.0
    want_k = (k * c + _rotate_half(k) * s).sum(-1)
    q_in, k_in = q.clone(), k.clone()
    for call in range(1, 3):
        got_q, got_k = f(q, k, cos, sin)
        assert got_q.shape == want_q.shape and got_k.shape == want_k.shape
        assert torch.allclose(got_q, want_q, rtol=1e-5, atol=1e-5)
        assert torch.allclose(got_k, want_k, rtol=1e-5, atol=1e-5)
        assert torch.equal(q, q_in) and torch.equal(k, k_in)  # liger works on copies
        assert counts(f) == dict(hits=call - 1, misses=1, compiles=1, fallbacks=0, traces=1,
                                 interpreted=call)
    assert [s.launch.kernel for s in triton_steps(f)] == ["_triton_rope"]


def softmax_block(x, bias):
    return liger_functional.liger_softmax(x + bias).relu() * 2.0


@needs_liger
def test_liger_softmax():
    f = trident.jit(fallback=False)(softmax_block)
    x, bias = randn(6, 50, seed=29), randn(50, seed=30)
    want = torch.softmax(x + bias, dim=-1) * 2.0
    for call in range(1, 3):
        got = f(x, bias)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
        assert torch.allclose(got.sum(-1), torch.full((6,), 2.0), rtol=1e-5)
        assert counts(f)["interpreted"] == call
    assert f.stats.hits == 1 and f.stats.fallbacks == 0
    assert len(triton_steps(f)) == 1


def relu_squared_block(x):
    y = liger_functional.liger_relu_squared(x - 0.25)
    return y + x, y.mean()


@needs_liger
def test_liger_relu_squared():
    f = trident.jit(fallback=False)(relu_squared_block)
    x = randn(4, 64, seed=31)
    sq = torch.relu(x - 0.25) ** 2
    for call in range(1, 3):
        y, m = f(x)
        assert torch.allclose(y, sq + x, rtol=1e-6, atol=1e-6)
        assert torch.allclose(m, sq.mean(), rtol=1e-5, atol=1e-6)
        assert counts(f)["interpreted"] == call
    assert f.stats.hits == 1 and f.stats.fallbacks == 0
    assert len(triton_steps(f)) == 1


# ---- 6. CUDA code generation without a GPU ---------------------------------------------------


def unaligned_call(x, y):
    xs = x[1:]  # float32: 4 bytes past an aligned root, so not 16-byte aligned
    out = torch.empty_like(y)
    n = y.numel()
    # 256 elements over 64 threads: 4 per thread, vectorized only where pointers are aligned
    strided_add_kernel[(triton.cdiv(n, 256),)](xs, y, out, n, 1, BLOCK=256, num_warps=2)
    return out


def _retarget_to_cuda(jf, spec_index: int = 0):
    """A deep copy of ``jf``'s specialization with its Triton launches compiled for sm_90."""
    from trident.lower import cubins, kernels

    spec = copy.deepcopy(jf._specs[spec_index])
    for step in triton_steps_of(spec):
        step.launch = dataclasses.replace(step.launch, device="cuda:0")
        step.binary = cubins.compile_cuda(kernels.find_kernel(step.launch.ref, jf._fn),
                                          step.launch, (9, 0))
    return spec


def _launch_block(source: str, kernel: str) -> str:
    """The C block of the launch of ``kernel``: from its step comment to the launch call."""
    end = source.index(f"trt_cuda_launch(&{kernel},")
    start = source.rindex("/* ", 0, source.rindex("CUdeviceptr p0", 0, end))
    return source[start:end]


def test_cuda_codegen_and_build_without_gpu(tmp_path):
    from trident import build, runtime
    from trident.codegen import render as codegen

    f = trident.jit(fallback=False)(add_tuple_grid)
    x, y = randn(1000, seed=32), randn(1000, seed=33)
    assert torch.equal(f(x, y), x + y)
    spec = _retarget_to_cuda(f)
    (step,) = triton_steps_of(spec)
    binary = step.binary
    assert binary.arch == "sm_90"
    assert binary.name == "add_kernel"
    assert binary.threads == 32 * 4  # Triton's default num_warps
    assert binary.arg_types == ("CUdeviceptr",) * 3 + ("int32_t", None)
    cubin = binary.cubin
    assert cubin[:4] == b"\x7fELF"

    rendered = codegen.render(spec, "f")
    source, units = rendered.source, rendered.sources
    assert rendered.callbacks == []  # nothing left for the interpreter
    assert "python_callback" not in source
    assert '#include "trident_cuda.h"' in source
    # trt_cuda_launch(&<kernel>, device 0, stream, grid cdiv(1000, 32) x 1 x 1, params)
    (kernel,) = re.findall(r"trt_cuda_launch\(&(\w+), 0, stream, 32, 1, 1, params\)", source)
    # the cubin is handed over at install (scm_set_cubin), not written into the C as text; the
    # source names its size and SHA-256, so that another cubin makes another module
    assert rendered.cubins == [cubin]
    assert re.search(rf'TRT_SHARED trt_kernel {kernel} = \{{"add_kernel", NULL, 128, ', source)
    assert (f"/* add_kernel: sm_90 cubin, {len(cubin)} bytes, sha256 "
            f"{hashlib.sha256(cubin).hexdigest()} */") in source
    assert "unsigned char" not in source.split("scm_set_cubin", 1)[0]
    launch_block = _launch_block(source, kernel)
    # a[0] is the argument tree's key (Note [Argument trees])
    assert "CUdeviceptr p0 = (CUdeviceptr)a[1].data_ptr;  /* x_ptr */" in launch_block
    assert "CUdeviceptr p1 = (CUdeviceptr)a[2].data_ptr;  /* y_ptr */" in launch_block
    assert re.search(r"if \(rt->data_ptr\(v\[\d+\], &p2_data\)\) \{ rt->set_error\(", launch_block)
    assert "CUdeviceptr p2 = (CUdeviceptr)p2_data;  /* out_ptr */" in launch_block
    assert "int32_t p3 = 1000;  /* n */" in launch_block
    assert "void* params[] = {&p0, &p1, &p2, &p3, &scratch[0], &scratch[1]};" in launch_block
    assert "rt->cuda_stream(0, &stream)" in launch_block
    cuda_header = (runtime.HEADER.parent / "trident_cuda.h").read_text()
    assert "static int trt_cuda_launch(" in cuda_header and "cuLaunchKernelEx" in cuda_header

    module = build.build(units, tmp_path / "cuda-build")
    # libcuda is opened at the first launch, so a module holding cubins loads without a GPU
    assert module.lib.scm_init(runtime.load().api_address()) == 0
    assert module.lib.scm_set_cubin(0, cubin, len(cubin)) == 0
    assert module.lib.scm_set_cubin(1, cubin, len(cubin)) == 1  # the module has one kernel


def test_cuda_codegen_specializes_ones_and_unaligned_pointers(tmp_path):
    from trident import build, runtime
    from trident.codegen import render as codegen

    f = trident.jit(fallback=False)(unaligned_call)
    x, y = randn(129, seed=34), randn(128, seed=35)
    assert x.data_ptr() % 16 == 0
    assert torch.equal(f(x, y), x[1:] + y)
    (cpu_step,) = triton_steps(f)
    assert param(cpu_step.launch, "x_ptr").aligned is False
    assert param(cpu_step.launch, "y_ptr").aligned is True
    assert param(cpu_step.launch, "out_ptr").aligned is True  # a fresh allocation
    assert param(cpu_step.launch, "x_stride") == ScalarParam("x_stride", 1)

    spec = _retarget_to_cuda(f)
    (step,) = triton_steps_of(spec)
    binary = step.binary
    names = [p.name for p in step.launch.params]
    types = dict(zip(names, binary.arg_types))
    assert types["x_stride"] is None  # an int equal to 1 is specialized away by Triton
    assert types["BLOCK"] is None
    assert types["n"] == "int32_t"
    assert binary.threads == 64  # num_warps=2 at the launch
    units = codegen.render(spec, "f").sources
    source = "\n".join(units)
    assert "/* x_stride */" not in source
    (kernel,) = re.findall(r"trt_cuda_launch\(&(\w+), 0, stream, 1, 1, 1, params\)", source)
    assert re.search(rf'TRT_SHARED trt_kernel {kernel} = \{{"strided_add_kernel", \w+, 64, ', source)
    launch_block = _launch_block(source, kernel)
    # x[1:] is a view computed in C (Note [Views in C]): the launch reads the storage's data at
    # the view's offset, and no tensor is made for it
    assert re.search(r"CUdeviceptr p0 = \(CUdeviceptr\)\(w\[(\d+)\]\.data \+ w\[\1\]\.offset \* "
                     r"w\[\1\]\.itemsize\);  /\* x_ptr \*/", launch_block)
    assert re.search(r"trt_view_slice\(&in, 0, 1LL, \S+, 1LL, &w\[", source)
    assert "view_tensor" not in source
    assert "CUdeviceptr p1 = (CUdeviceptr)a[2].data_ptr;  /* y_ptr */" in launch_block
    assert "int32_t p3 = 128;  /* n */" in launch_block
    assert "void* params[] = {&p0, &p1, &p2, &p3, &scratch[0], &scratch[1]};" in launch_block
    module = build.build(units, tmp_path / "cuda-build")
    assert module.lib.scm_init(runtime.load().api_address()) == 0

    # the unaligned pointer compiles differently from an aligned one (no tt.divisibility, so
    # no vector loads of x)
    aligned = dataclasses.replace(step.launch, params=tuple(
        dataclasses.replace(p, aligned=True) if p.name == "x_ptr" else p
        for p in step.launch.params))
    from trident.lower import cubins, kernels

    aligned_binary = cubins.compile_cuda(kernels.find_kernel(aligned.ref, f._fn), aligned, (9, 0))
    assert aligned_binary.cubin != binary.cubin


def test_cuda_codegen_of_a_symbolic_launch(tmp_path):
    """Note [Symbolic launches]: ``n`` and the grid are C expressions over the argument's size;
    the kernel is compiled once for the traced ``n``'s class (not divisible by 16)."""
    from trident import build, runtime
    from trident.codegen import render as codegen

    f = trident.jit(fallback=False, dynamic=True)(add_callable_grid)
    x, y = randn(1000, seed=38), randn(1000, seed=39)
    assert torch.equal(f(x, y), x + y)
    spec = _retarget_to_cuda(f)
    (step,) = triton_steps_of(spec)
    assert step.binary.arg_types == ("CUdeviceptr",) * 3 + ("int32_t", None)
    units = codegen.render(spec, "f").sources
    source = "\n".join(units)
    grid = r"\(unsigned\)\(trt_floordiv\(63LL \+ a\[1\]\.sizes\[0\], 64LL\)\), 1, 1"
    (kernel,) = re.findall(rf"trt_cuda_launch\(&(\w+), 0, stream, {grid}, params\)", source)
    assert "int32_t p3 = (int32_t)a[1].sizes[0];  /* n = x.size(0) */" in _launch_block(source,
                                                                                      kernel)
    assert "% 16" in "".join(g.words(spec.arg_names) for g in spec.guards)
    module = build.build(units, tmp_path / "cuda-build")
    assert module.lib.scm_init(runtime.load().api_address()) == 0


def add_direct(x, y):
    out = torch.empty_like(y)
    add_kernel[(triton.cdiv(y.numel(), 64),)](x, y, out, y.numel(), BLOCK=64)
    return out


def test_unaligned_argument_is_its_own_specialization():
    f = trident.jit(fallback=False)(add_direct)
    base, y = randn(101, seed=36), randn(100, seed=37)
    aligned, unaligned = base[:100].clone(), base[1:]
    assert unaligned.data_ptr() % 16 != 0
    assert torch.equal(f(aligned, y), aligned + y)
    assert torch.equal(f(unaligned, y), unaligned + y)
    assert f.stats.compiles == 2
    assert "data_ptr() % 16" in f.stats.miss_reasons[-1]
    assert param(triton_steps(f, 0)[0].launch, "x_ptr").aligned is True
    assert param(triton_steps(f, 1)[0].launch, "x_ptr").aligned is False
    assert torch.equal(f(unaligned, y), unaligned + y)
    assert torch.equal(f(aligned, y), aligned + y)
    assert counts(f) == dict(hits=2, misses=2, compiles=2, fallbacks=0, traces=2, interpreted=4)


# ---- 7. across processes ---------------------------------------------------------------------

SCRIPT = '''
import torch
import triton
import triton.language as tl

import trident
from trident.ir import sizes
from trident.ir.plan import TritonStep


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, ALPHA: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * ALPHA + tl.load(y_ptr + offs, mask=mask), mask=mask)


axpy = triton.heuristics({"ALPHA": lambda args: ALPHA_VALUE})(axpy_kernel)


@trident.jit(fallback=False)
def f(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    axpy[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, BLOCK=64)
    return out * 2.0, out.sum()


x = torch.arange(300, dtype=torch.float32)
y = torch.full((300,), 0.5)
want = x * ALPHA_VALUE + y
ok = True
for _ in range(3):
    out, total = f(x, y)
    ok = ok and torch.equal(out, want * 2.0) and torch.equal(total, want.sum())
s = f.stats
alpha = [p.value for st in f._specs[0].plan.steps if isinstance(st, TritonStep)
         for p in st.launch.params if p.name == "ALPHA"]
RESULT = (f"RESULT ok={ok} traces={s.traces} compiles={s.compiles} hits={s.hits} "
          f"misses={s.misses} interpreted={s.interpreted_launches} alpha={alpha}")
'''


def _run_script(folder) -> str:
    """``SCRIPT``'s result, run as a new process would import it (``fresh_imports``)."""
    with fresh_imports(folder):
        return importlib.import_module("triton_script").RESULT


def test_second_process_reuses_the_cached_specialization(tmp_path):
    (tmp_path / "triton_script.py").write_text(SCRIPT.replace("ALPHA_VALUE", "1"))
    first = _run_script(tmp_path)
    assert first == ("RESULT ok=True traces=1 compiles=1 hits=2 misses=1 interpreted=3 "
                     "alpha=[1]")
    second = _run_script(tmp_path)
    assert second == ("RESULT ok=True traces=0 compiles=0 hits=3 misses=0 interpreted=3 "
                      "alpha=[1]")


def test_editing_a_heuristic_invalidates_the_cache(tmp_path):
    script = tmp_path / "triton_script.py"
    script.write_text(SCRIPT.replace("ALPHA_VALUE", "1"))
    assert _run_script(tmp_path).startswith("RESULT ok=True traces=1 ")
    script.write_text(SCRIPT.replace("ALPHA_VALUE", "3"))
    second = _run_script(tmp_path)
    assert second.startswith("RESULT ok=True traces=1 ") and second.endswith("alpha=[3]"), second


# ---- 8. unsupported kernel arguments ---------------------------------------------------------


def list_argument(x):
    out = torch.empty_like(x)
    add_kernel[(1,)](x, x, out, [1, 2], BLOCK=128)
    return out


def test_unsupported_kernel_argument_raises_without_fallback():
    f = trident.jit(fallback=False)(list_argument)
    with pytest.raises(trident.TridentError, match=r"add_kernel.*'n'.*list"):
        f(randn(100, seed=38))
    assert f.stats.fallbacks == 0 and f.stats.compiles == 0 and f.stats.traces == 1
    assert f.specializations == []


def test_unsupported_kernel_argument_warns_with_fallback():
    f = trident.jit(list_argument)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            f(randn(100, seed=39))
        except Exception:  # eager Triton on CPU tensors: no driver without TRITON_INTERPRET
            pass
    messages = [str(w.message) for w in caught]
    assert any("add_kernel" in m and "list" in m for m in messages), messages
    assert f.stats.fallbacks == 1 and f.stats.compiles == 0


def test_eager_fallback_interprets_cpu_launches():
    """A call Trident runs eagerly (here: an argument that requires grad under grad mode) runs
    its CPU launches through Triton's interpreter, as the served calls do."""
    f = trident.jit(add_tuple_grid)
    x, y = randn(100, seed=40), randn(100, seed=41)
    assert torch.equal(f(x, y), x + y)
    x.requires_grad_(True)
    assert torch.equal(f(x, y), (x + y).detach())
    assert counts(f) == dict(hits=0, misses=2, compiles=1, fallbacks=1, traces=1, interpreted=1)


def test_interpreted_launches_do_not_keep_the_function_alive():
    """The runtime keeps a CPU launch's Python callback for the process; the callback holds the
    JitFunction weakly, so a dropped function is freed (it held every compiled module)."""
    import gc
    import weakref

    f = trident.jit(fallback=False)(add_callable_grid)
    a, b = randn(100, seed=3), randn(100, seed=4)
    for _ in range(2):
        assert torch.equal(f(a, b), a + b)
    assert f.stats.interpreted_launches == 2
    ref = weakref.ref(f)
    del f
    gc.collect()
    assert ref() is None


def test_symbolic_guards_state_each_condition_once():
    """The range a 32-bit kernel argument needs (``< 2**31``, from the ShapeEnv) and the range of
    the size it is (``<= 2**31 - 1``) are one condition: one guard (Note [Symbolic guards])."""
    f = trident.jit(fallback=False, dynamic=True)(add_callable_grid)
    a = randn(1000, seed=1)
    assert torch.equal(f(a, a), a + a)
    (spec,) = f._specs
    words = [g.words(spec.arg_names) for g in spec.guards if g.field == "sym"]
    assert [w for w in words if "214748364" in w] == ["x.size(0) <= 2147483647"], words
    assert len(set(words)) == len(words)


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def _double(x):
    out = torch.empty_like(x)
    n = x.numel()
    _double_kernel[(1,)](x, out, n, BLOCK=triton.next_power_of_2(n))
    return out


def test_a_constexpr_of_next_power_of_2_of_a_size_is_reported_briefly(caplog):
    """Automatic dynamic cannot make ``n`` symbolic where ``triton.next_power_of_2(n)`` is a
    constexpr (its guard is bitwise ors of ``n``, which the C guards do not compute): the
    recompiles log says so in a bounded line naming the constexpr and the user's line (it
    printed the ~3 KB sympy expression), and every size compiles statically."""
    jf = trident.jit(_double)
    with caplog.at_level("INFO", logger="trident.recompiles"):
        for n in (5, 7, 9):
            x = torch.randn(n)
            assert torch.equal(jf(x), x * 2)
    (line,) = [r.getMessage() for r in caplog.records if "dynamic dims" in r.getMessage()]
    assert len(line) < 500, line
    assert "_double_kernel's constexpr BLOCK at test_triton.py:" in line, line
    assert "BLOCK=triton.next_power_of_2(n)" in line and "BitwiseFn_bitwise_or" in line, line
    s = jf.stats
    assert (s.compiles, s.misses, s.fallbacks) == (3, 3, 0), s
    assert all(len(r) < 500 for r in s.miss_reasons), s.miss_reasons
