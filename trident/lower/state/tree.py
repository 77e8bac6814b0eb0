"""The state tree (Note [State guards]): the nodes that a set of reads makes as they evaluate
now, the words its digest hashes, and the program the dispatcher checks."""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import hashlib
import os
import sys
import threading
import types

import torch

from trident import frames
from trident.errors import TridentError, transient
from trident.identity import PROCESS
from trident.serials import object_serial
from trident.ir.trees import ABSENT, ID, MAX_NODES, OBJECT, TENSOR, TYPE, Node
from trident.lower.flatten import _Flattener
from trident.lower.trace_writes import decimal_refusal, reads_decimal
from trident.lower.state.wholes import held_class_reads, members, whole_member
from trident.lower.state.words import _tensor_words, _words
from trident.lower.state.library_steps import (CELL, GETATTR, GETITEM, ROOT, _by_id,
                                               _library_step, _path_text)
from trident.lower.state.chain import (_MISSING, _READ_INTO, _STOP, Read, _descriptor_owner,
                                       _resolve_root, _root_of, _step)



@dataclasses.dataclass
class StateTree:
    """The nodes of a set of reads (Note [State guards]), with each node's path and words."""

    nodes: list[Node]
    description: list[str]

    def program(self) -> tuple | None:
        """As the Dispatcher's ``_set_state`` reads it (runtime/dispatcher.cpp) (None: nothing to check)."""
        if not self.nodes:
            return None
        return (0, tuple((n.parent, n.access, n.key, n.check, n.expect, n.length, n.keys)
                         for n in self.nodes))

    def process_only(self) -> str | None:
        """The path of the first node whose words name this process (an object no path from
        a module reaches, checked by identity: Note [Reached roots] in roots.py), or None. A
        digest with such words matches in no other process."""
        for node, words in zip(self.nodes, self.description):
            if PROCESS in words:
                if node.parent < 0:  # a root: its path text is its token
                    return f"a {type(node.expect).__name__} that no module's path reaches"
                return node.path
        return None

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.description).encode()).hexdigest()[:32]


class _StateFlattener(_Flattener):
    what = "global"

    def __init__(self, fn=None):
        super().__init__()
        self.fn = fn  # the jitted function (its roots)
        self.whole: set = set()  # ids of the classes and modules used whole (Note [Modules
        # used whole] in wholes.py)

    def add(self, value, node: Node, words: str) -> int:
        index = super().add(value, node, words)
        if node.access == ROOT:  # its key is the object: named by the words alone
            self.description[index] = f"root|{words}"
        return index

    def words(self, value) -> str:
        return _words(value)

    def tensor(self, value, node: Node) -> None:
        """Note [Global tensor values]: a global tensor read as Python values (``.item()``,
        ``.tolist()``) is checked by its identity, its version counter, and its contents
        against a copy: a write through ``.data`` (``t.data.fill_(5)``, ``t.data = u``) goes
        to another version counter or none, so only the contents show it. The check compares
        bytes in place, which a CPU tensor of plain dense layout allows; any other runs the
        call eagerly."""
        if value.is_inference():  # (torch.inference_mode): written there without a trace
            raise TridentError(f"the global {node.path} is an inference tensor, which has no "
                               "version counter to guard its values by; pass it as an argument")
        if value.device.type != "cpu" or value.layout != torch.strided or \
                not value.is_contiguous() or value.is_conj() or value.is_neg():
            raise TridentError(f"the global {node.path} is a {value.device.type} tensor "
                               f"{'' if value.device.type != 'cpu' else 'not of dense layout '}"
                               "read as Python values, whose contents no check reads on the hit "
                               "path (a write through .data moves no version counter); pass "
                               "it as an argument")
        self.add(value, dataclasses.replace(node, check=TENSOR, expect=value,
                                            length=value._version,
                                            keys=value.detach().clone()),
                 _tensor_words(value))


