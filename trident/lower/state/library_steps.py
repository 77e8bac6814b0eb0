"""A chain's steps through a library's state (Note [Library state]) and a library's
containers used whole (Note [Library containers used whole]): the part of the state tree's
builder (tree.py) that reads what user code reads from library modules."""

from __future__ import annotations

import collections
import inspect
import logging
import types

import torch

from trident.errors import TridentError
from trident.identity import identity_words
from trident.ir.trees import ABSENT, ID, TYPE, _BY_ID, _CONSTS, Node
from trident.runtime import ABI
from trident.lower.state.library import by_value
from trident.lower.state.words import _op_types, _words
from trident.lower.state.roots import registries
from trident.lower.state.chain import (_MISSING, _READ_INTO, _STOP, _is_getter, _kernel_fns,
                                       _plain_object)

# Node.access of state trees (trident_trees.h's TRT_ACC_*): a root object, getattr, getitem, and
# a closure cell's contents.
ROOT, GETATTR, GETITEM, CELL = (ABI[f"TRT_ACC_{k}"] for k in (
    "ROOT", "GETATTR", "GETITEM", "CELL"))


def _by_id(value) -> bool:
    return isinstance(value, (_BY_ID, logging.Logger, *_op_types())) or \
        bool(_kernel_fns(value)) or \
        type(value).__name__ == "JitFunction"


# Note [Library state]: a library's code and its module state are taken as fixed (its reads
# are not chains, but for the functions, classes, modules and immutable values its code that
# ran loads: Note [Library code that ran], Note [Library values] in library.py), but what user
# code reads from a library module is guarded, since users patch it: `F.gelu = torch.tanh`,
# `mock.patch("torch.relu", torch.neg)`, `math.pi = 3`.
# Modules and classes are read through by identity, functions and other objects are checked by
# identity (not read into: their contents are the library's), numbers and strings by value,
# torch's dtypes, layouts and memory formats by identity (one object per value), a tuple of
# immutable values (Note [Library values] in library.py) item by item.
# torch's global module hooks are checked whole (a hook registered later is seen), and a flag
# that a `torch.backends` module serves from C (`torch.backends.mkldnn.enabled`, a
# `ContextProp`) is read by calling its getter in C; any other value a library module serves
# through Python code (a config module's `__getattr__`, a module-level `__getattr__`) is not
# followed: the function runs eagerly. An object checked by identity is named in the digest by
# words that hold in every process where they can (``_words``): a function by its code, a
# library's value by its class and repr (`tl.int32`: `triton.language.core.dtype
# triton.language.int32`), never by its address where its repr names it, so that a new
# process finds the specializations stored by an earlier one (issue 27).
_WHOLE_LIBRARY_STATE = {
    "torch.nn.modules.module": ("_global_backward_pre_hooks", "_global_backward_hooks",
                                "_global_forward_hooks", "_global_forward_hooks_always_called",
                                "_global_forward_hooks_with_kwargs", "_global_forward_pre_hooks",
                                "_global_is_full_backward_hook"),
}


# Note [Value reads] in lower/values.py: the package's __getattr__ answers who asks, not state
_FAKE_ANSWER = ("torch._subclasses", "FakeTensor")


