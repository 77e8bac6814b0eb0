"""Property tests: over random shapes (zero-size dims included), strides (transposed, sliced,
expanded) and dtypes, compiled functions equal eager PyTorch bit for bit, on the compiling
call and on a hit."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import trident
from _trident_helpers import assert_same, clone_args, fresh_cache

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def random_values(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen, dtype=torch.float64) * 4
        # sprinkle special values
        flat = t.view(-1)
        if flat.numel() >= 3:
            flat[0], flat[1], flat[2] = 0.0, -0.0, 1.0
        return t.to(dtype)
    return torch.randint(-50, 50, shape, generator=gen, dtype=dtype)


@st.composite
def layouts(draw, shape, dtype):
    """A tensor of logical ``shape`` laid out one of several ways."""
    seed = draw(st.integers(0, 2**16))
    kind = draw(st.sampled_from(["contig", "transposed", "sliced", "expanded", "permuted"]))
    t = _layout(draw, kind, shape, dtype, seed)
    event(f"layout={kind if t.dim() >= 2 or kind in ('contig', 'sliced', 'expanded') else 'contig'}")
    event(f"dtype={str(dtype).replace('torch.', '')}")
    if 0 in t.shape:
        event("zero-size")
    return t


def _layout(draw, kind, shape, dtype, seed):
    ndim = len(shape)
    if kind == "transposed" and ndim >= 2:
        return random_values(shape[:-2] + (shape[-1], shape[-2]), dtype, seed).transpose(-1, -2)
    if kind == "permuted" and ndim >= 2:
        perm = draw(st.permutations(range(ndim)))
        inv = [perm.index(i) for i in range(ndim)]
        base = random_values(tuple(shape[p] for p in perm), dtype, seed)
        return base.permute(inv)
    if kind == "sliced" and ndim >= 1:
        step = draw(st.integers(2, 3))
        start = draw(st.integers(0, 1))
        dim = draw(st.integers(0, ndim - 1))
        big = list(shape)
        big[dim] = shape[dim] * step + start
        t = random_values(tuple(big), dtype, seed)
        index = [slice(None)] * ndim
        index[dim] = slice(start, start + shape[dim] * step, step)
        return t[tuple(index)]
    if kind == "expanded" and ndim >= 1:
        small = tuple(1 if draw(st.booleans()) else s for s in shape)
        return random_values(small, dtype, seed).expand(shape)
    return random_values(shape, dtype, seed)


shapes = st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple)


@st.composite
def one_tensor(draw, allow=DTYPES):
    shape = draw(shapes)
    dtype = draw(st.sampled_from(allow))
    return draw(layouts(shape, dtype))


@st.composite
def two_broadcastable(draw):
    shape = draw(shapes)
    dtype = draw(st.sampled_from(DTYPES))
    other_dtype = draw(st.sampled_from([dtype] + DTYPES))
    # y broadcasts against x: drop leading dims and set some dims to 1
    k = draw(st.integers(0, len(shape) - 1))
    yshape = tuple(1 if draw(st.booleans()) else s for s in shape[k:])
    return draw(layouts(shape, dtype)), draw(layouts(yshape, other_dtype))


def other_layout(t: torch.Tensor) -> torch.Tensor:
    """Same values and shape, different strides (where the shape allows it)."""
    if not isinstance(t, torch.Tensor):
        return t
    if not t.is_contiguous():
        return t.contiguous()
    if t.dim() >= 2:
        dims = list(range(t.dim()))[::-1]
        u = torch.empty([t.shape[d] for d in dims], dtype=t.dtype).permute(dims)
    else:
        u = torch.empty((t.shape[0] * 2,) if t.dim() else (), dtype=t.dtype)
        u = u[::2] if t.dim() else u
    u.copy_(t)
    return u


_SHARED: dict = {}  # fn -> its JitFunction, shared by the examples of its test


def shared_jit(fn):
    """One ``trident.jit(fn)`` (static sizes, in a cache folder of its own) for all the
    examples of a test: an example whose signature an earlier one compiled is served by that
    specialization, with its own values (the guards must pick it among all the others)."""
    if fn not in _SHARED:
        with fresh_cache():
            _SHARED[fn] = trident.jit(fn, dynamic=False, max_specializations=256)
    return _SHARED[fn]


def counts(jf) -> tuple[int, int, int, int]:
    s = jf.stats
    return s.compiles, s.misses, s.hits, s.fallbacks


def compare(fn, *args, **kw):
    """Call ``fn`` compiled (``shared_jit``) twice: a miss that compiles, or a hit on the
    specialization of an earlier example's signature, then a hit; both equal eager. Then the
    same values in other layouts: another specialization (or a hit, if the guards cannot
    tell them apart) must equal eager too."""
    jf = shared_jit(fn)
    want = fn(*clone_args(args))
    before = counts(jf)
    for _ in range(2):
        got = jf(*clone_args(args))
        assert_same(got, want, **kw)
    compiles, misses, hits, fallbacks = (a - b for a, b in zip(counts(jf), before))
    assert compiles in (0, 1) and (misses, hits, fallbacks) == (compiles, 2 - compiles, 0), \
        jf.stats
    alt = [other_layout(a) for a in args]
    before = counts(jf)
    assert_same(jf(*clone_args(alt)), fn(*clone_args(alt)), **kw)
    compiles, misses, hits, fallbacks = (a - b for a, b in zip(counts(jf), before))
    assert (misses, hits, fallbacks) == (compiles, 1 - compiles, 0), jf.stats


def elementwise(x, y):
    a = x * 2 + y
    b = torch.where(x > y, x - y, y - x)
    return a, b, torch.maximum(x, y), (x == y) | (x < 0), torch.abs(a).neg()


@SETTINGS
@given(two_broadcastable())
def test_elementwise_binary_ops_equal_eager(xy):
    x, y = xy
    compare(elementwise, x, y)


def reductions_and_shapes(x):
    d = x.dim() - 1
    return (x.sum(d), x.sum(), torch.cumsum(x, 0), x.flip(0), x.transpose(0, d).contiguous(),
            x.reshape(-1), torch.cat([x, x], d), x.clone(memory_format=torch.contiguous_format),
            x.amax(d) if x.shape[d] > 0 else x.sum(d), x[..., :1] * 3)


@SETTINGS
@given(one_tensor())
def test_reductions_and_shape_ops_equal_eager(x):
    compare(reductions_and_shapes, x)


def float_math(x, w):
    h = torch.softmax(x, -1) + torch.log_softmax(x.float(), -1).to(x.dtype)
    return h, torch.tanh(x) * w, x.mean(-1), torch.sigmoid(x).to(torch.float32), x.sqrt()


@SETTINGS
@given(one_tensor(allow=[torch.float32, torch.float64, torch.float16, torch.bfloat16]),
       st.floats(min_value=-4, max_value=4, allow_nan=False) | st.sampled_from([0.0, -0.0]))
def test_float_math_equal_eager(x, w):
    compare(float_math, x, w)


def views_and_inplace(x, out):
    v = x.t() if x.dim() == 2 else x.unsqueeze(0)
    out.copy_(x * 2)
    out.add_(1)
    return v, out, x[..., ::2]


@SETTINGS
@given(one_tensor())
def test_views_and_inplace_writes_equal_eager(x):
    """Views of inputs come back as views; in-place writes land in the caller's tensor."""
    out_e = torch.zeros(x.shape, dtype=x.dtype)
    out_t = torch.zeros(x.shape, dtype=x.dtype)
    want = views_and_inplace(x, out_e)
    jf = shared_jit(views_and_inplace)
    before = counts(jf)
    for _ in range(2):
        out_t.zero_()
        got = jf(x, out_t)
        assert_same(got, want)
        assert got[1] is out_t
        assert got[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert_same(out_t, out_e)
    compiles, misses, hits, fallbacks = (a - b for a, b in zip(counts(jf), before))
    assert compiles in (0, 1) and (misses, hits, fallbacks) == (compiles, 2 - compiles, 0), \
        jf.stats