def build(reads: list[Read], fn) -> StateTree:
    """The state tree of ``reads`` as they evaluate now (Note [State guards]).

    Raises:
        TridentError: a value read that no check can see the contents of (a numpy array, an
            object with ``__slots__``), or more than ``MAX_NODES`` values."""
    f = _StateFlattener(fn)
    trie: dict = {}  # (root, steps prefix) -> node index
    for read in sorted(reads, key=lambda r: (repr(r.root), repr(r.steps))):
        _add_read(f, trie, read, fn)
    held: set = set()  # Note [Classes of held objects] in wholes.py: of the values used whole
    while more := [r for r in held_class_reads(f.nodes, f.values, False) if r not in held]:
        held.update(more)
        for read in more:
            _add_read(f, trie, read, fn)
    if len(f.nodes) > MAX_NODES:
        raise TridentError("the function reads too much state to guard")
    return StateTree(f.nodes, f.description)


def _root_words(root: tuple, fn) -> str:
    """A root in the state tree's description, which its digest hashes. An object of this
    process (``("object", token)``: a globals dict of a module that ``sys.modules`` does not
    hold, an object no module path reaches) is named with the process and the jitted
    function's identity: another import of the same source (same function key, its own
    globals) must not accept the specializations whose state was read from this one's."""
    if root[0] != "object":
        return "|".join(map(str, root))
    return f"object {root[1]}:{PROCESS}:fn#{object_serial(fn)}"  # (Note [Identity serials])


