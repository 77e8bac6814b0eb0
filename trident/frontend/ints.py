"""Which ints and tensor dims a compile makes symbolic, compared by path across argument
structures (Note [Int leaves] in policy.py decides when an int attribute is a leaf; Note [Ints
by path], here, what a new structure takes from the others).

Note [Ints by path]: a call of a new argument structure, in a function that has int leaves
already (it generalized one structure, or a specialization wrote ints: Note [Batch dims] in
batch.py), is compared with the known structures by path, as Dynamo's automatic dynamic keeps
what it learnt per source across a code object's frames: an int constant whose path another
structure holds with another value, or as a leaf, is a leaf from now on, and those structures
count as alike (``MissPolicy._int_trees``), so ``_dynamic_dims`` makes symbolic the dims of
its tensors that were symbolic, or of other sizes, at the same paths there
(``differing_dims``). A tensor at a path that no installed specialization holds as a tensor
(a static cache's keys and values, which the prefill of a lazily initialized cache does not
have) is symbolic in the dims whose size is the value of an int leaf that changed
(``sized_by``: the keys' dim 2 is ``max_cache_len``; the values 0 and 1 excepted, and the
ints a specialization writes, such as ``num_heads``, unless a call changed them). So an
argument structure met after the first change (a transformers static cache's decode step
after a ``generate`` with ``max_new_tokens=1``, a one-token prompt's prefill, passed a 4-D
mask) compiles once, with its lengths and batch symbolic, and never at exact sizes.
What stays order-dependent (docs/huggingface.md, tests/test_sweep_orders.py): a structure met
before anything changed compiles at exact sizes first, as torch.compile's automatic dynamic
does, so a sweep compiles once per structure plus once per structure met before the first
change.
"""

from __future__ import annotations

import torch

from trident.frontend import batch
from trident.frontend.install import _Call
from trident.ir.specialization import Specialization
from trident.ir.trees import CONST, LEAF


def int_differences(tree, call: _Call) -> set[str] | None:
    """The paths of the int constants in which ``call``'s tree differs from ``tree``, or
    None where it differs otherwise (Note [Int leaves] in policy.py)."""
    paths = set()
    for i, (mine, theirs) in enumerate(zip(tree.description, call.tree.description)):
        if mine == theirs:
            continue
        node, old = call.tree.nodes[i], tree.nodes[i]  # (a constant, or a leaf already)
        if not (node.check in (CONST, LEAF) and old.check in (CONST, LEAF) and
                node.path == old.path and type(call.values[i]) is int and
                (old.check == LEAF or type(old.expect) is int)):
            return None
        paths.add(node.path)
    return paths


def int_paths(tree, values: list | None, leaves: frozenset[str]) -> dict[str, int | None]:
    """Note [Ints by path]: ``{path: value}`` of ``tree``'s int constants (``values``: the
    call's values of its nodes, or None: the tree's own constants), ``{path: None}`` of its
    int leaves."""
    ints: dict[str, int | None] = {}
    for i, node in enumerate(tree.nodes):
        value = node.expect if values is None else values[i]
        if node.check == CONST and type(value) is int:
            ints[node.path] = value
        elif node.check == LEAF and node.path in leaves:
            ints[node.path] = None
    return ints


def differing_dims(dims: dict[int, set[int]], spec: Specialization, call: _Call) -> None:
    """Adds to ``dims`` the dims of ``call``'s tensors whose size differs from (or was
    symbolic in) ``spec``'s leaf of the same path: ``spec``'s tree differed from the call's in
    int constants that are leaves now (Note [Int leaves] in policy.py), so its leaves are
    found by path."""
    index = {name: j for j, name in enumerate(spec.arg_names)}
    for i, a in enumerate(call.leaves):
        j = index.get(call.names[i])
        old = spec.shapes[j] if j is not None and j < len(spec.shapes) else None
        if isinstance(a, torch.Tensor) and old is not None and len(old) == a.dim():
            dims[i] = dims.get(i, set()) | set(spec.dynamic.get(str(j), ())) | {
                d for d, n in enumerate(a.shape) if n != old[d]}


def sized_by(call: _Call, paths: frozenset[str]) -> dict[int, set[int]]:
    """Note [Ints by path]: ``{leaf index: dims}`` of ``call``'s tensor leaves (no module's
    parameters or buffers) whose size is the value (2 or more) of one of its int leaves at
    ``paths`` (a static cache's keys, whose dim 2 is ``max_cache_len``)."""
    sizes = {a for a, name in zip(call.leaves, call.names) if type(a) is int and a >= 2
             and name in paths}
    tree = call.tree
    dims = {i: {d for d, n in enumerate(a.shape) if n in sizes}
            for i, a in enumerate(call.leaves) if isinstance(a, torch.Tensor)
            and not batch._module_tensor(tree, tree.leaf_nodes[i - 1])} if sizes else {}
    return {i: d for i, d in dims.items() if d}
