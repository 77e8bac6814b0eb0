"""Size expressions: sympy expressions over the places a call's sizes are read from.

Note [Size expressions]: a dynamic trace's sizes are sympy expressions over the ShapeEnv's
symbols (``s0``, ``s1``). Each symbol is read from its source, the first argument size or
stride that is that bare symbol (Note [Symbolic guards] in guards.py). ``at_places`` replaces
every symbol by a *place* symbol that names where the runtime reads it: ``size_0_1`` is
argument 0's ``size(1)`` (``a[0].sizes[1]`` in C), ``stride_0_1`` its ``stride(1)``,
``offset_0`` its ``storage_offset()``, ``value_3`` the value of argument 3, an int traced as a
symbol (Note [Symbolic ints] in lower/guards.py; ``a[3].i`` in C). The expression is then
self-contained data:

* held by guards and launches as the expression, stored in the cache as ``sympy.srepr`` text
  (``dumps``, in their ``to_json``) and read back by ``loads`` (in their ``from_json``), which
  walks the text's syntax tree over a fixed set of constructors (nothing is ``eval``ed);
* printed to C by ``codegen.CPrinter`` (codegen writes all C), to words by ``words``;
* evaluated on a call's facts by ``evaluate``: the Python twin of the C, used to explain a miss
  and property-tested against it (tests/test_guards.py).

Only integer arithmetic that the generated C computes exactly as Python does is accepted
(``check``): ``+``, ``*``, floor division and modulo with Python's signs (``trt_floordiv``,
``trt_mod`` in trident_rt.h), ``Max``, ``Min``, comparisons, ``And``, ``Or``, ``Not``.
"""

from __future__ import annotations

import ast
import functools
from typing import Any

import sympy
from torch.utils._sympy import functions
from torch.utils._sympy.printers import PythonPrinter

from trident.errors import TridentError

PLACES = {"size": "sizes", "stride": "strides", "offset": "storage_offset", "value": "i"}
_MAX = getattr(functions, "Max", sympy.Max)  # torch's own Max/Min where it has them
_MIN = getattr(functions, "Min", sympy.Min)
_MAXES, _MINS = (sympy.Max, _MAX), (sympy.Min, _MIN)


def place(kind: str, arg: int, dim: int | None = None) -> sympy.Symbol:
    """The symbol of argument ``arg``'s ``kind`` ("size", "stride" or "offset") at ``dim``."""
    name = f"{kind}_{arg}" if dim is None else f"{kind}_{arg}_{dim}"
    return sympy.Symbol(name, integer=True)


def where(symbol: sympy.Symbol) -> tuple[str, int, int | None]:
    """``(kind, arg, dim)`` of a place symbol (``dim`` None for an offset)."""
    kind, *numbers = symbol.name.split("_")
    return kind, int(numbers[0]), int(numbers[1]) if len(numbers) > 1 else None


def at_places(expr: sympy.Basic, sources: dict) -> sympy.Basic:
    """``expr`` over ShapeEnv symbols, rewritten over their sources' place symbols.

    Raises:
        TridentError: a symbol no argument size holds, or arithmetic ``check`` refuses.
    """
    for s in expr.free_symbols:
        if s not in sources:
            raise TridentError(f"a guard reads the symbol {s}, which no argument size has")
    out = expr.xreplace(sources)
    check(out)
    return out


# The constructors ``check`` accepts and ``loads`` makes, by the names ``srepr`` prints.
_CONSTRUCTORS = {
    "Symbol": sympy.Symbol, "Integer": sympy.Integer, "Add": sympy.Add, "Mul": sympy.Mul,
    "FloorDiv": functions.FloorDiv, "Mod": functions.Mod, "PythonMod": functions.PythonMod,
    "Max": _MAX, "Min": _MIN, "Equality": sympy.Eq, "Unequality": sympy.Ne,
    "StrictLessThan": sympy.Lt, "LessThan": sympy.Le, "StrictGreaterThan": sympy.Gt,
    "GreaterThan": sympy.Ge, "And": sympy.And, "Or": sympy.Or, "Not": sympy.Not,
}
_ATOMS = {"true": sympy.true, "false": sympy.false}
_ACCEPTED = (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul, functions.FloorDiv,
             functions.Mod, functions.PythonMod, sympy.Mod, *_MAXES, *_MINS, sympy.Eq, sympy.Ne,
             sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge, sympy.And, sympy.Or, sympy.Not,
             sympy.logic.boolalg.BooleanAtom)


