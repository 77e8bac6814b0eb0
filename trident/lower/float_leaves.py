"""Float leaves traced as symbols that say whether the trace read them (Note [Float leaves] in
frontend/policy.py)."""

from __future__ import annotations

import math

import torch

_INTERNAL = {"__init__", "__init_subclass__", "__new__", "__getattribute__", "__setattr__",
             "__class__", "__subclasshook__", "__weakref__", "__dict__", "__module__", "__doc__"}


class _Watched(torch.SymFloat):
    """A SymFloat that records any operation on it (``read``): its arithmetic, comparisons,
    conversions (``float()``, ``__float__`` that C code calls), text and hash. Made from a
    SymFloat's node, so torch handles it as that SymFloat (ops take it into the graph)."""

    read = False


def _watching(name: str, method):
    def watched(self, *args, **kwargs):
        self.read = True
        return method(self, *args, **kwargs)
    watched.__name__ = name
    return watched


for _name, _method in list(vars(torch.SymFloat).items()):  # (torch 2.11-2.13's methods)
    if callable(_method) and _name not in _INTERNAL:
        setattr(_Watched, _name, _watching(_name, _method))


def symbol(shape_env, value: float, i: int):
    """A SymFloat of its own for the float leaf ``value`` (argument ``i``), or ``value`` itself
    where it is no finite number (sympy's algebra is not IEEE's for inf and NaN)."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    if not math.isfinite(value):
        return value
    made = shape_env.create_symfloatnode(shape_env.create_unspecified_symbol(
        value, LocalSource(f"value_{i}"), DimDynamic.DYNAMIC), hint=value)
    return _Watched(made.node)


def floats_read(graph_module, fake_args: tuple, shape_env) -> set[int]:
    """The arguments of ``fake_args`` that are float leaves traced as symbols and that the
    trace read (their placeholders' values made plain SymFloats): an operation on one, its
    symbol in a guard the ShapeEnv recorded (or replaced), or its placeholder used by the
    graph (taken by an op, returned, written)."""
    watched = {i: a for i, a in enumerate(fake_args or ()) if isinstance(a, _Watched)}
    if not watched:
        return set()
    seen = set(shape_env.replacements)
    for guard in shape_env.guards:
        seen |= guard.expr.free_symbols
    for asserts in shape_env.deferred_runtime_asserts.values():
        for a in asserts:
            seen |= a.expr.free_symbols
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for i, a in watched.items():  # (Torch-MLIR's importer takes a SymFloat of its exact type)
        if i < len(placeholders) and isinstance(placeholders[i].meta.get("val"), _Watched):
            placeholders[i].meta["val"] = torch.SymFloat(a.node)
    return {i for i, a in watched.items() if a.read or a.node.expr in seen or
            (i < len(placeholders) and placeholders[i].users)}
