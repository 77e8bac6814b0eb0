"""Classes and modules used whole (Note [Modules used whole]): which of their members a state
tree guards when the function hands one on as a value."""

from __future__ import annotations

import types

from trident import frames
from trident.errors import TridentError
from trident.ir.trees import DICT, ID, OBJECT, SEQ, _CONSTS
from trident.lower.state.chain import _MISSING, _STOP, Read, _root_of, _step
from trident.lower.state.instances import _plain_lookup

CLASS_CONTAINER = 64  # a user class's containers guarded with the class used whole
_CONTAINERS = (list, tuple, dict, set, frozenset)

# Note [Modules used whole]: a chain that ends at a module with no attribute after it (``[mod]
# [0].K``, ``operator.attrgetter("Cfg.K")(mod)``, ``functools.reduce(getattr, names, mod)``,
# ``mod.__getattribute__("K")``, a helper that returns the module it was given) hands the
# module on to code whose reads of it no chain names: a C function, a list the function
# indexes, a helper's result. The module was checked by identity alone, so a rebound
# ``mod.K`` was stale. As a user class used whole (whose numbers, strings and small
# containers are guarded through its MRO), a user module used whole (``frames.
# library_module`` is false: a library's module state is taken as fixed, Note [Library state]
# in tree.py) has each of its globals guarded: functions, classes, modules and other values
# by identity (``by_id``; a user class whole, as above: ``attrgetter("Cfg.K")(mod)``; a
# module it holds by identity alone), numbers, strings and containers whole; an
# object or a value no check sees (a CUDA tensor) makes the call run eagerly, with a warning.
# Dunder names (``__builtins__``, ``__name__``) are the module's machinery, not its state.
# A library module used whole stays checked by identity (``torch`` handed to a helper).
# What a user module or class used whole holds is used whole in turn, at any depth: a user
# module (``import helpers`` in the module: ``attrgetter("helpers.K")(mod)`` read a rebound
# ``helpers.K`` stale while the module was checked by identity alone), and a user class that a
# class holds (a nested ``Cfg.Inner``) or a module it holds. Each is used whole once per state
# tree (``whole``: the ids already used so; modules import each other): elsewhere it is
# checked by identity, and every place that holds it holding the same object, its members are
# those guarded where it was used whole.


def members(value, path: str, by_id) -> list[tuple[str, object, bool]]:
    """Note [Modules used whole]: (name, value, checked by identity) of each member of the
    class or module ``value`` (at ``path``, used whole) that its guard checks.

    Raises:
        TridentError: a user class holds a container of more than ``CLASS_CONTAINER`` items."""
    out = []
    if isinstance(value, type) and frames.user_class(value):
        # a user class used whole may reach a local the scan does not follow (returned by a
        # call: c = pick(); c.k, getattr(self, name)): its numbers and strings, and its
        # lists, tuples, dicts and sets of up to CLASS_CONTAINER items, whole, through its
        # MRO; a larger one is more than a guard checks per call: the call runs eagerly (it
        # was taken as fixed: stale once it changed)
        names = {n for c in value.__mro__ if frames.user_class(c) for n in vars(c)
                 if not (n.startswith("__") and n.endswith("__"))}
        for name in sorted(names):
            data = _step(value, ("attr", name))
            if type(data) in _CONTAINERS and len(data) > CLASS_CONTAINER:
                raise TridentError(f"the function uses the class {path} whole, and its "
                                   f"{name} holds {len(data)} items, more than the "
                                   f"{CLASS_CONTAINER} a guard checks")
            if type(data) in _CONSTS or type(data) in _CONTAINERS:
                out.append((name, data, False))
            elif whole_member(data):  # (used whole in turn)
                out.append((name, data, True))
    elif isinstance(value, types.ModuleType) and not frames.library_module(value):
        for name, data in list(vars(value).items()):
            if not isinstance(name, str) or name.startswith("__") and name.endswith("__") or \
                    data is _MISSING or data is _STOP:
                continue
            out.append((name, data, not isinstance(data, _CONSTS) and by_id(data)))
    return out


def whole_member(data) -> bool:
    """Note [Modules used whole]: a member used whole in turn: a user class or a user
    module."""
    return isinstance(data, type) and frames.user_class(data) or \
        isinstance(data, types.ModuleType) and not frames.library_module(data)


# Note [Classes of held objects]: a class attribute is found through the class of the object it
# is read of, and reads that no chain names reach such objects: a method's result
# (``m.get_layer().K``), the items a generator yields (``for mod in m.modules()``, a method
# that yields), the items C code reads (``map(operator.attrgetter("K"), m.layers)``), a name
# computed at run time (``getattr(l, m.which)``, ``getattr(l, name, default)``). They were
# taken as constants: ``K`` changed on the class, on a base, shadowed on a subclass later or
# deleted, a hit returned the trace's value. What such a read can reach of the call's objects
# is what the argument tree holds (the scan holds whole what is passed on, iterated or called:
# Note [Parameter reads] in lower/uses.py), or a value a state tree uses whole
# (``map(attrgetter("K"), LAYERS)``); so the class of every object of a user class that either
# holds (an ``OBJECT`` node), and every user class an argument tree holds by identity (or a
# container or object of such a value: ``map(attrgetter("K"), CLASSES)``; not a class a chain
# reads through, ``Knobs.a``, whose reads are its chains), is used whole (Note [Modules used
# whole]): its numbers, strings and containers through its MRO, by value. And since a name
# found nowhere is a read too (``getattr(l, name, 1.0)``, a ``__getattr__`` added later), each
# user class of its MRO has its names checked: an ``OBJECT`` check of the class beside its
# ``ID`` node (in C a class's instance dict is its own dict, so the check is of its keys in
# order; ``_names`` in tree.py). The values are class attributes under a root, and the names
# the class's own dict: once an evaluation held, both are proven by the class's version tag
# (Note [Quiet state] in runtime/state_memo.cpp: any attribute of the class or of a base set or
# deleted clears it), with no check run while it holds. A change misses, the chains are
# evaluated again, and the digest (values by content, names in order) decides: the state of an
# earlier specialization reinstalls it. A library's class is not read (its state is taken as
# fixed: Note [Library state] in library_steps.py), so a model of transformers' classes reads no more
# than before; nor is a class whose metaclass looks names up otherwise than ``type`` (its
# Python code would run on the hit path), as in Note [Instance lookups]. The name that Python
# caches on a class at the first ``copy`` or pickle of an instance (``__slotnames__``,
# copyreg) is cached before the names are taken, so a deepcopied model compiles nothing more.


def held_class_reads(nodes, values, classes_held: bool) -> list[Read]:
    """Note [Classes of held objects]: a whole read of the class of each object of a user class
    that ``nodes`` hold (an argument tree's or a state tree's, ``values`` their values, index
    for index), and of each user class they hold by identity: every one (``classes_held``: an
    argument tree's), or else those that a container or an object holds (a state tree's value
    used whole; not the classes its chains read through, whose reads are chains)."""
    classes: dict = {}
    for node, value in zip(nodes, values):
        if node.check == OBJECT and not isinstance(value, type):  # (a class's names: _names
            cls = type(value)  # in tree.py)
        elif node.check == ID and isinstance(value, type) and (classes_held or (
                node.parent >= 0 and nodes[node.parent].check in (SEQ, DICT, OBJECT))):
            cls = value
        else:
            continue
        if id(cls) not in classes and frames.user_class(cls) and _plain_lookup(type(cls)):
            classes[id(cls)] = cls
    return [Read(*_root_of(cls), True) for cls in classes.values()]
