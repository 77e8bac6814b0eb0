"""Views computed in C (Note [Views in C] in trident/lower/plan.py).

The C arithmetic of every view op (trident/runtime/trident_views.h) is checked against eager
PyTorch on random geometries; compiled functions are checked for values (``torch.equal``), for
aliasing as eager aliases (``_base``, storage, version counter), and for making no dispatcher
call for their views (counted with the torch profiler, which records every dispatcher call).
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

import trident
from trident.runtime import HEADER

VIEW_OPS = {"aten::view", "aten::_unsafe_view", "aten::t", "aten::transpose", "aten::permute",
            "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::narrow",
            "aten::expand", "aten::as_strided", "aten::reshape", "aten::alias"}


def dispatcher_calls(fn, *args) -> list[str]:
    """The names of the ops the dispatcher ran for one call of ``fn``, not counting those that
    ops ran inside themselves."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return [e.name for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]


def geometry(t):
    return t.shape, t.stride(), t.storage_offset(), t.untyped_storage().data_ptr()


# ---- the C arithmetic against ATen ----------------------------------------------------------

_HARNESS = r"""
#include "trident_views.h"
int view_op(int op, int dim, const int64_t* sizes, const int64_t* strides, int64_t offset,
            int64_t nbytes, const int64_t* args, int nargs, int64_t* result) {
  trt_view in, out;
  in.base = 0; in.data = 0; in.itemsize = 4; in.nbytes = nbytes; in.offset = offset;
  in.dim = dim;
  for (int d = 0; d < dim; ++d) { in.sizes[d] = sizes[d]; in.strides[d] = strides[d]; }
  int failed;
  switch (op) {
    case 0: failed = trt_view_view(&in, args, nargs, &out); break;
    case 1: failed = trt_view_expand(&in, args, nargs, &out); break;
    case 2: failed = trt_view_transpose(&in, (int32_t)args[0], (int32_t)args[1], &out); break;
    case 3: failed = trt_view_permute(&in, args, &out); break;
    case 4: failed = trt_view_unsqueeze(&in, (int32_t)args[0], &out); break;
    case 5: failed = trt_view_squeeze(&in, (uint32_t)args[0], &out); break;
    case 6: failed = trt_view_slice(&in, (int32_t)args[0], args[1], args[2], args[3], &out); break;
    case 7: failed = trt_view_select(&in, (int32_t)args[0], args[1], &out); break;
    default: failed = trt_view_as_strided(&in, args + 3, args + 3 + args[0], (int32_t)args[0],
                                          (int32_t)args[1], args[2], &out); break;
  }
  if (failed) return 1;
  result[0] = out.dim;
  result[1] = out.offset;
  for (int d = 0; d < out.dim; ++d) { result[2 + d] = out.sizes[d]; result[18 + d] = out.strides[d]; }
  return 0;
}
"""


