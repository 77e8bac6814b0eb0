"""User Triton kernels under ``torch.compile(backend="trident")`` on the GPU (skipped without CUDA).

The scenarios PyTorch's own tests cover for user-defined Triton kernels under torch.compile
(test/dynamo/test_triton_kernels.py in PyTorch 2.11), written again for Trident: each compiled
function equals eager PyTorch bit for bit, on the first calls and on replays, and is served by a
Specialization Cache Module (no eager fallback).
"""

import pytest
import torch

from trident.frontend.backend import trident_backend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

triton = pytest.importorskip("triton")
tl = triton.language

from _triton_kernels import add_kernel  # noqa: E402


@triton.jit
def mul2_inplace_kernel(ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(ptr + offs, tl.load(ptr + offs, mask=mask) * 2, mask=mask)


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, ACTIVATION: tl.constexpr,
                      BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    z = tl.load(x_ptr + offs, mask=mask) + alpha * tl.load(y_ptr + offs, mask=mask)
    if ACTIVATION == "relu":
        z = tl.maximum(z, 0)
    tl.store(out_ptr + offs, z, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4),
                          triton.Config({"BLOCK": 512}, num_warps=8)], key=["n"])
@triton.jit
def autotuned_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


@triton.heuristics({"BLOCK": lambda args: 256 if args["n"] < 4096 else 1024})
@triton.jit
def heuristic_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


def check(fn, *args, calls=3):
    """torch.compile(fn, backend=trident) equals fn on copies of args, call after call."""
    made = []

    def backend(gm, example_inputs):
        compiled = trident_backend(gm, example_inputs)
        made.append(compiled)
        return compiled

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    for _ in range(calls):
        c_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        e_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        got, want = compiled(*c_args), fn(*e_args)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)
        for a, b in zip(c_args, e_args):  # the same writes to the inputs
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b)
    assert made, "Dynamo did not call the backend"
    assert all(m.stats.fallbacks == 0 and m.stats.compiles >= 1 for m in made), \
        [m.stats for m in made]
    return made


def vec(n=3000, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, device="cuda", generator=g).to(dtype)


def test_constexpr_arguments():
    def fn(x, y):
        out = torch.empty_like(x)
        scaled_add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), 0.5,
                                                           ACTIVATION="relu", BLOCK=256)
        return out * 2

    check(fn, vec(), vec(seed=1))


def test_grid_callable_over_meta_parameters():
    def fn(x, y):
        out = torch.empty_like(x)
        grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)  # noqa: E731
        add_kernel[grid](x, y, out, x.numel(), BLOCK=512)
        return out

    check(fn, vec(5000), vec(5000, seed=1))


def test_autotuned_kernel_with_a_grid_callable():
    def fn(x, y):
        out = torch.empty_like(x)
        grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)  # noqa: E731
        autotuned_add_kernel[grid](x, y, out, x.numel())
        return out.relu()

    check(fn, vec(4000), vec(4000, seed=1))


def test_heuristics():
    def fn(x, y):
        out = torch.empty_like(x)
        heuristic_add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel())
        return out

    check(fn, vec(1000), vec(1000, seed=1))


def test_one_kernel_called_twice():
    def fn(x, y):
        a, b = torch.empty_like(x), torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, a, x.numel(), BLOCK=256)
        add_kernel[(triton.cdiv(x.numel(), 256),)](a, a, b, x.numel(), BLOCK=256)
        return a, b

    check(fn, vec(), vec(seed=1))


def test_kernel_mutates_an_input():
    def fn(x):
        mul2_inplace_kernel[(triton.cdiv(x.numel(), 256),)](x, x.numel(), BLOCK=256)
        return x + 1

    check(fn, vec())


def test_views_and_slices_as_kernel_arguments():
    def fn(x, y):
        out = torch.zeros_like(x)
        n = x.shape[1] // 2
        for row in range(x.shape[0]):
            add_kernel[(triton.cdiv(n, 128),)](x[row, :n], y[row, n:], out[row, n:], n,
                                               BLOCK=128)
        return out

    check(fn, torch.randn(4, 512, device="cuda"), torch.randn(4, 512, device="cuda"))


def test_kernel_inside_a_triton_op_custom_op():
    from torch.library import triton_op, wrap_triton

    @triton_op("trident_test::fused_add", mutates_args={})
    def fused_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        wrap_triton(add_kernel)[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
        return out

    def fn(x, y):
        return fused_add(x, y).sin()

    check(fn, vec(), vec(seed=1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int32])
def test_several_dtypes(dtype):
    def fn(x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
        return out * 3

    x = (vec() * 10).to(dtype)
    y = (vec(seed=1) * 10).to(dtype)
    check(fn, x, y)


def test_no_grad_and_inference_mode():
    def fn(x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
        return torch.tanh(out)

    with torch.no_grad():
        check(fn, vec(), vec(seed=1))
    with torch.inference_mode():
        check(fn, vec(), vec(seed=1))
