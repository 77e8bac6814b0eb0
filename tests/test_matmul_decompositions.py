"""``linear`` and ``matmul`` decomposed through their C++ bodies in static traces (Note
[Composite ops] in trident/lower/decompositions.py): the compiled call must equal eager bit for
bit (values, dtype, strides, views), raise eager's exception type, and miss on a new layout.

The bodies branch on ``isTensorSubclassLike``, which is true for the trace's fake tensors and
false for eager's (ATen's ``linear``: ``add`` instead of ``add_`` for the bias; ``_matmul_impl``:
a 3-D @ 3-D product with a batch of 1 squeezes it and folds into ``mm`` where eager runs
``bmm``). Those cases failed when every ``linear`` and ``matmul`` was unfolded; they stay whole
now (a bias, a batched right operand). The sweep covers the kinds that were found fine.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import trident
from _trident_helpers import as_in_a_new_process, assert_same, clone_strided


def _clone(args, memo=None):
    """Equal but separate arguments (lists too), with their strides and ``requires_grad``; a
    tensor passed twice stays one tensor."""
    memo = {} if memo is None else memo
    out = []
    for a in args:
        if isinstance(a, list):
            out.append(_clone(a, memo))
        elif isinstance(a, torch.Tensor):
            if id(a) not in memo:
                memo[id(a)] = clone_strided(a).requires_grad_(a.requires_grad)
            out.append(memo[id(a)])
        else:
            out.append(a)
    return out


def _like_eager(fn, *argsets):
    """Each argument set through ``trident.jit(fn)`` (static) twice, against eager: same
    result (``assert_same``: values bit for bit, dtype, strides), same ``_base is None``, or
    the same exception type. Returns the JitFunction."""
    jf = trident.jit(fn, dynamic=False)
    for args in argsets:
        for _ in range(2):
            want_args, got_args = _clone(args), _clone(args)
            try:
                want = fn(*want_args)
            except Exception as e:  # noqa: BLE001 (eager's exception, whatever its type)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with pytest.raises(type(e)):
                        jf(*got_args)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = jf(*got_args)
            assert_same(got, want)
            for g, w in zip(got if isinstance(got, tuple) else (got,),
                            want if isinstance(want, tuple) else (want,)):
                assert (g._base is None) == (w._base is None), "a view where eager has none"
            assert_same(got_args, want_args, path="args")
    return jf


def _matmul(a, b):
    return torch.matmul(a, b)


def _linear(x, w, b):
    return F.linear(x, w, b)


# ---- faults: the trace's fake tensors are "subclass-like" ------------------------------------

def _noncontiguous(*shape, dtype=torch.float32):
    """A 3-D input that is not contiguous (so ``linear`` takes ``matmul`` + bias ``add_``)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(shape[1], shape[0], shape[2], generator=g) * 4).to(dtype).transpose(0, 1)


@pytest.mark.parametrize("x_dtype, bias", [
    (torch.float32, torch.randn(6, dtype=torch.float64)),  # eager: float32 (add_), not float64
    (torch.float16, torch.randn(6)),  # eager: float16, not float32
    (torch.float32, torch.randn(2, 4, 3, 6)),  # eager raises: add_ cannot broadcast its self
    (torch.float32, torch.randn(6, dtype=torch.complex64)),  # eager raises: complex into float
    (torch.int64, torch.randn(6)),  # eager raises: float into int64
], ids=["f64-bias", "f32-bias-f16-input", "broadcast-bias", "complex-bias", "float-bias-int"])
def test_linear_bias_is_added_in_place_as_eager(x_dtype, bias):
    """ATen's ``linear`` adds a bias that it cannot fuse into ``addmm`` (non-contiguous
    input) with ``output.add_(bias)``, but ``at::add(output, bias)`` on a subclass-like bias,
    which a fake tensor is: a static trace of ``F.linear`` promotes the result's dtype, and
    returns a broadcast result where eager raises."""
    x = _noncontiguous(4, 3, 5, dtype=x_dtype)
    w = (torch.randn(6, 5) * 4).to(x_dtype)
    _like_eager(_linear, (x, w, bias))


