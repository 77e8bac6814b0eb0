"""Compiled results equal eager PyTorch bit for bit, and have eager's aliasing and mutation
semantics (views share storage, in-place writes reach the caller, inputs come back as the same
object)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import trident
from _trident_helpers import assert_same, clone_args, run_python


def run_both(fn, *args, calls: int = 2):
    """Eager result on copies of ``args``, and the compiled results of ``calls`` calls on other
    copies. Asserts the calls were served natively (one compile, no fallback; later calls hit).
    """
    jf = trident.jit(fn)
    want = fn(*clone_args(args))
    targs = clone_args(args)
    got = [jf(*targs) for _ in range(calls)]
    st = jf.stats
    assert (st.misses, st.compiles, st.fallbacks) == (1, 1, 0), st
    assert st.hits == calls - 1, st
    return jf, want, got


def check(fn, *args, strides: bool = True):
    jf, want, got = run_both(fn, *args)
    for g in got:
        assert_same(g, want, strides=strides)
    return jf


def g(seed=0):
    return torch.Generator().manual_seed(seed)


# ---- elementwise ---------------------------------------------------------------------------


def test_elementwise_chain_float32():
    def f(x, y):
        return torch.sigmoid(x * 2 + 1).exp() - x / 3 + torch.tanh(y).abs().sqrt()

    check(f, torch.randn(5, 7, generator=g()), torch.randn(5, 7, generator=g(1)))


def test_elementwise_broadcast_and_scalars_float64():
    def f(x, y, a, b):
        return (x * a + y) ** 2 - torch.clamp(x, -0.5, 0.5) * b

    check(f, torch.randn(4, 1, 3, dtype=torch.float64, generator=g()),
          torch.randn(5, 1, dtype=torch.float64, generator=g(1)), 3, -1.25)


def test_elementwise_integer_and_bool_ops():
    def f(a, b):
        c = (a * 3 + b) // 2 % 5
        return c, (a > b) & (b != 0), torch.where(a > 0, a, -b), a.to(torch.float32) / 3

    a = torch.randint(-20, 20, (6, 4), generator=g())
    b = torch.randint(1, 9, (6, 4), generator=g(1))
    check(f, a, b)


def test_elementwise_on_noncontiguous_inputs_keeps_eager_strides():
    def f(x, y):
        return torch.relu(x) * y + 1

    x = torch.randn(6, 4, generator=g()).t()
    y = torch.randn(8, 12, generator=g(1))[::2, 1::2]
    jf = check(f, x, y)
    assert jf.stats.compiles == 1


@pytest.mark.parametrize("first", ["contiguous", "transposed"])
def test_layout_dependent_tracing_is_guarded(first):
    """reshape() traces to a view for one layout and a copy for another, contiguous() to an
    alias or a copy: a specialization must not serve the other layout."""
    def f(x):
        return x.reshape(-1), x.contiguous(), x.view_as(x) * 1

    a = torch.randn(4, 4, generator=g())
    layouts = [a, a.t()] if first == "contiguous" else [a.t(), a]
    jf = trident.jit(f)
    for x in layouts + layouts:
        assert_same(jf(x), f(x))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 2, 0)


def test_nan_inf_and_signed_zero_propagate_exactly():
    def f(x):
        return x * -1.0, torch.nan_to_num(x, nan=7.0), x.sign()

    x = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.5])
    check(f, x)


# ---- matmul / nn ---------------------------------------------------------------------------


def test_mlp_matmul_linear_relu():
    def mlp(x, w1, b1, w2, b2):
        return F.linear(torch.relu(x @ w1 + b1), w2, b2)

    gen = g(3)
    check(mlp, torch.randn(8, 32, generator=gen), torch.randn(32, 64, generator=gen),
          torch.randn(64, generator=gen), torch.randn(16, 64, generator=gen),
          torch.randn(16, generator=gen))


def test_bmm_addmm_and_einsum():
    def f(a, b, c, bias):
        return torch.bmm(a, b), torch.addmm(bias, a[0], b[0]), torch.einsum("bij,bjk->bik", a, b) + c

    gen = g(4)
    check(f, torch.randn(3, 4, 5, generator=gen), torch.randn(3, 5, 6, generator=gen),
          torch.randn(3, 4, 6, generator=gen), torch.randn(4, 6, generator=gen))


def test_softmax_log_softmax_layer_norm_gelu():
    def f(x, w, b):
        return (torch.softmax(x, -1), F.log_softmax(x, dim=0),
                F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5), F.gelu(x), x.mean(-1), x.var(0))

    gen = g(5)
    check(f, torch.randn(6, 10, generator=gen), torch.randn(10, generator=gen),
          torch.randn(10, generator=gen))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_constants_are_served(dtype):
    """A 0-dim constant made from Python data in bfloat16 (``torch.finfo(dtype).min`` in
    Hugging Face's attention masks) is a literal that Torch-MLIR's importer writes through
    ``ml_dtypes``, a dependency since a fresh install ran every bf16 model eagerly."""
    def masked(x):
        return (torch.where(x > 0, x, torch.tensor(0.5, dtype=x.dtype))
                + torch.tensor(torch.finfo(x.dtype).min, dtype=x.dtype))

    _, want, got = run_both(masked, torch.randn(4, 8).to(dtype))
    assert all(torch.equal(g, want) for g in got)


def test_half_precision_softmax():
    def f(x):
        return torch.softmax(x, -1), x.float().sum(), x * 0.1

    check(f, torch.randn(4, 16, generator=g()).to(torch.bfloat16))
    check(f, torch.randn(4, 16, generator=g()).to(torch.float16))


# ---- views and slices ----------------------------------------------------------------------


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", ["slice", "t", "view", "unsqueeze", "narrow", "select",
                                  "expand", "diagonal", "transpose_slice"])
def test_view_outputs_share_storage_with_input(name):
    views = {
        "slice": lambda x: x[1:, 2:],
        "t": lambda x: x.t(),
        "view": lambda x: x.view(-1),
        "unsqueeze": lambda x: x.unsqueeze(0),
        "narrow": lambda x: x.narrow(1, 1, 3),
        "select": lambda x: x[:, 2],
        "expand": lambda x: x[:1].expand(5, 6),
        "diagonal": lambda x: x.diagonal(),
        "transpose_slice": lambda x: x.transpose(0, 1)[::2],
    }
    fn = views[name]
    jf = trident.jit(fn)
    x = torch.randn(4, 6, generator=g())
    want = fn(x)
    for _ in range(2):  # the miss (compile) and a hit
        out = jf(x)
        assert_same(out, want)
        assert shares_storage(out, x)
        assert out.storage_offset() == want.storage_offset()
        assert out._base is x
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (1, 0, 1)
    # the view keeps following the caller's tensor
    out = jf(x)
    x.add_(1)
    assert torch.equal(out, fn(x))


def test_view_of_intermediate_is_view_of_that_intermediate():
    def f(x):
        y = x + 1
        return y, y[1:]

    jf = check(f, torch.randn(4, 3, generator=g()))
    y, v = jf(torch.randn(4, 3, generator=g()))
    assert shares_storage(y, v) and v._base is y


def test_multiple_views_of_one_input():
    def f(x):
        return x[0], x[1], x.t()

    x = torch.randn(3, 3, generator=g())
    jf = trident.jit(f)
    for _ in range(2):
        outs = jf(x)
        assert all(shares_storage(o, x) for o in outs)
        assert_same(outs, f(x))


# ---- in-place mutation ---------------------------------------------------------------------


def test_inplace_add_on_input_is_visible_to_caller():
    def f(x):
        x.add_(1)

    jf = trident.jit(f)
    x = torch.zeros(5)
    v0 = x._version
    assert jf(x) is None
    assert torch.equal(x, torch.ones(5))
    assert jf(x) is None  # hit
    assert torch.equal(x, torch.full((5,), 2.0))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 1, 0)
    # the version counter moves as in eager mode (ADInplaceOrView still runs)
    e = torch.zeros(5)
    e0 = e._version
    f(e)
    f(e)
    assert x._version - v0 == e._version - e0


def test_out_copy_writes_into_callers_tensor():
    def f(out, x):
        out.copy_(x * 2)
        return out

    jf = trident.jit(f)
    for i in range(3):
        out = torch.zeros(4)
        x = torch.arange(4, dtype=torch.float32) + i
        r = jf(out, x)
        assert r is out
        assert torch.equal(out, (torch.arange(4, dtype=torch.float32) + i) * 2)
    assert (jf.stats.compiles, jf.stats.hits) == (1, 2)


def test_inplace_on_slice_of_input_and_non_contiguous_out():
    def f(x, out):
        x[0].mul_(2)
        out.copy_(x.sum(0))

    jf = trident.jit(f)
    x0 = torch.randn(3, 4, generator=g())
    base = torch.zeros(4, 2)
    out = base[:, 1]  # non-contiguous view of the caller's tensor
    ex, ebase = x0.clone(), torch.zeros(4, 2)
    f(ex, ebase[:, 1])
    x = x0.clone()
    jf(x, out)
    assert_same(x, ex)
    assert_same(base, ebase)
    assert torch.equal(base[:, 0], torch.zeros(4))


def test_inplace_then_read_returns_mutated_input_identity():
    def f(x, y):
        y.mul_(x)
        z = x.add_(y)
        return z, y * 2

    jf = trident.jit(f)
    x, y = torch.randn(3, generator=g()), torch.randn(3, generator=g(1))
    ex, ey = x.clone(), y.clone()
    want = f(ex, ey)
    got = jf(x, y)
    assert got[0] is x
    assert_same(got, want)
    assert_same(x, ex)
    assert_same(y, ey)


def test_inplace_with_aliased_arguments():
    def f(a, b):
        a.add_(1)
        return b * 2

    jf = trident.jit(f)
    y, z = torch.zeros(3), torch.zeros(3)
    assert_same(jf(y, z), torch.zeros(3))  # compiled for separate tensors
    assert torch.equal(y, torch.ones(3)) and torch.equal(z, torch.zeros(3))
    x = torch.zeros(3)
    # one tensor in both positions is its own specialization; b sees a's write, as in eager
    assert_same(jf(x, x), torch.full((3,), 2.0))
    assert torch.equal(x, torch.ones(3))
    assert (jf.stats.compiles, jf.stats.hits) == (2, 0)


@pytest.mark.parametrize("count", [3, 16, 17, 40, 70])
def test_aliased_arguments_among_many(count):
    # one tensor in two of `count` positions (pairwise up to 16 tensors, a hash set of their
    # indices beyond, with None and ints between them): its own specialization, as eager
    def f(ts):
        ts[0].add_(1)
        return [t * 2 if isinstance(t, torch.Tensor) else t for t in ts]

    def args(alias):
        ts = [torch.zeros(2) if k % 3 else (None if k % 2 else k) for k in range(3 * count)]
        ts[0] = torch.zeros(2)
        if alias is not None:
            ts[alias] = ts[0]
        return ts

    jf = trident.jit(f)
    last = 3 * count - 1
    for alias in (None, None, last, 1, last, None):
        ts, want_ts = args(alias), args(alias)
        want = f(want_ts)
        assert_same(jf(ts), want)
        assert_same(ts, want_ts)
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (3, 3, 0)


def test_specialization_traced_with_aliased_arguments_serves_distinct_ones():
    def f(a, b):
        return a + 1, b * 2

    jf = trident.jit(f)
    x = torch.zeros(3)
    assert_same(jf(x, x), f(x, x))
    y, z = torch.zeros(3), torch.ones(3)
    assert_same(jf(y, z), f(y, z))


# ---- output structures ---------------------------------------------------------------------


def test_nested_output_structure_with_python_scalars():
    def f(x):
        return (x + 1, [x * 2, (None, 3, 2.5, True)], None, [], ())

    jf = check(f, torch.randn(3, generator=g()))
    out = jf(torch.randn(3))
    assert type(out) is tuple and type(out[1]) is list and type(out[1][1]) is tuple
    assert out[1][1] == (None, 3, 2.5, True)
    assert type(out[1][1][1]) is int and type(out[1][1][2]) is float
    assert out[1][1][3] is True and out[2] is None


@pytest.mark.parametrize("value", [None, 7, -2.5, True, False, float("inf")])
def test_scalar_only_outputs(value):
    def f(x, v):
        x.sum()
        return v

    jf = trident.jit(f)
    for _ in range(2):
        r = jf(torch.ones(2), value)
        assert type(r) is type(value) and (r == value if value is not None else r is None)
    assert (jf.stats.compiles, jf.stats.fallbacks) == (1, 0)


def test_output_derived_from_shapes():
    def f(x):
        return x.shape[0] * 2, x.dim(), float(x.shape[1]) / 4, x.shape[0] > 2

    jf = check(f, torch.randn(3, 6))
    assert jf(torch.randn(3, 6)) == (6, 2, 1.5, True)
    assert jf(torch.randn(1, 2)) == (2, 2, 0.5, False)  # a new specialization


def test_returning_an_input_returns_the_same_object():
    def f(x, y):
        return x

    def g2(x):
        return x, [x], (x, x)

    jf = trident.jit(f)
    x, y = torch.randn(3), torch.randn(3)
    assert jf(x, y) is x
    assert jf(x, y) is x  # hit
    assert jf(y, x) is y
    jg = trident.jit(g2)
    for _ in range(2):
        a, (b,), (c, d) = jg(x)
        assert a is x and b is x and c is x and d is x
    assert jf.stats.hits == 2 and jg.stats.hits == 1


def test_same_intermediate_returned_twice_is_one_object():
    """Eager returns the same tensor object twice; a compiled call must not crash doing so.
    Run in a child process because the failure mode is a segfault."""
    code = textwrap.dedent("""
        import torch, trident
        def f(x):
            y = x + 1
            return y, [y]
        jf = trident.jit(f)
        x = torch.randn(3)
        for _ in range(2):
            a, (b,) = jf(x)
            assert a is b and torch.equal(a, x + 1)
        print("OK", jf.stats.hits)
    """)
    _run_child(code)


def _run_child(code: str):
    import os

    from _trident_helpers import REPO

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    assert "OK" in run_python(env, "-c", code).stdout


# ---- multi-output ops ----------------------------------------------------------------------


def test_split_chunk_unbind_return_tuples_of_views():
    def f(x):
        return x.split(2, dim=1), torch.chunk(x, 3, 0), x.unbind(1), x.split([1, 3], 0)

    x = torch.randn(4, 6, generator=g())
    jf = check(f, x)
    out = jf(x)
    assert all(shares_storage(t, x) for group in out for t in group)
    assert [len(group) for group in out] == [3, 2, 6, 2]


def test_max_dim_sort_topk():
    def f(x):
        v, i = torch.max(x, 1)
        s, si = torch.sort(x, dim=0, descending=True)
        t = torch.topk(x, 2)
        return v, i, s, si, t.values, t.indices, torch.min(x, 0, keepdim=True)[1]

    check(f, torch.randn(5, 6, generator=g()))


def _structseqs(x, a, m):
    """Every kind of op that returns a ``torch.return_types`` struct sequence."""
    return (torch.max(x, 1), torch.min(x, 0, keepdim=True), torch.sort(x, stable=True),
            torch.topk(x, 2), torch.kthvalue(x, 2), torch.mode(m), torch.cummax(x, 1),
            torch.cummin(x, 0), torch.aminmax(x, dim=1), torch.frexp(x), torch.median(x, 1),
            torch.linalg.eigh(a), torch.linalg.qr(a), torch.linalg.slogdet(a),
            torch.linalg.svd(a), torch.linalg.lu_factor(a), torch.var_mean(x, 1))


def test_ops_returning_struct_sequences():
    """``torch.return_types`` results (``torch.max(x, 1)``, ``sort``, ``linalg.eigh``...) are
    served natively: same type, fields and values as eager, on a hit and from the cache."""
    x = torch.randn(5, 6, generator=g())
    a = torch.randn(4, 4, generator=g(1))
    a = a @ a.T + torch.eye(4)
    m = torch.randint(0, 3, (5, 6), generator=g(2)).float()
    jf, want, got = run_both(_structseqs, x, a, m)
    for out in got:
        assert_same(out, want)
        assert all(type(o) is type(w) for o, w in zip(out, want))
        assert out[0].indices is out[0][1]
    again = trident.jit(_structseqs)  # as in a new process: the stored specialization serves,
    out = again(x, a, m)  # its recipe read back from the cache (test_in_process_reload_from_disk)
    assert [type(o) for o in out] == [type(w) for w in want]
    assert all(torch.equal(p, q) for o, w in zip(out, want) for p, q in zip(o, w))
    st = again.stats
    assert (st.traces, st.compiles, st.misses, st.fallbacks, st.hits) == (0, 0, 0, 0, 1), st


def test_results_holding_torch_sizes():
    """``torch.Size`` results (``x.shape``, ``torch.broadcast_shapes``) come back as
    ``torch.Size``, as in eager."""
    def f(x, y):
        return torch.broadcast_shapes(x.shape, y.shape), x.sum(0).shape, [x.shape], x + y

    jf, want, got = run_both(f, torch.randn(3, 1, generator=g()), torch.randn(4))
    for out in got:
        assert_same(out, want)


def _scalars_of_data(x, i):
    return x.sum().item(), x.max().item(), (x > 0).any().item(), i.argmax().item(), x * 2


def test_scalars_computed_from_data_are_results():
    """``.item()`` results (float, int, bool) come from the call's own data on every hit: the
    trace returns the op's symbolic scalar and the plan returns the value the op computes."""
    jf = trident.jit(_scalars_of_data)
    for seed in range(3):
        x, i = torch.randn(5, generator=g(seed)), torch.randint(0, 9, (4,), generator=g(seed))
        assert_same(jf(x, i), _scalars_of_data(x, i))
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (1, 0, 2), jf.stats


def _bool_results(x, y):
    return (torch.equal(x, y), x.equal(y), torch.allclose(x, y), x.allclose(y, atol=0.5),
            torch.allclose(input=x, other=y, rtol=0.0, atol=1e-6, equal_nan=True), x + y)


def test_bool_results_of_equal_and_allclose():
    """Note [Bool results]: ``torch.equal`` and ``torch.allclose`` (functions, methods,
    keywords) are values the plan computes on every call, True on one call and False on the
    next; a branch on one is a value check (Note [Value reads] in lower/values.py): one
    specialization per answer, each checked on every call."""
    jf = trident.jit(_bool_results)
    x = torch.randn(6, generator=g())
    nan = torch.tensor([1.0, float("nan")])
    for a, b in ((x, x.clone()), (x, x + 0.1), (x, x + 1e-7), (x, x + 1.0), (nan, nan.clone()),
                 (x, x[:3])):
        try:
            want = _bool_results(a, b)
        except RuntimeError as e:  # allclose of shapes that do not broadcast: eager's error
            with pytest.warns(UserWarning, match="runs eagerly"), pytest.raises(type(e)):
                jf(a, b)
            continue
        got = jf(a, b)
        assert got[:5] == want[:5] and all(type(v) is bool for v in got[:5]), (got, want)
        assert_same(got[5], want[5])
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 3, 1), jf.stats

    def branch(x, y):
        return x if torch.equal(x, y) else -x

    jf = trident.jit(branch)
    assert_same(jf(x, x.clone()), x)
    assert_same(jf(x, x + 1), -x)
    assert_same(jf(x, x.clone()), x)
    assert_same(jf(x, x - 1), -x)
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 2, 0), jf.stats


