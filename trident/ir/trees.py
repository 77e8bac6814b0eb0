"""Argument trees and output recipes as data: what the native dispatcher walks on every call
(Note [Argument trees] in lower/flatten.py) and how it rebuilds a result."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import types
from typing import Any, Callable

import torch

from trident.runtime import ABI

# Node.access and Node.check, as the runtime reads them (trident_trees.h: TRT_ACC_*, TRT_CHK_*);
# state trees (Note [State guards] in lower/state/) add accesses and TYPE, ABSENT and TENSOR checks.
ARG, ITEM, INDEX, ATTR, SELF = (ABI[f"TRT_ACC_{k}"] for k in (
    "ARG", "ITEM", "INDEX", "ATTR", "SELF"))
LEAF, SEQ, DICT, OBJECT, CONST, ID, SAME, TYPE, ABSENT, TENSOR = (ABI[f"TRT_CHK_{k}"] for k in (
    "LEAF", "SEQ", "DICT", "OBJECT", "CONST", "ID", "SAME", "TYPE", "ABSENT", "TENSOR"))
MAX_NODES = 200_000  # a bigger argument (a huge object graph) runs eagerly

_SCALARS = (bool, int, float, type(None))
_CONSTS = (str, bytes, int, float, bool, complex, type(None), torch.dtype, torch.device,
           torch.Size, range, torch.memory_format, torch.layout)
# A slice is a CONST when its bounds are of these types, compared by exact type and value
# (const_equal in runtime/trees.cpp: ``x[1.0:]`` raises where ``x[1:]`` does not, though
# 1.0 == 1).
_SLICE_BOUNDS = (int, bool, type(None))
_BY_ID = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
          types.ModuleType, types.CodeType, property, staticmethod, classmethod,
          types.MethodWrapperType, types.WrapperDescriptorType, types.MethodDescriptorType)


@dataclasses.dataclass(frozen=True)
class Node:
    """One value of the call: read from ``parent`` by ``access`` with ``key``, then checked.

    ``expect`` is the exact type (SEQ, DICT, OBJECT), the value (CONST), the object (ID) or the
    node index (SAME); ``length`` the number of items or ``__dict__`` entries, and ``keys``
    their keys in order (a function that iterates a dict sees that order)."""

    parent: int
    access: int
    key: Any
    check: int
    expect: Any = None
    length: int = 0
    path: str = ""
    keys: tuple | None = None  # DICT and OBJECT: the keys in order (iteration order is read)


@dataclasses.dataclass
class ArgTree:
    """The flattened structure of one call (Note [Argument trees])."""

    nodes: list[Node]
    leaf_nodes: list[int]  # node index of leaf 1, 2, ... (leaf 0 is ``key``)
    key: int
    description: list[str]  # per node, stable across processes; the key hashes it

    @property
    def leaf_paths(self) -> list[str]:
        return ["<call structure>"] + [self.nodes[i].path for i in self.leaf_nodes]

    def program(self) -> tuple:
        """The tree as the Dispatcher's ``_set_call_trees`` reads it (runtime/dispatcher.cpp)."""
        return (self.key, tuple((n.parent, n.access, n.key, n.check, n.expect, n.length,
                                 n.keys) for n in self.nodes))

    def first_difference(self, other: "ArgTree", leaves: tuple | None = None) -> str:
        """Where ``other`` (a call's tree, ``leaves`` its leaves) departs from this (an
        installed one), in words."""
        return self.words().first_difference(other, leaves)

    def words(self) -> "TreeWords":
        """What its differences are told in (Note [Stored trees])."""
        return TreeWords(self.description, [n.path for n in self.nodes],
                         [n.keys for n in self.nodes])

    def int_difference(self, ints: dict, key: int) -> str | None:
        """Where this tree (a call's) departs from a stored one that no call of this process
        had, given the key and the int constants of that one (``Specialization.tree_ints``):
        the paths and both values where this tree, with those ints, is that tree; else
        None."""
        description = list(self.description)
        for index, line in ints.items():
            if int(index) >= len(description):
                return None
            description[int(index)] = line
        if description == self.description or tree_key(description) != key:
            return None
        return "; ".join(f"{self.nodes[i].path}: {_words(mine)} where {_words(theirs)} was "
                         "compiled" for i, (mine, theirs) in enumerate(
                             zip(self.description, description)) if mine != theirs)