@pytest.mark.parametrize("swap", [False, True], ids=["batch1-rhs", "batch1-lhs"])
def test_matmul_3d_batch_of_one_runs_bmm_as_eager(swap):
    """``_matmul_impl`` squeezes a 3-D operand's batch of 1 (against a batch of 4) only for a
    tensor that requires grad or is subclass-like: the trace folds ``a @ b[0]`` into one
    ``mm``, eager runs ``bmm`` of the expanded ``b``, whose CPU kernel for small products
    sums in another order (float32: last-bit differences in about half of random draws)."""
    g = torch.Generator().manual_seed(0)
    draws = [(torch.randn(4, 8, 8, generator=g), torch.randn(1, 8, 6, generator=g))
             for _ in range(4)]
    if swap:
        draws = [(b.mT, a.mT) for a, b in draws]
    jf = _like_eager(_matmul, *draws)
    assert jf.stats.fallbacks == 0


# ---- the kinds checked and found fine --------------------------------------------------------

def _t(*shape, dtype=torch.float32, layout="contiguous"):
    """A tensor of ``shape``: contiguous, ``reversed`` (its dims' order in memory reversed),
    ``sliced`` (every other element of its last dim) or ``expanded`` (dim 0 stride 0)."""
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    def make(s):
        x = torch.randn(*s, generator=g) * 4
        return (x.abs() if dtype == torch.uint8 else x).to(dtype)
    if layout == "reversed":
        return make(shape[::-1]).permute(*range(len(shape) - 1, -1, -1))
    if layout == "sliced":
        return make((*shape[:-1], 2 * shape[-1]))[..., ::2]
    if layout == "expanded":
        return make((1, *shape[1:])).expand(*shape)
    return make(shape)


_MATMULS = [  # (a, b): every rank pair from 1-D to 5-D, broadcast batches, size 0 and 1, k = 0
    ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)), ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (3, 4, 5)), ((1, 2, 2, 3, 4), (2, 1, 4, 5)), ((2, 3, 0), (0, 5)),
    ((0, 3, 4), (4, 5)), ((2, 1, 4), (4, 1)), ((4, 1), (1, 2, 1, 5)), ((1, 3, 4), (1, 4, 5)),
]


def _products(operands):
    return tuple(a @ b for a, b in zip(operands[::2], operands[1::2]))


def test_matmul_every_rank_and_layout_like_eager():
    """Every pair of ``_MATMULS`` in one function, in three layouts (contiguous; reversed
    against sliced: a reshape that must copy, a fold that must not; expanded): one
    specialization per layout, each hit once; values, strides and views as eager's."""
    layouts = [("contiguous",) * 2, ("reversed", "sliced"), ("sliced", "reversed"),
               ("expanded", "expanded")]
    argsets = [([t for a, b in _MATMULS for t in (_t(*a, layout=la), _t(*b, layout=lb))],)
               for la, lb in layouts]
    jf = _like_eager(_products, *argsets)
    assert (jf.stats.misses, jf.stats.hits, jf.stats.fallbacks) == (4, 4, 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8, torch.complex64])
def test_matmul_and_linear_dtypes_like_eager(dtype):
    def products(x, w, v, b):
        xt = x.transpose(0, 1)
        return (x @ w.mT, xt @ w.mT, v @ x.mT, F.linear(x, w), F.linear(x, w, b),
                F.linear(xt, w, b), F.linear(xt[0], w, b))
    _like_eager(products, (_t(2, 3, 5, dtype=dtype), _t(4, 5, dtype=dtype), _t(5, dtype=dtype),
                           _t(4, dtype=dtype)))


def test_linear_bias_shapes_and_layouts_like_eager():
    """Bias fused into ``addmm`` (2-D input; contiguous input and 1-D bias) or added after
    ``matmul`` (a sliced, expanded or 2-D bias; a non-contiguous input), same dtype."""
    def linears(x, w, *biases):
        return tuple(F.linear(x, w, b) for b in biases)
    x, w = _t(2, 3, 5), _t(4, 5)
    biases = _t(4), _t(4, layout="sliced"), _t(3, 4, layout="expanded"), _t(1, 4)
    _like_eager(linears, (x, w, *biases), (x.transpose(0, 1), w, *biases), (x[0], w, *biases),
                (x[0, 0], w, *biases[:2]))


