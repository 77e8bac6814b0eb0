"""Dict orders: whether a specialization's result depends on the key order of a dict argument.

Note [Dict orders]: a dict iterates in the order its keys were inserted, and code that builds
one from a set of str (transformers' ``create_masks_for_generate`` makes a hybrid model's
attention masks ``{layer type: mask}`` in the order of ``set(config.layer_types)``) orders it
by Python's per-process str hash seed (``PYTHONHASHSEED``). An argument tree checks a dict's
keys in order (Note [Argument trees] in flatten.py), as it must where the function iterates
the dict (``[x * m for m in masks.values()]`` returns its values in that order); so a process
of another seed had another tree key and traced and built again what an earlier process
stored (issue 27).

Which dicts may be checked in any order is decided by the trace, not guessed: the call's only
*candidate* dict (an exact ``dict`` of two str keys that the call holds in its arguments
themselves or in tuples, lists and dicts there, not inside an object and not the ``**kwargs``
dict) is traced a second time with its two keys the other way round (in place, put back
after), and where both traces are the same (the graph, its constants, the result's structure
and constants, what the trace assumed of symbolic sizes: ``same_capture``) nothing the
specialization does depends on the order, for a dict of two keys has no third order. Then
that dict's tree node checks its keys as a set (a ``frozenset`` in ``Node.keys``:
``same_keys`` in runtime/trees.cpp), its description names its keys sorted "in any order",
and so the tree's key is one in every process. Where the traces differ (the function
iterates the dict), or the call holds no candidate or several (their orders combined would
need a trace each), the tree checks the order, as before. A dict of more keys is checked in
order: two traces cannot show that none of its orders matters.

The flattening visits a candidate's items in sorted key order (``flatten.py``), so that the
leaves of a call whose dict comes in another order are those of the stored specialization.
The dict paths a specialization checks in any order are stored with it
(``Specialization.free_orders``) and learned by a process from the specializations it
installs, stored ones too (``_free_orders``, as Note [Int leaves] learns int leaves): its
calls are flattened with those dicts in any order, but where a known specialization's tree
checks the order of the call's dict (another call of the function iterated it), that tree
is kept. Either way the dispatcher checks what the installed tree's key says: a call of
another order is never served by a specialization that read the order.

What it costs: the compile of a call that holds a candidate traces twice (the second trace is
part of the first's stage, not counted in ``stats.traces``; the tiny Gemma2 of
tests/test_partials_in_trees.py has one per compile). Two traces of one call may differ
in what a first run initializes lazily, so graphs are compared by their live nodes (a dead
``aten.empty`` aside); any other difference keeps the order checked. The hit path is
unchanged for every other dict (one type test more in ``same_keys``): the check of one in any
order costs a set lookup per key where an ordered one compares keys in order.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from trident.ir.trees import DICT, SEQ, ArgTree, tree_key


def sorted_items(nodes: list, i: int) -> bool:
    """Note [Dict orders]: node ``i`` of ``nodes`` (a tree's, or those a flattening made so
    far) is a candidate dict, whose items the flattening visits in sorted key order: an exact
    dict of two str keys, not the ``**kwargs`` dict, under tuples, lists and dicts only."""
    n = nodes[i]
    if n.check != DICT or n.expect is not dict or n.length != 2 or n.path == "" or \
            n.keys is None or not all(type(k) is str for k in n.keys):
        return False
    parent = n.parent
    while parent >= 0:
        if nodes[parent].check not in (SEQ, DICT):
            return False
        parent = nodes[parent].parent
    return True


def candidate(tree: ArgTree) -> int | None:
    """Note [Dict orders]: the node of the call's only candidate dict, or None."""
    found = [i for i in range(len(tree.nodes)) if sorted_items(tree.nodes, i)]
    return found[0] if len(found) == 1 else None


def ordered(tree: ArgTree, values: list, free: frozenset) -> ArgTree:
    """``tree`` with its candidate dict checked in any order where its path is in ``free``,
    else in its order in ``values`` (the call's node values); ``tree`` itself where that
    changes nothing."""
    i = candidate(tree) if free or any(type(n.keys) is frozenset for n in tree.nodes) else None
    if i is None:
        return tree
    n = tree.nodes[i]
    if n.path in free:
        keys, words = frozenset(n.keys), f"dict with keys {sorted(n.keys)} in any order"
    else:
        keys, words = tuple(values[i]), f"dict with keys {[str(k) for k in values[i]]}"
    if keys == n.keys and type(keys) is type(n.keys):
        return tree
    nodes = list(tree.nodes)
    nodes[i] = dataclasses.replace(n, keys=keys)
    description = list(tree.description)
    description[i] = description[i].rsplit("|", 1)[0] + "|" + words
    return ArgTree(nodes, tree.leaf_nodes, tree_key(description), description)


