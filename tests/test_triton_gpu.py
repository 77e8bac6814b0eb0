"""Triton kernels launched natively by the SCM on the GPU (skipped without CUDA).

Every result is compared with eager PyTorch + Triton bit for bit: the same cubin (Triton's own
specialization, recomputed by trident.lower.cubins.compile_cuda) on the same data.
"""

import sys

import pytest
import torch

import trident
from trident.ir.plan import TritonStep

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

triton = pytest.importorskip("triton")
tl = triton.language

from _triton_kernels import add_kernel, scale_inplace_kernel  # noqa: E402


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4),
                          triton.Config({"BLOCK": 1024}, num_warps=8)], key=["n"])
@triton.jit
def autotuned_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"]) if args["n"] < 4096
                    else 4096})
@triton.jit
def heuristic_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


def add_relu(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return torch.relu(out)


def assert_same(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), (a - b).abs().max()


def run_both(fn, *args):
    """(trident result on the second call, eager result), each on its own copies of args."""
    f = trident.jit(fn, fallback=False)
    tr_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    f(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    got = f(*tr_args)
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    want = fn(*eager_args)
    torch.cuda.synchronize()
    for a, b in zip(tr_args, eager_args):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), "in-place writes differ"
    return f, got, want


def test_add_relu_is_native_and_exact():
    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    f, got, want = run_both(add_relu, x, y)
    assert_same(got, want)
    assert f.stats.interpreted_launches == 0
    assert (f.stats.misses, f.stats.hits) == (1, 1)
    del got  # Note [Graph outputs]: a result kept across calls makes a copy-out recapture
    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame) if event == "call" else None)
    try:
        for _ in range(1000):
            f(x, y)
    finally:
        sys.setprofile(None)
    assert calls == []


def test_in_place_kernel_and_scalar_args():
    def fn(x, s: float):
        scale_inplace_kernel[(triton.cdiv(x.numel(), 256),)](x, x.numel(), s, BLOCK=256)
        return x.sum()

    x = torch.randn(3000, device="cuda")
    _, got, want = run_both(fn, x, 0.5)
    assert_same(got, want)


def test_views_and_unaligned_pointers_recompile_not_reuse():
    def fn(x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
        return out

    base = torch.randn(4097, device="cuda")
    y = torch.randn(4096, device="cuda")
    f = trident.jit(fn, fallback=False)
    assert_same(f(base[:4096], y), fn(base[:4096], y))
    assert_same(f(base[1:], y), fn(base[1:], y))  # 4-byte offset: not 16-byte aligned
    assert f.stats.compiles == 2
    aligned = [p.aligned for s in f._specs for st in s.plan.steps if isinstance(st, TritonStep)
               for p in st.launch.params if p.name == "x_ptr"]
    assert aligned == [True, False]


def test_int_equal_to_one_is_its_own_specialization():
    def fn(x, y, n: int):
        out = torch.zeros_like(x)
        add_kernel[(1,)](x, y, out, n, BLOCK=1024)
        return out

    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    f = trident.jit(fn, fallback=False)
    assert_same(f(x, y, 1), fn(x, y, 1))
    assert_same(f(x, y, 16), fn(x, y, 16))
    assert_same(f(x, y, 17), fn(x, y, 17))
    types = [st.binary.arg_types[3] for s in f._specs for st in s.plan.steps
             if isinstance(st, TritonStep)]
    assert types[0] is None and types[1] == types[2] == "int32_t"


def test_autotune_and_heuristics():
    def fn(x, y):
        a = torch.empty_like(x)
        b = torch.empty_like(x)
        n = x.numel()
        autotuned_add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, a, n)
        heuristic_add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, b, n)
        return a, b

    x, y = torch.randn(100000, device="cuda"), torch.randn(100000, device="cuda")
    _, got, want = run_both(fn, x, y)
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_liger_kernels_equal_eager(dtype):
    from liger_kernel.transformers import functional as liger

    def block(h, w_norm, wg, wu, q, k, cos, sin, r):
        x = liger.liger_rms_norm(h, w_norm, 1e-6)
        y, res = liger.liger_fused_add_rms_norm(x, r, w_norm, 1e-6)
        g = torch.nn.functional.linear(y, wg)
        u = torch.nn.functional.linear(y, wu)
        m = liger.liger_swiglu(g, u)
        q2, k2 = liger.liger_rope(q, k, cos, sin)
        return m, res, q2, k2

    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device="cuda", generator=g).to(dtype)

    D, I, H, KV, S, HD = 256, 512, 4, 2, 8, 64
    args = (rnd(S, D), rnd(D), rnd(I, D) / 16, rnd(I, D) / 16, rnd(1, H, S, HD),
            rnd(1, KV, S, HD), rnd(1, S, HD), rnd(1, S, HD), rnd(S, D))
    f, got, want = run_both(block, *args)
    assert_same(got, want)
    assert f.stats.interpreted_launches == 0


def test_liger_cross_entropy_forward_runs_eagerly():
    """Liger's cross-entropy reads ``target_mask.sum().item()`` and asserts on tensor values:
    data-dependent Python that a trace cannot specialize, so the call runs eagerly (counted).
    Where the trace stops depends on how far value reads go (Note [Value reads]): at
    ``.item()`` before, at the kernel launch that takes the read value since (triton 3.6:
    ``int()`` of the trace's None in its launcher); either names liger's file."""
    from liger_kernel.transformers import functional as liger

    def loss(logits, target):
        return liger.liger_cross_entropy(logits, target)

    logits = torch.randn(16, 1000, device="cuda")
    target = torch.randint(0, 1000, (16,), device="cuda")
    f = trident.jit(loss)
    with torch.no_grad(), pytest.warns(UserWarning, match="runs eagerly.*cross_entropy.py"):
        got = f(logits.clone(), target)
    want = loss(logits.clone(), target)
    assert_same(got, want)
    assert f.stats.fallbacks == 1 and f.stats.compiles == 0
    with pytest.raises(trident.TridentError, match="cross_entropy.py"):
        trident.jit(loss, fallback=False)(logits.clone(), target)


def test_several_specializations_and_stream():
    f = trident.jit(add_relu, fallback=False)
    for n in (1000, 2000, 3000):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        assert_same(f(x, y), add_relu(x, y))
    assert f.stats.compiles == 3
    x, y = torch.randn(2000, device="cuda"), torch.randn(2000, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = f(x, y)
    s.synchronize()
    assert_same(out, add_relu(x, y))
    assert f.stats.hits >= 1


@trident.jit
def _nested_add_relu(x, y):
    return add_relu(x, y)


def test_a_nested_jitted_functions_launch_is_native_in_the_outer_specialization():
    """Note [Nested jitted calls]: the launch of a jitted function that another one's traced
    code calls is the outer specialization's (it ran the nested function's launcher with the
    trace's fake tensors: the outer function ran eagerly at every call)."""
    import warnings

    def outer(x, y):
        return _nested_add_relu(x, y) * 2

    f = trident.jit(outer)
    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the nested function runs eagerly in the trace)
        for _ in range(3):
            got = f(x, y)
            assert_same(got, add_relu(x, y) * 2)
            del got
    assert (f.stats.compiles, f.stats.hits, f.stats.fallbacks) == (1, 2, 0), f.stats
    assert f.stats.interpreted_launches == 0
    assert any(isinstance(s, TritonStep) for s in f._specs[0].plan.steps)
