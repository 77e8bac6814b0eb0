"""Argument trees: a call's Python arguments as flat leaves, and the checks that keep them valid.

Note [Argument trees]: the launch sequence of a specialization reads flat leaves (tensors and
Python scalars, ``trt_arg`` in runtime/trident_rt.h). A call passes anything: keyword arguments,
defaults, tuples, dicts, an ``nn.Module`` and its parameters, a transformers ``StaticCache``.
``flatten_call`` walks the bound arguments once, at a miss, into an :class:`ArgTree`: one
:class:`Node` per value reached, each saying where its value is read (a bound parameter, a dict
item, a sequence index, an instance attribute) and what must hold of it:

* ``LEAF``: a tensor, int, float, bool or None in a parameter or a container: a leaf of the
  specialization, guarded by the SCM like any argument (guards.py);
* ``SEQ`` / ``DICT``: an exact ``tuple``/``list``/``dict`` type and length (a namedtuple by its
  exact class); its children are its items;
* ``OBJECT``: any other object with a ``__dict__`` (an ``nn.Module``, a config, a cache): its exact
  class and the number of entries of its ``__dict__``; its children are those entries, so a
  module's parameters are leaves read through ``_parameters`` on every call (a replaced or
  reloaded parameter is seen), and its plain attributes are constants;
* ``CONST``: a str, bytes, number, dtype, device, memory format, layout, ``torch.Size``, a
  slice of ints, or a frozen set inside an object: equal by value (floats by bit pattern, a
  slice's bounds each by exact type) and of the same exact type;
* ``ID``: functions, classes, modules and objects without ``__dict__``: the same object;
* ``SAME``: an object reached a second time (a tied weight, a config every layer holds): the
  same object as at its first node.

The dispatcher (runtime.cpp, ``eval_tree``) evaluates the tree in C on every call before the
SCM: the bound parameters come from C's own binding of ``args`` and ``kwargs`` (so a value passed
by position, by keyword or left to its default binds alike), then each node is read and checked
in order. Leaf 0 of every specialization is the tree's key (``ArgTree.key``): a specialization
only ever sees leaves of the tree it was traced with. A node that fails sends the call to Python,
which flattens it again and names the first path that differs from the installed tree.

While tracing (:func:`substituted`), the leaves of the real objects are replaced by the trace's
fake tensors in place and restored afterwards; a function that assigns to the Python state the
tree covers (a lazily initialized cache that stores new tensors in ``self.keys``) is reported,
its assignments are undone, and the call runs eagerly. The result's structure
(:class:`OutputRecipe`) is rebuilt in C from the SCM's flat outputs: tuples, lists, dicts,
namedtuples, ``torch.return_types`` struct sequences, dataclasses and transformers'
``ModelOutput`` (an ``OrderedDict`` dataclass), and objects of the call itself
(``past_key_values`` returned in the output) by reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import inspect
import types
import weakref
from collections import OrderedDict
from typing import Any, Callable

import torch

from .errors import TridentError
from .runtime import ABI

# Node.access and Node.check, as the runtime reads them (trident_trees.h: TRT_ACC_*, TRT_CHK_*);
# state trees (Note [State guards] in state.py) add accesses and TYPE, ABSENT and TENSOR checks.
ARG, ITEM, INDEX, ATTR, SELF = (ABI[f"TRT_ACC_{k}"] for k in (
    "ARG", "ITEM", "INDEX", "ATTR", "SELF"))
LEAF, SEQ, DICT, OBJECT, CONST, ID, SAME, TYPE, ABSENT, TENSOR = (ABI[f"TRT_CHK_{k}"] for k in (
    "LEAF", "SEQ", "DICT", "OBJECT", "CONST", "ID", "SAME", "TYPE", "ABSENT", "TENSOR"))
MAX_NODES = 200_000  # a bigger argument (a huge object graph) runs eagerly

_SCALARS = (bool, int, float, type(None))
_CONSTS = (str, bytes, int, float, bool, complex, type(None), torch.dtype, torch.device,
           torch.Size, range, torch.memory_format, torch.layout)
# A slice is a CONST when its bounds are of these types, compared by exact type and value
# (runtime.cpp's const_equal: ``x[1.0:]`` raises where ``x[1:]`` does not, though 1.0 == 1).
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
        """The tree as runtime.cpp's ``_set_trees`` reads it."""
        return (self.key, tuple((n.parent, n.access, n.key, n.check, n.expect, n.length,
                                 n.keys) for n in self.nodes))

    def first_difference(self, other: "ArgTree") -> str:
        """Where ``other`` (a call's tree) departs from this (an installed one), in words."""
        for i, (mine, theirs, n) in enumerate(zip(self.description, other.description,
                                                   other.nodes)):
            if mine == theirs:
                continue
            where = n.path or "keyword arguments"
            old, new = self.nodes[i].keys, n.keys
            if old is not None and new is not None and old != new:  # name the keys only
                added = [k for k in new if k not in old]
                removed = [k for k in old if k not in new]
                if added or removed:
                    return (f"{where}: " + ", ".join(
                        [f"{k!r} added" for k in added] + [f"{k!r} removed" for k in removed]))
                return f"{where}: keys in another order"
            return f"{where}: {_words(theirs)} where {_words(mine)} was compiled"
        if len(self.nodes) != len(other.nodes):
            longer = self if len(self.nodes) > len(other.nodes) else other
            n = longer.nodes[min(len(self.nodes), len(other.nodes))]
            return f"{n.path} {'missing' if longer is self else 'added'}"
        return "same structure"


