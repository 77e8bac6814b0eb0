"""Batch dims: which dims of a call are its batch, made symbolic together with the lengths
(Note [Batch dims]); the miss policy (policy.py) asks.

Note [Batch dims]: automatic dynamic shapes (Note [Automatic dynamic] in dynamic.py) make a dim
symbolic once a call showed it change. A server's calls change their lengths at every request
and their batch now and then, so a batch of 4 after batches of 2 compiled the prefill and the
decode step once more, after their lengths had gone symbolic. So when a compile makes a dim
symbolic because it changed (or traces int leaves, Note [Int leaves] in policy.py), it also
makes the call's batch dims symbolic: dim 0 of the first tensor the call binds to a parameter
(``input_ids``: not an attribute of an object, not a module's parameter or buffer), the
batch, and dim 0 of every other tensor leaf of the same size there that is no module's
parameter or buffer (``attention_mask``, ``position_ids``, a cache's keys and values); a dim 0
no other tensor shares is no batch (a function of one tensor keeps automatic dynamic's own
rules). An int
attribute that a specialization writes (a static cache layer's ``batch_size``, from the
prefill's ``key_states.shape[0]``) is an int leaf from then on (Note [Int leaves]), so the next
call of another batch finds its tree known.

A batch of one: torch's ShapeEnv specializes a size 1 (a symbol of range >= 2), since
broadcasting, views and some decompositions read whether a size is 1. So a batch symbol is
traced with range >= 1 instead, and the trace runs size-oblivious (torch's
``backed_size_oblivious``, as ``torch.export`` runs): a check that torch's own code makes
obliviously (``guard_or_false(size == 1)`` in broadcasting) takes the general path with no
guard, one that any code makes explicitly is a guard as ever. Where the general path differs
for one, the guard excludes one and a batch of one compiles its own specialization. A kept
``linear`` or ``matmul`` (the prefill's ``lm_head`` of a strided last position: ATen folds a
batch of one into one ``mm`` and runs ``bmm`` for others) picks its kernel at call time, as in
eager, and its fake result comes from its shape alone (Note [Kept products] in
lower/decompositions.py), so it guards nothing about the batch: a transformers prefill and
decode step of a batch of one share the symbolic ones. torch's oblivious checks are those it
makes for unbacked sizes, whose general path must hold at any size.
A batch of one is traced so too, when a compile makes other dims symbolic: the dims 0 of size 1
of the call's tensor leaves of 2 or more dims (its 1-D leaves of size one, such as a decode
step's ``cache_position``, are lengths), and its int leaves of value 1 (a cache layer's
``batch_size`` that a batch-1 prefill wrote) are symbols of range >= 1 with hint 1 (torch
creates them where its size-oblivious mode is on, ``_fake_args`` in lower/capture.py). The trace
is the one a batch of 2 gives, but for the checks that code makes explicitly, which the hint
decides: a check that the batch is 1 becomes a guard ``== 1`` (a function that views its input
as ``(1, ...)`` is specialized to one row, as before), its opposite a guard ``!= 1``, each
counted as a compile where a call fails it. So a server whose first requests have one row
compiles the symbolic prefill and decode step once, as one whose first requests have more
(transformers 5.25, torch 2.13: a batch of 2 or 4 then hits them, as a batch of one hits those
traced at 2), not once more at the first larger batch.
A batch dim the trace ties to a constant (a size equal to a weight's) is guarded as such: a
call that breaks the tie misses, and never runs a graph traced for other sizes.
"""

from __future__ import annotations

import torch

from trident.ir.trees import ATTR, DICT, OBJECT
from trident.frontend.install import _Call


def _module_tensor(tree, node: int) -> bool:
    """The leaf at ``node`` is a module's parameter or buffer (read through ``_parameters``
    or ``_buffers``)."""
    parent = tree.nodes[node].parent
    if parent < 0:
        return False
    holder = tree.nodes[parent]
    return (holder.check == DICT and holder.access == ATTR
            and holder.key in ("_parameters", "_buffers") and holder.parent >= 0
            and tree.nodes[holder.parent].check == OBJECT
            and issubclass(tree.nodes[holder.parent].expect, torch.nn.Module))


def _in_object(tree, node: int) -> bool:
    """The value at ``node`` is reached through an object's attributes."""
    node = tree.nodes[node].parent
    while node >= 0:
        if tree.nodes[node].check == OBJECT:
            return True
        node = tree.nodes[node].parent
    return False


def batch_dims(call: _Call) -> dict[int, set[int]]:
    """Note [Batch dims]: ``{leaf index: {0}}`` for the tensor leaves of ``call`` whose dim 0
    is its batch; empty where the call binds no tensor of 2 or more rows to a parameter."""
    tree, leaves = call.tree, call.leaves
    free = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor) and a.dim()
            and not _module_tensor(tree, tree.leaf_nodes[i - 1])]
    first = next((i for i in free if not _in_object(tree, tree.leaf_nodes[i - 1])), None)
    if first is None or not leaves[first].shape[0]:
        return {}
    batch = leaves[first].shape[0]
    least = 1 if batch > 1 else 2  # a batch of one: of tensors of 2 or more dims
    dims = {i: {0} for i in free if leaves[i].shape[0] == batch and leaves[i].dim() >= least}
    return dims if len(dims) > 1 else {}  # a batch is a dim 0 that tensors share


def ones(call: _Call, dynamic: dict[int, set[int]]) -> dict[int, set[int]]:
    """Note [Batch dims]: ``{leaf index: {0}}`` of the leaves a trace with ``dynamic`` dims
    makes symbols of range >= 1, size-oblivious: the batch dims it makes symbolic, and, where
    there are some, its int leaves of value 1 (a cache's ``batch_size`` that a batch-1 prefill
    wrote)."""
    dims = {i for i in batch_dims(call) if 0 in dynamic.get(i, ())}
    return {i: {0} for i in dims | {i for i, a in enumerate(call.leaves) if type(a) is int
                                    and a == 1 and i in dynamic}} if dims else {}