def in_orders(call, free: frozenset):
    """``call`` (frontend/install.py's ``_Call``) with its tree's candidate dict checked in any
    order where its path is in ``free``, else in its order."""
    tree = ordered(call.tree, call.values, free)
    if tree is call.tree:
        return call
    return dataclasses.replace(call, tree=tree, leaves=(tree.key,) + call.leaves[1:])


def learned(call, free: frozenset, specs: list):
    """``call`` with its dict of a path in ``free`` (learned from specializations) in any
    order, but where one of ``specs`` has its tree (one that checks the dict's order)."""
    if free and not any(s.tree == call.tree.key for s in specs):
        return in_orders(call, free)
    return call


@contextlib.contextmanager
def reversed_in_place(d: dict):
    """``d`` with its items in the reverse order; its order put back afterwards."""
    items = list(d.items())
    d.clear()
    d.update(reversed(items))
    try:
        yield
    finally:
        d.clear()  # (the trace's substitution put back the call's own values)
        d.update(items)


def same_capture(a, b) -> bool:
    """Note [Dict orders]: two traces (``capture.Capture``) of one call whose specializations
    would be the same: the same graph code and constants, result structure and constants,
    ``try`` around its ops, and assumptions about symbolic sizes."""
    try:
        if not _same_graph(a.graph_module, b.graph_module) or a.out_spec != b.out_spec or \
                a.catching != b.catching or not _same_values(a.out_leaves, b.out_leaves):
            return False
        if (a.recipe is None) != (b.recipe is None) or \
                (a.recipe is not None and not _same_values(a.recipe.ops, b.recipe.ops)):
            return False
        if (a.shape_env is None) != (b.shape_env is None):
            return False
        if a.shape_env is not None:
            guards = [[str(g.expr) for g in s.guards] for s in (a.shape_env, b.shape_env)]
            if guards[0] != guards[1] or \
                    str(a.shape_env.replacements) != str(b.shape_env.replacements) or \
                    str(a.shape_env.var_to_range) != str(b.shape_env.var_to_range):
                return False
        return True
    except Exception:  # (a value that does not compare: not shown the same)
        return False


def _same_graph(a: torch.fx.GraphModule, b: torch.fx.GraphModule) -> bool:
    """The same live nodes (a pure op whose value no one uses aside: the first trace of a
    model ran a lazy initialization's dead ``aten.empty`` that the second did not), with the
    same targets, arguments and constants."""
    if a.code == b.code:
        targets = [n.target for n in a.graph.nodes if n.op == "get_attr"]
        return all(_same_values(_attr(a, t), _attr(b, t)) for t in targets)
    mine, theirs = _live(a), _live(b)
    return len(mine) == len(theirs) and all(_same_values(x, y) for x, y in zip(mine, theirs))


def _live(gm: torch.fx.GraphModule) -> list:
    """Per live node of ``gm`` in order: its op, target (a constant's value) and arguments,
    the nodes among them by their live index."""
    live: set = set()
    for n in reversed(gm.graph.nodes):
        if n.op in ("placeholder", "output") or n.is_impure() or any(u in live for u in n.users):
            live.add(n)
    index = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n in live)}

    def ref(m):
        return ("node", index[m])

    return [(n.op, _attr(gm, n.target) if n.op == "get_attr" else str(n.target),
             torch.fx.node.map_arg(n.args, ref), torch.fx.node.map_arg(n.kwargs, ref))
            for n in gm.graph.nodes if n in live]


def _attr(m, target: str):
    for name in target.split("."):
        m = getattr(m, name)
    return m


def _same_values(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.fx.GraphModule):
        return _same_graph(a, b)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.shape, a.stride(), a.device) == (b.dtype, b.shape, b.stride(),
                                                            b.device) and \
            torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_values(a[k], b[k]) for k in a)
    return bool(a == b) and (type(a) not in (float, complex) or repr(a) == repr(b))  # (-0.0)
