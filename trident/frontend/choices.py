"""Dynamo's graphs with Python's ``max``, ``min`` and ``+`` of sizes, before Trident traces them.

Note [Size choices in graphs]: Dynamo records Python's ``max(a, b)`` and ``min(a, b)`` of
symbolic sizes as ``torch.sym_max`` and ``torch.sym_min`` nodes, the choice left open
(``Max(0, s35 - 4095)``): transformers' ``DynamicSlidingWindowLayer.get_mask_sizes`` takes
``kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)``, so every decode step
of a Gemma 2 with the default cache holds one. Trident's trace of the graph keeps the node, and
Torch-MLIR's importer has no rule for it (``FIX ME: Unimplemented call_function: target=<function
sym_max ...>``): the symbolic trace failed, the sizes were specialized from then on, and the
decode step compiled once per cache length until the limit of 8 specializations
(``sweep_hf gemma2 17 default backend``: 11 compiles, 884 of 906 calls eager). So the graph
calls Python's own ``max`` and ``min`` instead, as the function did in eager before Dynamo:
the trace compares the sizes, which the ShapeEnv guards (``s35 - 4095 < 0``), and goes on with
the size that eager's comparison picks; a call whose sizes pick the other one misses that guard
and compiles its own specialization. ``trident.jit`` traces the function's own ``max``, so its
traces guard the same way. ``torch.sym_max`` promotes: where either operand is a float, its
answer is one (``torch.sym_max(n, 1.0)`` is ``3.0`` for ``n = 3``, where ``max`` answers the int
``3``: a ``torch.full`` of it made an int64 tensor where eager made a float32 one), so a node
whose operands are not all known to be ints (by their traced values) calls ``_promoted_max``
or ``_promoted_min``, which answer as ``torch.sym_max`` does: ``float`` of the choice where an
operand is a float; one whose operands are all ints calls ``max`` or ``min`` itself.

The same holds for ``torch.sym_sum``, the n-ary sum Dynamo records for Python's ``sum`` of
ints and for a size that is a sum of symbols (torch 2.13 rebuilds a ``sympy.Add`` as one: the
``slen`` that transformers' ``repeat_kv`` unpacks from a padded decode step's keys, ``1 +
s60``): Torch-MLIR cannot import it either, so a Qwen2 with the default cache, padded batches
and a one-token prompt first through ``torch.compile(backend="trident")`` compiled its padded
decode step once per cache length until the limit of 16 (``sweep_hf qwen2 50 default backend
padded 0 1``: 21 compiles, 774 fallbacks in 15 generates). The graph adds with Python's ``+``
instead (which promotes as ``torch.sym_sum`` does), recorded as ``operator.add`` nodes; no
choice, so no guard.
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.fx as fx


def _python_sum(*args):
    """``torch.sym_sum``'s value by Python's ``+``: ``_python_sum((a, b, c))`` or
    ``_python_sum(a, b, c)`` is ``a + b + c``."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = args[0]
    return functools.reduce(operator.add, args) if args else 0


# Note [Size choices in graphs]
_CHOICES = {torch.sym_max: max, torch.sym_min: min, torch.sym_sum: _python_sum}


_FLOATS = (float, torch.SymFloat)


def _promoted_max(a, b):  # Note [Size choices in graphs]: torch.sym_max's answer
    choice = max(a, b)
    return float(choice) if isinstance(a, _FLOATS) or isinstance(b, _FLOATS) else choice


def _promoted_min(a, b):
    choice = min(a, b)
    return float(choice) if isinstance(a, _FLOATS) or isinstance(b, _FLOATS) else choice


_PROMOTED = {torch.sym_max: _promoted_max, torch.sym_min: _promoted_min,
             torch.sym_sum: _python_sum}  # (Python's + promotes as torch.sym_sum does)


def _int(operand) -> bool:
    """Whether a node's operand (an FX node, by its traced value: Dynamo's ``example_value``
    or ``val``; or a constant) is known to be an int."""
    if isinstance(operand, fx.Node):
        meta = operand.meta
        operand = meta["val"] if "val" in meta else meta.get("example_value")
    return isinstance(operand, (int, torch.SymInt))


def python_choices(gm: fx.GraphModule) -> fx.GraphModule:
    """Note [Size choices in graphs]: ``gm`` with its ``torch.sym_max``, ``torch.sym_min`` and
    ``torch.sym_sum`` nodes calling Python's ``max``, ``min`` and ``+``; its code regenerated
    where one changed."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _CHOICES:
            ints = not node.kwargs and all(_int(a) for a in node.args)
            node.target = (_CHOICES if ints else _PROMOTED)[node.target]
            changed = True
    if changed:
        gm.recompile()
    return gm
