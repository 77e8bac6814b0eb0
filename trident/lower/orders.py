"""Dict orders: whether a specialization's result depends on the key order of a dict argument.

Note [Dict orders]: a dict iterates in the order its keys were inserted, and code that builds
one from a set of str (transformers' ``create_masks_for_generate`` makes a hybrid model's
attention masks ``{layer type: mask}`` in the order of ``set(config.layer_types)``) orders it
by Python's per-process str hash seed (``PYTHONHASHSEED``). An argument tree checks a dict's
keys in order (Note [Argument trees] in flatten.py), as it must where the function iterates
the dict (``[x * m for m in masks.values()]`` returns its values in that order); so a process
of another seed had another tree key and traced and built again what an earlier process
stored (issue 27).

Which dicts may be checked in any order is decided by the trace, not guessed. A *candidate* is
an exact ``dict`` of two or more str keys that the call holds in its arguments themselves or
in tuples, lists and dicts there (not inside an object, not the ``**kwargs`` dict). The call
is traced a second time, the *order probe* (``Tracer._order_probe``), with each candidate
replaced by an :class:`OrderWatch`: a ``dict`` subclass holding the same items in the reverse
order whose every method that reveals or changes the order (iteration of the dict or of its
views, ``repr``, ``copy``, ``|``, pickling and copying's ``__reduce_ex__``, any write) notes
that the candidate was seen. What C code does with a dict subclass goes through those
methods: ``dict(d)``, ``{**d}``, ``f(**d)``, ``set(d)``, ``json.dumps(d)`` call its
``keys``/``__iter__``/``items``. A candidate is *free* where the probe saw none of that and
both traces are the same (the graph, its constants, the result's structure and constants,
what the trace assumed of symbolic sizes: ``same_capture``; a trace that a dict subclass
made take another path, as ``type(d) is dict`` or pytree's leaves, is not the same and keeps
every order checked). Code that never asked for the order of a dict computes the same in
every order, so one probe decides for a dict of any number of keys, and for every candidate
of the call at once (no trace per order: a dict of n keys has n! of them). A free dict's tree
node checks its keys as a set (a ``frozenset`` in ``Node.keys``: ``same_keys`` in
runtime/trees.cpp), its description names its keys sorted "in any order", and so the tree's
key is one in every process. Any other candidate's node checks the order, as before: one
the function iterates (its specialization serves that order only), one that the tree reaches
a second time (a ``SAME`` node: the alias would not be watched), and every candidate of a
call whose probe failed or differed. (The same dict read through a global or another state
chain is the original, not the watch: a state read, whose tree checks its order.) Not seen
by the probe's watch's methods: ``dict``'s own methods called on it through the class. Those
that are C methods (``dict.keys(d)``, ``dict.values(d)``, ``dict.items(d)``, ``dict.copy(d)``,
``dict.__reversed__(d)``) are C calls that the recording's profile hook reports, bound to the
watch: ``Probe.called`` notes them (a 3-key dict's middle item read through ``dict.values(d)``
was missed, and served another order's specialization). The slot wrappers (``dict.__iter__``,
``dict.__repr__``, ``dict.__or__``, ``dict.__ror__``, ``dict.__ior__``, ``dict.__setitem__``,
``dict.__delitem__``) are no C call the hook sees; the watch holds its items reversed, which a
reversal leaves alike where it keeps what is read (a 3-key dict's middle item through
``dict.__iter__(d)`` was missed: served another order's specialization). So the code that ran
in the probe (user code and scanned library code: Note [Library code that ran] in
lower/state/library.py) is scanned for a load of one (``slot_loaded``: ``dict.__iter__``, a
global or a local bound to it, an attribute of a class that resolves to it): where one is
loaded, no candidate is free. Still unseen: such a slot wrapper reached where the code alone
does not say it (``getattr(dict, name)`` of a computed name, ``type(d).__mro__[1]``), and C
extensions that walk a dict subclass with ``PyDict_Next``: there the reversal is all that
tells. Each kind is a case of tests/test_dict_orders.py and tests/test_stale45_orders.py.

The flattening visits a candidate's items in sorted key order (``flatten.py``), so that the
leaves of a call whose dict comes in another order are those of the stored specialization.
The dict paths a specialization checks in any order are stored with it
(``Specialization.free_orders``) and learned by a process from the specializations it
installs, stored ones too (``_free_orders``, as Note [Int leaves] learns int leaves): its
calls are flattened with those dicts in any order, but where a known specialization's tree
checks the order of the call's dict (another call of the function iterated it), that tree
is kept. Either way the dispatcher checks what the installed tree's key says: a call of
another order is never served by a specialization that read the order.

What it costs: the compile of a call that holds a candidate traces twice (the probe is part
of the ``trace`` stage and counted on its own as ``order probe``, Note [Compile stages]; not
counted in ``stats.traces``; the tiny Gemma2 of tests/test_partials_in_trees.py has one per
compile; docs/benchmarks.md has its seconds). Two traces of one call may differ
in what a first run initializes lazily, so graphs are compared by their live nodes (a dead
``aten.empty`` aside); any other difference keeps the order checked. The hit path is
unchanged for every other dict (one type test more in ``same_keys``): the check of one in any
order costs a set lookup per key where an ordered one compares keys in order.
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from trident.ir.trees import DICT, SAME, SEQ, ArgTree, tree_key


def sorted_items(nodes: list, i: int) -> bool:
    """Note [Dict orders]: node ``i`` of ``nodes`` (a tree's, or those a flattening made so
    far) is a candidate dict, whose items the flattening visits in sorted key order: an exact
    dict of two or more str keys, not the ``**kwargs`` dict, under tuples, lists and dicts
    only."""
    n = nodes[i]
    if n.check != DICT or n.expect is not dict or n.length < 2 or n.path == "" or \
            n.keys is None or not all(type(k) is str for k in n.keys):
        return False
    parent = n.parent
    while parent >= 0:
        if nodes[parent].check not in (SEQ, DICT):
            return False
        parent = nodes[parent].parent
    return True


def candidates(tree: ArgTree) -> list[int]:
    """Note [Dict orders]: the nodes of the call's candidate dicts."""
    return [i for i in range(len(tree.nodes)) if sorted_items(tree.nodes, i)]


