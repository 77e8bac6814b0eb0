"""The Python twin of a specialization's value checks (Note [Value checks] in
codegen/checks.py): the miss path asks whether a stored specialization that the module does not
hold accepts a call (``_stored_fit``), and explains a miss, as the SCM's ``check_values()``
decides on a hit."""

from __future__ import annotations

import operator

import torch

from trident.ir import operands as o
from trident.ir.plan import OpCall, SizeStep

_INT_OPS = {"mul": operator.mul, "add": operator.add, "sub": operator.sub,
            "floordiv": operator.floordiv, "remainder": operator.mod, "neg": operator.neg}


def _values(checks, leaves: tuple) -> list:
    """The numbers ``checks``' plan computes from the call's ``leaves``."""
    vals: dict = {}
    lists: dict = {}
    scalars: dict = {}

    def read(x):
        match x:
            case o.Arg(i):
                return leaves[i]
            case o.Val(i):
                return vals[i]
            case o.Item(lst, i):
                return lists[lst][i]
            case o.Scalar(i):
                return scalars[i]
            case o.Int(v) | o.Float(v) | o.Bool(v) | o.Str(v):
                return v
            case o.NoneConst():
                return None
            case o.Device(device_type, index):
                return torch.device("cuda" if device_type else "cpu",
                                    None if index < 0 else index)
            case o.Ints(v) | o.Floats(v) | o.Bools(v) | o.IntList(v) | o.Tensors(v) | \
                    o.OptTensors(v):
                return [read(item) if isinstance(item, o.Operand) else item for item in v]
        raise ValueError(f"not an operand a check reads: {x}")

    with torch.no_grad():
        for step in checks.plan.steps:
            args = [read(a) for a in step.args]
            if isinstance(step, SizeStep):
                if step.op == "size":
                    out = (args[0].size(args[1]),)
                elif step.op == "value":
                    out = (args[0],)
                else:
                    out = (_INT_OPS[step.op](*args),)
            elif isinstance(step, OpCall):
                namespace, name = step.op.split("::")
                op = getattr(getattr(getattr(torch.ops, namespace), name),
                             step.overload or "default")
                names = op._schema.arguments
                out = op(*[a for a, n in zip(args, names) if not n.kwarg_only],
                         **{n.name: a for a, n in zip(args, names) if n.kwarg_only})
                out = out if isinstance(out, tuple) else (out,)
            else:
                raise ValueError(f"not a step a check runs: {step}")
            for r, value in zip(step.results, out):
                table = {o.Val: vals, o.List: lists, o.Scalar: scalars}.get(type(r))
                if table is not None:
                    table[r.i] = value
    return [read(x) for x in checks.plan.outputs]


def failed_check(spec, leaves: tuple) -> str | None:
    """Why ``leaves`` fail ``spec``'s value checks: ``"model.py:12 (if m.all():) read True,
    now False"``; None where they hold (or it has none)."""
    if spec.checks is None:
        return None
    try:
        now = _values(spec.checks, leaves)
    except Exception as e:  # noqa: BLE001 - eager raises it too, where it reads the value
        return f"a value the trace read cannot be computed ({type(e).__name__}: {e})"
    for k, (value, was) in enumerate(zip(now, spec.checks.values)):
        if int(value) != int(was):
            where, text = spec.checks.lines[k] if k < len(spec.checks.lines) else ("?", "")
            return f"the value read at {where} ({text}) was {was!r}, now {type(was)(value)!r}"
    return None