def test_errors_and_mixed_dtypes_run_as_eager():
    """Eager's exception type: mismatched inner sizes, 0-D operands, mixed dtypes, bool."""
    for args in ((_t(3, 4), _t(5, 2)), (torch.tensor(2.0), _t(5, 2)),
                 (_t(3, 4), _t(4, 2, dtype=torch.float64)),
                 (_t(3, 4) > 0, _t(4, 2) > 0), (_t(2, 3, 4), _t(3, 5, 2))):
        _like_eager(_matmul, args)
    _like_eager(_linear, (torch.tensor(2.0), _t(5, 2), None), (_t(3, 2), _t(4, 3), None))


def test_results_views_inputs_and_reused_buffers_like_eager():
    """Results returned with their inputs, viewed, mutated after the call; a chain whose
    ``mm`` writes a buffer reused between calls; one tensor passed twice; under no_grad with
    a weight that requires grad (``should_fold`` reads it) and under inference_mode."""
    def returned(x, w):
        y = x @ w
        z = F.linear(x, w.mT, None)
        z.relu_()
        return y, x, y.view(-1), z[..., :2]

    def chain(x, w1, w2):
        return ((x @ w1) * 2) @ w2 + F.linear(x, w1.mT) @ w2

    x, w = _t(2, 3, 4), _t(4, 5)
    _like_eager(returned, (x, w), (x.transpose(0, 1), w))
    _like_eager(chain, (_t(3, 4), w, _t(5, 6)), (_t(4), w, _t(5, 6)))
    _like_eager(lambda a, b: a @ b, (_t(4, 4),) * 2, (_t(3, 4, 4),) * 2)
    with torch.no_grad():
        wg = _t(4, 5).requires_grad_()
        _like_eager(lambda a, b: (a @ b, b.mT @ a.mT), (x.transpose(0, 1), wg),
                    (_t(2, 3, 2, 4, layout="reversed"), wg))
    with torch.inference_mode():
        _like_eager(chain, (_t(3, 4), _t(4, 5), _t(5, 6)))


_KERNELS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::mv", "aten::dot", "aten::baddbmm")


def _kernels(fn, args, names=_KERNELS):
    """The kernels of ``names`` (the matmul family) one call of ``fn`` runs, in order
    (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(*args)
    return [e.name for e in prof.events() if e.name in names]


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_views_of_a_tensor_that_requires_grad_fold_as_eager(mode):
    """Under no_grad and inference_mode a view of a tensor that requires grad requires grad
    (unless the tensor is an inference tensor), and ``matmul`` reads the flag (``should_fold``:
    one ``mm`` instead of ``bmm``), so the views the plan computes in C carry it: the hits run
    eager's kernels (the GPU machine's CPU found a ``b.mT @ a.mT`` whose ``bmm`` differed from
    eager's ``mm`` in its last bits)."""
    def products(a, b):
        return a @ b, b.mT @ a.mT, b.mT[:2] @ a.mT, (a @ b.mT.mT).sum()
    pairs = [(a, b) for a, b in _MATMULS if len(a) >= 2 and len(b) == 2 and 0 not in a]
    with torch.inference_mode():
        inference = _t(4, 5).requires_grad_()  # its views do not require grad
    with mode():
        for a, b in [*pairs, ((2, 3, 4), "inference")]:
            b = inference if b == "inference" else _t(*b).requires_grad_()
            args = (_t(*a, layout="reversed"), b)
            jf = trident.jit(products, dynamic=False)
            assert_same(jf(*args), products(*args))  # the compile (its trace runs kernels)
            want, hits = _kernels(products, args), jf.stats.hits
            for _ in range(2):
                assert _kernels(jf, args) == want, (a, b)
            assert (jf.stats.hits - hits, jf.stats.fallbacks) == (2, 0)


