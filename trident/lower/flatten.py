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
* ``CONST``: a str, bytes, number (an int or float at a path of ``int_leaves`` is a ``LEAF``:
  Note [Int leaves] and Note [Float leaves] in frontend/policy.py), dtype, device, memory
  format, layout, ``torch.Size``, a slice of ints, or a frozen set inside an object: equal by
  value (floats by bit pattern, a slice's bounds each by exact type) and of the same exact
  type;
* ``ID``: functions, classes, modules and objects without ``__dict__``: the same object;
* ``SAME``: an object reached a second time (a tied weight, a config every layer holds): the
  same object as at its first node.

The dispatcher (``eval_tree`` in runtime/tree_eval.cpp) evaluates the tree in C on every call
before the SCM: the bound parameters come from C's own binding of ``args`` and ``kwargs`` (so a value passed
by position, by keyword or left to its default binds alike), then each node is read and checked
in order. Leaf 0 of every specialization is the tree's key (``ArgTree.key``): a specialization
only ever sees leaves of the tree it was traced with. A node that fails sends the call to Python,
which flattens it again and names the first path that differs from the installed tree.

Tracing puts the trace's fake tensors in the call's own objects (``substitute.py``). The
result's structure (``OutputRecipe``, outputs.py) is rebuilt in C from the SCM's flat outputs: tuples, lists, dicts,
namedtuples, ``torch.return_types`` struct sequences, dataclasses and transformers'
``ModelOutput`` (an ``OrderedDict`` dataclass), and objects of the call itself
(``past_key_values`` returned in the output) by reference.
"""

from __future__ import annotations

import enum
import functools
import inspect
import threading
import types
from collections import OrderedDict
from typing import Any

import torch

from trident import frames
from trident.errors import TridentError, with_article
from trident.identity import identity_words, jitted_code, stable_words
from trident.runtime import ABI
from trident.lower.orders import sorted_items
from trident.lower.partials import partial_words
from trident.lower.uses import WHOLE, Uses, attributes_read, covers, items_read, merge
from trident.ir.trees import (ARG, ATTR, CONST, DICT, ID, INDEX, ITEM, LEAF, MAX_NODES, OBJECT,
                              SAME, SELF, SEQ, TYPE, _BY_ID, _CONSTS, _SCALARS, _SLICE_BOUNDS,
                              ArgTree, Binding, Node, tree_key)

# ---- flattening ------------------------------------------------------------------------------

def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _is_module_dict(parent: Node, key: str) -> bool:
    return parent.check == OBJECT and issubclass(parent.expect, torch.nn.Module) and \
        key in ("_parameters", "_buffers", "_modules")


class _Flattener:
    what = "argument"  # what its messages call a path

    def __init__(self, int_leaves: frozenset = frozenset()):
        self.int_leaves = int_leaves  # paths of ints in objects read as leaves
        self.nodes: list[Node] = []
        self.description: list[str] = []
        self.leaf_nodes: list[int] = []
        self.values: list = []
        self.seen: dict[int, int] = {}
        # Note [Objects reached twice]: per object, the uses its node's subtree was made with,
        # and the uses an earlier attempt found it reached with beyond those
        self.seen_uses: dict[int, Uses] = {}
        self.more: dict[int, Uses] = {}

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
        jitted = jitted_code(value) is not None
        fn = getattr(value, "_fn", None) if jitted else value
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            owner = self.seen.get(id(fn.__self__))
            bound = (f"bound to the object at {self.nodes[owner].path or 'the call'}"
                     if owner is not None else f"bound to {identity_words(fn.__self__)}")
            return f"{'trident.jit of ' * jitted}{stable_words(fn.__func__)} {bound}"
        if jitted and isinstance(fn, types.FunctionType):
            return f"trident.jit of {stable_words(fn)}"
        return stable_words(value)

    def held(self, parent: int) -> str:
        """``" of a DynamicCache"``: the class of the object whose attribute the
        value at a node under ``parent`` is, or ``""``."""
        if parent < 0 or self.nodes[parent].check != OBJECT:
            return ""
        holder = self.nodes[parent]
        return f" of a {holder.expect.__qualname__}"

    def steps(self, value, parent: int, access: int, key) -> tuple:
        """Note [Unflattenable values]: ``((access, key, type), ...)``, the way from the call's
        bound parameters to ``value`` (at a new node under ``parent``) and each value's type."""
        chain = [(access, key, type(value))]
        while parent >= 0:
            node = self.nodes[parent]
            chain.append((node.access, node.key, type(self.values[parent])))
            parent = node.parent
        return tuple(reversed(chain))

    def tensor(self, value: torch.Tensor, node: Node) -> None:
        """A tensor first reached at ``node``: a leaf of the specialization."""
        self.leaf_nodes.append(self.add(value, node, "a leaf"))

    def named(self, path: str) -> str:
        """``"argument c.n"``: the value at ``path`` in a message (``""``: the ``**kwargs``
        dict, whose items' paths are their keys)."""
        return f"{self.what} {path or '**kwargs'}"

    def visit(self, value: Any, parent: int, access: int, key: Any, path: str,
              in_object: bool, uses: Uses = WHOLE) -> None:
        """Adds ``value``'s node and, of its children, those ``uses`` reaches (all where it
        is ``WHOLE``: Note [Parameter reads] in uses.py)."""
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
        if t in _SCALARS and (not in_object or (t in (int, float) and path in self.int_leaves)):
            self.leaf_nodes.append(self.add(value, node(LEAF), "a leaf"))
            return
        if t in (set, frozenset):  # of str: compared with a copy (numbers: -0.0, True ...)
            if not all(type(item) is str for item in value):
                raise TridentError(f"{self.named(path)} is {with_article(t.__name__)} of "
                                   "other values than str, which Trident cannot guard")
            self.add(value, node(CONST, set(value) if t is set else value),
                     f"{t.__name__} {sorted(value)}")
            return
        if t in _CONSTS or (t is slice and all(type(b) in _SLICE_BOUNDS for b in (
                value.start, value.stop, value.step))):
            self.add(value, node(CONST, value), f"{t.__name__} {value!r}")
            return
        if id(value) in self.seen:
            first = self.seen[id(value)]
            had = self.seen_uses.get(id(value), WHOLE)
            if not covers(had, uses):  # Note [Objects reached twice]
                self.more[id(value)] = merge(had, uses)
                raise _ReachedAgain
            self.add(value, node(SAME, first), f"the object at {self.nodes[first].path}")
            return
        if isinstance(value, functools._lru_cache_wrapper) and frames.user_file(getattr(
                getattr(getattr(value, "__wrapped__", None), "__code__", None), "co_filename",
                "")):
            # a user function whose results are cached: a hit would keep the value its code
            # returned at the trace, whatever the cache returns (its code may not run at all)
            raise TridentError(f"{self.named(path)} is {with_article(_type_name(t))} of a "
                               "user function, whose cache Trident cannot guard")
        if _bound_builtin(value):  # Note [Bound built-in methods]
            error = TridentError(f"{self.named(path)} is a built-in method bound to "
                                 f"{with_article(_type_name(type(value.__self__)))}, whose "
                                 "contents Trident cannot guard")
            error.steps = self.steps(value, parent, access, key)
            raise error
        named = partial_words(value)
        if named is not None:  # Note [Partials in arguments]: checked by what decides the code
            self.seen[id(value)] = len(self.nodes)
            self.seen_uses[id(value)] = WHOLE
            me = self.add(value, node(TYPE, t), "functools.partial")
            self.add(value.func, Node(me, GETATTR, "func", ID, value.func, 0, f"{path}.func"),
                     named)
            for name in ("args", "keywords"):
                self.visit(getattr(value, name), me, GETATTR, name, f"{path}.{name}", True)
            return
        if isinstance(value, (_BY_ID, enum.Enum)) or _opaque(value):
            self.add(value, node(ID, value), self.words(value))
            return
        if isinstance(value, (int, float, complex, str, bytes)):  # its value is not in __dict__
            raise TridentError(f"{self.named(path)} is {with_article(_type_name(t))}, a "
                               f"subclass of {next(b for b in t.__mro__ if b.__module__ == 'builtins').__name__}"
                               ", whose value Trident cannot guard")
        if ((not hasattr(value, "__dict__") or _c_state(t))
                and t not in (tuple, list, dict, OrderedDict) and not _is_namedtuple(t)) \
                or isinstance(value, threading.local) or _slotted(t):
            # a numpy array, a deque, an object with __slots__ (those beside a __dict__ too:
            # no guard reads them, and a trace's write to one would not be undone), a thread's
            # own attributes (another thread reads other ones), a Python subclass of a C type
            # that holds its own contents (a deque's, a bytearray's items): contents no check
            # can see; a stream or an event (Note [Unflattenable values])
            if isinstance(value, (torch.Stream, torch.Event)):
                error = TridentError(f"{self.named(path)} is {with_article(_type_name(t))}"
                                     f"{self.held(parent)}: work that streams order (an "
                                     "offloaded cache copies its "
                                     "layers between the GPU and host memory on a side stream "
                                     "around each layer) is not traced")
            else:
                error = TridentError(f"{self.named(path)} is "
                                     f"{with_article(_type_name(t))}, whose "
                                     "contents Trident cannot guard")
            error.steps = self.steps(value, parent, access, key)  # Note [Unflattenable values]
            raise error
        self.seen[id(value)] = len(self.nodes)
        if id(value) in self.more:
            uses = merge(uses, self.more[id(value)])
        self.seen_uses[id(value)] = uses
        if t in (tuple, list) or _is_namedtuple(t):
            me = self.add(value, node(SEQ, t, len(value)), f"{_type_name(t)} of {len(value)}")
            items = items_read(uses, range(len(value)))
            for i, item in enumerate(value):
                if items is WHOLE or i in items:
                    self.visit(item, me, INDEX, i, f"{path}[{i}]", in_object,
                               WHOLE if items is WHOLE else items[i])
            return
        if t in (dict, OrderedDict):
            for k in value:
                if type(k) not in (str, int):
                    raise TridentError(f"{self.named(path)} is a dict with "
                                       f"{with_article(type(k).__name__)} key; Trident "
                                       "flattens dicts with str and int keys")
            me = self.add(value, node(DICT, t, len(value), tuple(value)),
                          f"{t.__name__} with keys {[str(k) for k in value]}")
            module_dict = (parent >= 0 and access == ATTR
                           and _is_module_dict(self.nodes[parent], key))
            items = items_read(uses, value)
            for k in sorted(value) if sorted_items(self.nodes, me) else list(value):
                item = value[k]  # Note [Dict orders]: a candidate's in sorted key order
                if items is not WHOLE and k not in items:
                    continue
                if module_dict:
                    child = f"{path.rsplit('.', 1)[0]}{_attr(k)}" if path else str(k)
                else:  # **kwargs (path "") by their names
                    child = f"{path}[{k!r}]" if path else str(k)
                self.visit(item, me, ITEM, k, child, in_object and not module_dict,
                           WHOLE if items is WHOLE else items[k])
            return
        if isinstance(value, (dict, list, tuple, set)):
            raise TridentError(f"{self.named(path)} is {with_article(_type_name(t))}, "
                               "which Trident cannot flatten (a subclass of a built-in container)")
        entries = vars(value)
        me = self.add(value, node(OBJECT, t, len(entries), tuple(entries)),
                      f"{_type_name(t)} with {list(entries)}")
        unread = _PER_PROCESS_ATTRIBUTES.get(_type_name(t), ())
        attrs = attributes_read(value, entries, uses)
        for k, item in list(entries.items()):
            if type(k) is not str:
                raise TridentError(f"{self.named(path)} has a non-str attribute name {k!r}")
            if k in unread or (attrs is not WHOLE and k not in attrs):
                continue
            self.visit(item, me, ATTR, k, f"{path}.{k}" if path else k, True,
                       WHOLE if attrs is WHOLE else attrs[k])


