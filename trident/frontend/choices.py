"""Dynamo's graphs with Python's ``max`` and ``min`` of sizes, before Trident traces them.

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
traces guard the same way.
"""

from __future__ import annotations

import torch
import torch.fx as fx

_CHOICES = {torch.sym_max: max, torch.sym_min: min}  # Note [Size choices in graphs]


def python_choices(gm: fx.GraphModule) -> fx.GraphModule:
    """Note [Size choices in graphs]: ``gm`` with its ``torch.sym_max`` and ``torch.sym_min``
    nodes calling Python's ``max`` and ``min``; its code regenerated where one changed."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _CHOICES:
            node.target = _CHOICES[node.target]
            changed = True
    if changed:
        gm.recompile()
    return gm