@pytest.fixture(scope="module")
def harness():
    """trident_views.h compiled with a small entry point (cffi, as the SCMs are built)."""
    import importlib.util

    import cffi

    ffi = cffi.FFI()
    ffi.cdef("int view_op(int op, int dim, const int64_t* sizes, const int64_t* strides, "
             "int64_t offset, int64_t nbytes, const int64_t* args, int nargs, int64_t* result);")
    folder = tempfile.mkdtemp(prefix="trident-views-")
    ffi.set_source("trident_views_harness", _HARNESS, include_dirs=[str(HEADER.parent)],
                   extra_compile_args=["-O1"])
    path = ffi.compile(tmpdir=folder)
    spec = importlib.util.spec_from_file_location("trident_views_harness", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_c(harness, op, x, args):
    ffi, lib = harness.ffi, harness.lib
    result = ffi.new("int64_t[34]")
    failed = lib.view_op(op, x.dim(), ffi.new("int64_t[]", list(x.shape) or [0]),
                         ffi.new("int64_t[]", list(x.stride()) or [0]), x.storage_offset(),
                         x.untyped_storage().nbytes(), ffi.new("int64_t[]", list(args) or [0]),
                         len(args), result)
    if failed:
        return None
    dim = result[0]
    return (torch.Size(result[2 + d] for d in range(dim)),
            tuple(result[18 + d] for d in range(dim)), result[1])


def wrap(d, n):
    return d % max(n, 1)


@st.composite
def strided(draw):
    """A float32 tensor of 0-4 dims over a storage of its own, any non-negative strides."""
    dim = draw(st.integers(0, 4))
    sizes = draw(st.lists(st.integers(0, 4), min_size=dim, max_size=dim))
    strides = draw(st.lists(st.integers(0, 7), min_size=dim, max_size=dim))
    offset = draw(st.integers(0, 3))
    extent = 1 + sum((s - 1) * t for s, t in zip(sizes, strides) if s > 0)
    storage = torch.empty(offset + extent + draw(st.integers(0, 2)))
    return torch.as_strided(storage, sizes, strides, offset)


def view_cases(draw, x):
    """(op code, C args, eager call) for a random view op on ``x``; dims in range (codegen
    wraps them; the rank is static)."""
    n = x.dim()
    dims = st.integers(-max(n, 1), max(n, 1) - 1)
    small = st.integers(-6, 6)
    kind = draw(st.sampled_from(["view", "expand", "transpose", "permute", "unsqueeze",
                                 "squeeze", "slice", "select", "as_strided"]))
    if kind == "view":
        shape = draw(st.lists(st.integers(-1, 6), min_size=0, max_size=4))
        return 0, shape, lambda: x.view(shape)
    if kind == "expand":
        shape = draw(st.lists(st.integers(-2, 4), min_size=0, max_size=5))
        return 1, shape, lambda: x.expand(shape)
    if kind == "transpose":
        d0, d1 = draw(dims), draw(dims)
        return 2, [wrap(d0, n), wrap(d1, n)], lambda: x.transpose(d0, d1)
    if kind == "permute":
        perm = draw(st.permutations(range(n)))
        return 3, perm, lambda: x.permute(perm)
    if kind == "unsqueeze":
        d = draw(st.integers(-n - 1, n))
        return 4, [d % (n + 1)], lambda: x.unsqueeze(d)
    if kind == "squeeze":
        which = draw(st.lists(dims, max_size=3, unique_by=lambda d: wrap(d, n)))
        mask = sum(1 << wrap(d, n) for d in which) if n else 0
        if draw(st.booleans()):
            return 5, [(1 << n) - 1], lambda: x.squeeze()
        return 5, [mask], lambda: x.squeeze(which)
    if kind == "slice":
        d, start, end, step = draw(dims), draw(small), draw(small), draw(st.integers(-1, 3))
        none_start, none_end = draw(st.booleans()), draw(st.booleans())
        c_args = [wrap(d, n), 0 if none_start else start,
                  2**63 - 1 if none_end else end, step]
        return 6, c_args, lambda: torch.ops.aten.slice.Tensor(
            x, d, None if none_start else start, None if none_end else end, step)
    if kind == "select":
        d, index = draw(dims), draw(small)
        return 7, [wrap(d, n), index], lambda: x.select(d, index)
    k = draw(st.integers(0, 3))
    sizes = draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
    strides = draw(st.lists(st.integers(-1, 4), min_size=k, max_size=k))
    offset = draw(st.integers(-1, 8))
    with_offset = draw(st.booleans())
    return 8, [k, int(with_offset), offset] + sizes + strides, lambda: torch.as_strided(
        x, sizes, strides, offset if with_offset else None)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_view_arithmetic_equals_aten(harness, data):
    x = data.draw(strided())
    if x.dim() == 0 and data.draw(st.booleans()):
        x = torch.empty(()).fill_(1.0)
    op, c_args, eager = view_cases(data.draw, x)
    if op in (6, 7) and x.dim() == 0:
        c_args = None  # codegen does not compute slice/select of a 0-dim tensor
    try:
        want = eager()
    except (RuntimeError, IndexError, ValueError):
        want = None
    got = None if c_args is None else run_c(harness, op, x, c_args)
    if want is None:
        assert got is None  # the step calls the op, which raises eager's exception
    elif c_args is not None and not (op == 1 and min(c_args, default=0) < (
            0 if x.dim() == 0 else -1)):
        # (the C gives up on expanding to a size below -1, or a 0-dim tensor to a size < 0,
        # which ATen does not check: the step calls the op, which makes the same tensor)
        assert got == (want.shape, want.stride(), want.storage_offset())


# ---- compiled functions ----------------------------------------------------------------------

def chain(x, y):
    a = x.view(4, 6).t().unsqueeze(0).transpose(1, 2).squeeze(0)  # [4, 6]
    b = a[1:4, ::2].permute(1, 0).reshape(-1)  # _unsafe_view of a clone
    c = x.expand(2, 24).narrow(1, 2, 9).select(0, 1)
    d = torch.as_strided(x, (3, 2), (2, 1), 1).flatten()
    return b + c + y[:9] + d.repeat(2)[:9].squeeze()


def selects(x, y):
    return x[1, :, -1] + y.unsqueeze(-1).expand(3, 5).permute(1, 0)[2]


def views_of_results(x, y):
    z = x @ y  # [4, 3]
    return z.t().reshape(3, 2, 2)[:, 1].unsqueeze(1) * 2


@pytest.mark.parametrize("fn, shapes, ops", [
    (chain, [(24,), (12,)], ["clone", "add", "add", "repeat", "add"]),  # clone: reshape's copy
    (selects, [(2, 3, 4), (3,)], ["add"]),
    (views_of_results, [(4, 5), (5, 3)], ["mm", "mul"]),
    # the returned view of an intermediate: as eager makes it (aten::as_strided)
    (lambda x, kc, vc, wq, wo: attention_step(x, kc, vc, wq, wo),
     [(1, 1, 64), (1, 4, 8, 16), (1, 4, 8, 16), (64, 64), (64, 64)],
     ["mm", "cat", "cat", "scaled_dot_product_attention", "bmm", "as_strided"])])
def test_views_equal_eager_and_make_no_dispatcher_call(trident_runtime, fn, shapes, ops):
    f = trident.jit(fn)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        args = [torch.randn(s, generator=g) for s in shapes]
        got, want = f(*args), fn(*args)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert all(torch.equal(p, q) and geometry(p)[:3] == geometry(q)[:3]
                   for p, q in zip(got, want))
    assert (f.stats.hits, f.stats.compiles) == (2, 1)
    assert dispatcher_calls(f, *args) == [f"aten::{op}" for op in ops]  # no view op
    assert f.stats.hits == 3
    assert VIEW_OPS & set(dispatcher_calls(fn, *args))  # eager's views do call it


def forty_views(x, y):
    for _ in range(10):
        x = x.t().unsqueeze(0).squeeze(0).transpose(0, 1)
    return x + y


def test_forty_views_and_one_add_call_the_dispatcher_once(trident_runtime):
    f = trident.jit(forty_views)
    x, y = torch.randn(8, 16), torch.randn(16)
    f(x, y)
    assert torch.equal(f(x, y), forty_views(x, y))
    assert dispatcher_calls(f, x, y) == ["aten::add"]


def returned(x):
    return x.t(), x[1:], x.view(-1), x.unsqueeze(0).expand(2, 3, 4)[1], x.reshape(4, 3)


def test_returned_views_alias_as_in_eager(trident_runtime):
    f = trident.jit(returned)
    base = torch.randn(5, 4)
    x = base[1:4]  # a view itself: eager's results are views of `base`
    f(x)
    got, want = f(x), returned(x)
    assert f.stats.hits == 1
    for a, b in zip(got, want):
        assert torch.equal(a, b) and geometry(a) == geometry(b)
        assert a._is_view() == b._is_view() and a._base is b._base
    got[0][1, 1] = 7.0  # writes through to x and base, as eager's would
    assert base[2, 1] == 7.0 and x[1, 1] == 7.0
    version = base._version
    got[2].add_(1)
    assert base._version == version + 1  # one version counter, as eager's views share


def composite_returns_its_argument(x, y):
    return x.t().type_as(y), x[0].type_as(y) * 2  # type_as of the same dtype: the view itself


def test_a_composite_op_that_returns_its_argument_returns_eagers_view(trident_runtime):
    f = trident.jit(composite_returns_its_argument)
    x, y = torch.randn(3, 4), torch.randn(2)
    f(x, y)
    got, want = f(x, y), composite_returns_its_argument(x, y)
    assert f.stats.hits == 1
    assert got[0]._base is x and want[0]._base is x and geometry(got[0]) == geometry(want[0])
    assert torch.equal(got[1], want[1])


def write_through(x, y):
    x[:, 1].mul_(2)
    x.select(1, 0).copy_(y)
    return x.t()[0] + 1


def test_writes_through_views_reach_the_argument_as_in_eager(trident_runtime):
    f = trident.jit(write_through)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 4, generator=g), torch.randn(3, generator=g)
    f(x.clone(), y)
    for _ in range(2):
        a, b = x.clone(), x.clone()
        va, vb = a._version, b._version
        got, want = f(a, y), write_through(b, y)
        assert torch.equal(got, want) and torch.equal(a, b)
        assert a._version - va == b._version - vb
    assert f.stats.hits == 2


