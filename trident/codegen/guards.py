"""The C check of each guard kind (ir/guards.py): the expression the SCM's ``guard()``
evaluates on the hit path, in Note [Guard order] (ir/guards.py). Each guard's Python twin is its
``holds``, over what ``read_arg``/``read_args`` in runtime.cpp read; tests/test_guards.py proves
the two agree on random arguments.
"""

from __future__ import annotations

from trident.codegen.cprint import CPrinter, c_int, c_string
from trident.ir.guards import (Aliased, Aligned16, ArgCount, Autocast, DefaultDtype, DeviceIndex,
                               DeviceType, Dim, Dtype, FloatBits, FunctionModes, GlobalFlags,
                               GradEnabled, Guard, Inference, InferenceMode, IntValue, Kind,
                               NumThreads, ProcessGroup, RequiresGrad, SameAs, Size, SizeRelation,
                               Stride, Transforms)
from trident.runtime import ABI

# trt_arg_kind's names (trident_rt.h), by value
_KIND_NAMES = {v: k for k, v in ABI.items() if k.startswith("TRT_ARG_")}
# the bit of trt_arg.flags each flag guard reads
_FLAG_BITS = {Aligned16: "TRT_ALIGNED16", RequiresGrad: "TRT_REQUIRES_GRAD",
              Inference: "TRT_INFERENCE"}


def guard_c(g: Guard) -> str:
    """The C check of guard ``g``: an expression over ``const trt_arg* a``, ``int32_t n`` and
    ``const trt_env* env`` that is non-zero when the guard holds. Raises ValueError for a kind
    that has no C check."""
    match g:
        case ArgCount():
            return f"n == {g.value}"
        case GradEnabled() | InferenceMode() | Autocast() | Aliased() | Transforms() | \
                FunctionModes():  # call-wide bools
            return f"env->{g.field} == {int(g.value)}"
        case DefaultDtype() | NumThreads():
            return f"env->{g.field} == {g.value}"
        case ProcessGroup():  # Note [Process group guard] in ir/guards.py
            return f"trt_streq(env->process_group, {c_string(g.value)})"
        case GlobalFlags():
            return f"env->flags == {g.value}ULL"
        case Kind():
            return f"a[{g.arg}].kind == {_KIND_NAMES[g.value]}"
        case Dtype() | DeviceType() | DeviceIndex() | Dim():
            return f"a[{g.arg}].{g.field} == {g.value}"
        case SameAs():
            return f"a[{g.arg}].tensor == a[{g.value}].tensor"
        case Size() | Stride():
            return f"a[{g.arg}].{g.member}[{g.index}] == {g.value}"
        case Aligned16() | RequiresGrad() | Inference():
            return f"{'' if g.value else '!'}(a[{g.arg}].flags & {_FLAG_BITS[type(g)]})"
        case IntValue():
            return f"a[{g.arg}].i == {c_int(g.value)}"
        case FloatBits():
            return f"trt_f64_bits(a[{g.arg}].f) == {g.value}ULL"
        case SizeRelation():  # Note [Symbolic guards] in lower/guards.py; sets `bad` where
            # int64 cannot decide it (Note [Checked size steps] in render.py)
            return CPrinter(checked=True).doprint(g.expr)
    raise ValueError(f"not a guard kind with a C check: {g!r}")