def test_sizes_under_dynamic_dims_are_results():
    """A size returned under dynamic dims is computed per call (one specialization)."""
    def f(x):
        return x.shape[0], x.shape, x.sum(0)

    jf = trident.jit(f, dynamic=True)
    for n in (3, 4, 5, 4):
        x = torch.randn(n, 2, generator=g(n))
        assert_same(jf(x), f(x))
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (1, 0, 3), jf.stats


def test_cat_stack_and_tensor_list_inputs_from_args():
    def f(x, y, z):
        return torch.cat([x, y, z], 0), torch.stack([x, y], -1), torch.cat([x.t(), z.t()], 1)

    gen = g(6)
    check(f, torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen),
          torch.randn(4, 3, generator=gen))


# ---- indexing ------------------------------------------------------------------------------


def test_index_with_tensor():
    def f(x, i, j):
        return x[i], x[:, j], x[i, j], x.index_select(1, j), torch.gather(x, 1, i[:, None].expand(-1, 2))

    x = torch.randn(5, 6, generator=g())
    i = torch.tensor([0, 4, 2, 2])
    j = torch.tensor([5, 0, 1, 1])
    check(f, x, i, j)


def test_masked_fill_and_index_put_with_tensor_values():
    def f(x, i, m, v):
        y = x.clone()
        y[i] = v
        return y, x.masked_fill(m, -1.0), torch.index_put(x, (i,), v)

    x = torch.randn(4, 3, generator=g())
    check(f, x, torch.tensor([1, 3]), x > 0, torch.randn(3, generator=g(1)))