def _odd_unit_stride():
    """A (2, 1, 4) tensor whose size-1 dim has another stride than its dims would give it (as
    a Qwen2 decode step's attention output with a batch of 2): contiguous, but its batch dims
    do not fold for ``should_fold``, which compares every stride."""
    return _t(8).as_strided((2, 1, 4), (4, 8, 1))


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_products_whose_fold_reads_requires_grad_run_eagers_kernels(mode):
    """``should_fold`` folds a 3-D input whose batch dims do not fold without a copy (a
    transposed batch; a size-1 dim of another stride) into one ``mm`` only where the matrix
    requires grad, else runs ``bmm``. The trace's fake views lose the flag where a composite's
    body makes them (``linear``'s ``weight.t()``) and under inference_mode where a composite
    view does (``w.T``, ``mT``, ``swapaxes``, ``movedim``, ``reshape``): the plan ran ``bmm``
    where eager runs ``mm`` (a Qwen2 ``generate`` with a batch of 2: its ``o_proj``, other
    logits in the last bits). Where a tensor the function reads requires grad such products
    stay whole (a module's weight too); else the trace's ``bmm`` is eager's."""
    def products(x, w):
        return (F.linear(x, w), F.linear(x, w.t().t()), x @ w.T, x @ w.mT, x @ w.swapaxes(0, 1),
                x @ w.movedim(0, 1), x @ w.reshape(4, 5), x @ w.t(), x @ w[0])
    lin = torch.nn.Linear(4, 5, bias=False)  # made outside inference_mode: not an inference tensor
    with mode():
        for x in (_t(2, 3, 4, layout="reversed"), _odd_unit_stride()):
            for requires_grad in (True, False):
                w = _t(5, 4).requires_grad_(requires_grad)
                jf = trident.jit(products, dynamic=False)
                assert_same(jf(x, w), products(x, w))
                want, hits = _kernels(products, (x, w)), jf.stats.hits
                assert _kernels(jf, (x, w)) == want, (x.stride(), requires_grad)
                assert (jf.stats.hits - hits, jf.stats.fallbacks) == (1, 0)
            jm = trident.jit(lin)
            assert_same(jm(x), lin(x))
            assert _kernels(jm, (x,)) == _kernels(lin, (x,)) == ["aten::mm"]
            assert (jm.stats.hits, jm.stats.fallbacks) == (1, 0)


# and the bias additions (``add`` out of place, ``add_`` in place)
_KERNELS_AND_ADDS = (*_KERNELS, "aten::add", "aten::add_")


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_linear_adds_a_bias_that_it_cannot_fuse_in_place_as_eager(mode):
    """A contiguous 3-D input's bias fuses into ``addmm`` only where it is contiguous and 1-D
    (or squeezes to 1-D: torch 2.13); eager adds any other after ``matmul``, in place
    (``add_``), which the trace's fake tensors add out of place: a 0-D, 2-D, 3-D, sliced or
    expanded bias must not be unfolded (a float64 bias promoted the result, a 4-D one
    broadcast it and a complex one was added where eager raises). Kernels as eager's."""
    x, w = _t(2, 3, 5), _t(6, 5)
    biases = [_t(3, 6, dtype=torch.float64), _t(6, layout="sliced", dtype=torch.float64),
              _t(1, dtype=torch.float64).expand(6), _t(6), _t(1, 6), _t(3, 6), _t(2, 3, 6),
              torch.tensor(1.5), torch.tensor(1.5, dtype=torch.float64), _t(6, layout="sliced"),
              _t(2, 1, 3, 6), torch.tensor(1j)]
    with mode():
        for b in biases:
            as_in_a_new_process()  # Note [Specialization limit]: three per bias
            _like_eager(_linear, (x, w, b), (_t(4, 5), w, b))
            try:
                want = _kernels(_linear, (x, w, b), _KERNELS_AND_ADDS)
            except RuntimeError:
                continue  # _like_eager checked eager's exception
            jf = trident.jit(_linear, dynamic=False)
            jf(x, w, b)
            hits = jf.stats.hits
            assert _kernels(jf, (x, w, b), _KERNELS_AND_ADDS) == want, \
                (b.shape, b.stride(), b.dtype)
            assert (jf.stats.hits - hits, jf.stats.fallbacks) == (1, 0)


def test_module_linear_on_3d_inputs_like_eager():
    """``torch.nn.Linear`` (Hugging Face style: 3-D hidden states), contiguous then a
    transposed and a sliced input of the same shape: a miss each, then hits."""
    with torch.no_grad():
        lin = torch.nn.Linear(4, 5)
        h = _t(2, 3, 4)
        jf = _like_eager(lin, (h,), (h.transpose(0, 1).contiguous().transpose(0, 1),),
                         (_t(2, 3, 4, layout="sliced"),))
    assert (jf.stats.misses, jf.stats.hits, jf.stats.fallbacks) == (3, 3, 0)
