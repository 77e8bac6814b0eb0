"""The native guards (C, in the SCM, over what args.cpp's read_arg saw) agree with the Python
reference (guards.first_failure over facts.arg_facts) on random arguments."""

from __future__ import annotations

import contextlib
import json
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trident
from _trident_helpers import c_module, make_cache_dir
from trident.ir import sizes
from trident.ir.guards import (KINDS, ArgCount, ArgGuard, Dtype, FloatBits, Guard, IntValue,
                               ProcessGroup, SameAs, Size, SizeRelation, Stride, first_failure)
from trident.ir.facts import TENSOR, ArgFacts, Facts, float_bits


def probe(*args):
    return tuple(a + 1 for a in args if isinstance(a, torch.Tensor))


class Sub(torch.Tensor):
    pass


# A tensor description: (dtype, shape, layout, requires_grad); layouts:
#   contig, t (last two dims transposed), expand (size-1 dims broadcast to 3), slice (every
#   other row of a bigger tensor), offset (a contiguous view starting one element in:
#   misaligned), param (nn.Parameter), attrs (a Python attribute set on it), subclass, conj
#   (conjugate bit), zero_dim.
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
    elif layout == "attrs":
        t = torch.zeros(shape, dtype=dtype)
        t.scale = 2.0
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
    (lambda: (lambda t: (t, 2, t))(T(torch.float32, (2,), "contig")), False),  # one tensor twice
    (lambda: (T(torch.float32, (2,), "param"),), False),
    (lambda: (T(torch.float32, (2,), "attrs"),), False),
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
LAYOUTS = ["contig", "t", "expand", "slice", "offset", "param", "attrs", "subclass", "conj",
           "contig"]


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
                                     "random", "alias"]))
    if mutation == "replace" and args:
        args[draw(st.integers(0, len(args) - 1))] = draw(any_arg)
    elif mutation == "append":
        args.append(draw(any_arg))
    elif mutation == "drop" and args:
        args.pop(draw(st.integers(0, len(args) - 1)))
    elif mutation == "random":
        args = draw(st.lists(any_arg, max_size=4))
    elif mutation == "alias" and any(isinstance(a, torch.Tensor) for a in args):
        args.append(draw(st.sampled_from([a for a in args if isinstance(a, torch.Tensor)])))
    grad = draw(st.sampled_from([grad, not grad]))
    return tuple(args), grad, draw(st.sampled_from(["as is"] * 4 + list(ENVIRONMENTS)))


@contextlib.contextmanager
def _default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


# Call-wide state a call may run under (Note [Guard order]'s call-wide guards)
ENVIRONMENTS = {"as is": contextlib.nullcontext, "inference mode": torch.inference_mode,
                "default dtype": lambda: _default_dtype(torch.float64),
                # (the flags() context: torch.testing disables setting the flags directly)
                "global flags": lambda: torch.backends.cudnn.flags(
                    enabled=not torch.backends.cudnn.enabled)}