def _words(description: str) -> str:
    return description.split("|", 3)[-1]


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
        """The parameters as runtime.cpp's ``_set_binding`` reads them: (name, kind, has a
        default, default)."""
        return tuple((name, kind, default is not inspect.Parameter.empty,
                      None if default is inspect.Parameter.empty else default)
                     for name, kind, default in self.params)


# ---- flattening ------------------------------------------------------------------------------

# An identity-checked function's words, fixed at its first sight in this process: the native
# check is by identity, and its Python twin must agree with it. Recomputed at each miss, a
# function whose globals change between calls (a wrapper that counts its calls) would give an
# unchanged call a new tree, and a recompile, on every slow-path call.
_FUNCTION_WORDS: "weakref.WeakKeyDictionary[types.FunctionType, str]" = weakref.WeakKeyDictionary()


def _stable(obj: Any) -> str:
    """Words for an object checked by identity, the same in every process where they can be."""
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        from .cache import function_key

        fn = obj.__func__ if isinstance(obj, types.MethodType) else obj
        words = _FUNCTION_WORDS.get(fn)
        if words is None:
            words = f"function {fn.__module__}.{fn.__qualname__} {function_key(fn)}"
            _FUNCTION_WORDS[fn] = words
        return words
    return identity_words(obj)


def identity_words(obj: Any) -> str:
    """Words for a class, a module, a builtin, an enum member (the same in every process) or
    any other object checked by identity (this process only)."""
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, types.BuiltinFunctionType):
        return f"builtin {getattr(obj, '__module__', '')}.{obj.__qualname__}"
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch operator {obj}"  # one object per operator, in every process
    if isinstance(obj, enum.Enum):  # one object per member of its class, in every process
        return f"enum {type(obj).__module__}.{type(obj).__qualname__}.{obj.name}"
    from .cache import _PROCESS

    return f"object {type(obj).__qualname__}@{id(obj)}:{_PROCESS}"  # this process only


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _is_module_dict(parent: Node, key: str) -> bool:
    return parent.check == OBJECT and issubclass(parent.expect, torch.nn.Module) and \
        key in ("_parameters", "_buffers", "_modules")


