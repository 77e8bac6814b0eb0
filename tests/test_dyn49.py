"""Note [Dims of a failed size expression] (frontend/dynamic.py): a dynamic compile that fails on
a size expression the C guards cannot compute (``triton.next_power_of_2`` of a size) makes the
dims that expression reads static, for this function from now on; the other dims stay symbolic.

Triton kernels run on CPU tensors through Triton's interpreter, called back from the SCM (as in
tests/test_triton.py); eager references are plain torch, exact on inputs of +-2 (each row's mean
square is 4, its reciprocal square root 0.5: no rounding for the interpreter's numpy and torch to
differ in).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import counts

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

SIZES = [(3, 8), (5, 8), (2, 33), (7, 33), (11, 33), (4, 33)]
EPS = 0.0


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (x * r * w).to(out_ptr.dtype.element_ty), mask=m)


def rmsnorm(x, w, eps: float):
    out = torch.empty_like(x)
    _rmsnorm_kernel[(x.shape[0],)](x, w, out, x.stride(0), out.stride(0), x.shape[1], eps,
                                   BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def reference(x, w, eps):
    r = 1.0 / torch.sqrt((x * x).sum(1, keepdim=True) / x.shape[1] + eps)
    return x * r * w


def inputs(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 2, (rows, cols), generator=g).float() * 4 - 2
    return x, torch.randint(-3, 4, (cols,), generator=g).float()


def run_sizes(jf):
    for seed, (rows, cols) in enumerate(SIZES):
        x, w = inputs(rows, cols, seed)
        assert torch.equal(jf(x, w, EPS), reference(x, w, EPS)), (rows, cols)


def shapes(jf):
    return [s.split("(", 1)[1].split(", eps")[0] for s in jf.specializations]


def test_next_power_of_2_block_specializes_the_columns_only(caplog):
    """Automatic: (3, 8) exact, (5, 8) rows symbolic; (2, 33) tries rows, columns and
    ``w.shape[0]`` symbolic, fails on the BLOCK of the columns, and compiles again with the
    columns static, rows and ``w`` symbolic: the last three hit it (it compiled 6 times, every
    size after the failure at exact sizes)."""
    jf = trident.jit(rmsnorm)
    with caplog.at_level("INFO", logger="trident.recompiles"):
        run_sizes(jf)
    assert counts(jf) == (3, 3, 0), jf.stats.miss_reasons
    assert jf.stats.misses == 3
    assert shapes(jf) == ["x: float32[3, 8] cpu, w: float32[8] cpu",
                          "x: float32[?, 8] cpu, w: float32[8] cpu",
                          "x: float32[?, 33] cpu, w: float32[?] cpu"]
    (line,) = [r.getMessage() for r in caplog.records if "not compiled" in r.getMessage()]
    assert "BitwiseFn_bitwise_or" in line and len(line) < 700, line
    assert line.endswith("specializing on {'x': [1]} from now on"), line
    x, w = inputs(6, 20, 9)  # new columns: the columns' dim compiles exact, rows symbolic
    assert torch.equal(jf(x, w, EPS), reference(x, w, EPS))
    assert counts(jf) == (4, 3, 0)
    assert shapes(jf)[-1] == "x: float32[?, 20] cpu, w: float32[?] cpu", shapes(jf)
    x, w = inputs(9, 20, 10)
    assert torch.equal(jf(x, w, EPS), reference(x, w, EPS))
    assert counts(jf) == (4, 4, 0)


def test_asked_dims_stay_symbolic_after_a_failed_size_expression():
    """``dynamic={"x": [0]}``: the rows stay symbolic through the failure (it compiled each
    new row count of 33 columns exactly)."""
    jf = trident.jit(rmsnorm, dynamic={"x": [0]})
    run_sizes(jf)
    assert counts(jf) == (2, 4, 0), jf.stats.miss_reasons
    assert shapes(jf) == ["x: float32[?, 8] cpu, w: float32[8] cpu",
                          "x: float32[?, 33] cpu, w: float32[?] cpu"]


def _next_power_of_2_in_python(x, y):
    """The failing expression is a guard of the trace (a Python branch on the bitwise ors of
    ``x.shape[1]``), not a constexpr: the ``symbolic_guards`` path."""
    if triton.next_power_of_2(x.shape[1]) == x.shape[1]:
        return x.sum(1) + y
    return x.sum(1) - y


def test_a_guard_on_next_power_of_2_specializes_its_dim_only():
    jf = trident.jit(_next_power_of_2_in_python)
    for rows, cols in [(3, 8), (5, 8), (2, 6), (7, 6), (11, 6), (4, 16)]:
        x, y = torch.arange(float(rows * cols)).reshape(rows, cols), torch.arange(float(rows))
        assert torch.equal(jf(x, y), _next_power_of_2_in_python(x, y)), (rows, cols)
    assert counts(jf) == (4, 2, 0), jf.stats.miss_reasons


def test_a_failure_naming_no_dims_specializes_every_size_as_before():
    """A dynamic compile that fails where no size expression names the dims (Python asks
    whether a size is an int) keeps the fallback: every size specialized from then on, the
    other argument's too (a guard of today's behaviour: it passes without the change too)."""
    def f(x, y):
        return x * 2 + y.sum() if isinstance(x.shape[0], int) else x + y.sum()

    jf = trident.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n, m in [(3, 4), (5, 4), (6, 4), (7, 9), (7, 9), (8, 10)]:
            x, y = torch.arange(float(n)), torch.arange(float(m))
            assert torch.equal(jf(x, y), f(x, y)), (n, m)
    assert counts(jf) == (5, 1, 0), jf.stats.miss_reasons
    assert jf._static_dims == {}
