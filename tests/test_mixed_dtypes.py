"""Operands of mixed floating dtypes (a new user's ``f(x_float32, y_float64)``, session 50):
ops whose kernels refuse the mix while their fake kernels accept it fail the trace, so the call
runs eagerly at once (eager's error, one warning, no compile, one trace); ops that promote, and
Triton launches that load each pointer's own dtype, are served. Note [Checks the fake kernels
skip] in trident/lower/kernel_checks.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import trident

f32 = dict(dtype=torch.float32)
f64 = dict(dtype=torch.float64)


def _args():
    g = torch.Generator().manual_seed(0)
    return dict(a=torch.randn(3, 3, generator=g), b=torch.randn(3, 3, generator=g, **f64),
                v=torch.randn(3, generator=g), v64=torch.randn(3, generator=g, **f64),
                A=torch.randn(2, 3, 3, generator=g), B=torch.randn(2, 3, 3, generator=g, **f64),
                i=torch.tensor([0, 2]), s64=torch.randn(6, generator=g, **f64)[::2])


# Each refused by torch 2.13's CPU kernel and accepted by its fake kernel (a probe of
# FakeTensorMode against eager, session 50).
REFUSED = {
    "mm": lambda a, b, **_: torch.mm(a, b),
    "matmul": lambda a, b, **_: a @ b,
    "addmm": lambda a, v64, **_: torch.addmm(v64, a, a),
    "linear": lambda a, b, **_: F.linear(a, b),
    "linear_bias": lambda a, v64, **_: F.linear(a, a, v64),
    "mv": lambda a, v64, **_: torch.mv(a, v64),
    "conv1d": lambda A, B, **_: F.conv1d(A, B),
    "index_put": lambda a, b, i, **_: a.index_put((i,), b[:2]),
    "index_copy_": lambda a, b, i, **_: a.clone().index_copy_(0, i, b[:2]),
    "index_add": lambda a, b, i, **_: a.index_add(0, i, b[:2]),
    "put": lambda a, v64, i, **_: a.put(i, v64[:2]),
    "layer_norm": lambda a, v, v64, **_: F.layer_norm(a, (3,), v64, v),
    "group_norm": lambda A, v64, **_: F.group_norm(A, 1, v64),
    "batch_norm": lambda a, v64, **_: F.batch_norm(a, v64, v64),
    "cross": lambda a, b, **_: torch.linalg.cross(a, b),
    "cdist": lambda a, b, **_: torch.cdist(a, b),
    "complex": lambda a, b, **_: torch.complex(a, b),
    "polar": lambda a, b, **_: torch.polar(a, b.abs()),
}

SERVED = {
    "add": lambda a, b, **_: a + b,
    "where": lambda a, b, **_: torch.where(a > 0, a, b),
    "cat": lambda a, b, **_: torch.cat([a, b]),
    "copy_": lambda a, b, **_: a.clone().copy_(b) * 2,
    "mm_after_cast": lambda a, b, **_: a.double() @ b,
    # a 3-D input's sliced bias is added in place after the product (a contiguous one fuses
    # into addmm, which refuses it): the check runs on the operands' own strides
    "linear_sliced_bias": lambda A, a, s64, **_: F.linear(A, a, s64),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_mix_runs_eagerly_at_once(name):
    fn = REFUSED[name]
    kw = _args()
    with pytest.raises(Exception) as eager:
        fn(**kw)
    jf = trident.jit(lambda **kw: fn(**kw))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with pytest.raises(type(eager.value)) as got:
                jf(**_args())
            assert str(got.value) == str(eager.value)
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1 and "fake kernel skips" in said[0], said
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks, s.traces) == (0, 3, 0, 3, 1), s
    same = {k: v.float() if v.is_floating_point() else v for k, v in _args().items()}
    for _ in range(2):  # operands of one dtype: compiled and served
        assert torch.equal(jf(**same), fn(**same))
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks, s.traces) == (1, 4, 1, 3, 2), s


@pytest.mark.parametrize("name", sorted(SERVED))
def test_promoting_mix_is_served(name):
    fn = SERVED[name]
    jf = trident.jit(lambda **kw: fn(**kw))
    for _ in range(2):
        want = fn(**_args())
        got = jf(**_args())
        assert got.dtype == want.dtype and torch.equal(got, want)
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (1, 1, 1, 0), s


def test_triton_launch_of_mixed_pointers_is_served():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")
    saved = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = True  # CPU tensors: Triton's interpreter (Note
    try:  # [Interpreted kernels] in trident/lower/kernels.py)
        @triton.jit
        def mixed_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            s = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
            tl.store(out_ptr + offs, s, mask=mask)
    finally:
        triton.knobs.runtime.interpret = saved

    def f(x, y):
        out = torch.empty_like(x)
        mixed_add[(1,)](x, y, out, x.numel(), BLOCK=16)
        return out

    jf = trident.jit(f)
    for _ in range(2):
        kw = _args()
        want = f(kw["a"], kw["b"])
        assert torch.equal(want, (kw["a"].double() + kw["b"]).float())
        assert torch.equal(jf(kw["a"], kw["b"]), want)
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (1, 1, 1, 0), s