class _Flattener:
    what = "argument"  # what its messages call a path

    def __init__(self):
        self.nodes: list[Node] = []
        self.description: list[str] = []
        self.leaf_nodes: list[int] = []
        self.values: list = []
        self.seen: dict[int, int] = {}

    def add(self, value, node: Node, words: str) -> int:
        if len(self.nodes) >= MAX_NODES:
            raise TridentError(f"{self.what} {node.path} is too large to guard (more than "
                               f"{MAX_NODES} values reachable)")
        index = len(self.nodes)
        self.nodes.append(node)
        self.values.append(value)
        self.description.append(f"{node.parent}|{node.access}|{node.key!r}|{words}")
        return index

    def words(self, value) -> str:
        """Words for an object checked by identity (the tree's description). A bound method,
        or a ``trident.jit`` of one (``model.forward = trident.jit(model.forward)`` puts it in
        the model's ``__dict__``), is its function's words and the object it is bound to: the
        path of that object where the tree reached it already (the same in every process),
        else that object's identity (this process only)."""
        jitted = isinstance(value, _opaque_types()[1])
        fn = getattr(value, "_fn", None) if jitted else value
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            owner = self.seen.get(id(fn.__self__))
            bound = (f"bound to the object at {self.nodes[owner].path or 'the call'}"
                     if owner is not None else f"bound to {identity_words(fn.__self__)}")
            return f"{'trident.jit of ' * jitted}{_stable(fn.__func__)} {bound}"
        if jitted and isinstance(fn, types.FunctionType):
            return f"trident.jit of {_stable(fn)}"
        return _stable(value)

    def tensor(self, value: torch.Tensor, node: Node) -> None:
        """A tensor first reached at ``node``: a leaf of the specialization."""
        self.leaf_nodes.append(self.add(value, node, "a leaf"))

    def visit(self, value: Any, parent: int, access: int, key: Any, path: str,
              in_object: bool) -> None:
        t = type(value)
        def node(check: int, expect: Any = None, length: int = 0, keys=None) -> Node:
            return Node(parent, access, key, check, expect, length, path, keys)

        if t in (torch.Tensor, torch.nn.Parameter) or isinstance(value, torch.Tensor):
            if id(value) in self.seen:
                self.add(value, node(SAME, self.seen[id(value)]),
                         f"the tensor at {self.nodes[self.seen[id(value)]].path}")
                return
            self.seen[id(value)] = len(self.nodes)
            self.tensor(value, node(LEAF))
            return
        if t in _SCALARS and not in_object:
            self.leaf_nodes.append(self.add(value, node(LEAF), "a leaf"))
            return
        if t in (set, frozenset):  # of str: compared with a copy (numbers: -0.0, True ...)
            if not all(type(item) is str for item in value):
                raise TridentError(f"{self.what} {path} is a {t.__name__} of other values than "
                                   "str, which Trident cannot guard")
            self.add(value, node(CONST, set(value) if t is set else value),
                     f"{t.__name__} {sorted(value)}")
            return
        if t in _CONSTS or (t is slice and all(type(b) in _SLICE_BOUNDS for b in (
                value.start, value.stop, value.step))):
            self.add(value, node(CONST, value), f"{t.__name__} {value!r}")
            return
        if id(value) in self.seen:
            first = self.seen[id(value)]
            self.add(value, node(SAME, first), f"the object at {self.nodes[first].path}")
            return
        if isinstance(value, (_BY_ID, enum.Enum)) or _opaque(value):
            self.add(value, node(ID, value), self.words(value))
            return
        if isinstance(value, (int, float, complex, str, bytes)):  # its value is not in __dict__
            raise TridentError(f"{self.what} {path} is a {_type_name(t)}, a subclass of "
                               f"{next(b for b in t.__mro__ if b.__module__ == 'builtins').__name__}"
                               ", whose value Trident cannot guard")
        if not hasattr(value, "__dict__") and t not in (tuple, list, dict, OrderedDict) \
                and not _is_namedtuple(t):
            # a numpy array, a deque, an object with __slots__: contents no check can see
            raise TridentError(f"{self.what} {path} is a {_type_name(t)}, whose contents Trident "
                               "cannot guard")
        self.seen[id(value)] = len(self.nodes)
        if t in (tuple, list) or _is_namedtuple(t):
            me = self.add(value, node(SEQ, t, len(value)), f"{_type_name(t)} of {len(value)}")
            for i, item in enumerate(value):
                self.visit(item, me, INDEX, i, f"{path}[{i}]", in_object)
            return
        if t in (dict, OrderedDict):
            for k in value:
                if type(k) not in (str, int):
                    raise TridentError(f"{self.what} {path} is a dict with a {type(k).__name__} "
                                       "key; Trident flattens dicts with str and int keys")
            me = self.add(value, node(DICT, t, len(value), tuple(value)),
                          f"{t.__name__} with keys {[str(k) for k in value]}")
            module_dict = (parent >= 0 and access == ATTR
                           and _is_module_dict(self.nodes[parent], key))
            for k, item in value.items():
                if module_dict:
                    child = f"{path.rsplit('.', 1)[0]}{_attr(k)}" if path else str(k)
                else:  # **kwargs (path "") by their names
                    child = f"{path}[{k!r}]" if path else str(k)
                self.visit(item, me, ITEM, k, child, in_object and not module_dict)
            return
        if isinstance(value, (dict, list, tuple, set)):
            raise TridentError(f"{self.what} {path} is a {_type_name(t)}, which Trident cannot "
                               "flatten (a subclass of a built-in container)")
        entries = vars(value)
        me = self.add(value, node(OBJECT, t, len(entries), tuple(entries)),
                      f"{_type_name(t)} with {list(entries)}")
        unread = _PER_PROCESS_ATTRIBUTES.get(_type_name(t), ())
        for k, item in list(entries.items()):
            if type(k) is not str:
                raise TridentError(f"{self.what} {path} has a non-str attribute name {k!r}")
            if k in unread:
                continue
            self.visit(item, me, ATTR, k, f"{path}.{k}" if path else k, True)