# Attributes whose value differs in every process by construction and that only their
# library's own code reads, outside any model's forward: they are neither checked nor part of
# the tree's key, so that a new process finds the specializations stored by an earlier one.
# transformers' GenerationConfig keeps hash(self), a hash of its other fields under Python's
# per-process str hash seed, so that generate() can tell whether the user changed it since
# (GenerationConfig.METADATA_FIELDS); the fields it hashes are checked one by one.
_PER_PROCESS_ATTRIBUTES = {
    "transformers.generation.configuration_utils.GenerationConfig": ("_original_object_hash",),
}


GETATTR = ABI["TRT_ACC_GETATTR"]


_OPAQUE = (functools.partial, torch._ops.OpOverload, torch._ops.OpOverloadPacket)


def _opaque(value) -> bool:
    """Callables whose state lives outside their ``__dict__``: checked by identity (a
    JitFunction, a ``functools.partial`` that ``partial_words`` does not name, whose
    function, arguments and keywords are then a state read: Note [Partials in arguments]; a torch
    operator such as ``torch.ops.aten.add.Tensor``,
    whose ``__dict__`` holds the dispatcher's caches). A stream or an event is not one: the
    work it orders is not traced (Note [Unflattenable values])."""
    return isinstance(value, _OPAQUE) or jitted_code(value) is not None