def take_rows(x, n: int):
    rows = x.size(0)
    return x.view(-1)[-3:] + x.select(0, n) + x[n:].sum(0) + x.t()[:, -1] + x.view(rows * 3)[4:7]


def test_symbolic_views_equal_eager_and_raise_eagers_errors(trident_runtime):
    f = trident.jit(take_rows)
    for rows in (5, 6, 9, 7):  # the second size makes dim 0 symbolic
        x = torch.randn(rows, 3)
        assert torch.equal(f(x, 2), take_rows(x, 2))
    assert f.stats.compiles == 2 and "?" in f.specializations[-1]
    hits = f.stats.hits
    assert not VIEW_OPS & set(dispatcher_calls(f, torch.randn(8, 3), 2))
    assert f.stats.hits == hits + 1

    def sel(x):
        return x.select(0, 4) * 2

    g = trident.jit(sel)
    for rows in (6, 7, 8):
        x = torch.randn(rows, 3)
        assert torch.equal(g(x), sel(x))
    assert "?" in g.specializations[-1]
    x = torch.randn(3, 3)  # index 4 out of range: guarded (size > 4), eager's IndexError
    with pytest.raises(IndexError) as eager_error:
        sel(x)
    with pytest.raises(IndexError) as error, pytest.warns(UserWarning, match="runs eagerly"):
        g(x)
    assert str(eager_error.value) == str(error.value)