# Attributes whose value differs in every process by construction and that only their
# library's own code reads, outside any model's forward: they are neither checked nor part of
# the tree's key, so that a new process finds the specializations stored by an earlier one.
# transformers' GenerationConfig keeps hash(self), a hash of its other fields under Python's
# per-process str hash seed, so that generate() can tell whether the user changed it since
# (GenerationConfig.METADATA_FIELDS); the fields it hashes are checked one by one.
_PER_PROCESS_ATTRIBUTES = {
    "transformers.generation.configuration_utils.GenerationConfig": ("_original_object_hash",),
}


@functools.cache
def _opaque_types() -> tuple:
    from .jit import jit_function_class

    return (functools.partial, jit_function_class(), torch._ops.OpOverload,
            torch._ops.OpOverloadPacket)


def _opaque(value) -> bool:
    """Callables whose state lives outside their ``__dict__``: checked by identity (a
    JitFunction, a ``functools.partial``, a torch operator such as ``torch.ops.aten.add.Tensor``,
    whose ``__dict__`` holds the dispatcher's caches)."""
    return isinstance(value, _opaque_types())


def _attr(k) -> str:
    return f".{k}" if isinstance(k, str) and k.isidentifier() else f"[{k}]"


def _is_namedtuple(t: type) -> bool:
    return issubclass(t, tuple) and hasattr(t, "_fields") and t is not tuple


def _is_structseq(t: type) -> bool:
    """A C tuple type made by calling it on its items: ``torch.Size``, a struct sequence whose
    fields are all items (``torch.return_types.sort``; ``os.stat_result`` is not: it has fields
    beyond its items)."""
    return t is torch.Size or (issubclass(t, tuple) and isinstance(getattr(t, "n_fields", None),
                                                                   int)
                               and t.n_fields == t.n_sequence_fields and t.n_unnamed_fields == 0)


def flatten_call(binding: Binding, args: tuple, kwargs: dict) -> tuple[ArgTree, list, list]:
    """(tree, leaves, node values) of one call; leaves[0] is the tree's key.

    Raises:
        TypeError: the call does not bind to the function's parameters.
        TridentError: an argument that cannot be flattened (its path and type named)."""
    bound = binding.bind(args, kwargs)
    try:
        return _flatten_bound(binding, bound)
    except RecursionError:
        raise TridentError("an argument is nested too deeply to guard") from None


def _flatten_bound(binding: Binding, bound: list) -> tuple[ArgTree, list, list]:
    f = _Flattener()
    if binding.has_self:
        f.visit(binding.self_obj, -1, SELF, None, "self", False)
    for index, ((name, kind, _), value) in enumerate(zip(binding.params, bound)):
        f.visit(value, -1, ARG, index,
                "" if kind == inspect.Parameter.VAR_KEYWORD else name, False)
    digest = hashlib.sha256("\n".join(f.description).encode()).digest()
    key = int.from_bytes(digest[:8], "little") >> 2  # a positive int64
    tree = ArgTree(f.nodes, f.leaf_nodes, key, f.description)
    return tree, [key] + [f.values[i] for i in f.leaf_nodes], f.values


