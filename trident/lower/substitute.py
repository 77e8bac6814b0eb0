"""Tracing inside the call's own objects: the trace's fake tensors in place of its leaves.

While tracing (:func:`substituted`), the leaves of the real objects are replaced by the trace's
fake tensors in place and restored afterwards; a function that assigns to the Python state the
tree covers (a lazily initialized cache that stores new tensors in ``self.keys``) is seen and
its assignments are undone: an attribute write the specialization replays (Note [Attribute
writes] in writes.py) is handed to the output recipe, any other makes the call run eagerly.
"""

from __future__ import annotations

import contextlib

import torch

from trident.errors import TridentError
from trident.ir.trees import ARG, CONST, DICT, OBJECT, SAME, SEQ, ArgTree, Node
from trident.lower import source_lines
from trident.lower.flatten import _MISSING, _is_namedtuple, _type_name
from trident.lower.writes import (constant, fake_keys, finalized, plain_setattr, replayable,
                                  tensor_attributes)


def _entries(node: Node, value) -> dict | list:
    """What a mutable node holds, in place: an object's ``__dict__``, a dict, a list."""
    return vars(value) if node.check == OBJECT else value


def _snapshot(node: Node, value) -> dict | list:
    entries = _entries(node, value)
    return dict(entries) if isinstance(entries, dict) else list(entries)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _changed_entry(path: str, now, before) -> str:
    """``cache.layers[0].keys``: the first entry of a container that the function changed."""
    if isinstance(now, dict):
        for k in list(now) + [k for k in before if k not in now]:
            if now.get(k, _MISSING) is not before.get(k, _MISSING):
                return f"{path}.{k}" if path else str(k)
    return path



def _restore(node: Node, value, saved) -> None:
    """Put ``saved`` back into ``value`` (keys the function added are deleted)."""
    if isinstance(saved, list):
        value[:] = saved
        return
    target = _entries(node, value)
    for k in [k for k in target if k not in saved]:
        del target[k]
    if list(target) != list(saved):  # a key deleted and set again: saved's order, too
        target.clear()
    for k, v in saved.items():
        if k not in target or target[k] is not v:
            target[k] = v