def _add_read(f: _StateFlattener, trie: dict, read: Read, fn) -> None:
    obj = _resolve_root(read.root, fn)
    if obj is _MISSING:
        raise transient(TridentError(f"the state root {read.root} is gone"))
    key = (read.root,)
    if key not in trie:
        if read.root[0] in ("fn", "builtins"):
            text = getattr(fn, "__qualname__", "fn") if read.root[0] == "fn" else "builtins"
        else:
            text = "" if read.root[1] == getattr(fn, "__module__", None) else read.root[1]
        trie[key] = f.add(obj, Node(-1, ROOT, obj, ID, obj, 0, text), _root_words(read.root, fn))
    if not read.steps and read.whole and isinstance(obj, type):  # a class that no module
        _members(f, trie, key + ("whole",), obj, trie[key], obj.__qualname__)  # names, whole
    parent, parent_obj = trie[key], obj
    came = None  # how the parent was read: (its parent, access, key, trie key)
    library = False  # reading a library's module state (Note [Library state])
    from_library = False  # reading into a library's object (Note [Library objects read into])
    for n, step in enumerate(read.steps):
        last = n == len(read.steps) - 1
        value = _step(parent_obj, step)
        if reads_decimal(value, read.root, fn):  # Note [The decimal context]
            raise decimal_refusal(_path_text(f.nodes[parent].path, step))
        if parent_obj is sys.modules and step[0] == "item" and \
                isinstance(value, types.ModuleType):  # an import: the module held there now,
            key = key + (step,)  # read on as any module (a user module's state is chains)
            if key not in trie:
                trie[key] = f.add(value, Node(parent, GETITEM, step[1], ID, value, 0,
                                              _path_text(f.nodes[parent].path, step)),
                                  _words(value))
            parent, parent_obj, library, came = trie[key], value, False, None
            continue
        if not library and isinstance(parent_obj, types.ModuleType) and \
                frames.library_module(parent_obj) and value is not os.environ:
            library = True
        if library:
            went = _library_step(f, trie, key, parent, parent_obj, step, value, last,
                                 read.steps[n + 1:n + 2] == (("attr", "__class__"),))
            if went is _READ_INTO:  # Note [Library objects read into]: as a user's object
                library, from_library = False, True
            elif went:
                key = key + (step,)
                parent, parent_obj = trie[key], value
                continue
            else:
                return
        if value is _STOP and isinstance(parent_obj, types.ModuleType) and \
                type(parent_obj) is types.ModuleType and step[0] == "attr":
            # a module's __getattr__ (PEP 562) serves it: it runs in the trace (its reads are
            # chains) while the name stays unbound in the module
            kid = key + (step,)
            if kid not in trie:
                trie[kid] = f.add(None, Node(parent, GETATTR, step[1], ABSENT, None, 0,
                                             _path_text(f.nodes[parent].path, step)),
                                  "absent, served by the module's __getattr__")  # not "absent":
            return  # a specialization traced without one must not be taken with one
        if value is _STOP and from_library:
            raise TridentError(f"the function reads {_path_text(f.nodes[parent].path, step)}, "
                               "which the library serves through Python code that no guard "
                               "follows")
        if value is _STOP:  # Python code serves it (a property, a tensor's __getitem__): the
            if came is not None:  # object it is read from, whole
                grand, access, k, pkey = came
                _use(f, trie, pkey, parent_obj, grand, access, k, f.nodes[parent].path)
            owner = _descriptor_owner(parent_obj, step) if step[0] == "attr" else None
            if owner is not None:  # a descriptor's own state, which its __get__ reads
                root, steps = _root_of(owner)  # through its self: the object, whole
                _add_read(f, trie, Read(root, steps + (("attr", "__dict__"), ("item", step[1])),
                                        True), fn)
            return
        if step[0] == "cell":
            access, k = CELL, None
        elif step[0] == "attr":
            access, k = GETATTR, step[1]
        else:
            access, k = GETITEM, step[1]
            if parent_obj is os.environ:  # its items, as bytes: os.environ._data
                env = os.environ._data
                kid = key + (("attr", "_data"),)
                if kid not in trie:
                    trie[kid] = f.add(env, Node(parent, GETATTR, "_data", TYPE, dict, 0,
                                                f.nodes[parent].path), "type dict")
                parent, parent_obj, key = trie[kid], env, kid
                k = os.environ.encodekey(step[1])
        key = key + (step,)
        path = _path_text(f.nodes[parent].path, step)
        if value is _MISSING:
            if key not in trie:
                trie[key] = f.add(None, Node(parent, access, k, ABSENT, None, 0, path), "absent")
            return
        if last and read.whole:
            _use(f, trie, key, value, parent, access, k, path, (parent_obj, f.nodes[parent].path))
            return
        if isinstance(value, threading.local):  # each thread reads its own attributes
            raise TridentError(f"the function reads {path}, a threading.local, whose "
                               "contents Trident cannot guard")
        if key not in trie:
            trie[key] = f.add(value, _through(value, parent, access, k, path),
                              _through_words(value))
        came = (parent, access, k, key)
        parent, parent_obj = trie[key], value


def _through(value, parent: int, access: int, key, path: str) -> Node:
    """A node a chain reads through: the object itself (modules, classes, functions, cells),
    or its exact type (containers and other objects, read again on every call)."""
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.CellType)) or \
            _by_id(value):
        return Node(parent, access, key, ID, value, 0, path)
    return Node(parent, access, key, TYPE, type(value), 0, path)


def _through_words(value) -> str:
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.CellType)) or \
            _by_id(value):
        return "cell" if isinstance(value, types.CellType) else _words(value)
    return f"type {type(value).__module__}.{type(value).__qualname__}"