def test_setitem_with_python_scalar_compiles():
    def f(x, i):
        y = x.clone()
        y[i] = 0.5
        return y

    check(f, torch.randn(4, 3, generator=g()), torch.tensor([1, 3]))


# ---- dtypes and factories ------------------------------------------------------------------


def test_dtype_conversions():
    def f(x):
        return (x.to(torch.float16), x.int(), x.double(), x.to(torch.bool), x.bfloat16(),
                x.to(torch.int8), x.long().float())

    check(f, torch.randn(3, 4, generator=g()) * 10)


def test_factories():
    def f(x):
        return (torch.zeros(3, 2), torch.ones(2, dtype=torch.int64), torch.arange(5),
                torch.arange(0, 1, 0.25), torch.full((2, 2), 3.5), torch.eye(3),
                torch.zeros_like(x), torch.ones_like(x, dtype=torch.float64), torch.empty(0, 3),
                torch.linspace(0, 1, 5))

    check(f, torch.randn(2, 3))


def test_factory_outputs_are_fresh_each_call():
    def f(x):
        return torch.zeros(3), x + 0

    jf = trident.jit(f)
    x = torch.ones(3)
    a, b = jf(x)
    a.add_(5)
    b.add_(5)
    c, d = jf(x)  # hit
    assert torch.equal(c, torch.zeros(3)) and torch.equal(d, torch.ones(3))
    assert c.data_ptr() != a.data_ptr()
    assert torch.equal(x, torch.ones(3))


