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

Note [Paths of one tree]: a call of a known argument tree whose specializations' guards
other than sizes fail (another path of the same code: a Qwen2 static cache's unpadded prefill,
whose ``attention_mask['full_attention']`` is None where the padded and one-token prefills held
a tensor) takes from those specializations what a related structure would: the dims that
differ from, or were symbolic in, their leaves of the same path (``differing_dims``), as
Dynamo's automatic dynamic keeps its sizes per source whatever guard failed. Before, such a
call compiled at exact sizes and again at its next length (``sweep_hf qwen2 50 static jit
padded 0 1``: 5 compiles, the unpadded prefill's prompt length exact, then symbolic).
A tensor at a path where such a specialization held none (``new_paths``: the padded prefill's
``attention_mask['full_attention']``, None in the unpadded one) is a new tensor of the call's
tree (``new_tensor_dims``, Note [Tensors by path]), though another tree holds a tensor there
(the decode step's ``[batch, 1, 1, capacity]`` mask): before, it counted as known, its dims
stayed static (``bool[?, 1, 9, 11]``) and pinned the symbolic prompt length to 9 and the
capacity to 11, so a user's padded Qwen2 requests compiled 5 times where Llama's, whose first
prefill passes no ``attention_mask`` at all, compiled 3 (tests/test_serve51.py).

Note [Lengths of written state]: the first compile of an argument structure in which nothing
changed yet is at exact sizes (automatic dynamic), but for one kind of evidence that a size
will change: the trace stores tensors into the state of its arguments' objects (Note
[Attribute writes] in lower/writes.py), state the next call reads, and what it stores has
other sizes than what the object held there. A function that fills or grows the state it keeps
across calls is a step over a sequence (a transformers ``DynamicCache``'s prefill: its layers'
``keys`` were None and are ``[batch, heads, prompt, head_dim]`` after it), and the lengths it
stores are a request's, which a server's requests change, as serving engines treat the token
count as dynamic from the start. So such a trace, where ``_dynamic_dims`` found nothing
symbolic, is traced again (``written_lengths``) with symbolic: where the object held a tensor
at that path, the dims of that leaf whose size the write changes (a cache of one token grown
to two too); where it held none (None, or no attribute), the dims of the
call's tensor leaves (no module's parameters or buffers; of tensors of 2 or more dims, dims
other than 0, the batch's: Note [Batch dims], which the trace makes symbolic too) whose size
(1 too) is the size of a dim other than 0 of a stored tensor (the prompt's length in
``input_ids``, ``attention_mask``, ``position_ids``), but for a size that is an int attribute
the object had (a static cache layer's ``max_cache_len``), which sizes a buffer of its own, not
a length the call brings (a static cache's lengths are int attributes: Note [Int leaves] in
policy.py; an int the trace writes, as a sliding-window layer's ``cumulative_length``, the
prompt's length, does not count). A dim of such a size by coincidence (a prompt as long as the
number of heads) is symbolic too; what the trace ties to a constant is
guarded as one. The exact trace is kept if the symbolic trace or compile fails (once per
function, as any automatic attempt: ``_dynamic_failed``). So a ``DynamicCache`` server compiles
its first prefill with the prompt's length and the batch symbolic, not at exact sizes and
again at the second request's length: a padded sweep compiles 4 times (the prefill and decode
step of each of the two argument structures), not 5. The cost is one more trace of the first
compile (``Stats.traces``). A function that stores a tensor of the sizes the path held (a
buffer rewritten in place of another of its shape) keeps automatic dynamic's rules.
A length is a symbol of range >= 1, as a batch is (Note [Batch dims] in batch.py): the dims
of the lengths compile, and the dims a compile reads at paths where tensors were stored with
them symbolic, are symbols whatever their size, 1 included, traced size-oblivious
(``one_lengths``; torch's ``backed_size_oblivious``, ``_fake_args`` in lower/capture.py): torch
specializes a size of 1 otherwise, so a one-token prompt's prefill (a cache of length one) and
its decode step (which grows the cache from 1 to 2) compiled at exact sizes, and the decode
step again at the next length, and a decode step traced at a length of 2 or more missed for a
cache of one. A check that code makes on a length of one (``if n == 1``) is a guard, as for a
batch. Code may not take a symbol there at all: transformers' SDPA integration computes
``is_causal = q_length > 1 and ...``, a SymBool where the length is a symbol of hint 1, which
SDPA refuses. So where the lengths are of one, the dims that the exact trace stored with the
size of a length (``stored_lengths``: the cache's dim 2) are read back symbolic whatever the
lengths trace does, and where the lengths trace fails, the call is traced again with its batch
alone symbolic (then the exact trace is compiled), automatic dynamic kept: a failure at a size
of one says nothing of the others. So a one-token prompt first compiles its prefill with the
batch symbolic (3 traces) and its decode step once for any cache length and batch.
What a specialization stores with a symbolic dim is read back symbolic: the tensors a trace
writes with symbolic dims are recorded by path (``symbolic_writes``, ``_written_dims``), and a
later compile makes those dims of the tensors at those paths symbolic (``written_dims``): the
decode step after a symbolic prefill of another request has its cache's length symbolic, where
its ``input_ids`` (one token) and the prefill specialization's recorded sizes (the first
request's) no longer show it (``varied_sizes`` in Note [Tensors by path] compares sizes only).

Note [Capacities of written state]: a trace that allocates the state it keeps across calls
where its object held none, sized by an int attribute the object had (a transformers static
cache layer's prefill: ``keys = zeros(batch, heads, max_cache_len, head_dim)``), stores a
capacity that ``generate`` sizes per request (the prompt's length and ``max_new_tokens``, at
least the longest before it: the model's ``_previous_max_cache_length`` holds the same value).
It is a length as a stored prompt's is, of the state's other dim: so such an exact trace
(``capacities``: every int constant of the tree of such a value, ``_previous_max_cache_length``
included; a constant of that value by coincidence is a leaf too, and what the trace reads of it
is guarded as a constant) is traced again with those ints as int leaves (Note [Int leaves] in
policy.py: symbols), the dims of their size symbolic (``sized_by``: a 4-D mask's last dim) and
the batch, before anything is compiled, and the decode step reads the keys back symbolic
(``written_dims``). So a static cache's first prefill and decode step compile once for every
later request's cache length, not at exact sizes and again at the second request's: a one-token
prompt first (its prefill passed a 4-D mask, a structure of its own) compiles 4 times in a
padded sweep, not 5. Where that trace fails, the exact trace is compiled and the ints stay
constants (once per function: ``_capacities_failed``).

Note [Symbols of like layers]: a model's layers keep state of one structure each (a
transformers static cache: each layer's ``keys``, ``values``, ``max_cache_len``, ``batch_size``,
...), and a symbolic trace made every layer's dims and int leaves symbols of their own (48 of
one value in a 16-layer Llama's decode step), so each layer's ops met sizes no earlier layer's
had: FakeTensorMode's cache of results, keyed by the sizes' expressions, missed at every layer
and its sympy work was done again (docs/benchmarks.md, "cold47": the symbolic traces were most
of a cold ``generate``'s compile). So the dynamic leaves whose paths differ only in the indices
of an attribute's items (``cache.layers[3].keys`` and ``cache.layers[0].keys``: ``cache.layers[]
.keys``), through objects of the same types, share one symbol per dim and size (``like_layers``;
torch's duck sizing, which Dynamo applies to all of its sizes, within one such path and dim):
every layer is traced on the same symbols. A shared symbol is guarded as any symbol read in two
places, by equality with its source (Note [Symbolic guards] in lower/guards.py): a call whose
layers part (a capacity that equalled another layer's at the trace) misses and compiles, and
never runs a graph traced for equal sizes. Sizes are never shared across paths or dims: a
cache's ``num_heads`` and a batch of the same size (2) stay two symbols (torch's duck sizing of
every size tied them, and the next batch missed: docs/benchmarks.md, "cold47"). The items of a
list argument or of ``*args`` (``xs[0]``, ``args[1]``), and the dims ``dynamic=`` asks for,
keep symbols of their own.
"""

from __future__ import annotations

import functools
import re

import torch

from trident.frontend import batch
from trident.frontend.install import _Call
from trident.ir.specialization import Specialization
from trident.ir.trees import CONST, LEAF, OBJECT, TYPE


def int_differences(tree, call: _Call) -> set[str] | None:
    """The paths of the int (and float: Note [Float leaves]) constants in which ``call``'s
    tree differs from ``tree``, or None where it differs otherwise (Note [Int leaves] in
    policy.py)."""
    paths = set()
    for i, (mine, theirs) in enumerate(zip(tree.description, call.tree.description)):
        if mine == theirs:
            continue
        node, old = call.tree.nodes[i], tree.nodes[i]  # (a constant, or a leaf already)
        if not (node.check in (CONST, LEAF) and old.check in (CONST, LEAF) and
                node.path == old.path and type(call.values[i]) in (int, float) and
                (old.check == LEAF or type(old.expect) is type(call.values[i]))):
            return None
        if _in_partial(call.tree, node):
            return None
        paths.add(node.path)
    return paths


def _in_partial(tree, node) -> bool:
    """Whether ``node`` is in the arguments or keywords of a ``functools.partial`` checked as a
    value (Note [Partials in arguments] in lower/partials.py): no int or float leaf there, as
    the trace calls the partial with its own values, not the leaf's symbol, so the symbol was
    never read where the value was (a partial's int or float argument made a leaf: a hit
    returned another value's result, sessions 49-50)."""
    while node.parent >= 0:
        node = tree.nodes[node.parent]
        if node.check == TYPE and node.expect is functools.partial:
            return True
    return False


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


def new_paths(spec: Specialization, call: _Call) -> set[str]:
    """Note [Paths of one tree]: the paths of ``call``'s tensor leaves that ``spec``, of the
    same tree, holds no tensor at (a Qwen2 static cache's ``attention_mask['full_attention']``,
    None in the unpadded prefill): new to the call's tree, whatever another tree holds there."""
    held = {name for name, shape in zip(spec.arg_names, spec.shapes or ()) if shape is not None}
    return {name for a, name in zip(call.leaves, call.names)
            if isinstance(a, torch.Tensor) and name not in held}


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


def _written_tensors(call: _Call, writes: list):
    """``(node, name, tensor, the object's dict)`` of each tensor of static sizes that an exact
    trace's ``writes`` stored on an object of ``call`` (``{}`` for one without a dict)."""
    for node, name, value, _ in writes:
        if isinstance(value, torch.Tensor) and all(type(n) is int for n in value.shape):
            obj = call.values[node]
            yield node, name, value, (vars(obj) if hasattr(obj, "__dict__") else {})


def written_lengths(call: _Call, writes: list) -> dict[int, set[int]]:
    """Note [Lengths of written state]: ``{leaf index: dims}`` of ``call``'s tensor leaves
    that an exact trace's tensor ``writes`` (``(node, name, value, attributes)``: Note
    [Attribute writes] in lower/writes.py) show to be lengths: the dims a write changes of the
    leaf the object held at that path, and the dims of the sizes of the tensors stored where
    it held none."""
    tree, index = call.tree, {name: i for i, name in enumerate(call.names)}
    dims: dict[int, set[int]] = {}
    sizes: set[int] = set()
    for node, name, value, owner in _written_tensors(call, writes):
        before, i = owner.get(name), index.get(f"{tree.nodes[node].path}.{name}")
        if isinstance(before, torch.Tensor):
            if i is not None and before.dim() == value.dim():
                dims[i] = dims.get(i, set()) | {
                    d for d, n in enumerate(before.shape) if n >= 1 and n != value.shape[d]}
            continue
        # a buffer its object sizes by its own ints (a static cache layer's ``max_cache_len``)
        # holds no length of the call
        own = {v for v in owner.values() if type(v) is int}
        sizes |= {n for n in value.shape[1:] if n >= 1 and n not in own}
    for i, a in enumerate(call.leaves):
        if isinstance(a, torch.Tensor) and i and sizes and \
                not batch._module_tensor(tree, tree.leaf_nodes[i - 1]):
            dims[i] = dims.get(i, set()) | {d for d, n in enumerate(a.shape)
                                            if n in sizes and (d or a.dim() == 1)}
    return {i: d for i, d in dims.items() if d}


def capacities(call: _Call, writes: list) -> frozenset[str]:
    """Note [Capacities of written state]: the paths of ``call``'s int constants (2 or more)
    whose value is a capacity an exact trace's tensor ``writes`` allocated: the size of a dim
    (other than 0) of a tensor stored where its object held none, that is an int attribute the
    object had (a static cache layer's ``max_cache_len``); every int constant of that value
    (the model's ``_previous_max_cache_length``)."""
    sizes: set[int] = set()
    for _, name, value, owner in _written_tensors(call, writes):
        if not isinstance(owner.get(name), torch.Tensor):
            own = {v for v in owner.values() if type(v) is int and v >= 2}
            sizes |= {n for n in value.shape[1:] if n in own}
    return frozenset(node.path for node, value in zip(call.tree.nodes, call.values)
                     if node.check == CONST and type(value) is int and value in sizes)


def one_lengths(call: _Call, dynamic: dict[int, set[int]], written: dict[str, frozenset[int]],
                lengths: dict[int, set[int]]) -> dict[int, set[int]]:
    """Note [Lengths of written state]: ``{leaf index: dims}`` of ``call``'s ``dynamic`` dims
    that are lengths: at paths where a specialization stored them symbolic, or where an exact
    trace stored a length (``written``), or among ``lengths`` (those ``written_lengths`` found
    in an exact trace of ``call``); each a symbol of range >= 1 at any size (``_fake_args``
    in lower/capture.py)."""
    dims = {}
    for i, d in dynamic.items():
        a = call.leaves[i]
        if isinstance(a, torch.Tensor):
            ours = set(written.get(call.names[i], ())) | set(lengths.get(i, ()))
            dims[i] = {n for n in d & ours if n < a.dim()}
    return {i: d for i, d in dims.items() if d}


def stored_lengths(call: _Call, writes: list, lengths: dict[int, set[int]]):
    """Note [Lengths of written state]: ``{path: dims}`` of the tensors an exact trace's
    ``writes`` store, the dims (other than 0) whose size is the size of one of ``call``'s
    ``lengths`` (``written_lengths``): what a symbolic trace would have stored symbolic, for
    a call whose lengths of one that trace could not take."""
    sizes = {call.leaves[i].shape[d] for i, dims in lengths.items() for d in dims}
    paths: dict[str, frozenset[int]] = {}
    for node, name, value, _ in writes if sizes else ():
        if isinstance(value, torch.Tensor) and all(type(n) is int for n in value.shape):
            dims = frozenset(d for d in range(1, value.dim()) if value.shape[d] in sizes)
            if dims:
                path = f"{call.tree.nodes[node].path}.{name}"
                paths[path] = paths.get(path, frozenset()) | dims
    return paths


def symbolic_writes(tree, writes: list, known: dict[str, frozenset[int]]):
    """Note [Lengths of written state]: ``known`` (``{path: dims}``) with the dims that a
    trace's tensor ``writes`` store symbolic (no guard asked: the ShapeEnv's replacements,
    read), by the path of the attribute."""
    paths = dict(known)
    for node, name, value, _ in writes:
        if isinstance(value, torch.Tensor):
            dims = {d for d, n in enumerate(value.shape) if _symbolic(n)}
            if dims:
                path = f"{tree.nodes[node].path}.{name}"
                paths[path] = paths.get(path, frozenset()) | dims
    return paths


def _symbolic(n) -> bool:
    """``n`` is a SymInt that its ShapeEnv has not replaced by a constant (asks no guard)."""
    node = getattr(n, "node", None) if isinstance(n, torch.SymInt) else None
    env = getattr(node, "shape_env", None)
    return env is not None and bool(env.replace(node.expr).free_symbols)


def written_dims(call: _Call, written: dict[str, frozenset[int]]) -> dict[int, set[int]]:
    """Note [Lengths of written state]: ``{leaf index: dims}`` of ``call``'s tensor leaves at
    paths where a specialization stored tensors with those dims symbolic (``written``)."""
    dims = {i: {d for d in written.get(name, ()) if d < a.dim()}
            for i, (a, name) in enumerate(zip(call.leaves, call.names))
            if isinstance(a, torch.Tensor)}
    return {i: d for i, d in dims.items() if d}


_ITEM = re.compile(r"(\.\w+)\[\d+\]")  # an attribute's item: ``.layers[3]``


def like_layers(call: _Call, dynamic: dict[int, set[int]]) -> dict[tuple, tuple]:
    """Note [Symbols of like layers]: ``{(leaf index, dim): key}`` of ``call``'s ``dynamic``
    leaves reached through an attribute's items (an int's dim: None); the key is the path
    without those items' indices, the dim, and the types of the objects on the way
    (``_fake_args`` in lower/capture.py)."""
    tree, alike = call.tree, {}
    for i, dims in dynamic.items():
        node = tree.leaf_nodes[i - 1] if i else -1
        path = _ITEM.sub(r"\1[]", tree.nodes[node].path) if node >= 0 else ""
        if node < 0 or path == tree.nodes[node].path:
            continue
        types = []
        while node >= 0:
            types += [tree.nodes[node].expect] if tree.nodes[node].check == OBJECT else []
            node = tree.nodes[node].parent
        for d in dims if isinstance(call.leaves[i], torch.Tensor) else (None,):
            alike[(i, d)] = (path, d, *types)
    return alike
