"""Size steps in C (Note [Symbolic sizes] in lower/plan.py): Python's int operators on the
call's sizes and ints, each checked, and put before the steps whose effects a caller sees
(Note [Checked size steps] in render.py)."""

from __future__ import annotations

from typing import Callable

from trident.codegen.cprint import c_comment, c_string
from trident.codegen.target import CStep
from trident.ir.operands import Arg, Int, Scalar
from trident.ir.plan import SizeStep, Step

_C_INT_OPS = {"mul": "trt_mul_ck", "add": "trt_add_ck", "sub": "trt_sub_ck",
              "floordiv": "trt_floordiv_ck", "remainder": "trt_mod_ck", "neg": "trt_neg_ck"}
_EXACT = "9007199254740992LL"  # 2**53: the ints a double holds exactly


def first(steps: list[Step]) -> list[int]:
    """Note [Checked size steps]: the order the steps are rendered in, size steps over the
    call's sizes and ints first (in their own order), then the rest in theirs."""
    pure: set[int] = set()  # the scalars those size steps compute
    order = []
    for i, s in enumerate(steps):
        if isinstance(s, SizeStep) and all(
                isinstance(a, (Arg, Int)) or (isinstance(a, Scalar) and a.i in pure)
                for a in s.args):
            pure.update(r.i for r in s.results)
            order.append(i)
    return order + [i for i in range(len(steps)) if i not in set(order)]


def render(s: SizeStep, int_expr: Callable, on_error: str) -> CStep:
    """The C of one size step; ``int_expr`` gives an int operand's C expression, ``on_error``
    the label a failing check jumps to."""
    r = s.results[0].i
    if s.op == "size":
        (tensor, dim) = s.args
        expr = f"a[{tensor.i}].sizes[{dim.v}]"
    elif s.op == "value":  # an int argument traced as a symbol (Note [Symbolic ints])
        expr = f"a[{s.args[0].i}].i"
    elif s.op == "truediv":  # Python's int / int (Note [Checked size steps])
        x, y = (int_expr(a) for a in s.args)
        fail = c_string(f"{s.where} (truediv)")
        return CStep("int", s.where, c_comment(s.text), "int truediv", [
            f"int64_t x = {x}, y = {y};",
            f"if (y == 0 || x > {_EXACT} || x < -{_EXACT} || y > {_EXACT} || y < -{_EXACT}) "
            f"{{ rt->set_error({fail}, \"a zero divisor or an operand past 2**53 in a size "
            f"expression's true division\"); goto {on_error}; }}",
            f"s[{r}] = TRT_F((double)x / (double)y);"], [], [])
    else:  # Note [Checked size steps]
        args = ", ".join(int_expr(a) for a in s.args)
        why = ("integer division by zero or a quotient past int64" if s.op in (
            "floordiv", "remainder") else "a result past int64")
        return CStep("int", s.where, c_comment(s.text), f"int {s.op}", [
            "int64_t z;",
            f"if ({_C_INT_OPS[s.op]}({args}, &z)) {{ rt->set_error("
            f"{c_string(s.where + ' (' + s.op + ')')}, \"{why} in a size expression\"); "
            f"goto {on_error}; }}",
            f"s[{r}] = TRT_I(z);"], [], [])
    return CStep("int", s.where, c_comment(s.text), f"int {s.op}", [f"s[{r}] = TRT_I({expr});"],
                 [], [])