def test_conversion_to_complex64_keeps_dtype():
    def f(x):
        return x.to(torch.complex64), torch.zeros(2, dtype=torch.complex64)

    check(f, torch.randn(3, generator=g()))


def test_complex64_argument():
    def f(x):
        return x * 2 + 1

    check(f, torch.randn(3, dtype=torch.complex64, generator=g()))


def test_random_ops_follow_the_global_generator():
    def f(x):
        return x + torch.rand_like(x), torch.randn(3)

    jf = trident.jit(f)
    x = torch.ones(4)
    for _ in range(2):
        torch.manual_seed(123)
        want = f(x)
        torch.manual_seed(123)
        got = jf(x)
        assert_same(got, want)
    assert jf.stats.fallbacks == 0 and jf.stats.compiles == 1


def test_many_arguments_and_many_outputs():
    def f(*xs):
        return tuple(x * i for i, x in enumerate(xs))

    xs = [torch.full((2,), float(i)) for i in range(70)]
    check(f, *xs)


SCALE = 2


def scaled(x):
    return x * SCALE


def test_rebinding_a_global_scalar_is_seen(monkeypatch):
    jf = trident.jit(scaled)
    x = torch.ones(2)
    assert_same(jf(x), scaled(x))
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 3)
    assert_same(jf(x), scaled(x))