def watched(tree: ArgTree) -> list[int]:
    """The candidates the order probe watches: those the tree reaches once (no ``SAME`` node
    names them: an alias of the dict would not be the watch)."""
    again = {n.expect for n in tree.nodes if n.check == SAME}
    return [i for i in candidates(tree) if i not in again]


def ordered(tree: ArgTree, values: list, free: frozenset) -> ArgTree:
    """``tree`` with each candidate dict checked in any order where its path is in ``free``,
    else in its order in ``values`` (the call's node values); ``tree`` itself where that
    changes nothing."""
    if not free and not any(type(n.keys) is frozenset for n in tree.nodes):
        return tree
    nodes, description = list(tree.nodes), list(tree.description)
    for i in candidates(tree):
        n = nodes[i]
        if n.path in free:
            keys, words = frozenset(n.keys), f"dict with keys {sorted(n.keys)} in any order"
        else:
            keys, words = tuple(values[i]), f"dict with keys {[str(k) for k in values[i]]}"
        if keys == n.keys and type(keys) is type(n.keys):
            continue
        nodes[i] = dataclasses.replace(n, keys=keys)
        description[i] = description[i].rsplit("|", 1)[0] + "|" + words
    if nodes == list(tree.nodes) and description == list(tree.description):
        return tree
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


