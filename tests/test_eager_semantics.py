"""The trace makes the calls eager makes (issue 11, items 4-9): composite ops decompose as in
eager mode, Python scalars keep their wrapped-number semantics, views stay views, global side
effects and forward-mode AD run eagerly, reused buffers are never shared with anyone."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
import torch.nn.functional as F

import trident
from _trident_helpers import assert_same, clone_args


def calls(fn, *args, n: int = 3, fallbacks: int = 0):
    """Run ``fn`` eagerly and jitted ``n`` times on fresh copies of ``args``; outputs and the
    (possibly mutated) arguments must equal eager's bit for bit each time. Returns the stats."""
    jf = trident.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if fallbacks else "error")
        for _ in range(n):
            want_args, got_args = clone_args(args), clone_args(args)
            want = fn(*want_args)
            got = jf(*got_args)
            assert_same(got, want)
            assert_same(got_args, want_args, path="args")
    st = jf.stats
    assert (st.misses, st.fallbacks, st.hits) == ((1, 0, n - 1) if not fallbacks
                                                   else (st.misses, fallbacks, st.hits)), st
    return st


# ---- item 4: composite ops decompose as eager's --------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linalg_values_ops_decompose_as_eager(dtype):
    """svdvals asked _linalg_svd(compute_uv=True) of a fake tensor where eager passes False
    (LAPACK's values differ by a few ulps); the composite ops are now called whole."""
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(0), dtype=dtype)

    def f(a):
        s = a + a.mT
        return (torch.linalg.svdvals(a), torch.linalg.eigvalsh(s), torch.linalg.cond(a),
                torch.linalg.norm(a, "nuc"), torch.linalg.matrix_norm(a, 2),
                torch.linalg.matrix_norm(a, -2), torch.linalg.matrix_norm(a, "nuc"))

    calls(f, a)


def test_composite_ops_are_called_whole():
    """The plan calls the composite op eager's Python binding calls (a sweep of the kind)."""
    jf = trident.jit(lambda a, w: (torch.linalg.svdvals(a), torch.linalg.eigvalsh(a @ a.mT),
                                   torch.linalg.matrix_norm(w)))
    jf(torch.randn(3, 3), torch.randn(3, 3))
    source = jf.source()
    for op in ("aten::linalg_svdvals", "aten::linalg_eigvalsh", "aten::linalg_matrix_norm"):
        assert f'"{op}"' in source, op
    assert "_linalg_svd" not in source and "_linalg_eigh" not in source