def _use(f: _StateFlattener, trie: dict, key: tuple, value, parent: int, access, k,
         path: str, owner: tuple = (None, "")) -> None:
    """``value`` used whole: its contents guarded, as an argument tree guards an argument.
    ``owner``: the object ``value`` was read from, and its path (a method's ``__self__`` that
    is its owner is named by the owner's path: ``S``, not ``S.item.__self__``)."""
    whole = key + ("whole",)
    if whole in trie:
        return
    if isinstance(value, types.MethodType):  # obj.method: the function and its object
        me = f.add(value, Node(parent, access, k, TYPE, types.MethodType, 0, path), "method")
        trie[whole] = me
        _use(f, trie, whole + ("f",), value.__func__, me, GETATTR, "__func__", f"{path}.__func__")
        _use(f, trie, whole + ("s",), value.__self__, me, GETATTR, "__self__",
             owner[1] if owner[1] and value.__self__ is owner[0] else f"{path}.__self__")
        return
    if isinstance(value, functools.partial):
        me = f.add(value, Node(parent, access, k, TYPE, type(value), 0, path), "partial")
        trie[whole] = me
        for attr in ("func", "args", "keywords"):
            _use(f, trie, whole + (attr,), getattr(value, attr), me, GETATTR, attr,
                 f"{path}.{attr}")
        return
    if isinstance(value, (types.BuiltinMethodType, types.MethodWrapperType)) and \
            not isinstance(value.__self__, types.ModuleType) and value.__self__ is not None or \
            isinstance(value, types.MethodWrapperType):
        # a C method of an object (d.items, lst.copy, mod.__getattribute__): the object, whole
        me = f.add(value, Node(parent, access, k, TYPE, type(value), 0, path), "builtin method")
        trie[whole] = me
        _use(f, trie, whole + ("s",), value.__self__, me, GETATTR, "__self__",
             owner[1] if owner[1] and value.__self__ is owner[0] else f"{path}.__self__")
        return
    if _by_id(value):
        trie[whole] = me = f.add(value, Node(parent, access, k, ID, value, 0, path),
                                 _words(value))
        _members(f, trie, whole, value, me, path)
        return
    before = len(f.nodes)
    try:
        f.visit(value, parent, access, k, path, True)
    except RecursionError:
        raise TridentError(f"the global {path} is nested too deeply to guard") from None
    trie[whole] = before


def _members(f: _StateFlattener, trie: dict, whole: tuple, value, me: int, path: str) -> None:
    """Note [Modules used whole]: the members of the class or module ``value`` (at node ``me``)
    that its guard checks, each once per state tree."""
    used = f.whole
    if id(value) in used:
        return
    used.add(id(value))
    for c in value.__mro__ if isinstance(value, type) else ():
        if frames.user_class(c):
            _names(f, trie, c)
    for name, data, ident in members(value, path, _by_id):
        if (whole + ("attr", name)) not in trie:
            trie[whole + ("attr", name)] = len(f.nodes)
            if whole_member(data) and id(data) not in used:
                _use(f, trie, whole + ("attr", name), data, me, GETATTR, name,
                     f"{path}.{name}")  # (its own: attrgetter("helpers.Cfg.K")(mod))
            elif ident:
                f.add(data, Node(me, GETATTR, name, ID, data, 0, f"{path}.{name}"),
                      _words(data))
            else:
                f.visit(data, me, GETATTR, name, f"{path}.{name}", True)


def _names(f: _StateFlattener, trie: dict, cls: type) -> None:
    """Note [Classes of held objects] in wholes.py: the names ``cls``'s own dict holds, in
    order: an ``OBJECT`` check of the class beside its ``ID`` node (a class's instance dict, in
    C, is its own dict), so that a name it gains or loses later is seen."""
    root, steps = _root_of(cls)
    key = (root, *steps)
    if key + ("names",) in trie:
        return
    _add_read(f, trie, Read(root, steps, False), f.fn)
    at = f.nodes[trie[key]]
    if "__slotnames__" not in vars(cls):  # the name copy and pickle cache on the class at an
        copyreg._slotnames(cls)  # instance's first copy (CPython 3.11-3.12), cached now: no
    names = tuple(vars(cls))  # change after a deepcopy of the model (one recompile, it was)
    trie[key + ("names",)] = f.add(cls, Node(at.parent, at.access, at.key, OBJECT, type(cls),
                                             len(names), f"{at.path or cls.__qualname__}"
                                             ".__dict__", names), f"names {names}")