# Note [Bound built-in methods]: a built-in method bound to an object (``d.get``, ``l.index``,
# ``s.upper``, ``x.__len__``) answers from that object's contents, which its ID node does not
# check, and its words (``builtin .dict.get``) are those of the same method of any other object:
# a hit returned what the trace's object held. It makes the call run eagerly. One bound to a
# module or a class (``math.sqrt``, ``torch.relu``, ``dict.fromkeys``), or to nothing, is checked
# by identity as a function is.

def _bound_builtin(value) -> bool:
    return isinstance(value, (types.BuiltinFunctionType, types.MethodWrapperType)) and \
        not isinstance(getattr(value, "__self__", None), (types.ModuleType, type, type(None)))


def _c_state(t: type) -> bool:
    """Instances of ``t`` hold more than a plain Python object's ``__dict__`` and weak
    references: a base written in C keeps contents of its own (``class Q(collections.deque)``,
    a subclass of ``bytearray``, ``array.array`` or ``Exception``), which the object's node
    does not check. Bytes beyond ``object``'s that hold only the ``__dict__`` and weak-reference
    pointers are no contents (``types.SimpleNamespace`` keeps its dict in such a slot; Python
    3.12 moved a plain class's two pointers before the object, so its size is ``object``'s)."""
    slots = 8 * ((t.__dictoffset__ > 0) + (t.__weakrefoffset__ > 0))
    return t.__basicsize__ - slots > object.__basicsize__ or t.__itemsize__ != 0


