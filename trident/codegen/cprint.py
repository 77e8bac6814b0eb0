"""C literals and expressions: the printers every writer of C in codegen uses (a leaf module)."""

from __future__ import annotations

import json
import math
import struct

import sympy
from torch.utils._pytree import TreeSpec
from torch.utils._sympy.printers import ExprPrinter

from trident.errors import TridentError
from trident.ir import sizes
from trident.ir.plan import spec_children


def c_int(v: int) -> str:
    """A C literal for an int64, INT64_MIN included.

    Raises:
        TridentError: ``v`` is no int64 (a constant the trace computed past 2**63, Note
            [Checked size steps] in render.py): the call runs eagerly."""
    if not -2**63 <= v < 2**63:
        raise TridentError(f"the int {v} is past int64: the generated C has no such int")
    return "(-9223372036854775807LL - 1)" if v == -2**63 else f"{v}LL"


class CPrinter(ExprPrinter):
    """A size expression as a C int64 expression over the SCM's ``trt_arg a[]`` (torch's
    ``ExprPrinter`` parenthesizes by precedence; C's precedence of these operators agrees).
    ``checked``: ``+``, ``*``, ``//`` and ``%`` through trident_rt.h's ``trt_*_x``, which set the
    C int ``bad`` where Python's answer is no int64 or Python raises (Note [Checked size steps]
    in render.py)."""

    def __init__(self, checked: bool = False):
        super().__init__()
        self.checked = checked

    def _call(self, name: str, expr) -> str:  # a binary operator folded left, checked
        out = self.doprint(expr.args[0])
        for b in expr.args[1:]:
            out = f"trt_{name}_x({out}, {self.doprint(b)}, &bad)"
        return out

    def _print_Add(self, expr, order=None) -> str:
        return self._call("add", expr) if self.checked else super()._print_Add(expr, order)

    def _print_Mul(self, expr) -> str:
        return self._call("mul", expr) if self.checked else super()._print_Mul(expr)

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        kind, arg, dim = sizes.where(expr)
        return f"a[{arg}].{sizes.PLACES[kind]}" + ("" if dim is None else f"[{dim}]")

    def _print_Integer(self, expr: sympy.Integer) -> str:
        if self.checked and not -2**63 <= int(expr) < 2**63:
            return "(bad = 1, 0LL)"  # a literal past int64: Python's answer is no int64's
        return c_int(int(expr))

    def _print_BooleanTrue(self, expr) -> str:
        return "1"

    def _print_BooleanFalse(self, expr) -> str:
        return "0"

    def _print_FloorDiv(self, expr) -> str:
        if self.checked:
            return self._call("floordiv", expr)
        return f"trt_floordiv({self.doprint(expr.args[0])}, {self.doprint(expr.args[1])})"

    def _print_PythonMod(self, expr) -> str:
        if self.checked:
            return self._call("mod", expr)
        return f"trt_mod({self.doprint(expr.args[0])}, {self.doprint(expr.args[1])})"

    _print_Mod = _print_PythonMod

    def _print_Max(self, expr) -> str:  # folded pairwise
        return self._fold(expr, ">")

    def _print_Min(self, expr) -> str:
        return self._fold(expr, "<")

    def _fold(self, expr, op: str) -> str:
        out = self.doprint(expr.args[0])
        for b in expr.args[1:]:
            b = self.doprint(b)
            out = f"(({out}) {op} ({b}) ? ({out}) : ({b}))"
        return out

    def _print_And(self, expr) -> str:
        return " && ".join(f"({self.doprint(a)})" for a in expr.args)

    def _print_Or(self, expr) -> str:
        return " || ".join(f"({self.doprint(a)})" for a in expr.args)

    def _print_Not(self, expr) -> str:
        return f"!({self.doprint(expr.args[0])})"


def size_c(expr: sympy.Basic) -> str:
    """A size expression (Note [Size expressions]) as a C int64 expression."""
    return CPrinter().doprint(expr)


def out_spec_code(spec: TreeSpec) -> str:
    """An output structure as the runtime's ``build_output`` reads it (Note [Output spec] in
    runtime/args.cpp): ``(``..``)`` a tuple, ``[``..``]`` a list, ``v`` the next flat output,
    ``n`` None (where torch's pytree has None as a node of no children, not as a leaf)."""
    if spec.is_leaf():
        return "v"
    if spec.type is type(None):
        return "n"
    inner = "".join(out_spec_code(c) for c in spec_children(spec))
    return f"({inner})" if spec.type is tuple else f"[{inner}]"


def c_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=True)


def c_float(f: float) -> str:
    if math.isnan(f):  # keep the sign and payload: guards compare NaNs by bit pattern
        bits = struct.unpack("<Q", struct.pack("<d", f))[0]
        payload = bits & ((1 << 51) - 1)
        return f"{'-' if bits >> 63 else ''}__builtin_nan(\"{payload:#x}\")"
    if math.isinf(f):
        return "INFINITY" if f > 0 else "-INFINITY"
    return f"{float.hex(f)} /* {f!r} */"


def c_comment(s: str) -> str:
    return s.replace("*/", "* /")