def check(expr: sympy.Basic) -> None:
    """Raises TridentError for an expression the generated C does not compute as Python does;
    its ``symbols`` are the expression's free symbols (ShapeEnv symbols or place symbols, as
    ``expr`` has them: Note [Dims of a failed size expression] in frontend/dynamic.py)."""
    for e in sympy.preorder_traversal(expr):
        if not isinstance(e, _ACCEPTED):
            text = str(expr)  # (kilobytes for triton.next_power_of_2 of a size: bounded)
            text = text if len(text) <= 160 else f"{text[:160]}... ({len(text)} characters)"
            error = TridentError(f"cannot guard a size expression that calls "
                                 f"{type(e).__name__}: {text}")
            error.symbols = frozenset(expr.free_symbols)
            raise error


def dims_at(symbols) -> dict[int, set[int]] | None:
    """``{arg: {dim}}`` of the place symbols ``symbols`` (an int's ``value_i`` is its dim 0, as
    dynamic dims name it); None where one is no size or int value (a stride, an offset, a
    ShapeEnv symbol) or there are none."""
    dims: dict[int, set[int]] = {}
    for s in symbols:
        kind, _, rest = s.name.partition("_")
        numbers = rest.split("_")
        if kind not in ("size", "value") or not all(n.isdigit() for n in numbers) or \
                len(numbers) != (2 if kind == "size" else 1):
            return None
        dims.setdefault(int(numbers[0]), set()).add(int(numbers[1]) if kind == "size" else 0)
    return dims or None


def dumps(expr: sympy.Basic) -> str:
    return sympy.srepr(expr)


@functools.lru_cache(maxsize=4096)
def loads(text: str) -> sympy.Basic:
    """The expression ``dumps`` wrote, made by walking its syntax tree: only the constructors
    of ``_CONSTRUCTORS`` with int, string and bool arguments; nothing is evaluated as code.

    Raises:
        ValueError: text that is not such an expression (a damaged or edited cache entry).
    """
    def make(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, str, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and \
                isinstance(node.operand, ast.Constant) and type(node.operand.value) is int:
            return -node.operand.value
        if isinstance(node, ast.Name) and node.id in _ATOMS:
            return _ATOMS[node.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in _CONSTRUCTORS:
            kwargs = {k.arg: make(k.value) for k in node.keywords}
            if any(type(v) is not bool for v in kwargs.values()):
                raise ValueError(f"a size expression's assumption is not a bool: {text!r}")
            return _CONSTRUCTORS[node.func.id](*(make(a) for a in node.args), **kwargs)
        raise ValueError(f"not a size expression: {text!r}")

    try:
        expr = make(ast.parse(text, mode="eval").body)
    except (SyntaxError, RecursionError) as e:
        raise ValueError(f"not a size expression: {text!r}") from e
    if not isinstance(expr, sympy.Basic):
        raise ValueError(f"not a size expression: {text!r}")
    return expr


def evaluate(expr: sympy.Basic, facts: list) -> int | bool:
    """``expr``'s value for the call whose arguments ``facts.arg_facts`` describes.

    Raises:
        IndexError, TypeError: a place the call's arguments do not have.
        TypeError: an expression that does not reduce to a number.
        ZeroDivisionError: a division by zero.
    """
    values = {}
    for s in expr.free_symbols:
        kind, arg, dim = where(s)
        f = getattr(facts[arg], "value" if kind == "value" else PLACES[kind])
        values[s] = sympy.Integer(f if dim is None else f[dim])
    out = expr.xreplace(values)
    if isinstance(out, sympy.logic.boolalg.BooleanAtom):
        return bool(out)
    if not out.is_Integer:
        raise TypeError(f"{expr} is not an integer at {values}")
    return int(out)


class _WordsPrinter(PythonPrinter):
    def __init__(self, names: list[str]):
        super().__init__()
        self.names = names

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        kind, arg, dim = where(expr)
        who = self.names[arg] if arg < len(self.names) else f"argument {arg}"
        if kind == "value":
            return who
        return f"{who}.storage_offset()" if dim is None else f"{who}.{kind}({dim})"

    def _print_Max(self, expr) -> str:
        return f"max({', '.join(self.doprint(a) for a in expr.args)})"

    def _print_Min(self, expr) -> str:
        return f"min({', '.join(self.doprint(a) for a in expr.args)})"


def words(expr: sympy.Basic, names: list[str]) -> str:
    """``expr`` as Python over the user's argument names: ``x.size(0) >= 2``."""
    return _WordsPrinter(names).doprint(expr)