def _products(x, w, v, b):
    return (F.linear(x, w), F.linear(x[0], w), F.linear(x.transpose(0, 1), w),
            F.linear(x, w, b), F.linear(x.transpose(0, 1), w, b), x @ w.t(),
            x.transpose(0, 1) @ w.t(), x @ v, v @ w.t(), x[0] @ v, x @ x.transpose(1, 2),
            x.unsqueeze(0) @ x.transpose(1, 2), torch.matmul(v, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_linear_and_matmul_run_their_cpp_bodies_bit_for_bit(dtype):
    """Note [Composite ops]: ``linear`` and ``matmul`` decompose at trace time through their
    C++ bodies where those branch only on sizes and strides (folds into ``mm``, ``bmm`` of
    expanded views, a copy where a reshape cannot be a view), as eager runs them, and stay
    whole elsewhere: every rank, a transposed input, bias or not (a sweep of the kind)."""
    g = torch.Generator().manual_seed(0)
    make = (lambda *s: torch.randint(-4, 4, s, generator=g)) if dtype == torch.int64 else (
        lambda *s: torch.randn(*s, generator=g, dtype=dtype))
    jf = trident.jit(_products)
    for _ in range(3):
        args = make(3, 4, 5), make(6, 5), make(5), make(6)
        got, want = jf(*args), _products(*args)
        for p, q in zip(got, want, strict=True):
            assert torch.equal(p, q) and p.stride() == q.stride() and p.dtype == q.dtype
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 2, 0)
    # by a matrix or a vector, with a bias fused into addmm: views, mm and addmm; a bias added
    # after a non-contiguous input's matmul, or by a batch of matrices, whole (their bodies
    # branch on fake tensors: tests/test_matmul_decompositions.py)
    unfolded = trident.jit(lambda x, w, v, b: (F.linear(x, w), x @ w.t(), x @ v, v @ w.t(),
                                               F.linear(x, w, b), F.linear(x[0], w, b)))
    unfolded(*args)
    source = unfolded.source()
    assert '"aten::linear"' not in source and '"aten::matmul"' not in source
    assert '"aten::addmm"' in source
    assert '"aten::linear"' in jf.source() and '"aten::matmul"' in jf.source()


def test_dropout_decomposes_through_its_cpp_body():
    """With the Python dispatcher on, torch._decomp's dropout (native_dropout) would replace
    ATen's (bernoulli_, div_, mul): other random numbers than eager's."""
    x = torch.randn(64)

    def f(x):
        return torch.nn.functional.dropout(x, 0.5)

    jf = trident.jit(f)
    for _ in range(2):
        torch.manual_seed(3)
        want = f(x)
        torch.manual_seed(3)
        assert_same(jf(x), want)
    assert "native_dropout" not in jf.source()


# ---- item 5: Python scalars are wrapped numbers --------------------------------------------

def test_inplace_mul_by_python_float_bf16_fp16():
    torch.manual_seed(0)
    calls(lambda t: t.mul_(0.1), torch.randn(1000).bfloat16())
    calls(lambda t: t.mul_(1e20), torch.tensor([-0., 0.]).half())


def _float_scalars(x, z):
    return (x.clone().mul_(0.1), x.clone().add_(0.1), x.clone().sub_(1e20), x.clone().div_(0.3),
            x.clone().mul_(-1e-30), x * 0.1, x / 0.3, x + 1e20, x - 0.1,
            x.clone().add_(1), x * 3, z * 0.1, z.clone().mul_(0.5), z.clone().add_(3))


def _int_scalars(x, z):
    return (x.clone().mul_(3), x.clone().add_(300), x.clone().sub_(7), x * 0.1, x / 3,
            x + 2.5, x.clone().add_(True), z * 0.1, z.clone().mul_(5), z + 1e10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_python_scalars_float_tensors(dtype):
    """Every in-place and out-of-place arithmetic op with a Python scalar, in every float dtype
    (a 0-dim float32 ``z`` too), equals eager bit for bit."""
    g = torch.Generator().manual_seed(1)
    calls(_float_scalars, (torch.randn(257, generator=g) * 100).to(dtype),
          torch.tensor(0.7, dtype=torch.float32))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
def test_python_scalars_int_tensors(dtype):
    """Integer tensors with int, float and bool scalars: promotion (``x * 0.1`` is float32,
    as eager's wrapped number makes it) and wrap-around (``uint8 + 300``)."""
    x = torch.arange(-40, 60).to(dtype)
    calls(_int_scalars, x, torch.tensor(3, dtype=dtype))


def _bool_and_int_fills(x, b, i):
    return (torch.fill(x, b), x.masked_fill(x > 0, b), torch.full_like(x, b), b + x, x * b,
            x.clone().fill_(i), torch.full((2,), b), torch.full_like(x, i, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_python_bools_in_scalar_slots(dtype):
    """Torch-MLIR passes a Python bool to a Scalar slot through TorchScript's
    ``aten::Int.bool``, which no dispatcher holds; the op gets the bool, as in eager (``False +
    bool_tensor`` stays bool: an int would promote it to int64)."""
    x = torch.arange(-3, 5).to(dtype)
    for b, i in ((True, 3), (False, 0)):
        calls(lambda x: _bool_and_int_fills(x, b, i), x)


def test_python_scalar_on_zero_dim_reduced_float_runs_eagerly():
    """No plain tensor reproduces 0.1 as a wrapped number next to a 0-dim bfloat16 tensor
    (eager reads the double; a bf16 0-dim tensor would round it): that call runs eagerly."""
    z = torch.tensor(1.7, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="wrapped-number"):
        trident.jit(lambda z: z.mul_(0.1))(z.clone())
    calls(lambda z: z.mul_(0.1), z, fallbacks=3)
    calls(lambda z: z.mul_(0.5), z)  # 0.5 is exact in bf16: compiled


# ---- item 6: views stay views --------------------------------------------------------------

def test_as_strided_is_a_view():
    """Torch-MLIR rewrites as_strided into index (a copy); the plan calls aten::as_strided."""
    def f(x):
        v = torch.as_strided(x, [1], [1], 0)
        v.add_(1)
        return v

    calls(f, torch.zeros(3))


def test_view_family_writes_reach_the_base():
    """A sweep of the kind: writes through each view reach the argument, as in eager."""
    def f(x):
        torch.as_strided(x, [2, 2], [1, 2], 1).mul_(2)
        x.view(4, 3)[1].add_(1)
        x.t().select(0, 2).sub_(3)
        x.unsqueeze(0).narrow(2, 1, 2).mul_(-1)
        x.diagonal().add_(10)
        return x.reshape(12)[3:9].unflatten(0, (2, 3))

    out = calls(f, torch.arange(12.).reshape(3, 4))
    x = torch.zeros(3, 4)
    jf = trident.jit(f)
    jf(x.clone())
    y = jf(x)
    assert y._base is x or y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert out.hits == 2


# ---- item 9: reused buffers are never shared -----------------------------------------------

_kept: list = []


@torch.library.custom_op("trident_test::observe", mutates_args=())
def _observe(x: torch.Tensor) -> torch.Tensor:
    _kept.append(x)  # keeps its input, as an observer or a cache does
    return x.clone()


@_observe.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("trident_test::slow", mutates_args=())
def _slow(x: torch.Tensor) -> torch.Tensor:
    import time
    time.sleep(0.001)  # lets other threads run this specialization meanwhile
    return x + 0


@_slow.register_fake
def _(x):
    return torch.empty_like(x)


def test_custom_op_keeps_its_input():
    """Every tensor the observer kept holds its own call's values, not the last call's."""
    _kept.clear()
    jf = trident.jit(lambda x: torch.ops.trident_test.observe(x * 2) + 1)
    xs = [torch.full((4,), float(i)) for i in range(4)]
    for x in xs:
        jf(x)
    assert jf.stats.hits == 3
    for x, kept in zip(xs, _kept):
        assert torch.equal(kept, x * 2)


def test_threads_calling_a_custom_op():
    """8 threads x 100 calls of ``slow(x * 2) + x * 2``: every result is its own call's."""
    from concurrent.futures import ThreadPoolExecutor

    jf = trident.jit(lambda x: torch.ops.trident_test.slow(x * 2) + x * 2)
    jf(torch.zeros(64))

    def work(t):
        bad = 0
        for i in range(100):
            x = torch.full((64,), float(t * 1000 + i))
            bad += not torch.equal(jf(x), x * 4)
        return bad

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(work, range(8))) == 0
    assert jf.stats.hits == 800


def test_aten_only_plans_still_reuse_buffers():
    """The fix is not 'never reuse': a plan of ATen ops alone still writes .out overloads."""
    jf = trident.jit(lambda x: (x * x).sin() + x)
    jf(torch.randn(8))
    assert jf.source().count("result, reused") == 2  # mul, sin; the add is the output


# ---- item 7: global side effects run eagerly; random state calls are steps -------------------

def _default_dtype(x):
    torch.set_default_dtype(torch.float64)
    try:
        return x + torch.ones(3)
    finally:
        torch.set_default_dtype(torch.float32)


def _sets_default_dtype(x):
    torch.set_default_dtype(torch.float64)
    return x + torch.ones(3)


def _sets_threads(x):
    torch.set_num_threads(1)
    return x * 2


def test_global_side_effects_run_eagerly():
    """A function that changes global torch state the plan would not replay (a sweep of the
    kind: the default dtype, the thread count) runs eagerly on every call, with a warning, and
    equals eager each time; one that changes it back inside is compiled."""
    x = torch.randn(3)
    dtype, before = torch.get_default_dtype(), torch.get_num_threads()
    threads = 2  # (so that _sets_threads changes the count, whatever the worker had)
    torch.set_num_threads(threads)
    try:
        for fn in (_sets_default_dtype, _sets_threads):
            jf = trident.jit(fn)
            with pytest.warns(UserWarning, match="global torch state"):
                jf(x)
            for _ in range(2):
                torch.set_default_dtype(dtype)
                torch.set_num_threads(threads)
                want = fn(x)
                changed = torch.get_default_dtype(), torch.get_num_threads()
                torch.set_default_dtype(dtype)
                torch.set_num_threads(threads)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    assert_same(jf(x), want)
                assert (torch.get_default_dtype(), torch.get_num_threads()) == changed
            assert (jf.stats.fallbacks, jf.stats.hits) == (3, 0), jf.stats
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(before)
    calls(_default_dtype, torch.randn(3))  # restored inside: no change, compiled


def _generator_states() -> list[torch.Tensor]:
    states = [torch.default_generator.get_state()]
    if torch.cuda.is_initialized():
        states += [g.get_state() for g in torch.cuda.default_generators]
    return states


def rng_calls(fn, *args, calls_: int = 3, fallbacks: int = 0):
    """``fn`` eagerly and jitted under the caller's seeds 0, 1, 2...: the same results and
    written arguments, and the same generator states afterwards (CPU, and CUDA once
    initialized: ``torch.manual_seed`` seeds both). Returns the stats."""
    if torch.cuda.is_available():
        torch.cuda.init()  # Note [Random state steps]: CUDA's lazy seeding runs eagerly
    jf = trident.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if fallbacks else "error")
        for seed in range(calls_):
            want_args, got_args = clone_args(args), clone_args(args)
            torch.manual_seed(seed)
            try:
                want = fn(*want_args)
            except Exception as e:  # noqa: BLE001 - compared with Trident's
                want = e
            want_states = _generator_states()
            torch.manual_seed(seed)
            try:
                got = jf(*got_args)
            except Exception as e:  # noqa: BLE001
                assert isinstance(want, Exception) and isinstance(e, type(want)), (want, e)
                got = want
            if not isinstance(want, Exception):
                assert_same(got, want)
                assert_same(got_args, want_args, path="args")
            for g, w in zip(_generator_states(), want_states, strict=True):
                assert torch.equal(g, w), "the generators' state differs from eager's"
    st = jf.stats
    raised = isinstance(want, Exception)  # a call that raises is not a hit
    assert (st.fallbacks, st.hits) == (fallbacks, st.hits if fallbacks or raised else
                                       calls_ - 1), st
    for fn in (torch.manual_seed, torch.random.manual_seed, torch.get_rng_state,
               torch.cuda.manual_seed_all, torch.cuda.random.set_rng_state):
        assert "trident" not in fn.__code__.co_filename, "torch's own functions after a trace"
    return st


def _wrapper_set_seed(op, *args, **kwargs):  # OpInfo's, common_methods_invocations.py
    from torch.testing._internal.common_utils import freeze_rng_state

    with freeze_rng_state():
        torch.manual_seed(42)
        return op(*args, **kwargs)


def _seeded_dropout(x):
    torch.manual_seed(42)
    return torch.nn.functional.dropout(x, 0.5)


def _set_state_then_rand(x, state):
    torch.random.set_rng_state(state)
    return x + torch.rand(x.shape)


def _seed_then_restore(x):
    with torch.random.fork_rng():
        torch.manual_seed(42)
        return x + torch.rand_like(x)


def _set_state_then_restore(x, state):
    saved = torch.random.get_rng_state()
    torch.random.set_rng_state(state)
    try:
        return torch.nn.functional.dropout(x, 0.5) * torch.randn(x.shape)
    finally:
        torch.random.set_rng_state(saved)


def _seeded_ops(x, p):
    return (_wrapper_set_seed(torch.bernoulli, p), _wrapper_set_seed(torch.normal, x, 2.0),
            _wrapper_set_seed(torch.multinomial, p, 3),
            _wrapper_set_seed(torch.randint, 0, 9, (4,)),
            _wrapper_set_seed(torch.Tensor.exponential_, x.clone()),
            _wrapper_set_seed(torch.nn.functional.rrelu, x, training=True),
            torch.rand(2))  # after the restore: the caller's stream


def _saves_and_returns_the_state(x):
    state = torch.get_rng_state()
    y = x + torch.rand_like(x)
    torch.manual_seed(7)
    return y, state, torch.get_rng_state(), torch.rand(2)


def _seed_from_argument(x, seed: int):
    torch.manual_seed(seed)
    return x + torch.randn(x.shape)


def _every_spelling(x):
    torch.random.manual_seed(1)
    a = torch.rand(2)
    state = torch.random.get_rng_state()
    torch.manual_seed(2)
    b = torch.rand(2)
    torch.set_rng_state(state)
    return a, b, torch.rand(2) + x[:2], torch.get_rng_state()


def test_random_state_calls_are_steps():
    """Note [Random state steps]: a function that seeds, saves or restores the generators
    (``torch.manual_seed``, ``get_rng_state``/``set_rng_state``, ``fork_rng``, OpInfo's
    ``wrapper_set_seed``: a sweep of the kind) is compiled; every call draws what eager draws
    and leaves the caller's generators where eager leaves them."""
    x, p = torch.randn(64), torch.rand(5)
    state = torch.Generator().manual_seed(5).get_state()
    rng_calls(_seeded_dropout, x)
    rng_calls(_set_state_then_rand, x, state)
    rng_calls(_seed_then_restore, x)
    rng_calls(_set_state_then_restore, x, state)
    rng_calls(_seeded_ops, x, p)
    rng_calls(_saves_and_returns_the_state, x)
    importlib.import_module("torch._dynamo")  # it replaces torch.manual_seed with a wrapper
    rng_calls(_every_spelling, x)
    st = rng_calls(lambda x: (_seed_from_argument(x, 3), _seed_from_argument(x, 2 ** 64 - 1),
                              _seed_from_argument(x, -5)), x)
    assert st.compiles == 1, st


def test_random_state_errors_are_eagers():
    """A state eager rejects (a float tensor: TypeError; a byte tensor of the wrong size:
    RuntimeError) fails the first step, before the call changed anything: each call runs again
    eagerly and raises eager's exception (Note [Errors inside try] in capture.py)."""
    x = torch.randn(8)
    for state in (torch.zeros(5056), torch.zeros(10, dtype=torch.uint8)):
        st = rng_calls(_set_state_then_rand, x, state, fallbacks=3)
        assert st.compiles == 1, st


def _returns_the_generator(x):
    return x + torch.rand(3, generator=torch.manual_seed(1))


def _seed_from_the_os(x):
    state = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    torch.seed()  # nondeterministic, and seeds CUDA too: put back for eager's comparison
    torch.set_rng_state(state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    return x * 2


def _initial_seed(x):
    torch.manual_seed(9)
    return x * torch.initial_seed()


def _generator_method(x):
    return x * torch.default_generator.initial_seed()


def _generator_methods_restored(x):
    state = torch.default_generator.get_state()
    torch.default_generator.manual_seed(42)
    try:
        return x + torch.rand(3)
    finally:
        torch.default_generator.set_state(state)


def _seed_out_of_range(x):
    torch.manual_seed(2 ** 64)
    return x + torch.rand(3)


def test_unkept_random_state_runs_eagerly():
    """What no step replays runs eagerly on every call, equal to eager (a sweep of the kind): a
    seed from the OS, a seed read back (``torch.initial_seed()``, a generator's own method), a
    generator's own methods that change the state and put it back, the generator
    ``manual_seed`` returns used as an argument, a seed eager rejects."""
    x = torch.randn(3)
    for fn in (_returns_the_generator, _seed_from_the_os, _initial_seed, _generator_method,
               _generator_methods_restored, _seed_out_of_range):
        jf_stats = rng_calls(fn, x, fallbacks=3)
        assert jf_stats.compiles == 0, (fn, jf_stats)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_random_state_calls_are_steps():
    """The CUDA twins (``torch.cuda.manual_seed``/``manual_seed_all``/``get_rng_state``/
    ``set_rng_state``, ``fork_rng`` over CUDA devices) as steps, on CUDA tensors."""
    x = torch.randn(64, device="cuda")

    def f(x):
        with torch.random.fork_rng(devices=[0]):
            torch.cuda.manual_seed(4)
            a = torch.rand_like(x)
        state = torch.cuda.get_rng_state(0)
        torch.cuda.manual_seed_all(5)
        b = torch.nn.functional.dropout(x, 0.5)
        torch.cuda.set_rng_state(state, "cuda:0")
        return a, b, torch.randn(3, device="cuda")

    rng_calls(f, x)


def test_seed_outside_the_function():
    """torch.manual_seed before each call: the compiled dropout draws what eager draws."""
    x = torch.randn(100)
    jf = trident.jit(lambda x: torch.nn.functional.dropout(x, 0.5))
    for _ in range(3):
        torch.manual_seed(42)
        want = torch.nn.functional.dropout(x, 0.5)
        torch.manual_seed(42)
        assert_same(jf(x), want)
    assert jf.stats.hits == 2


# ---- item 8: forward-mode AD runs eagerly --------------------------------------------------

def test_dual_tensor_keeps_its_tangent():
    import torch.autograd.forward_ad as fwAD

    def f(x):
        return x.sin() * 2

    jf = trident.jit(f)
    x, t = torch.randn(5), torch.randn(5)
    with fwAD.dual_level():
        for _ in range(2):
            got = fwAD.unpack_dual(jf(fwAD.make_dual(x, t)))
            want = fwAD.unpack_dual(f(fwAD.make_dual(x, t)))
            assert_same(got.primal, want.primal)
            assert_same(got.tangent, want.tangent)
    assert (jf.stats.fallbacks, jf.stats.hits) == (2, 0), jf.stats


def test_dual_tensor_after_a_plain_call():
    # the native guards (read_arg in runtime/args.cpp) see a tensor's forward-AD tangent: a dual
    # tensor misses a specialization compiled for a plain one and runs eagerly
    import torch.autograd.forward_ad as fwAD

    jf = trident.jit(lambda x: x.sin() * 2)
    x, t = torch.randn(5), torch.randn(5)
    jf(x)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(jf(fwAD.make_dual(x, t)))
        want = fwAD.unpack_dual((lambda x: x.sin() * 2)(fwAD.make_dual(x, t)))
        assert_same(got.tangent, want.tangent)
    assert (jf.stats.hits, jf.stats.fallbacks) == (0, 1), jf.stats
