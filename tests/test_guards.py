"""The native guards (C, in the SCM, over what runtime.cpp's read_arg saw) agree with the Python
reference (guards.first_failure over guards.arg_facts) on random arguments."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trident
from _trident_helpers import make_cache_dir
from trident.guards import first_failure


def probe(*args):
    return tuple(a + 1 for a in args if isinstance(a, torch.Tensor))


class Sub(torch.Tensor):
    pass


# A tensor description: (dtype, shape, layout, requires_grad); layouts:
#   contig, t (last two dims transposed), expand (size-1 dims broadcast to 3), slice (every
#   other row of a bigger tensor), offset (a contiguous view starting one element in:
#   misaligned), param (nn.Parameter), subclass, conj (conjugate bit), zero_dim.
def make_tensor(dtype, shape, layout, requires_grad=False):
    shape = tuple(shape)
    if layout == "t" and len(shape) >= 2:
        t = torch.zeros(shape[:-2] + (shape[-1], shape[-2]), dtype=dtype).transpose(-1, -2)
    elif layout == "expand":
        t = torch.zeros(tuple(1 if s == 3 else s for s in shape), dtype=dtype).expand(shape)
    elif layout == "slice" and len(shape) >= 1:
        t = torch.zeros((shape[0] * 2,) + shape[1:], dtype=dtype)[::2]
    elif layout == "offset":
        n = math.prod(shape)
        t = torch.zeros(n + 1, dtype=dtype)[1:].view(shape)
    elif layout == "param":
        t = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
    elif layout == "subclass":
        t = torch.zeros(shape, dtype=dtype).as_subclass(Sub)
    elif layout == "conj":
        t = torch.zeros(shape, dtype=torch.complex64).conj()
    else:
        t = torch.zeros(shape, dtype=dtype)
    if requires_grad and t.dtype.is_floating_point and t.is_leaf:
        t.requires_grad_(True)
    return t


T = make_tensor

# Base signatures, each compiled once; (args factory, grad mode it is compiled under).
BASES = [
    (lambda: (T(torch.float32, (2, 3), "contig"), 3, 1.5), False),
    (lambda: (T(torch.float32, (2, 3), "t"), 3, -0.0), False),
    (lambda: (T(torch.float64, (4,), "contig"), True, None), False),
    (lambda: (T(torch.int64, (2, 0), "contig"), float("nan"), 2), False),
    (lambda: (T(torch.float16, (3, 3), "expand"), 7), False),
    (lambda: (T(torch.bfloat16, (5,), "slice"), -2**63), False),
    (lambda: (T(torch.bool, (2, 2), "contig"), T(torch.int32, (1,), "contig"), False), False),
    (lambda: (T(torch.float32, (3,), "contig", requires_grad=True),), False),
    (lambda: (T(torch.float32, (3,), "offset"), 2**63 - 1, float("inf")), False),
    (lambda: (T(torch.float32, (), "contig"),), False),
]


def native(jf, args) -> int:
    """The native guards' verdict on the call's leaves (Note [Argument trees])."""
    return jf._select(*args)


def reference(jf, args) -> int:
    try:
        call = jf._flatten(args, {})
    except trident.TridentError:  # Note [Argument trees]: such a call runs eagerly
        return -1
    for i, spec in enumerate(jf._specs):
        if spec.tree == call.tree.key and first_failure(spec.guards, call.leaves) is None:
            return i
    return -1


@pytest.fixture(scope="module")
def compiled_once(tmp_path_factory):
    """The base signatures' specializations, compiled once for this file's tests (which only
    hit them), in a cache folder of their own."""
    saved = os.environ["TRIDENT_CACHE_DIR"]
    os.environ["TRIDENT_CACHE_DIR"] = str(make_cache_dir(tmp_path_factory.mktemp("guards")))
    try:
        jf = trident.jit(max_specializations=32)(probe)
        for make, grad in BASES:
            with torch.set_grad_enabled(grad):
                jf(*make())
    finally:
        os.environ["TRIDENT_CACHE_DIR"] = saved
    assert jf.stats.compiles == len(BASES) and jf.stats.fallbacks == 0
    return jf


@pytest.fixture
def compiled(compiled_once):
    grad = torch.is_grad_enabled()
    yield compiled_once
    torch.set_grad_enabled(grad)


def test_each_base_signature_selects_its_own_specialization(compiled):
    jf = compiled
    for i, (make, grad) in enumerate(BASES):
        with torch.set_grad_enabled(grad):
            args = make()
            assert native(jf, args) == i
            assert reference(jf, args) == i
            hits = jf.stats.hits
            jf(*args)
            assert jf.stats.hits == hits + 1


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]
LAYOUTS = ["contig", "t", "expand", "slice", "offset", "param", "subclass", "conj", "contig"]


@st.composite
def tensors(draw):
    shape = draw(st.lists(st.sampled_from([0, 1, 2, 3, 4, 5]), min_size=0, max_size=3))
    layout = draw(st.sampled_from(LAYOUTS))
    dtype = draw(st.sampled_from(DTYPES))
    if layout in ("t", "slice") and len(shape) < 2:
        layout = "contig"
    return make_tensor(dtype, shape, layout, draw(st.booleans()))


scalars = st.one_of(
    st.integers(min_value=-2**63, max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 3, 7, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**100]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf"), -float("inf"), 2.0]),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.sampled_from([{"a": 1}, [1, 2], (3,), object(), torch.float32, 2j]),
)
any_arg = st.one_of(tensors(), scalars)


@st.composite
def calls(draw):
    """Mostly mutations of a base signature (so accepting and rejecting calls both occur)."""
    index = draw(st.integers(0, len(BASES) - 1))
    make, grad = BASES[index]
    args = list(make())
    mutation = draw(st.sampled_from(["none", "none", "replace", "replace", "append", "drop",
                                     "random"]))
    if mutation == "replace" and args:
        args[draw(st.integers(0, len(args) - 1))] = draw(any_arg)
    elif mutation == "append":
        args.append(draw(any_arg))
    elif mutation == "drop" and args:
        args.pop(draw(st.integers(0, len(args) - 1)))
    elif mutation == "random":
        args = draw(st.lists(any_arg, max_size=4))
    grad = draw(st.sampled_from([grad, not grad]))
    return tuple(args), grad


def test_native_guards_agree_with_python_reference(compiled):
    jf = compiled
    outcomes = {"match": 0, "miss": 0}

    @settings(max_examples=400, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(calls())
    def agree(call):
        args, grad = call
        with torch.set_grad_enabled(grad):
            want = reference(jf, args)
            got = native(jf, args)
        assert got == want, (f"native {got} != reference {want} for grad={grad} args="
                             f"{[_describe(a) for a in args]}")
        outcomes["match" if got >= 0 else "miss"] += 1

    agree()
    # the generator really exercised both verdicts
    # (grad mode is guarded: a call in the other mode than its base signature misses)
    assert outcomes["match"] > 10 and outcomes["miss"] > 20, outcomes


def test_float_guards_compare_bit_patterns(compiled):
    jf = compiled
    torch.set_grad_enabled(BASES[1][1])  # grad mode is guarded too (reset by the fixture)
    base = BASES[1][0]()  # (x, 3, -0.0)
    assert native(jf, base) == 1
    for other in (0.0, -0.0 + 0.0, 1e-300, -1e-320):
        args = (base[0], 3, other)
        assert native(jf, args) == reference(jf, args) == -1
    torch.set_grad_enabled(BASES[3][1])
    nan_base = BASES[3][0]()  # (x, nan, 2)
    assert native(jf, nan_base) == 3
    args = (nan_base[0], -float("nan"), 2)  # another NaN bit pattern
    assert native(jf, args) == reference(jf, args)


def test_int_guards_at_the_int64_edges(compiled):
    jf = compiled
    torch.set_grad_enabled(BASES[5][1])
    x = BASES[5][0]()[0]
    assert native(jf, (x, -2**63)) == 5
    for v in (-2**63 + 1, 2**63 - 1, -2**63 - 1, 2**64, True):
        args = (x, v)
        assert native(jf, args) == reference(jf, args) == -1


def _describe(a):
    if isinstance(a, torch.Tensor):
        return (f"{type(a).__name__}({a.dtype}, {tuple(a.shape)}, stride={a.stride()}, "
                f"offset={a.storage_offset()}, rg={a.requires_grad}, conj={a.is_conj()})")
    return repr(a)