# ---- tracing with fake leaves ----------------------------------------------------------------

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


_MISSING = object()


def _restore(node: Node, value, saved) -> None:
    """Put ``saved`` back into ``value`` (keys the function added are deleted)."""
    if isinstance(saved, list):
        value[:] = saved
        return
    target = _entries(node, value)
    for k in [k for k in target if k not in saved]:
        del target[k]
    for k, v in saved.items():
        if k not in target or target[k] is not v:
            target[k] = v


@contextlib.contextmanager
def substituted(tree: ArgTree, values: list, leaves: tuple, rebuilt: dict | None = None):
    """Put ``leaves`` (the trace's fake tensors; ``leaves[0]`` is the key) in place of the
    call's real leaves, inside the call's own objects, and yield the bound values to call
    the function with; restore every object the tree covers afterwards. ``rebuilt`` receives
    {id of a tuple made around fake leaves: its node}, so that a result that returns it is
    known as the call's own.

    Raises (after restoring):
        TridentError: the function assigned to Python state that the tree covers (an
            attribute, a list or dict item), which a specialization could not replay.
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
        if n.check == SEQ and n.expect is not list:
            kids = [new[j] for j in children.get(i, ())]
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
    changed: list[str] = []
    owners: list[object] = []
    try:
        yield roots
    finally:
        for i in mutable:
            now = _snapshot(nodes[i], values[i])
            if not _same(now, expected[i]):
                changed.append(_changed_entry(nodes[i].path, now, expected[i]))
                owners.append(values[i])
            _restore(nodes[i], values[i], saved[i])
        for i in sets:
            if values[i] != nodes[i].expect:
                changed.append(nodes[i].path)
                owners.append(values[i])
                values[i].clear()
                values[i].update(nodes[i].expect)
    if changed:
        hint = ""
        owner = type(owners[0])
        if owner.__module__.startswith("transformers.") and "Dynamic" in owner.__name__:
            # transformers' DynamicCache assigns each grown key/value tensor to its layer
            hint = ("; Hugging Face's StaticCache writes its tensors in place instead: "
                    "generate(..., cache_implementation=\"static\") (docs/huggingface.md)")
        raise TridentError(f"the function assigns to {changed[0]} (Python state of its "
                           f"arguments, which a specialization cannot replay){hint}")


# ---- outputs ---------------------------------------------------------------------------------

# OutputRecipe ops, as the runtime's build_recipe reads them (trident_trees.h: TRT_R_*)
(R_VALUE, R_CONST, R_INPUT, R_TUPLE, R_LIST, R_DICT, R_NAMEDTUPLE, R_OBJECT, R_AGAIN,
 R_BUILT, R_STRUCTSEQ) = (ABI[f"TRT_R_{k}"] for k in (
    "VALUE", "CONST", "INPUT", "TUPLE", "LIST", "DICT", "NAMEDTUPLE", "OBJECT", "AGAIN", "BUILT",
    "STRUCTSEQ"))
# R_OBJECT's base: how the object is made without running its Python __init__ (TRT_BASE_*)
BASE_OBJECT, BASE_DICT, BASE_ODICT = (ABI[f"TRT_BASE_{k}"] for k in (
    "OBJECT", "DICT", "ODICT"))


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
    ``__init__``."""

    ops: list

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
            ops.append(tuple(op))
        return cls(ops)


def _import_type(name: str) -> type:
    import importlib

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


def _rebuildable(t: type) -> bool:
    """Instances of ``t`` hold all their state in ``__dict__`` (and, for ``dict`` and
    ``OrderedDict`` subclasses, their items), so the runtime can make one with the base type's
    ``tp_new`` and fill it in: dataclasses, ``ModelOutput``, a ``DynamicCache`` made by the
    function. Classes with ``__slots__`` or another built-in base are not."""
    if isinstance(t, type) and issubclass(t, torch.nn.Module):
        return False
    for c in t.__mro__[:-1]:
        if c in (dict, OrderedDict):
            continue
        if not (c.__flags__ & (1 << 9)):  # Py_TPFLAGS_HEAPTYPE: a built-in base
            return False
        if set(c.__dict__.get("__slots__", ())) - {"__dict__", "__weakref__"} or \
                "__new__" in c.__dict__:
            return False
    return "__dict__" in dir(t)