class Probe:
    """Note [Dict orders]: the order probe's watches, by node; ``seen`` the nodes whose order
    (or contents) the trace asked for or changed."""

    def __init__(self, nodes: list[int]):
        self.nodes = frozenset(nodes)
        self.made: set[int] = set()
        self.seen: set[int] = set()

    def watch(self, i: int, items) -> OrderWatch:
        """The stand-in of candidate node ``i``, holding ``items`` (key, value) in order."""
        self.made.add(i)
        w = OrderWatch(items)
        w._probe, w._node = self, i
        return w

    def free(self, tree: ArgTree) -> frozenset:
        """The paths of the watched candidates the trace did not ask the order of."""
        return frozenset(tree.nodes[i].path for i in self.made - self.seen)

    def called(self, fn) -> None:
        """A C call of the probe's trace (the recording's profile hook): ``dict``'s own method
        that reveals or changes the order, called on a watch through the class
        (``dict.keys(d)``), notes it as seen."""
        owner = getattr(fn, "__self__", None)
        if type(owner) is OrderWatch and owner._probe is self and \
                getattr(fn, "__name__", None) in _ORDER_METHODS:
            self.seen.add(owner._node)


# Note [Dict orders]: dict's slot wrappers that reveal or change its order (no C call event)
_SLOTS = {n: vars(dict)[n] for n in ("__iter__", "__repr__", "__or__", "__ror__", "__ior__",
                                     "__setitem__", "__delitem__") if n in vars(dict)}
_SLOT_IDS = frozenset(id(v) for v in _SLOTS.values())


def slot_loaded(recording, ordered_dicts: bool = False) -> str | None:
    """Note [Dict orders]: ``"dict.__iter__ (file.py:3)"`` where code that ran in the
    ``recording`` (user code, scanned library code) loads one of dict's slot wrappers that
    reveal or change its order, else None. ``ordered_dicts``: only code that also names an
    OrderedDict of two or more keys (a parameter's value at the trace's call, a global: Note
    [Orders of an OrderedDict] in lower/state/recording.py)."""
    from trident.lower.state import flow  # (the state package imports flatten, which this)
    names = frozenset(_SLOTS)
    codes = [(c, g, p) for c, (g, p) in recording.codes.items()] + [
        (c, g, {}) for c, g in recording.library.values()]
    for code, g, params in codes:
        if names.isdisjoint(code.co_names) and not any(
                id(g.get(n)) in _SLOT_IDS for n in code.co_names):  # (a global bound to one)
            continue
        if ordered_dicts and not any(
                type(v) is collections.OrderedDict and len(v) >= 2 for v in
                [*params.values(), *(g.get(n) for n in code.co_names)]):
            continue
        f = flow.Flow(code, g)  # (a local or a cell bound to one: its load is in code that ran)
        for k, i in enumerate(f.ins[:-1]):
            if (i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in names or
                    i.opname == "LOAD_GLOBAL" and id(g.get(i.argval)) in _SLOT_IDS) and \
                    id(f.static(k + 1, 0)) in _SLOT_IDS:
                line = i.positions.lineno if i.positions else "?"
                return f"dict.{i.argval} ({code.co_filename.rsplit('/', 1)[-1]}:{line})"
    return None


def _seeing(name: str):
    base = getattr(dict, name)

    def method(self, *args, **kwargs):
        if self._probe is not None:
            self._probe.seen.add(self._node)
        return base(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


_ORDER_METHODS = ("__iter__", "__reversed__", "keys", "values", "items", "popitem", "copy",
                  "__repr__", "__or__", "__ror__", "__ior__", "__reduce__", "__reduce_ex__",
                  "__setitem__", "__delitem__", "update", "setdefault", "pop", "clear")


class OrderWatch(dict):
    """Note [Dict orders]: a candidate dict's stand-in in the order probe (``Probe.watch``);
    each method that reveals or changes its order notes the candidate as seen, and works as
    ``dict``'s does. Made otherwise (``type(d)()``), it notes nothing."""

    _probe: Probe | None = None
    _node = -1

    for _name in _ORDER_METHODS:
        locals()[_name] = _seeing(_name)
    del _name


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