def _library_step(f, trie: dict, key: tuple, parent: int, parent_obj, step,
                  value, last: bool, to_class: bool = False) -> bool:
    """One step of a chain in a library's state (Note [Library state]): the node it makes;
    True where the chain reads on through ``value`` (a module, a class, a getter's call, an
    object whose class it reads next: ``to_class``, Note [Module forwards] in roots.py).

    Raises:
        TridentError: a torch.backends value that Python code serves."""
    name = step[1] if len(step) > 1 else ""
    path = _path_text(f.nodes[parent].path, step)
    if value is _STOP and step[0] == "attr":
        prop = inspect.getattr_static(type(parent_obj), name, None)
        getter = getattr(prop, "getter", None)
        if type(prop).__name__ == "ContextProp" and _is_getter(getter):
            root = (("getter", id(getter)),)
            if root not in trie:
                trie[root] = f.add(getter, Node(-1, ROOT, getter, ID, getter, 0,
                                                getter.__name__), identity_words(getter))
            call = root + (("call",),)
            if call not in trie:
                f.visit(getter(), trie[root], GETATTR, (), path, True)
                trie[call] = len(f.nodes) - 1
            return False
        if isinstance(parent_obj, types.ModuleType) and (  # a config module, a module
                getattr(parent_obj, "__name__", None), name) != _FAKE_ANSWER:  # __getattr__
            raise TridentError(f"the function reads {path}, which the library serves through "
                               "Python code that no guard follows")
        return False
    if value is _MISSING and step[0] in ("item", "get") and type(parent_obj) is dict:
        key = key + (step,)  # Note [Library containers used whole]: "m" in sys.modules asks
        if key not in trie:  # for one key, guarded absent (present: its value, below)
            trie[key] = f.add(None, Node(parent, GETITEM, name, ABSENT, None, 0, path), "absent")
        return False
    if value is _STOP or value is _MISSING:
        return False
    access, k = (GETATTR, ()) if step[0] == "call" else (
        (GETATTR, name) if step[0] == "attr" else (GETITEM, name))
    key = key + (step,)
    if key in trie:  # read on through a module, a class, a container (as made below)
        return not last and (isinstance(value, (types.ModuleType, type)) or to_class or (
            type(value) in (list, dict, tuple) and f.nodes[trie[key]].check == TYPE))
    if name in _WHOLE_LIBRARY_STATE.get(getattr(parent_obj, "__name__", None), ()) or (
            name == "_global_mapping" and parent_obj in registries()):  # Note [Library
        # registries] in roots.py
        before = len(f.nodes)
        f.visit(value, parent, access, k, path, True)
        trie[key] = before
        return False
    if isinstance(value, (types.ModuleType, type)) and not last:
        trie[key] = f.add(value, Node(parent, access, k, ID, value, 0, path), _words(value))
        return True
    if type(value) in (list, dict, tuple) and not last and step[0] != "call":
        # a library's container read into (sys.argv[1]): its items, by their own kind
        trie[key] = f.add(value, Node(parent, access, k, TYPE, type(value), 0, path),
                          f"type {type(value).__name__}")
        return True
    if isinstance(value, types.MethodType) or (isinstance(
            value, types.BuiltinMethodType) and not isinstance(
                value.__self__, types.ModuleType) and value.__self__ is not None):
        # made anew at each read (a classmethod, a method of a library object): what it binds
        bound = getattr(value, "__self__", None)
        if _whole_container(bound, f"{path}.__self__"):  # sys.argv.count, sys.modules.keys
            me = trie[key] = f.add(value, Node(parent, access, k, TYPE, type(value), 0, path),
                                   "method")
            f.visit(bound, me, GETATTR, "__self__", f"{path}.__self__", True)
            return False
        me = trie[key] = f.add(value, Node(parent, access, k, TYPE, type(value), 0, path),
                               "method")
        for attr in ("__func__", "__self__"):
            if hasattr(value, attr):
                part = getattr(value, attr)
                f.add(part, Node(me, GETATTR, attr, ID, part, 0, f"{path}.{attr}"),
                      _words(part))
        return False
    if type(value) in (torch.dtype, torch.layout, torch.memory_format):  # one object per
        # value: by identity, which the module's dict tag proves (Note [Quiet state])
        trie[key] = f.add(value, Node(parent, access, k, ID, value, 0, path), _words(value))
        return False
    if type(value) in _CONSTS and (step[0] == "call" or not callable(value)):
        f.visit(value, parent, access, k, path, True)
        trie[key] = len(f.nodes) - 1
        return False
    # by value, each item by its kind (Note [Library values] in library.py; Note [Library
    # containers used whole])
    if last and (type(value) is tuple and by_value(value) or _whole_container(value, path)):
        trie[key] = len(f.nodes)
        f.visit(value, parent, access, k, path, True)
        return False
    if not last and not to_class and step[0] != "call":  # Note [Library objects read into]
        if isinstance(value, logging.Logger):
            raise TridentError(f"the function reads {path}'s attributes, a logger's state, "
                               "which no guard follows")
        if _plain_object(value) and not _by_id(value):
            return _READ_INTO
    trie[key] = f.add(value, Node(parent, access, k, ID, value, 0, path), _words(value))
    return not last and (_is_getter(value) or to_class)  # sys.getrecursionlimit, then its call


# Note [Library containers used whole]: a library's list or dict that user code uses whole
# (``len(sys.argv)``, ``"-v" in sys.argv``, ``for p in sys.path``, ``sys.argv.count("-v")``)
# was checked by identity, so an item appended after a hit was not seen (CPU machine, session
# 48). One of immutable items (``by_value``, as many as a tuple may hold; a dict's keys str) is
# checked by value like a user's global container, at every call (a list has no version tag).
# A bigger one, or one of other items (``sys.modules``), is not checked whole: where the use
# asks for one constant key (``"m" in sys.modules``, ``sys.modules.get("m")``: the chain's
# ``("get", key)``) that item is guarded, absent or its value by its kind; any other use of it
# whole (``len``, iterating it, passing it to a call, a bound method of it) makes the call run
# eagerly (session 49: each spelling was stale).
_CONTAINERS = (list, dict, set, collections.deque)  # (a frozenset: by identity, immutable)


def _whole_container(value, path: str) -> bool:
    """Whether ``value``, a library's container used whole, is checked by value; raises
    TridentError where it is a container that no check reads cheaply (Note [Library
    containers used whole]); False for any other value."""
    if type(value) is list and by_value(tuple(value)) or type(value) is dict and all(
            type(k) is str for k in value) and by_value(tuple(value.values())):
        return True
    if isinstance(value, _CONTAINERS):
        raise TridentError(f"the function uses {path} whole, a library's "
                           f"{type(value).__name__} of {len(value)} items that no guard "
                           "checks by value: a hit would not see an item added or removed")
    return False


def _path_text(parent: str, step: tuple) -> str:
    if step[0] == "call":
        return f"{parent}()"
    if step[0] == "attr":
        return f"{parent}.{step[1]}" if parent else step[1]
    if step[0] == "cell":
        return f"{parent}.cell_contents"
    return f"{parent}[{step[1]!r}]"