def flatten_output(result: Any, tree: ArgTree | None, values: list | None,
                   rebuilt: dict | None = None):
    """(flat outputs, recipe or None): ``recipe`` is None when the result is tensors, scalars
    and None in tuples and lists, which the SCM's output spec builds itself.

    Raises:
        TridentError: a result Trident cannot rebuild (its path and type named)."""
    objects = {id(v): i for i, v in enumerate(values or ())
               if tree and tree.nodes[i].check in (OBJECT, DICT, SEQ, ID)}
    objects.update(rebuilt or {})
    made: dict[int, int] = {}  # id of a container or object of the result -> its op
    making: set[int] = set()
    flat: list = []
    ops: list = []
    simple = [True]
    flat_index: dict[int, int] = {}  # id of a tensor -> its flat output

    def walk(v, path: str) -> None:
        t = type(v)
        if isinstance(v, torch.Tensor) and id(v) in flat_index:
            simple[0] = False
            ops.append((R_AGAIN, flat_index[id(v)]))
        elif isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)) \
                or t in _SCALARS:  # (a Sym scalar: an op's result while traced, .item())
            if isinstance(v, torch.Tensor):
                flat_index[id(v)] = len(flat)
            flat.append(v)
            ops.append((R_VALUE,))
        elif id(v) in objects:
            simple[0] = False
            ops.append((R_INPUT, objects[id(v)]))
        elif id(v) in made:  # the same container or object twice: one object, as in eager
            simple[0] = False
            ops.append((R_BUILT, made[id(v)]))
        elif id(v) in making:
            raise TridentError(f"the result {path} contains itself")
        else:
            making.add(id(v))
            op = len(ops)
            walk_new(v, path)
            making.discard(id(v))
            if type(v) not in _SCALARS and not isinstance(v, (str, torch.dtype, torch.device)):
                made[id(v)] = op

    def walk_new(v, path: str) -> None:
        t = type(v)
        if t in (tuple, list):
            ops.append((R_TUPLE if t is tuple else R_LIST, len(v)))
            for i, item in enumerate(v):
                walk(item, f"{path}[{i}]")
        elif _is_namedtuple(t) or _is_structseq(t):
            simple[0] = False
            ops.append((R_NAMEDTUPLE if _is_namedtuple(t) else R_STRUCTSEQ, t, len(v)))
            for i, item in enumerate(v):
                walk(item, f"{path}[{i}]")
        elif t is dict and all(type(k) is str for k in v):
            simple[0] = False
            ops.append((R_DICT, tuple(v)))
            for k, item in v.items():
                walk(item, f"{path}[{k!r}]")
        elif t in (str, torch.dtype, torch.device):
            simple[0] = False
            ops.append((R_CONST, v))
        elif _rebuildable(t) and all(type(k) is str for k in (v if isinstance(v, dict) else ())):
            simple[0] = False
            base = BASE_ODICT if isinstance(v, OrderedDict) else \
                BASE_DICT if isinstance(v, dict) else BASE_OBJECT
            if isinstance(v, (list, tuple, set)):
                raise TridentError(f"the result {path} is a {_type_name(t)}, which Trident "
                                   "cannot rebuild")
            attrs = tuple(vars(v))
            items = tuple(v) if base != BASE_OBJECT else ()
            ops.append((R_OBJECT, t, base, attrs, items))
            for k in attrs:
                walk(vars(v)[k], f"{path}.{k}")
            for k in items:
                walk(v[k], f"{path}[{k!r}]")
        else:
            raise TridentError(f"the result {path} is a {_type_name(t)}, which Trident cannot "
                               "rebuild (expected tensors, scalars, None, str, tuples, lists, "
                               "dicts, namedtuples, torch.return_types, torch.Size, "
                               "dataclasses, or an object of the call)")

    walk(result, "result")
    return flat, (None if simple[0] else OutputRecipe(ops))
