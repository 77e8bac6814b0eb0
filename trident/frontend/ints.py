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

Note [Tensors by path]: tensor dims are compared by path across argument structures too, as
ints are, whether or not the function has int leaves (a transformers ``DynamicCache`` has
none: its length is its tensors' dim 2). A call of a new argument structure is alike to each
known structure that holds a tensor at one of its paths (no module's parameter or buffer) with
a dim of another size there, or a symbolic one (``related``): Dynamo's automatic dynamic keeps
its sizes per source across the frames of a code object, so a prefill's ``input_ids`` of 431
tokens and a decode step's of one are one source that changed. ``_dynamic_dims`` then makes
symbolic the dims that differ or were symbolic at the same paths (``differing_dims``; sizes 0
and 1 stay static), the batch with them (Note [Batch dims]), and, in the tensors at paths no
specialization holds (a ``DynamicCache``'s keys and values, which a prefill of a fresh cache
does not have), the dims whose size is one of the sizes (2 or more, dims other than 0) that
differed (``varied_sizes``: the decode step's keys have the prompt's length in dim 2). So the
first decode step of a ``generate`` compiles with the cache's length and the batch symbolic,
not at exact sizes and again at its second step; and a structure met later (a batch of one,
whose all-ones mask transformers 5.25 drops: ``attention_mask`` removed; a padded batch after
one: added) compiles once, symbolic, rather than at exact sizes first. Such structures are
alike as int-alike ones are (``MissPolicy._int_trees``), for Note [Eager decisions] too: a
trace of one that fails for the reason a trace of another failed runs eagerly at any size,
without a second failed trace. Before, a server's mix
of both structures compiled each at exact sizes and again symbolic: a tiny Qwen2 reached the
limit of 8 specializations at its fifth request.
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


def _same_paths(spec: Specialization, call: _Call):
    """``(leaf index, spec's argument index, spec's shape)`` of ``call``'s tensor leaves (no
    module's parameters or buffers) that ``spec`` holds as tensors of as many dims at the same
    path."""
    index = {name: j for j, name in enumerate(spec.arg_names)}
    tree = call.tree
    for i, a in enumerate(call.leaves):
        j = index.get(call.names[i])
        old = spec.shapes[j] if j is not None and spec.shapes and j < len(spec.shapes) else None
        if isinstance(a, torch.Tensor) and old is not None and len(old) == a.dim() and \
                not batch._module_tensor(tree, tree.leaf_nodes[i - 1]):
            yield i, j, old


def differing_dims(dims: dict[int, set[int]], spec: Specialization, call: _Call) -> set[int]:
    """Adds to ``dims`` the dims of ``call``'s tensors whose size differs from (or was
    symbolic in) ``spec``'s leaf of the same path: ``spec``'s tree differed from the call's in
    int constants that are leaves now (Note [Int leaves] in policy.py), or holds tensors at
    the call's paths (Note [Tensors by path]), so its leaves are found by path. Returns the
    sizes (2 or more) of the dims other than 0 that differed, both ``spec``'s and the call's
    (``varied_sizes`` in Note [Tensors by path])."""
    varied: set[int] = set()
    for i, j, old in _same_paths(spec, call):
        a = call.leaves[i]
        differ = {d for d, n in enumerate(a.shape) if n != old[d]}
        dims[i] = dims.get(i, set()) | set(spec.dynamic.get(str(j), ())) | differ
        varied |= {n for d in differ if d for n in (a.shape[d], old[d]) if n >= 2}
    return varied


def related(spec: Specialization, call: _Call) -> bool:
    """Note [Tensors by path]: ``call`` holds a tensor at a path where ``spec`` holds one with
    a dim of another size, or a symbolic one."""
    return any(set(spec.dynamic.get(str(j), ())) or tuple(call.leaves[i].shape) != tuple(old)
               for i, j, old in _same_paths(spec, call))


def new_tensor_dims(call: _Call, known: set[str], sizes: set[int]) -> dict[int, set[int]]:
    """Note [Tensors by path]: ``{leaf index: dims}`` of ``call``'s tensor leaves at paths not
    in ``known`` (no module's parameters or buffers) whose size is one of ``sizes``."""
    tree = call.tree
    dims = {i: {d for d, n in enumerate(a.shape) if n in sizes}
            for i, a in enumerate(call.leaves) if isinstance(a, torch.Tensor)
            and call.names[i] not in known
            and not batch._module_tensor(tree, tree.leaf_nodes[i - 1])} if sizes else {}
    return {i: d for i, d in dims.items() if d}


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