def _slotted(t: type) -> bool:
    """``t`` or a base declares ``__slots__`` that hold values (not only ``__dict__`` and
    ``__weakref__``)."""
    for c in t.__mro__:
        slots = c.__dict__.get("__slots__", ())
        if set((slots,) if isinstance(slots, str) else slots) - {"__dict__", "__weakref__"}:
            return True
    return False


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


def flatten_call(binding: Binding, args: tuple, kwargs: dict,
                 int_leaves: frozenset = frozenset()) -> tuple[ArgTree, list, list]:
    """(tree, leaves, node values) of one call; leaves[0] is the tree's key. ``int_leaves``:
    paths of ints inside objects that are leaves rather than constants (Note [Int leaves]).

    Raises:
        TypeError: the call does not bind to the function's parameters.
        TridentError: an argument that cannot be flattened (its path and type named, or the
            error its object's own code raised)."""
    bound = binding.bind(args, kwargs)
    try:
        return _flatten_bound(binding, bound, int_leaves)
    except RecursionError:
        raise TridentError("an argument is nested too deeply to guard") from None
    except TypeError as e:  # an object's own code refused (a __getattribute__ that answers
        # every name: vars() finds no __dict__): not the binding's error, which eager raises
        raise TridentError(f"an argument cannot be flattened: {e}") from None


