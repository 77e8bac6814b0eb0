"""The C check of each guard kind (ir/guards.py): the expression the SCM's ``guard()``
evaluates on the hit path, in Note [Guard order] (ir/guards.py). Each guard's Python twin is its
``holds``, over what ``read_arg``/``read_args`` in runtime.cpp read; tests/test_guards.py proves
the two agree on random arguments.
"""

from __future__ import annotations

from trident.codegen.cprint import CPrinter, c_comment, c_int, c_string
from trident.ir.guards import (Aliased, Aligned16, ArgCount, Attributes, Autocast, DefaultDtype,
                               DeviceIndex, DeviceType, Dim, Dtype, FloatBits, FunctionModes,
                               GlobalFlags, GradEnabled, Guard, Inference, InferenceMode, IntValue,
                               IsParameter, Kind, NumThreads, ProcessGroup, RequiresGrad, SameAs,
                               Size, SizeRelation, Stride, Transforms)
from trident.runtime import ABI

# trt_arg_kind's names (trident_rt.h), by value
_KIND_NAMES = {v: k for k, v in ABI.items() if k.startswith("TRT_ARG_")}
# the bit of trt_arg.flags each flag guard reads
_FLAG_BITS = {Aligned16: "TRT_ALIGNED16", RequiresGrad: "TRT_REQUIRES_GRAD",
              Inference: "TRT_INFERENCE", IsParameter: "TRT_PARAMETER"}


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
        case Attributes():  # (a tensor's record holds it in `i`: trident_rt.h)
            return f"a[{g.arg}].i == {int(g.value)}"
        case Aligned16() | RequiresGrad() | Inference() | IsParameter():
            return f"{'' if g.value else '!'}(a[{g.arg}].flags & {_FLAG_BITS[type(g)]})"
        case IntValue():
            return f"a[{g.arg}].i == {c_int(g.value)}"
        case FloatBits():
            return f"trt_f64_bits(a[{g.arg}].f) == {g.value}ULL"
        case SizeRelation():  # Note [Symbolic guards] in lower/guards.py; sets `bad` where
            # int64 cannot decide it (Note [Checked size steps] in render.py)
            return CPrinter(checked=True).doprint(g.expr)
    raise ValueError(f"not a guard kind with a C check: {g!r}")


# ---- Note [Argument records] (trident_rt.h) ---------------------------------------------------
#
# A tensor's kind, dtype, device type and index, dim and flag bits are one word of its record,
# ``trt_arg.head``: the guards of one argument on those fields are checked as one compare of
# that word under a mask, at the place of the first of them in guard order (its Kind guard,
# before any of its sizes is read). The guards are pure reads of the records, so the order of
# a conjunction's checks decides only which fails first, and the miss reason is Python's (each
# guard's ``holds``). A field's value that its place cannot hold (no such tensor is read as one)
# stays a check of its own. read_arg writes no flag bit but TRT_REQUIRES_GRAD, TRT_ALIGNED16,
# TRT_INFERENCE and TRT_PARAMETER (a record starts zeroed), so where all four are guarded the
# whole flags byte is compared, and a tensor's every header guard is one compare of the word with a
# constant.

# per header guard kind: its field's bit offset in the word and its width in bits
_HEAD_FIELDS = {Kind: ("TRT_HEAD_KIND", 8), Dtype: ("TRT_HEAD_DTYPE", 8),
                DeviceType: ("TRT_HEAD_DEVICE_TYPE", 8),
                DeviceIndex: ("TRT_HEAD_DEVICE_INDEX", 16), Dim: ("TRT_HEAD_DIM", 16)}
_HEADER = (*_HEAD_FIELDS, *_FLAG_BITS)


def _head_bits(g: Guard) -> tuple[int, int] | None:
    """The (mask, value) of header guard ``g`` in ``trt_arg.head``, or None where its value
    does not fit its field (the record then never holds it: a check of its own)."""
    if type(g) in _FLAG_BITS:
        bit = ABI[_FLAG_BITS[type(g)]] << ABI["TRT_HEAD_FLAGS"]
        return bit, bit if g.value else 0
    name, width = _HEAD_FIELDS[type(g)]
    value = int(g.value)
    if not -(1 << (width - 1)) <= value < (1 << (width - 1)):
        return None
    mask = (1 << width) - 1
    return mask << ABI[name], (value & mask) << ABI[name]


def guard_checks(guards: list[Guard], names: list[str]) -> list[tuple[str, str]]:
    """The C checks of ``guards`` in guard order (Note [Guard order]), each (expression,
    comment): an argument's guards on its record's header as one compare (Note [Argument
    records]), a size relation as its checked form (Note [Checked size steps] in render.py),
    every other guard as ``guard_c``'s."""
    groups: dict[int, list[tuple[Guard, tuple[int, int]]]] = {}
    for g in guards:
        bits = _head_bits(g) if isinstance(g, _HEADER) else None
        if bits is not None:
            groups.setdefault(g.arg, []).append((g, bits))
    out: list[tuple[str, str]] = []
    for g in guards:
        group = groups.get(g.arg) if isinstance(g, _HEADER) and _head_bits(g) else None
        if group is None or len(group) < 2:
            expr = guard_c(g)
            out.append((f"({expr}) && !bad" if isinstance(g, SizeRelation) else expr,
                        c_comment(g.words(names))))
        elif group[0][0] is g:  # the argument's first header guard: all of them, here
            mask = value = 0
            for _, (m, v) in group:
                mask, value = mask | m, value | v
            if {type(h) for h, _ in group} >= set(_FLAG_BITS):  # every flag checked: the
                mask |= 0xFF << ABI["TRT_HEAD_FLAGS"]  # byte's other bits are 0 in every record
            word = f"a[{g.arg}].head"
            expr = f"{word} == {value:#x}ULL" if mask == (1 << 64) - 1 else \
                f"({word} & {mask:#x}ULL) == {value:#x}ULL"
            out.append((expr, c_comment("; ".join(h.words(names) for h, _ in group))))
    return out