# Note [Stored trees]: a specialization stored by another process names its argument tree by key
# only (``Specialization.tree``), and a process that had no call of that tree could not say
# where a call departs from it ("another argument structure"). What the words of a difference
# need (each node's description, path and keys) is stored once per tree key beside the
# specializations (``FunctionCache.save_tree``), and read back only by ``explain`` (a miss names
# stored trees by their int constants: Note [Stored int constants] in frontend/policy.py).

@dataclasses.dataclass(frozen=True)
class TreeWords:
    """An argument tree as its differences are told (Note [Stored trees]): per node its
    description (``ArgTree.description``), path, and keys (a dict's or an object's, in order;
    None for other nodes)."""

    description: list[str]
    paths: list[str]
    keys: list[tuple | None]

    def first_difference(self, other: ArgTree | TreeWords, leaves: tuple | None = None) -> str:
        """Where ``other`` (a call's tree; ``leaves``, where given, the call's leaves: Note
        [Leaf values in words]) departs from this (an installed or stored one), in words."""
        call = other
        other = other.words() if isinstance(other, ArgTree) else other
        i = self._first_apart(other)
        if i is None:
            return "same structure"
        if i == min(len(self.description), len(other.description)):
            return f"{self.paths[i]} missing" if len(self.description) > i else \
                f"{other.paths[i]} added"
        where = other.paths[i] or "keyword arguments"
        old, new = self.keys[i], other.keys[i]
        if old is not None and new is not None and old != new:  # name the keys only
            added = [k for k in new if k not in old]
            removed = [k for k in old if k not in new]
            if added or removed:
                return (f"{where}: " + ", ".join(
                    [f"{k!r} added" for k in added] + [f"{k!r} removed" for k in removed]))
            return f"{where}: keys in another order"
        return f"{where}: {_leaf_words(call, i, leaves)} where {_words(self.description[i])} " \
            "was compiled"

    def held_apart(self, other: TreeWords) -> str:
        """What this tree holds where it first departs from ``other``, in words: what tells
        two specializations of one signature apart in ``trident list`` (``c.mode: str
        'fast'``)."""
        i = self._first_apart(other)
        if i is None:
            return "the same structure"
        if i >= len(self.description):
            return f"no {other.paths[i]}"
        where = self.paths[i] or "keyword arguments"
        if i < len(other.description) and None not in (self.keys[i], other.keys[i]) and \
                self.keys[i] != other.keys[i]:
            return f"{where}: keys {', '.join(map(repr, self.keys[i]))}"
        return f"{where}: {_words(self.description[i])}"

    def _first_apart(self, other: TreeWords) -> int | None:
        """The first node where the two trees differ, the shorter one's length where one is
        the other's start; None where they are the same."""
        for i, (mine, theirs) in enumerate(zip(self.description, other.description)):
            if mine != theirs:
                return i
        if len(self.description) != len(other.description):
            return min(len(self.description), len(other.description))
        return None

    def to_json(self) -> dict:
        return {"description": self.description, "paths": self.paths,
                "keys": [(sorted(k) if type(k) is frozenset else list(k)) if k is not None
                         else None for k in self.keys]}

    @classmethod
    def from_json(cls, data: dict, key: int) -> "TreeWords":
        """Raises:
            ValueError: the description does not hash to ``key``, or the lists differ in
                length (a damaged or edited file)."""
        words = cls(list(data["description"]), list(data["paths"]),
                    [tuple(k) if k is not None else None for k in data["keys"]])
        if tree_key(words.description) != key or not \
                len(words.description) == len(words.paths) == len(words.keys):
            raise ValueError(f"not the words of the argument tree {key}")
        return words