def test_buffer_reuse_never_overwrites_earlier_results():
    """Note [Buffer reuse]: intermediates write into buffers kept between calls; outputs and
    views of intermediates that escape (reshape of an mm is an _unsafe_view) must not."""
    def f(x, w):
        h = x @ w  # 3-D @ 2-D: view, mm, then _unsafe_view of the mm result
        t = torch.sin(x * x + x).view(-1)
        return h, (x + x) * x, t, (t * t).sum()

    w = torch.randn(8, 4, generator=g())
    jf = trident.jit(f)
    firsts = []
    for i in range(4):
        x = torch.randn(2, 5, 8, generator=g(i + 1))
        out = jf(x, w)
        assert_same(out, f(x, w))
        firsts.append((out, [o.clone() for o in out]))
    for out, saved in firsts:
        for a, b in zip(out, saved):
            assert torch.equal(a, b)
    assert "reused" in jf.source()  # the chain x * x + x does reuse its buffers


def test_buffer_reuse_across_inference_mode():
    def f(x):
        return torch.relu(x * 2 + 1).sum()

    jf = trident.jit(f)
    for mode in (torch.inference_mode, torch.no_grad, torch.inference_mode, torch.no_grad):
        x = torch.randn(6, generator=g())
        with mode():
            assert_same(jf(x), f(x))
    # inference mode is guarded (a function may read torch.is_inference_mode_enabled()): one
    # specialization per mode, each hit once
    assert (jf.stats.compiles, jf.stats.hits) == (2, 2)