class _ReachedAgain(Exception):
    """An object reached again with uses its first node's subtree does not cover."""


# Note [Objects reached twice]: an object the tree reaches twice has one node, the first, and a
# SAME node at the second place, which checks only that it is the same object; so the first
# node's subtree must hold all that either place reads (Note [Parameter reads]). ``def f(m, h,
# x): return F.linear(x, m.head.weight, m.head.bias) + h.m(x)`` reaches the model first through
# ``m``, pruned to ``head``'s parameters, then whole as ``h.m``: a subtree made with ``m``'s
# uses alone would leave out ``h.m(x)``'s reads (its hooks, its float attributes), and an edit
# of them would go unseen. Where the second place reads more, the flattening starts again with
# that object's uses merged (each start adds uses, so it ends; in practice once or twice).

def _flatten_bound(binding: Binding, bound: list,
                   int_leaves: frozenset = frozenset()) -> tuple[ArgTree, list, list]:
    more: dict[int, Uses] = {}
    while True:
        f = _Flattener(int_leaves)
        f.more = more
        try:
            return _flatten_once(f, binding, bound)
        except _ReachedAgain:
            more = f.more


def _flatten_once(f: _Flattener, binding: Binding,
                  bound: list) -> tuple[ArgTree, list, list]:
    uses = list(binding.uses) or [WHOLE] * (binding.has_self + len(binding.params))
    if binding.has_self:
        f.visit(binding.self_obj, -1, SELF, None, "self", False, uses.pop(0))
    for index, ((name, kind, _), value) in enumerate(zip(binding.params, bound)):
        f.visit(value, -1, ARG, index,
                "" if kind == inspect.Parameter.VAR_KEYWORD else name, False, uses[index])
    key = tree_key(f.description)
    tree = ArgTree(f.nodes, f.leaf_nodes, key, f.description)
    return tree, [key] + [f.values[i] for i in f.leaf_nodes], f.values


# Note [Unflattenable values]: a value that no argument tree can hold, decided by its type
# alone (a ``torch.Stream``: an offloaded cache's ``prefetch_stream``), makes every call that
# reaches it run eagerly. Flattening the call up to it (a model's modules and parameters come
# first) costs about what the eager call does, at every call: so its error carries the way to
# it from the bound parameters and the type of every value on that way (``steps``), and the
# JitFunction tests a later call on that way alone (:func:`reaches`) before it flattens
# anything. A call whose values there have other types (another cache) is flattened as ever.


def reaches(binding: Binding, args: tuple, kwargs: dict, steps: tuple) -> bool:
    """Note [Unflattenable values]: the values of the call at ``steps`` have the types they
    had where flattening failed."""
    try:
        bound = binding.bind(args, kwargs)
    except TypeError:
        return False
    value = None
    for access, key, t in steps:
        if access == SELF:
            value = binding.self_obj
        elif access == ARG:
            value = bound[key]
        elif access == ATTR:
            value = getattr(value, "__dict__", {}).get(key, _MISSING)
        else:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                return False
        if type(value) is not t:
            return False
    return True


_MISSING = object()