def tree_key(description: list[str]) -> int:
    """The key of a tree of ``description`` (leaf 0 of its specializations): a positive
    int64 of its hash."""
    digest = hashlib.sha256("\n".join(description).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def int_constants(tree: ArgTree) -> dict[str, str]:
    """Note [Stored int constants]: ``{node index: description}`` of ``tree``'s int
    constants."""
    return {str(i): line for i, (node, line) in enumerate(zip(tree.nodes, tree.description))
            if node.check == CONST and type(node.expect) is int}


def _words(description: str) -> str:
    return description.split("|", 3)[-1]


# Note [Leaf values in words]: a call whose tree holds a leaf where a specialization's held a
# constant (an int attribute that became an int leaf: Note [Int leaves] in
# frontend/policy.py) differs from it in that node's words, "a leaf", which named no value:
# ``cumulative_length_int: a leaf where int 0 was compiled``. Where the call's leaves are at
# hand (a miss of this process), the words name the call's value: ``int 7 (a leaf) where int
# 0 was compiled``, a tensor its dtype and sizes.
def _leaf_words(call, i: int, leaves: tuple | None) -> str:
    """The words of node ``i`` of ``call`` (an ArgTree or TreeWords), a leaf's with its value
    in ``leaves`` (Note [Leaf values in words])."""
    words = _words(call.description[i])
    if words != "a leaf" or leaves is None or not isinstance(call, ArgTree) or \
            i not in call.leaf_nodes:
        return words
    value = leaves[call.leaf_nodes.index(i) + 1]
    if type(value) in _SCALARS:
        return f"{type(value).__name__} {value!r} (a leaf)"
    if isinstance(value, torch.Tensor):
        return f"a tensor leaf ({str(value.dtype).removeprefix('torch.')}{list(value.shape)})"
    return words


# ---- binding ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Binding:
    """How a call binds to the function's parameters, as C binds it (``bind_call``).

    ``params``: (name, inspect kind, default or ``inspect.Parameter.empty``) per parameter of
    the function as called (a bound method without ``self``). ``self_obj``: the object a bound
    method or a module carries, the tree's ``self`` root."""

    params: tuple
    self_obj: Any = None
    has_self: bool = False
    # per root (self first, where has_self), what the function reads of it (Note [Parameter
    # reads] in lower/uses.py: a trie of attribute and item paths, None: whole); () all whole
    uses: tuple = ()

    @classmethod
    def of(cls, fn: Callable, self_obj: Any = None, has_self: bool = False) -> "Binding":
        try:  # the function as called (a decorator's wrapper, not what it wraps)
            sig = inspect.signature(fn, follow_wrapped=False)
        except ValueError:  # a callable object without one (a JitFunction): what it wraps
            sig = inspect.signature(fn)
        return cls(tuple((p.name, int(p.kind), p.default) for p in sig.parameters.values()),
                   self_obj, has_self)

    def bind(self, args: tuple, kwargs: dict) -> list:
        """The bound values in parameter order (``*args`` a tuple, ``**kwargs`` a dict).

        Raises:
            TypeError: as calling the function would (the caller then calls it eagerly to
                raise eager's own message)."""
        values, used, i = [], 0, 0
        for name, kind, default in self.params:
            if kind == inspect.Parameter.VAR_POSITIONAL:
                values.append(tuple(args[i:]))
                i = len(args)
            elif kind == inspect.Parameter.VAR_KEYWORD:
                names = {p[0] for p in self.params if p[1] in (1, 3)}
                extra = {k: v for k, v in kwargs.items() if k not in names}
                used += len(extra)
                values.append(extra)
            elif kind != inspect.Parameter.KEYWORD_ONLY and i < len(args):
                if kind == inspect.Parameter.POSITIONAL_OR_KEYWORD and name in kwargs:
                    raise TypeError(f"multiple values for argument {name!r}")
                values.append(args[i])
                i += 1
            elif kind != inspect.Parameter.POSITIONAL_ONLY and name in kwargs:
                values.append(kwargs[name])
                used += 1
            elif default is not inspect.Parameter.empty:
                values.append(default)
            else:
                raise TypeError(f"missing argument {name!r}")
        if i < len(args) or used != len(kwargs):
            raise TypeError("unexpected arguments")
        return values

    def call(self, fn: Callable, values: list):
        """Call ``fn`` with bound ``values`` (the inverse of ``bind``)."""
        args, kwargs = [], {}
        for (name, kind, _), v in zip(self.params, values):
            if kind == inspect.Parameter.VAR_POSITIONAL:
                args.extend(v)
            elif kind == inspect.Parameter.VAR_KEYWORD:
                kwargs.update(v)
            elif kind == inspect.Parameter.KEYWORD_ONLY or kwargs:
                kwargs[name] = v
            else:
                args.append(v)
        return fn(*args, **kwargs)

    def program(self) -> tuple:
        """The parameters as the Dispatcher's ``_set_call_trees`` reads them: (name, kind, has a
        default, default)."""
        return tuple((name, kind, default is not inspect.Parameter.empty,
                      None if default is inspect.Parameter.empty else default)
                     for name, kind, default in self.params)


# ---- outputs ---------------------------------------------------------------------------------

# OutputRecipe ops, as the runtime's build_recipe reads them (trident_trees.h: TRT_R_*)
(R_VALUE, R_CONST, R_INPUT, R_TUPLE, R_LIST, R_DICT, R_NAMEDTUPLE, R_OBJECT, R_AGAIN,
 R_BUILT, R_STRUCTSEQ, R_WRITE) = (ABI[f"TRT_R_{k}"] for k in (
    "VALUE", "CONST", "INPUT", "TUPLE", "LIST", "DICT", "NAMEDTUPLE", "OBJECT", "AGAIN", "BUILT",
    "STRUCTSEQ", "WRITE"))
# R_OBJECT's base: how the object is made without running its Python __init__ (TRT_BASE_*)
BASE_OBJECT, BASE_DICT, BASE_ODICT = (ABI[f"TRT_BASE_{k}"] for k in ("OBJECT", "DICT", "ODICT"))


@dataclasses.dataclass
class OutputRecipe:
    """How the runtime rebuilds a result from the SCM's flat outputs (Note [Argument trees]).

    ``ops``: prefix order; each op is a tuple whose first item is an ``R_*`` code:
    ``(R_VALUE,)`` the next flat output; ``(R_AGAIN, k)`` flat output ``k`` once more (a
    tensor the result holds twice, as ``ModelOutput`` holds each field as an attribute and as
    an item); ``(R_BUILT, op)`` the container or object op ``op`` made, once more;
    ``(R_CONST, value)``; ``(R_INPUT, node)`` the call's
    object at that tree node; ``(R_TUPLE, n)``, ``(R_LIST, n)``; ``(R_DICT, keys)``;
    ``(R_NAMEDTUPLE, cls, n)``; ``(R_STRUCTSEQ, cls, n)`` a C tuple type such as
    ``torch.return_types.max`` or ``torch.Size``, made by calling ``cls`` (C) on the items;
    ``(R_OBJECT, cls, base, attributes, item keys)`` an object made by its base type's
    ``tp_new`` whose ``__dict__`` entries and (dict bases) items are set without calling its
    Python methods, as a dataclass or transformers' ``ModelOutput`` holds them after
    ``__init__``. After the result's ops, ``(R_WRITE, node, name, ((attribute, constant),
    ...))`` and the ops of one value: set attribute ``name`` of the call's object at that tree
    node to that value, after setting the constant attributes on it (Note [Attribute writes]
    in lower/writes.py)."""

    ops: list

    def stored(self) -> frozenset[int]:
        """The flat outputs that an attribute write stores into an object of the call (the
        values after the first ``R_WRITE``): that object, the caller's, holds them past the
        call (Note [Stored outputs] in frontend/graphs.py)."""
        out, k, writing = set(), 0, False
        for op in self.ops:
            writing = writing or op[0] == R_WRITE
            if op[0] == R_VALUE:
                out.update((k,) if writing else ())
                k += 1
            elif op[0] == R_AGAIN and writing:
                out.add(op[1])
        return frozenset(out)

    def writes(self) -> list[tuple[int, str]]:
        """``(node, name)`` of each attribute write (``R_WRITE``) that the recipe replays."""
        return [(op[1], op[2]) for op in self.ops if op[0] == R_WRITE]

    def to_json(self) -> list:
        out = []
        for op in self.ops:
            if op[0] in (R_NAMEDTUPLE, R_STRUCTSEQ, R_OBJECT):
                out.append([op[0], f"{op[1].__module__}:{op[1].__qualname__}", *op[2:]])
            elif op[0] == R_CONST and not isinstance(op[1], str):  # a dtype or device
                out.append([op[0], {type(op[1]).__name__: str(op[1]).replace("torch.", "")}])
            else:
                out.append(list(op))
        return out

    @classmethod
    def from_json(cls, data: list) -> "OutputRecipe":
        ops = []
        for op in data:
            if op[0] in (R_NAMEDTUPLE, R_STRUCTSEQ, R_OBJECT):
                op = [op[0], _import_type(op[1]), *op[2:]]
            if op[0] == R_DICT:
                op = [op[0], tuple(op[1])]
            if op[0] == R_CONST and isinstance(op[1], dict):
                (kind, text), = op[1].items()
                op = [op[0], getattr(torch, text) if kind == "dtype" else torch.device(text)]
            if op[0] == R_OBJECT:
                op = [*op[:3], tuple(op[3]), tuple(op[4])]
            if op[0] == R_WRITE:
                op = [*op[:3], tuple(tuple(a) for a in op[3])]
            ops.append(tuple(op))
        return cls(ops)


def _import_type(name: str) -> type:
    module, _, qualname = name.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import the result class {name}: {e}") from e
    if not isinstance(obj, type):
        raise ValueError(f"{name} is not a class")
    return obj