@contextlib.contextmanager
def substituted(tree: ArgTree, values: list, leaves: tuple, rebuilt: dict | None = None,
                writes: list | None = None, probe=None):
    """Put ``leaves`` (the trace's fake tensors; ``leaves[0]`` is the key) in place of the
    call's real leaves, inside the call's own objects, and yield the bound values to call
    the function with; restore every object the tree covers afterwards. ``rebuilt`` receives
    {id of a tuple made around fake leaves: its node}, so that a result that returns it is
    known as the call's own. ``writes`` receives the attribute writes a specialization
    replays (Note [Attribute writes] in writes.py): ``(node, name, value, tensor
    attributes)``. ``probe`` (``orders.Probe``, Note [Dict orders] in orders.py): its
    candidate dicts are replaced by their watches, which hold the fake leaves.

    Raises (after restoring):
        TridentError: the function assigned to Python state that the tree covers (an
            attribute, a list or dict item) in a way no specialization replays (any, where
            ``writes`` is None).
    """
    nodes = tree.nodes
    children: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        children.setdefault(n.parent, []).append(i)
    mutable = [i for i, n in enumerate(nodes)
               if n.check in (OBJECT, DICT) or (n.check == SEQ and n.expect is list)]
    saved = {i: _snapshot(nodes[i], values[i]) for i in mutable}
    sets = [i for i, n in enumerate(nodes) if n.check == CONST and type(values[i]) is set]
    new = list(values)
    for i, leaf in zip(tree.leaf_nodes, leaves[1:]):
        new[i] = leaf

    def same_nodes():
        for i, n in enumerate(nodes):
            if n.check == SAME:
                new[i] = new[n.expect]

    same_nodes()
    for i in reversed(range(len(nodes))):  # tuples around fake leaves are new tuples
        n = nodes[i]
        if probe is not None and i in probe.nodes:  # (its items' new values made before it)
            items = dict(values[i])
            for j in children.get(i, ()):
                items[nodes[j].key] = new[j]
            new[i] = probe.watch(i, reversed(items.items()))
        elif n.check == SEQ and n.expect is not list:
            kids = list(values[i])  # the items the tree leaves out as they are
            for j in children.get(i, ()):
                kids[nodes[j].key] = new[j]
            if any(a is not b for a, b in zip(kids, values[i])):
                new[i] = n.expect(*kids) if _is_namedtuple(n.expect) else tuple(kids)
                if rebuilt is not None:
                    rebuilt[id(new[i])] = i
    same_nodes()
    for i, n in enumerate(nodes):  # into the mutable parents, in place
        if n.parent >= 0 and new[i] is not values[i] and n.parent in saved:
            _entries(nodes[n.parent], values[n.parent])[n.key] = new[i]
    expected = {i: _snapshot(nodes[i], values[i]) for i in mutable}
    roots = [new[i] for i in children.get(-1, ()) if nodes[i].access == ARG]
    replayed = set() if writes is None else {
        i for i in mutable if nodes[i].check == OBJECT and plain_setattr(type(values[i]))}
    fakes = {i: (new[i], set(vars(new[i]))) for i in tree.leaf_nodes
             if writes is not None and isinstance(new[i], torch.Tensor)}
    changed: list[str] = []
    owners: list[object] = []
    def check():  # Note [Early assignment check] in source_lines.py
        for i in mutable:
            now = _snapshot(nodes[i], values[i])
            if i not in replayed and source_lines.new_tensor(now, expected[i]):
                raise _assigned(_changed_entry(nodes[i].path, now, expected[i]), values[i])
    try:
        with source_lines.at_torch_calls(check):
            yield roots
    finally:
        found: list = []
        for i in mutable:
            now = _snapshot(nodes[i], values[i])
            if not _same(now, expected[i]):
                entries = replayable(type(values[i]), now, expected[i]) \
                    if i in replayed else None
                if entries is None:
                    changed.append(_changed_entry(nodes[i].path, now, expected[i]))
                    owners.append(values[i])
                else:
                    found += [(i, k, v, tensor_attributes(v)) for k, v in entries]
            _restore(nodes[i], values[i], saved[i])
        for i, (fake, before) in fakes.items():  # torch._dynamo.mark_static_address(leaf)
            added = {k: v for k, v in vars(fake).items()
                     if k not in before and k not in fake_keys()}
            if not all(constant(v) for v in added.values()):
                changed.append(nodes[i].path)
                owners.append(values[i])
            found += [(i, k, v, ()) for k, v in added.items()]
        for i in sets:
            if values[i] != nodes[i].expect:
                changed.append(nodes[i].path)
                owners.append(values[i])
                values[i].clear()
                values[i].update(nodes[i].expect)
    for i, k, v, attrs in found:
        if not all(constant(a) for _, a in attrs):
            changed.append(f"{nodes[i].path}.{k}")
            owners.append(values[i])
        old = saved.get(i)  # (None: an attribute set on a tensor argument)
        why = finalized(old.get(k)) if isinstance(old, dict) else None
        if why is not None:  # Note [Finalizers of written values] (lower/writes.py)
            error = TridentError(f"the function's write to {nodes[i].path}.{k} drops a value "
                                 f"that {why} finalizes: eager runs it at the write, a "
                                 "specialization would not")
            error.any_sizes = True
            raise error
    if changed:
        raise _assigned(changed[0], owners[0])
    if writes is not None:
        writes += found


def _assigned(path: str, owner) -> TridentError:
    error = TridentError(f"the function assigns to {path} (Python state of its arguments, in a "
                         f"{_type_name(type(owner))}, which a specialization cannot replay)")
    error.any_sizes = True  # the trace of any sizes assigns it (policy.py)
    return error
