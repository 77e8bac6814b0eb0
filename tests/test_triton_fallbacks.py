"""Triton kernels Trident used to reject, and their eager fallback (issue 12).

Eager Triton on CPU tensors has no driver here ("0 active drivers"), so Trident runs CPU
launches through Triton's interpreter, served or eager; references are torch expressions that
the kernels compute exactly, or, under ``TRITON_INTERPRET=1`` (Note [Interpreted kernels] in
trident/lower/kernels.py), Triton's own interpreted launch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import pytest
import torch

import trident
from trident.ir.launch import ConstexprParam, PreHook, source_digest
from trident.ir.plan import TritonStep

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from _triton_kernels import add_kernel  # noqa: E402


@contextlib.contextmanager
def interpret_mode():
    """``TRITON_INTERPRET=1`` for the kernels decorated inside (triton 3.6 reads the knob when
    ``@triton.jit`` runs)."""
    saved = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = True
    try:
        yield
    finally:
        triton.knobs.runtime.interpret = saved


def stats(jf) -> tuple:
    s = jf.stats
    return s.hits, s.misses, s.compiles, s.fallbacks, s.interpreted_launches


def calls_warning(fn, *args) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught]


def randn(n, seed):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# ---- kernels -----------------------------------------------------------------------------------


@triton.jit
def accumulate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_add(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def relu_fn(v):
    return tl.maximum(v, 0.0)


@triton.jit
def neg_fn(v):
    return -v


@triton.jit
def act_kernel(x_ptr, out_ptr, n, ACT: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, ACT(tl.load(x_ptr + offs, mask=mask)).to(OUT), mask=mask)


# Triton runs a config's pre_hook before every launch of that config (Autotuner.run, 3.6)
zeroing_accumulate = triton.autotune(
    configs=[triton.Config({"BLOCK": 64}, pre_hook=lambda nargs: nargs["out_ptr"].zero_()),
             triton.Config({"BLOCK": 128}, pre_hook=lambda nargs: nargs["out_ptr"].zero_())],
    key=["n"])(accumulate_kernel)

with interpret_mode():
    interpreted_add = triton.jit(add_kernel.fn)
    interpreted_relu = triton.jit(relu_fn.fn)
    interpreted_act = triton.jit(act_kernel.fn)
    interpreted_heuristic_add = triton.heuristics({"BLOCK": lambda a: 32})(interpreted_add)
    interpreted_zeroing = triton.autotune(
        configs=[triton.Config({"BLOCK": 64}, pre_hook=lambda nargs: nargs["out_ptr"].zero_())],
        key=["n"])(triton.jit(accumulate_kernel.fn))
    interpreted_restoring = triton.autotune(  # the hooks run only while benchmarking configs
        configs=[triton.Config({"BLOCK": 64})], key=["n"], restore_value=["out_ptr"],
        reset_to_zero=["x_ptr"])(triton.jit(accumulate_kernel.fn))


# ---- 1. autotune pre_hook: served on the CPU, and an eager fallback that runs it too ---------


def prehook_call(x):
    out = torch.ones_like(x)
    zeroing_accumulate[(triton.cdiv(x.numel(), 64),)](x, out, x.numel())
    return out


def test_pre_hook_kernel_is_served_on_the_cpu():
    """Note [Pre-hooks]: the interpreted launch runs the config's pre_hook first (the call
    used to run eagerly, and the eager fallback raised TridentError itself)."""
    f = trident.jit(prehook_call)
    x = randn(100, 1)
    for _ in range(2):
        out, caught = calls_warning(f, x)
        assert torch.equal(out, x) and caught == []  # zeroed by the pre_hook, then out += x
    assert stats(f) == (1, 1, 1, 0, 2)
    (step,) = [s for s in f._specs[0].plan.steps if isinstance(s, TritonStep)]
    assert step.launch.pre_hook == PreHook(__name__, "zeroing_accumulate", 0)
    again = trident.jit(prehook_call)  # from the stored JSON: the pre_hook found again
    assert torch.equal(again(x), x) and stats(again) == (1, 0, 0, 0, 1)


def test_pre_hook_kernel_in_an_eager_call():
    """A call that runs eagerly (x requires grad) interprets the launch after its pre_hook."""
    f = trident.jit(prehook_call)
    x = randn(100, 9).requires_grad_(True)
    with torch.no_grad():
        want = x.detach().clone()
    out, caught = calls_warning(f, x)
    # the fallback itself says why, once (Note [Argument trees]: never a silent fallback)
    assert torch.equal(out, want) and caught == [
        "trident: prehook_call runs eagerly: x requires grad: Trident serves inference; "
        "autograd runs eagerly"]
    assert stats(f) == (0, 1, 0, 1, 0)


# ---- 2. constexprs that are a tl.dtype or a @triton.jit function ----------------------------


def act_call(x, y):
    a = torch.empty(x.shape, dtype=torch.float16)
    b = torch.empty(y.shape, dtype=torch.float32)
    act_kernel[(triton.cdiv(x.numel(), 32),)](x, a, x.numel(), ACT=relu_fn, OUT=tl.float16,
                                              BLOCK=32)
    act_kernel[(triton.cdiv(y.numel(), 32),)](y, b, y.numel(), ACT=neg_fn, OUT=tl.float32,
                                              BLOCK=32)
    return a, b


def test_dtype_and_function_constexprs_are_served():
    x, y = randn(100, 2), randn(50, 3)
    want = (torch.relu(x).half(), -y)
    f = trident.jit(fallback=False)(act_call)
    for _ in range(2):
        a, b = f(x, y)
        assert torch.equal(a, want[0]) and torch.equal(b, want[1])
    assert stats(f) == (1, 1, 1, 0, 4)
    steps = [s for s in f._specs[0].plan.steps if isinstance(s, TritonStep)]
    constexprs = [{p.name: p.value for p in s.launch.params if isinstance(p, ConstexprParam)}
                  for s in steps]
    assert constexprs == [  # (Note [Kernels of one name]: the source's digest too)
        {"ACT": {"triton_function": {"module": __name__, "qualname": "relu_fn",
                                     "source": source_digest(relu_fn)}},
         "OUT": {"triton_dtype": "fp16"}, "BLOCK": 32},
        {"ACT": {"triton_function": {"module": __name__, "qualname": "neg_fn",
                                     "source": source_digest(neg_fn)}},
         "OUT": {"triton_dtype": "fp32"}, "BLOCK": 32}]
    again = trident.jit(fallback=False)(act_call)  # from the stored JSON: objects made again
    a, b = again(x, y)
    assert torch.equal(a, want[0]) and torch.equal(b, want[1])
    assert stats(again) == (1, 0, 0, 0, 2)


def test_dtype_and_function_constexprs_compile_for_sm90():
    from trident.lower import cubins, kernels

    f = trident.jit(fallback=False)(act_call)
    f(randn(100, 4), randn(50, 5))
    compiled = []
    for step in f._specs[0].plan.steps:
        if isinstance(step, TritonStep):
            launch = dataclasses.replace(step.launch, device="cuda:0")
            binary = cubins.compile_cuda(kernels.find_kernel(launch.ref, f._fn), launch, (9, 0))
            assert binary.cubin[:4] == b"\x7fELF"
            assert binary.arg_types == ("CUdeviceptr", "CUdeviceptr", "int32_t", None, None,
                                        None)
            compiled.append(binary.cubin)
    assert len(compiled) == 2 and compiled[0] != compiled[1]  # one binary per ACT/OUT


# ---- 3. TRITON_INTERPRET=1: InterpretedFunction kernels ----------------------------------------


def interpreted_add_call(x, y):
    out = torch.empty_like(x)
    interpreted_add[(triton.cdiv(x.numel(), 32),)](x, y, out, x.numel(), BLOCK=32)
    return out


def interpreted_heuristic_call(x, y):
    out = torch.empty_like(x)
    interpreted_heuristic_add[(triton.cdiv(x.numel(), 32),)](x, y, out, x.numel())
    return out


def interpreted_act_call(x):
    out = torch.empty(x.shape, dtype=torch.float16)
    interpreted_act[(triton.cdiv(x.numel(), 32),)](x, out, x.numel(), ACT=interpreted_relu,
                                                   OUT=tl.float16, BLOCK=32)
    return out


def interpreted_restoring_call(x):
    out = torch.ones_like(x)
    interpreted_restoring[(triton.cdiv(x.numel(), 64),)](x, out, x.numel())
    return out


@pytest.mark.parametrize("call, n_args", [(interpreted_add_call, 2),
                                          (interpreted_heuristic_call, 2),
                                          (interpreted_act_call, 1),
                                          (interpreted_restoring_call, 1)])
def test_interpreted_kernels_are_served_natively(call, n_args):
    """Under TRITON_INTERPRET=1 every call used to run eagerly (or raise, for heuristics)."""
    args = [randn(100, 6), randn(100, 7)][:n_args]
    want = call(*args)  # eager: Triton's interpreter
    f = trident.jit(fallback=False)(call)
    assert torch.equal(f(*args), want) and torch.equal(f(*args), want)
    assert stats(f) == (1, 1, 1, 0, 2)


def interpreted_prehook_call(x):
    out = torch.ones_like(x)
    interpreted_zeroing[(triton.cdiv(x.numel(), 64),)](x, out, x.numel())
    return out


def test_interpreted_pre_hook_kernel_is_served_as_triton_runs_it():
    f = trident.jit(fallback=False)(interpreted_prehook_call)
    x = randn(100, 8)
    want = interpreted_prehook_call(x)  # eager: Triton's autotuner and interpreter
    assert torch.equal(want, x)
    assert torch.equal(f(x), want) and torch.equal(f(x), want)
    assert stats(f) == (1, 1, 1, 0, 2)