def triton_on_views(x, y):
    import triton

    from _triton_kernels import add_kernel

    out = torch.empty_like(y[1:])
    n = out.numel()
    add_kernel[(triton.cdiv(n, 256),)](x.view(-1)[1:], y[1:], out, n, BLOCK=256)
    return out.view(2, -1).t() + 1


@pytest.mark.gpu
def test_triton_launches_read_the_pointer_of_views_on_cuda(trident_runtime):
    f = trident.jit(triton_on_views, cuda_graphs=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(3):
        x = torch.randn(2, 65, device="cuda", generator=g)
        y = torch.randn(129, device="cuda", generator=g)
        got, want = f(x, y), triton_on_views(x, y)
        assert torch.equal(got, want) and got.stride() == want.stride()
    assert (f.stats.hits, f.stats.compiles) == (2, 1)
    assert not VIEW_OPS & set(dispatcher_calls(f, x, y))


def attention_step(x, kc, vc, wq, wo):
    q = (x @ wq).view(1, 1, 4, 16).transpose(1, 2)
    k = torch.cat([kc[:, :, 1:], q], dim=2)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, torch.cat([vc[:, :, 1:], q], 2))
    return a.transpose(1, 2).reshape(1, 1, 64) @ wo, k[0, :, -1]


@pytest.mark.gpu
def test_decode_step_views_on_cuda_equal_eager_without_dispatcher_calls(trident_runtime):
    f = trident.jit(attention_step, cuda_graphs=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    kc, vc = (torch.randn(1, 4, 8, 16, device="cuda", generator=g) for _ in range(2))
    wq, wo = (torch.randn(64, 64, device="cuda", generator=g) / 8 for _ in range(2))
    for _ in range(3):
        x = torch.randn(1, 1, 64, device="cuda", generator=g)
        got, want = f(x, kc, vc, wq, wo), attention_step(x, kc, vc, wq, wo)
        assert all(torch.equal(p, q) and geometry(p)[:3] == geometry(q)[:3]
                   for p, q in zip(got, want))
    assert (f.stats.hits, f.stats.compiles) == (2, 1)
    calls = dispatcher_calls(f, x, kc, vc, wq, wo)
    assert "aten::transpose" not in calls and "aten::slice" not in calls, calls


def _overflow_cases():
    """(op code, the tensor, C args, eager call): ints that the call may pass (``x.view(n,
    -1)``, ``x[::k]``) whose products or sums int64 cannot hold."""
    big, e = 2**62, torch.empty(0)
    row = torch.empty(3)
    one = torch.as_strided(torch.empty(1), (0, 5), (1, big))  # an empty tensor's any stride
    tall = torch.as_strided(torch.empty(4), (4, 1), (1, big))  # a size-1 dim's any stride
    return [
        (0, e, [2**32, 2**32], lambda: e.view(2**32, 2**32)),  # wraps to 0: numel 0
        (0, e, [0, big, big], lambda: e.view(0, big, big)),  # the empty view's strides
        (0, e, [0, 2**31, 2**31, 2**31, 4], lambda: e.view(0, 2**31, 2**31, 2**31, 4)),
        (0, tall, [2, 2], lambda: tall.view(2, 2)),  # a size-1 dim's stride
        (1, row, [big, big, 3], lambda: row.expand(big, big, 3)),  # numel past int64
        (1, torch.empty(1, 3), [big, 3], lambda: torch.empty(1, 3).expand(big, 3)),
        (8, row, [2, 1, 0, big, big, 0, 0], lambda: torch.as_strided(row, (big, big), (0, 0), 0)),
        (4, one, [2], lambda: one.unsqueeze(2)),  # size * stride
        (6, row, [0, 0, 2**63 - 1, 2**63 - 1], lambda: row[::2**63 - 1]),  # len + step - 1
        (6, row, [0, 1, 3, 2**62], lambda: row[1::2**62]),
        (6, one, [1, 0, 5, 4], lambda: one[:, ::4]),  # stride * step
        (7, tall, [0, 3], lambda: tall.select(0, 3)),
    ]


@pytest.mark.parametrize("case", range(len(_overflow_cases())))
def test_view_arithmetic_that_int64_cannot_hold_gives_up_or_equals_aten(harness, case):
    # Note [Checked size steps]: the view arithmetic read the call's ints unchecked; a product
    # that wrapped made a wrong view (x.view(2**32, 2**32) of an empty tensor was accepted)
    op, x, c_args, eager = _overflow_cases()[case]
    try:
        want = eager()
    except (RuntimeError, IndexError, ValueError, OverflowError):
        want = None
    got = run_c(harness, op, x, c_args)
    if got is not None:  # (None: the step calls the op, which gives eager's view or error)
        assert want is not None and got == (want.shape, want.stride(), want.storage_offset())