def test_native_guards_agree_with_python_reference(compiled):
    jf = compiled
    outcomes = {"match": 0, "miss": 0}

    @settings(max_examples=400, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(calls())
    def agree(call):
        args, grad, env = call
        with torch.set_grad_enabled(grad), ENVIRONMENTS[env]():
            want = reference(jf, args)
            got = native(jf, args)
        assert got == want, (f"native {got} != reference {want} for grad={grad}, {env}, args="
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


# ---- Note [Size expressions]: the C that codegen prints agrees with sizes.evaluate ------------

def _size_expressions(n: int, seed: int = 0) -> list:
    """``n`` random integer and boolean expressions over a few places of two tensor arguments
    (divisors are positive, as a specialization's range guards make them before they run)."""
    import random

    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, Min, PythonMod

    rng = random.Random(seed)
    places = [sizes.place("size", 0, 0), sizes.place("size", 0, 1), sizes.place("stride", 0, 0),
              sizes.place("size", 1, 0), sizes.place("offset", 1)]

    def integer(depth):
        pick = rng.randrange(9 if depth else 2)
        if pick == 0:
            return rng.choice(places)
        if pick == 1:
            return sympy.Integer(rng.randint(-5, 40))
        a, b = integer(depth - 1), integer(depth - 1)
        return [a + b, a * b, FloorDiv(a, rng.randint(1, 9)), PythonMod(a, rng.randint(1, 9)),
                FloorDiv(a, Max(1, b)), Max(a, b), Min(a, b, integer(0))][pick - 2] \
            if pick < 9 else a

    def boolean(depth):
        pick = rng.randrange(4 if depth else 1)
        if pick == 0:
            relation = rng.choice([sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge])
            return relation(integer(2), integer(2))
        a, b = boolean(depth - 1), boolean(depth - 1)
        return [sympy.And(a, b), sympy.Or(a, b), sympy.Not(a)][pick - 1]

    out = []
    while len(out) < n:
        e = integer(3) if rng.random() < 0.5 else boolean(2)
        try:
            sizes.check(e)
        except trident.TridentError:
            continue
        out.append(e)
    return out


@pytest.fixture(scope="module")
def size_expressions(tmp_path_factory):
    """The expressions and a cffi library whose ``eval_expr(k, ...)`` computes expression ``k``
    as codegen prints it, over ``trt_arg a[2]``."""
    pytest.importorskip("cffi")
    from trident.codegen.cprint import CPrinter

    exprs = _size_expressions(300)
    body = "\n".join(f"    case {k}: return (int64_t)({CPrinter().doprint(e)});"
                     for k, e in enumerate(exprs))
    source = f"""#include <stdint.h>
#include "trident_rt.h"
int64_t eval_expr(int k, const int64_t* s0, const int64_t* t0, const int64_t* s1, int64_t o1) {{
  trt_arg a[2] = {{{{0}}}};
  a[0].sizes = s0; a[0].strides = t0; a[1].sizes = s1; a[1].storage_offset = o1;
  switch (k) {{
{body}
  }}
  return 0;
}}
"""
    ffi, lib = c_module(tmp_path_factory.mktemp("size-expressions"), "size_expressions",
                        "int64_t eval_expr(int k, const int64_t* s0, const int64_t* t0, "
                        "const int64_t* s1, int64_t o1);", source)
    return exprs, lib, ffi


def test_size_expressions_in_c_agree_with_python(size_expressions):
    """Each expression's C (codegen's CPrinter) and its Python twin (sizes.evaluate, which
    SizeRelation guards read) give the same value on random sizes, strides and offsets; its
    stored text reads back as the same expression."""
    exprs, lib, ffi = size_expressions
    for e in exprs:
        assert sizes.loads(sizes.dumps(e)) == e

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(st.integers(0, len(exprs) - 1), st.lists(st.integers(0, 40), min_size=3, max_size=3),
           st.integers(-5, 40), st.integers(0, 40))
    def agree(k, numbers, stride, offset):
        facts = [ArgFacts(TENSOR, sizes=tuple(numbers[:2]), strides=(stride,)),
                 ArgFacts(TENSOR, sizes=tuple(numbers[2:]), storage_offset=offset)]
        got = lib.eval_expr(k, ffi.new("int64_t[]", numbers[:2]),
                                   ffi.new("int64_t[]", [stride]),
                                   ffi.new("int64_t[]", numbers[2:]), offset)
        want = sizes.evaluate(exprs[k], facts)
        assert got == int(want), (exprs[k], facts)
        if isinstance(want, bool):  # as a guard
            guard = SizeRelation(True, 1, exprs[k])
            assert guard.holds(Facts(facts, 2, {})) == want

    agree()


def test_size_expression_text_is_read_without_eval():
    """A stored expression is read by walking its syntax tree: anything but the constructors
    of size arithmetic is refused (a damaged or edited cache entry), never run."""
    for text in ("__import__('os').system('true')", "Symbol('x').__class__", "Integer(1.5)",
                 "Add(Integer(1), lambda: 1)", "Symbol('x', integer=print)", "[Integer(1)]", ""):
        with pytest.raises(ValueError):
            sizes.loads(text)


def _one_guard_of_each_kind() -> set:
    examples = {ArgCount(3), Dtype(6, 1), Size(4, 0, 1), Stride(1, 0, 1), SameAs(0, 1),
                FloatBits(float_bits(-0.0), 2), IntValue(7, 2), ProcessGroup(""),
                SizeRelation(True, 0, sizes.place("size", 0, 0) >= 2)}
    examples |= {kind(1, 0) for kind in KINDS.values() if issubclass(kind, ArgGuard)
                 and kind not in (Size, Stride, SizeRelation)}
    examples |= {kind(True) for kind in KINDS.values() if not issubclass(kind, ArgGuard)
                 and kind not in (ArgCount, ProcessGroup)}
    assert {type(g) for g in examples} == set(KINDS.values())
    return examples


def test_every_guard_kind_round_trips_through_json():
    """Each guard kind is stored and read back as itself; an unknown kind raises KeyError (the
    cache drops such an entry)."""
    examples = _one_guard_of_each_kind()
    for g in examples:
        assert Guard.from_json(json.loads(json.dumps(g.to_json()))) == g
    with pytest.raises(KeyError):
        Guard.from_json({"field": "no such kind", "value": 1})


def test_every_guard_kind_has_a_c_check():
    """codegen's ``guard_c`` prints each kind's C check; a kind it does not know raises
    ValueError instead of printing a check that always holds."""
    from trident.codegen.guards import guard_c

    for g in _one_guard_of_each_kind():
        assert guard_c(g)
    assert guard_c(IntValue(-2**63, 1)) == "a[1].i == (-9223372036854775807LL - 1)"
    assert guard_c(Size(4, 0, 1)) == "a[0].sizes[1] == 4"
    assert guard_c(Stride(1, 2, 0)) == "a[2].strides[0] == 1"
    assert guard_c(ProcessGroup("g:0/2")) == 'trt_streq(env->process_group, "g:0/2")'

    class NoCheck(Guard):
        pass

    with pytest.raises(ValueError):
        guard_c(NoCheck(1))


def test_tree_key_is_checked_right_after_the_argument_count():
    """Note [Guard order]: two argument trees of as many leaves (a dict's two key orders, which
    ``f`` reads: Note [Dict orders] in lower/orders.py): each specialization checks the tree
    key (leaf 0) right after the count, so the module of the other tree fails there; each call
    is served by its own, equal to eager."""
    from trident.ir.facts import INT
    from trident.ir.guards import Kind

    def f(d):
        first, second = d.values()
        return first * 2 + second

    jf = trident.jit(f)
    calls = [{"a": torch.ones(3), "b": torch.arange(3.0)},
             {"b": torch.arange(3.0), "a": torch.full((3,), 2.0)}]
    for d in calls + calls:
        assert torch.equal(jf(d), f(d))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 2, 0)
    keys = {s.tree for s in jf._specs}
    assert len(keys) == 2
    for s in jf._specs:
        assert s.guards[:3] == [ArgCount(3), Kind(INT, 0), IntValue(s.tree, 0)]
        assert sum(isinstance(g, IntValue) and g.arg == 0 for g in s.guards) == 1
