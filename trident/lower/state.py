"""State guards: what a function reads outside its arguments, checked natively on every call.

Note [State guards]: a trace bakes in every Python value the function reads that is not an
argument: a global ``SCALE``, ``Knobs.factor``, ``GAIN[0]``, ``cfg.SCALE``, a closure's list, a
default, ``os.environ.get("MODE")``, a helper's code, a Triton kernel's ``tl.constexpr`` global.
Each such read becomes a **chain** (as Dynamo's sources: a root, then attribute, item and
closure-cell accessors), found in two steps:

1. :func:`record` watches the trace with ``sys.setprofile``: every function of user code that
   runs (the function, the helpers and methods it calls, in any module and at any depth; not
   the standard library, installed packages or Trident) and every call of a function whose
   result no guard can keep (``random.random()``, ``time.time()``,
   ``torch.default_generator.initial_seed()``: Python's random state, a ``torch.Generator``'s,
   the clock, the OS), which make the call run eagerly.
2. :func:`reads_of` reads the bytecode of each function that ran (and of each user Triton kernel
   it launches) for chains (:func:`_chains`): ``LOAD_GLOBAL`` / ``LOAD_DEREF`` of a closure
   cell / an ``import`` inside the function, then ``LOAD_ATTR`` / ``LOAD_METHOD`` / a constant
   subscript / ``.get(constant)`` / ``"k" in d`` / ``type(v)`` / ``getattr(v, constant)``;
   ``globals()[...]`` and ``os.getenv(constant)`` too; a local bound to a chain continues it
   where it is loaded; a parameter's attribute that its class holds (``self.factor``,
   ``type(self).K``, ``cls.s``) is read through the value's own class (its MRO, in C). Every
   instruction of a function that ran counts, taken or not, so a branch the next call takes
   is guarded too. A read the scan sees but cannot follow (``getattr`` with a computed name,
   ``globals()[name]``) makes the call eager: no read is assumed constant (issue 28).

:func:`build` evaluates the chains now and makes a **state tree**: the argument tree's nodes
(flatten.py) under roots (a module, the function, ``builtins``), read in C by ``getattr`` /
``getitem`` / a cell's contents, each checked like Dynamo's guard kinds:

* ``ID`` (ID_MATCH): modules, classes, functions (their code runs, so their own reads are
  chains of their own), builtins, Triton kernels;
* ``CONST`` (EQUALS_MATCH): numbers (floats by bit pattern), str, bytes, None, dtypes;
* ``TENSOR``: a tensor's identity and its version counter (a version tag: an in-place write
  bumps it), for a global tensor read as Python values (``.tolist()``, ``.item()``);
* ``TYPE``: the exact type of a container or object a chain goes through;
* ``ABSENT``: a name that must stay unbound (a global that would shadow the builtin ``abs``);
* a value used whole (a list iterated, a config passed on): its whole contents, as an argument
  tree checks an argument (SEQ, DICT, OBJECT, CONST ...). Values whose contents no check sees
  (numpy arrays, locks, an object with ``__slots__``) make the call run eagerly, with a warning.

Reads by the standard library's and installed packages' own code are not chains (their code
and module state are taken as fixed); what user code reads from them is (Note [Library state]);
torch's global flags that ops obey are call-wide guards instead (``trt_env.flags`` in
guards.py).

The dispatcher evaluates the union of its specializations' state trees before every call
(``state_holds`` in runtime/dispatcher.cpp). When a check fails the call goes to Python, which
evaluates each stored specialization's chains again and installs only those whose **digest** (a hash of
every node's contents, by value: floats by bit pattern, functions by their code, tensors by
their bytes) equals the one stored with it; the others stay on disk for the state they were
compiled in. The digest is also what makes a stored specialization valid in another process.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import dis
import functools
import hashlib
import importlib
import inspect
import logging
import os
import sys
import sysconfig
import types
import warnings
from pathlib import Path
from typing import Any

import torch

from trident import config
from trident.errors import TridentError
from trident.lower.flatten import _Flattener
from trident.ir.trees import ABSENT, ID, MAX_NODES, TENSOR, TYPE, _BY_ID, _CONSTS, Node
from trident.identity import PROCESS, hash_code, identity_words
from trident.runtime import ABI

# Node.access of state trees (trident_trees.h's TRT_ACC_*): a root object, getattr, getitem, and
# a closure cell's contents.
ROOT, GETATTR, GETITEM, CELL = (ABI[f"TRT_ACC_{k}"] for k in (
    "ROOT", "GETATTR", "GETITEM", "CELL"))

_HERE = str(config.PACKAGE_DIR) + os.sep
_INSTALL_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")
# Modules whose functions return what no guard keeps: Python's random state, the clock, the OS.
_IMPURE_MODULES = ("random", "_random", "time", "secrets", "uuid", "posix", "nt")


@functools.lru_cache(maxsize=8)
def _library_dirs(search_path: tuple[str, ...]) -> tuple[str, ...]:
    """Where installed packages live: the interpreter's install paths, and every ``sys.path``
    entry that holds a ``*.dist-info`` directory (a ``pip install --target`` folder put on
    ``PYTHONPATH``, a second site directory): a package there is a library, not user code."""
    dirs = {sysconfig.get_paths()[k] for k in _INSTALL_PATHS}
    for entry in search_path:
        try:
            if entry and os.path.isdir(entry) and any(
                    name.endswith(".dist-info") for name in os.listdir(entry)):
                dirs.add(entry)
        except OSError:
            continue
    return tuple(sorted(str(Path(d).resolve()) + os.sep for d in dirs))


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Code whose reads are chains: not Trident, the standard library or an installed package."""
    if filename.startswith("<frozen") or not filename:
        return False
    if filename.startswith("<"):  # exec'd code
        return True
    path = str(Path(filename).resolve())
    return not path.startswith(_HERE) and not path.startswith(_library_dirs(tuple(sys.path)))


def _is_user_frame(frame) -> bool:
    """A frame of user code; exec'd code (a dataclass's ``__init__``) belongs to the module
    whose globals it runs in."""
    filename = frame.f_code.co_filename
    if not filename.startswith("<") or filename.startswith("<frozen"):
        return is_user_file(filename)
    module = sys.modules.get(frame.f_globals.get("__name__"))
    return module is not None and not _is_library_module(module)


def _is_library_module(m: types.ModuleType) -> bool:
    """A module whose state is taken as fixed: one from a library's file, or built into the
    interpreter (``sys``, ``math``). A module without a file that is neither (one made at run
    time with ``types.ModuleType``, a config namespace) is user state."""
    f = vars(m).get("__file__")  # (not getattr: a module __getattr__ may raise anything)
    if f is None:
        spec = vars(m).get("__spec__")
        return m.__name__ in sys.builtin_module_names or \
            getattr(spec, "origin", None) in ("built-in", "frozen")
    return not is_user_file(f)


# ---- recording -------------------------------------------------------------------------------

@dataclasses.dataclass
class Recording:
    """What ran during a trace: per user code object, its globals and its parameters' values
    at the call; and the calls whose results no guard keeps."""

    codes: dict = dataclasses.field(default_factory=dict)  # code -> (globals, {param: value})
    impure: list = dataclasses.field(default_factory=list)
    module_call: bool = False  # an nn.Module was called: torch's global hooks were read
    generator_calls: list = dataclasses.field(default_factory=list)  # this thread's setters
    active: bool = False  # the profile hook ran (the function has code to record)

    def changed_rng(self) -> bool:
        """Whether this thread's trace set a random generator's state (Note [Global side
        effects] in capture.py): another thread's draws meanwhile are not the function's."""
        return bool(self.generator_calls)


# A torch.Generator's methods that set its state (its draws are ops, which a trace makes on
# fake tensors without drawing).
_GENERATOR_SETTERS = frozenset({"manual_seed", "seed", "set_state", "set_offset",
                                "graphsafe_set_state"})


@functools.cache
def _module_call_codes() -> frozenset:
    m = torch.nn.Module
    return frozenset(getattr(m, n).__code__ for n in ("_call_impl", "_wrapped_call_impl")
                     if hasattr(getattr(m, n, None), "__code__"))


def _impure_name(fn) -> str | None:
    owner = getattr(fn, "__self__", None)
    import random

    module = getattr(fn, "__module__", None) or type(owner).__module__
    if isinstance(owner, (random.Random, torch.Generator)) or module in _IMPURE_MODULES or \
            str(type(owner).__module__).startswith("numpy.random"):
        return f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', fn))}"
    if isinstance(owner, type) and owner.__module__ == "datetime" and \
            getattr(fn, "__name__", "") in ("now", "today", "utcnow"):  # the clock
        return f"datetime.{owner.__name__}.{fn.__name__}"
    return None


# Standard-library modules whose functions read the file system for their caller
# (os.path.exists, os.path.abspath's getcwd, pathlib): a C call of posix they make for user
# code is the user's read of OS state.
_OS_WRAPPERS = frozenset({"os", "genericpath", "posixpath", "ntpath", "pathlib", "shutil",
                          "glob", "fnmatch"})
_OS_READS = frozenset({"stat", "lstat", "fstat", "listdir", "scandir", "getcwd", "getcwdb",
                       "access", "readlink", "statvfs", "getpid", "cpu_count", "urandom"})


@contextlib.contextmanager
def record(fn):
    """Record the user code that ``fn``'s code runs in this thread (Note [State guards]);
    chains to a profile function already set. A profiler written in C (``cProfile``:
    ``sys.getprofile()`` returns its ``Profile`` object, which is not callable) cannot be
    chained: it is disabled while the call is recorded and enabled again after it."""
    rec = Recording()
    top = getattr(fn, "__code__", None)
    if top is None:
        yield rec
        return
    previous = sys.getprofile()
    suspended = previous if previous is not None and not callable(previous) and \
        callable(getattr(previous, "enable", None)) else None
    if suspended is not None:
        suspended.disable()
        previous = None
    elif previous is not None and not callable(previous):
        raise TridentError("a profiler that Trident cannot chain to is active "
                           f"({type(previous).__name__}): its calls run eagerly")
    called: dict = {}  # frame -> whether fn's code called it (frames live until the end)
    module_codes = _module_call_codes()

    def under_fn(frame) -> bool:
        """``frame`` runs for ``fn``: ``fn``'s frame is below it, and no Trident frame in
        between (Trident's own calls of user code, as an import hook or a patched ``open`` in
        the trace's bookkeeping, are not the function's reads; a Triton heuristic that
        kernels.py evaluates for the launch is)."""
        if frame in called:
            return called[frame]
        f, seen = frame, []
        while f is not None and f not in called and f.f_code is not top:
            seen.append(f)
            name = f.f_code.co_filename
            if name.startswith(_HERE) and not name.endswith("kernels.py"):
                f = None
                break
            f = f.f_back
        result = f is not None and (f.f_code is top or called[f])
        for g in seen:
            called[g] = result
        return result

    def hook(frame, event, arg):
        code = frame.f_code
        if event == "call":
            if code in module_codes and not rec.module_call and under_fn(frame):
                rec.module_call = True
            elif _is_user_frame(frame) and under_fn(frame):
                if code not in rec.codes:
                    nparams = code.co_argcount + code.co_kwonlyargcount
                    local = frame.f_locals
                    rec.codes[code] = (frame.f_globals, {n: local[n] for n in
                                                         code.co_varnames[:nparams] if n in local})
            elif frame.f_back is not None and _is_user_frame(frame.f_back) and \
                    frame.f_globals.get("__name__") in _IMPURE_MODULES and \
                    under_fn(frame.f_back):
                rec.impure.append(f"{frame.f_globals['__name__']}.{code.co_name}")
        elif event == "c_call":
            if getattr(arg, "__name__", None) in _GENERATOR_SETTERS and isinstance(
                    getattr(arg, "__self__", None), torch.Generator) and under_fn(frame):
                rec.generator_calls.append(arg.__name__)  # from any code the function runs
            if _is_user_frame(frame) and under_fn(frame):
                name = _impure_name(arg)
                if name:
                    rec.impure.append(name)
            elif frame.f_globals.get("__name__") in _OS_WRAPPERS:
                caller, depth = frame, 0  # the wrappers' own calls, up to the user's code
                while caller is not None and depth < 8 and \
                        caller.f_globals.get("__name__") in _OS_WRAPPERS:
                    outer, caller, depth = caller, caller.f_back, depth + 1
                if getattr(arg, "__name__", None) in _OS_READS and caller is not None and \
                        _is_user_frame(caller) and under_fn(caller):
                    name = _impure_name(arg)
                    if name:
                        rec.impure.append(f"{outer.f_globals['__name__']}."
                                          f"{outer.f_code.co_name}, which calls {name}")
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(hook)
    rec.active = True
    try:
        yield rec
    finally:
        sys.setprofile(previous)
        if suspended is not None:
            suspended.enable()


@contextlib.contextmanager
def unrecorded():
    """Torch's own set-up code while a call is recorded (not the user's): the recording's
    profile hook is off meanwhile. A profile function that is not a Python callable (a C
    profiler's object) is left alone."""
    hook = sys.getprofile()
    if not callable(hook):
        yield
        return
    sys.setprofile(None)
    try:
        yield
    finally:
        sys.setprofile(hook)


# ---- chains ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Read:
    """One chain: ``root`` (``("module", name)``, ``("fn",)``: the jitted function,
    ``("builtins",)``, ``("object", token)``: an object of this process only) then ``steps``
    (``("attr", name)``, ``("item", key)``, ``("get", key)``: an item that may be absent,
    ``("cell",)``: a closure cell's contents). ``whole``: the value is used whole (its contents
    are guarded), not only read through."""

    root: tuple
    steps: tuple
    whole: bool = True

    def to_json(self) -> list:
        return [list(self.root), [[s[0], *map(_key_json, s[1:])] for s in self.steps],
                self.whole]

    @classmethod
    def from_json(cls, data: list) -> "Read":
        root, steps, whole = data
        return cls(tuple(root), tuple((s[0], *map(_key_from_json, s[1:])) for s in steps),
                   whole)


def _key_json(k):
    return {"bytes": k.hex()} if isinstance(k, bytes) else k


def _key_from_json(k):
    return bytes.fromhex(k["bytes"]) if isinstance(k, dict) else k


_OBJECTS: dict[str, Any] = {}  # ("object", token) roots: objects no module path reaches


def _root_of(obj) -> tuple[tuple, tuple]:
    """(root, steps) naming ``obj``: its module, then its qualified name, when that path
    reaches it; else the object itself, in this process only."""
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__), ()
    name, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is not None and "<locals>" not in qualname:
        target = module
        for part in qualname.split("."):
            target = getattr(target, part, None)
        if target is obj:
            return ("module", name), tuple(("attr", part) for part in qualname.split("."))
    token = f"{type(obj).__name__}@{id(obj)}"
    _OBJECTS[token] = obj
    return ("object", token), ()


def _globals_root(g: dict) -> tuple[tuple, str]:
    """(root, step kind) for a globals dict: its module (read by getattr) or the dict itself."""
    name = g.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is not None and module.__dict__ is g:
        return ("module", name), "attr"
    return _root_of_dict(g), "item"


def _root_of_dict(g: dict) -> tuple:
    token = f"dict@{id(g)}"
    _OBJECTS[token] = g
    return ("object", token)


def _resolve_root(root: tuple, fn) -> Any:
    """The object a root names now; ``_MISSING`` when it names none."""
    kind = root[0]
    if kind == "fn":
        return fn
    if kind == "builtins":
        return builtins
    if kind == "module":
        return sys.modules.get(root[1], _MISSING)
    return _OBJECTS.get(root[1], _MISSING)


_MISSING = object()


_LOAD_FAST = ("LOAD_FAST", "LOAD_FAST_CHECK")


def _single_stores(code: types.CodeType, ins: list) -> set:
    """The locals (not parameters) that ``code`` binds exactly once: a local bound to a chain
    there is an alias of that chain wherever it is loaded (``log = LOG``, ``import mod``)."""
    nparams = code.co_argcount + code.co_kwonlyargcount + \
        bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    counts: dict = {}
    for i in ins:
        if i.opname in ("STORE_FAST", "DELETE_FAST"):
            counts[i.argval] = counts.get(i.argval, 0) + 1
    return {n for n, c in counts.items() if c == 1 and n not in code.co_varnames[:nparams]}


def _chains(code: types.CodeType) -> list[tuple[str, Any, tuple]]:
    """(start kind, name, steps) per chain of ``code``'s bytecode: start ``global``, ``free``
    (a closure cell), ``param`` or ``import`` (``import m`` / ``from m import n`` inside the
    function: name is ``(module name, level, whether the top package is bound)``); steps as in
    :class:`Read`, plus ``("call0",)`` and ``("call1", constant)`` / ``("call2", constant,
    constant)`` for a call with no argument or constant arguments (``globals()``,
    ``.get("k")``, ``os.getenv("k", "2")``), ``("gattr", global name)`` for ``getattr(obj,
    NAME)`` and ``("eager", why)`` for a read this scan cannot follow, resolved by
    :func:`reads_of`. ``type(v)`` is the step ``("attr", "__class__")``; a local bound once to
    a chain (``log = LOG``, ``import mod``) continues that chain where it is loaded."""
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL")]
    nparams = code.co_argcount + code.co_kwonlyargcount
    params = set(code.co_varnames[:nparams])
    single = _single_stores(code, ins)
    aliases: dict = {}  # local -> (start kind, name, steps)
    out: list = []

    def const_at(j):
        return j < len(ins) and ins[j].opname == "LOAD_CONST" and \
            type(ins[j].argval) in (str, int, bytes)

    def call_at(j, n):
        return j < len(ins) and ins[j].opname == "CALL" and ins[j].argval == n

    def chain_at(i, depth=0):
        """(start, name, steps, next index) of the chain that starts at ``ins[i]``, or None."""
        op = ins[i]
        steps: list = []
        if op.opname == "LOAD_GLOBAL" and op.argval in ("type", "getattr", "hasattr") and \
                depth < 8 and i + 1 < len(ins):
            inner = chain_at(i + 1, depth + 1)
            if inner is not None:
                kind, name, isteps, j = inner
                if op.argval == "type" and call_at(j, 1):
                    return _more(kind, name, list(isteps) + [("attr", "__class__")], j + 1)
                if op.argval != "type":
                    nargs = 2 if op.argval == "hasattr" else None
                    if const_at(j) and isinstance(ins[j].argval, str):
                        step, k = ("attr", ins[j].argval), j + 1
                    elif j < len(ins) and ins[j].opname == "LOAD_GLOBAL" and not (
                            j + 1 < len(ins) and ins[j + 1].opname in ("LOAD_ATTR",
                                                                          "LOAD_METHOD")):
                        out.append(("global", ins[j].argval, ()))  # the name's own read
                        step, k = ("gattr", ins[j].argval), j + 1
                    else:
                        out.append((kind, name, tuple(isteps) + (
                            ("eager", f"{op.argval}() with a name computed at run time"),)))
                        return None
                    if nargs is None and k < len(ins) and ins[k].opname == "LOAD_CONST" and \
                            call_at(k + 1, 3):  # a default
                        return _more(kind, name, list(isteps) + [step], k + 2)
                    if call_at(k, 2):
                        return _more(kind, name, list(isteps) + [step], k + 1)
                    out.append((kind, name, tuple(isteps) + (
                        ("eager", f"{op.argval}() called in a way Trident does not follow"),)))
                    return None
                out.append((kind, name, tuple(isteps)))  # type(v) called otherwise
                return None
        if op.opname == "LOAD_GLOBAL":
            start = ("global", op.argval)
        elif op.opname == "LOAD_DEREF" and op.argval in code.co_freevars:
            start = ("free", op.argval)
        elif op.opname in _LOAD_FAST and op.argval in aliases:
            (kind, name, asteps), *others = aliases[op.argval]
            found = _more(kind, name, list(asteps), i + 1)
            more = found[2][len(asteps):]
            for okind, oname, osteps in others:  # bound elsewhere to another chain
                out.append((okind, oname, tuple(osteps) + more))
            return found
        elif op.opname in _LOAD_FAST and op.argval in params:
            start = ("param", op.argval)
        elif op.opname == "IMPORT_NAME":
            level = ins[i - 2].argval if i >= 2 and ins[i - 2].opname == "LOAD_CONST" else 0
            fromlist = ins[i - 1].argval if i >= 1 and ins[i - 1].opname == "LOAD_CONST" \
                else None
            start = ("import", (op.argval, level or 0, not fromlist))
            j = i + 1
            while j < len(ins) and ins[j].opname == "IMPORT_FROM":  # from m import a, b
                step = ("attr", ins[j].argval)
                if j + 1 < len(ins) and ins[j + 1].opname == "STORE_FAST":
                    bind(ins[j + 1].argval, (*start, (step,)))
                out.append((*start, (step,)))
                j += 2
                if j < len(ins) and ins[j].opname == "POP_TOP":
                    j += 1
            if j == i + 1:
                out.append((*start, ()))
                if j < len(ins) and ins[j].opname == "STORE_FAST":
                    bind(ins[j].argval, (*start, ()))
            return None if j > i + 1 else (*start, (), j)
        else:
            return None
        return _more(*start, steps, i + 1)

    def _more(kind, name, steps, j):
        while j < len(ins):
            nxt = ins[j]
            if nxt.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                steps.append(("attr", nxt.argval))
                j += 1
            elif const_at(j) and j + 1 < len(ins) and ins[j + 1].opname == "BINARY_SUBSCR":
                steps.append(("item", nxt.argval))
                j += 2
            elif call_at(j, 0):
                steps.append(("call0",))
                j += 1
            elif const_at(j) and call_at(j + 1, 1):
                steps.append(("call1", nxt.argval))
                j += 2
            elif nxt.opname == "LOAD_GLOBAL" and steps and steps[-1][0] == "attr" and (
                    call_at(j + 1, 1) or (j + 2 < len(ins) and ins[j + 1].opname ==
                                          "LOAD_CONST" and call_at(j + 2, 2))):
                out.append(("global", nxt.argval, ()))  # d.get(NAME), os.getenv(NAME): the
                steps.append(("gcall", nxt.argval))  # name's own read, then the call
                j += 2 if call_at(j + 1, 1) else 3
            elif nxt.opname == "LOAD_GLOBAL" and j + 1 < len(ins) and \
                    ins[j + 1].opname == "BINARY_SUBSCR":  # d[NAME]
                out.append(("global", nxt.argval, ()))
                steps.append(("gitem", nxt.argval))
                j += 2
            elif const_at(j) and j + 1 < len(ins) and ins[j + 1].opname == "LOAD_CONST" and \
                    call_at(j + 2, 2):
                steps.append(("call2", nxt.argval, ins[j + 1].argval))
                j += 3
            else:
                break
        return kind, name, tuple(steps), j

    def bind(local, chain):
        """``local`` is bound to ``chain`` (each of its loads continues it)."""
        if local in params:
            return
        chains = aliases.setdefault(local, [])
        if chain not in chains:
            chains.append(chain)

    at = {i.offset: (i.opname, i.argval) for i in ins}  # jump targets
    for scan in range(2):  # the first finds what locals are bound to (a loop may load first)
        out.clear()
        i = 0
        while i < len(ins):
            found = chain_at(i)
            if found is None:
                i += 1
                continue
            kind, name, steps, j = found
            if kind == "param" and not steps:
                i = j
                continue
            stored = j < len(ins) and ins[j].opname == "STORE_FAST"
            if stored:
                bind(ins[j].argval, (kind, name, steps))
            elif j < len(ins) and ins[j].opname in ("JUMP_FORWARD", "JUMP") and \
                    at.get(ins[j].argval, (None,))[0] == "STORE_FAST":  # c = A if f else B
                bind(at[ins[j].argval][1], (kind, name, steps))
                stored = True
            if stored and ins[j].argval in single:
                pass  # each load of it is a chain
            elif j < len(ins) and ins[j].opname == "CONTAINS_OP" and const_at(i - 1):
                out.append((kind, name, steps + (("contains", ins[i - 1].argval),)))  # "k" in d
            else:
                out.append((kind, name, steps))
            i = max(j, i + 1)
    return list(dict.fromkeys(out))


@functools.cache
def _kernel_types() -> tuple:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import KernelInterface

    return (KernelInterface, InterpretedFunction)


def _kernel_fns(value) -> list:
    """The Python functions of a Triton kernel (through autotuners and heuristics)."""
    fns = []
    while isinstance(value, _kernel_types()):
        value = value.fn
        if isinstance(value, types.FunctionType):
            fns.append(value)
    return fns


# Methods that change the container they are called on (list, dict, set, deque).
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update",
                       "setdefault", "popitem", "add", "discard", "appendleft", "popleft",
                       "__setitem__", "__delitem__"})


def outside_write(code: types.CodeType, g: dict) -> str | None:
    """Note [State guards]: what ``code`` writes outside its frame and its arguments (a
    ``global`` or ``nonlocal`` assignment, an item or attribute of an object read from a global
    or a closure cell, a mutating method of such a container), or None. Only the trace runs the
    function's Python code: a hit would skip the write (issue 11's never-stale rule), so such a
    function runs eagerly. Read from the bytecode (CPython 3.11-3.13); a local bound to such an
    object (``log = LOG``, ``import mod``) writes outside as the object does."""
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL")]
    aliases: dict = {}  # a local bound to a global or a closure variable: log = LOG

    def outside(i, modules: bool = False) -> str | None:
        if i.opname == "LOAD_GLOBAL" and (
                modules or not isinstance(g.get(i.argval), types.ModuleType)):
            return f"global {i.argval}"
        if i.opname == "LOAD_DEREF" and i.argval in code.co_freevars:
            return f"closure variable {i.argval}"
        if i.opname in _LOAD_FAST and i.argval in aliases:
            what, module = aliases[i.argval]
            return what if modules or not module else None
        return None

    line = 0
    for j, i in enumerate(ins):
        if i.starts_line not in (None, False):
            line = j
        if i.opname == "STORE_FAST" and j >= 1:  # (bound once or more: a write may go there)
            prev = ins[j - 1]
            what = outside(prev, True)
            if what is not None:
                module = prev.opname == "LOAD_GLOBAL" and isinstance(g.get(prev.argval),
                                                                      types.ModuleType)
                aliases[i.argval] = (f"{what} (as {i.argval})", module)
            elif prev.opname in ("IMPORT_NAME", "IMPORT_FROM"):  # import m: m.N = v
                aliases[i.argval] = (f"{prev.argval} (imported as {i.argval})", True)
        if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            return f"global {i.argval}"
        if i.opname in ("STORE_DEREF", "DELETE_DEREF") and i.argval in code.co_freevars:
            return f"closure variable {i.argval}"
        target = None
        if i.opname in ("STORE_ATTR", "DELETE_ATTR") and j >= 1:
            target = outside(ins[j - 1], True)  # obj.n = v, mod.N = v
        elif i.opname in ("STORE_SUBSCR", "DELETE_SUBSCR") and j >= 2 and \
                ins[j - 1].opname in ("LOAD_CONST", "LOAD_FAST"):
            target = outside(ins[j - 2])  # d[k] = v
        elif i.opname in ("LOAD_METHOD", "LOAD_ATTR") and i.argval in _MUTATORS and j >= 1:
            target = outside(ins[j - 1])  # log.append(v)
        if target is None and i.opname in ("STORE_ATTR", "STORE_SUBSCR") and j >= 1 and \
                ins[j - 1].opname == "SWAP":
            target = outside(ins[line])  # d[k] += v, obj.n += v
        if target is not None:
            return f"{target} ({code.co_filename.rsplit('/', 1)[-1]}:{i.positions.lineno})"
    return None


def terminal_output(code: types.CodeType, g: dict) -> str | None:
    """A call in ``code`` that prints or warns (``print``, ``warnings.warn`` or
    ``warn_explicit``, ``sys.stdout.write``, ``sys.stderr.write``, named by a global or a
    builtin, through modules), or None. Only the trace runs the function's Python code: eager
    prints and warns at every call (as Python's warning filters allow), a hit would not, so such
    a function runs eagerly. Every instruction counts, as for writes: a ``print`` in a branch
    not taken makes the function run eagerly too."""
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL")]
    for j, i in enumerate(ins):
        if i.opname != "LOAD_GLOBAL":
            continue
        name = i.argval
        obj = g[name] if name in g else getattr(builtins, name, None)
        for step in ins[j + 1:j + 3]:  # warnings.warn, sys.stdout.write (no other getattr)
            if step.opname not in ("LOAD_ATTR", "LOAD_METHOD") or not (
                    obj is warnings or obj is sys or any(obj is s for s in streams)):
                break
            obj, name = getattr(obj, step.argval, None), f"{name}.{step.argval}"
        if any(obj is f for f in (print, warnings.warn, warnings.warn_explicit)) or (
                name.endswith(".write") and any(getattr(obj, "__self__", None) is s
                                                for s in streams)):
            return f"{name} at {code.co_filename.rsplit('/', 1)[-1]}:{i.positions.lineno}"
    return None


def check_write(code: types.CodeType, g: dict) -> None:
    """Raises:
        TridentError: ``code`` writes outside its arguments (:func:`outside_write`) or prints
            or warns (:func:`terminal_output`)."""
    written = outside_write(code, g)
    if written is not None:
        raise TridentError(f"the function writes to {written}: Python state outside its "
                           "arguments, which a hit would not write")
    output = terminal_output(code, g)
    if output is not None:
        raise TridentError(f"the function prints or warns ({output}): eager does at every "
                           "call, a hit would not")


def check_writes_before_trace(fn) -> None:
    """:func:`check_write` of ``fn`` and of the user functions it names by global or closure
    (four calls deep), before a trace runs them: a trace that wrote (or printed) would leave
    the write done twice once the call runs eagerly.

    Raises:
        TridentError: one of them writes outside its arguments, prints or warns."""
    seen: set = set()
    todo = [(fn, 0)]
    while todo:
        f, depth = todo.pop()
        if not isinstance(f, types.FunctionType):
            continue
        code = f.__code__
        if code in seen or not is_user_file(code.co_filename):
            continue
        seen.add(code)
        check_write(code, f.__globals__)
        if depth < 4:
            cells = dict(zip(code.co_freevars, f.__closure__ or ()))
            for i in dis.get_instructions(code):
                if i.opname == "LOAD_GLOBAL":
                    todo.append((f.__globals__.get(i.argval), depth + 1))
                elif i.opname == "LOAD_DEREF" and i.argval in cells:
                    try:
                        todo.append((cells[i.argval].cell_contents, depth + 1))
                    except ValueError:  # an empty cell
                        pass


def reads_of(rec: Recording, fn) -> list[Read]:
    """Note [State guards]: the chains of every user function that ran in ``rec`` (and of the
    Triton kernels they name), rooted where a new call reads them.

    Raises:
        TridentError: the function calls something whose result no guard keeps, writes
            outside its arguments (a helper reached past :func:`check_writes_before_trace`), or
            reads a closure variable whose cell cannot be found again."""
    if rec.impure:
        raise TridentError(f"the function calls {rec.impure[0]}(), whose result a "
                           "specialization would keep (Python's random state, a "
                           "torch.Generator's, the clock, the OS)")
    for code, (g, _) in rec.codes.items():
        check_write(code, g)
    functions = {}  # code -> function object, for closure cells
    if isinstance(fn, types.FunctionType):
        functions[fn.__code__] = fn
    parents = {}  # nested code -> the code that makes it
    reads: list[Read] = []
    todo = list(rec.codes.items())
    seen_kernels: set = set()
    for code, _ in todo:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                parents[const] = code

    def root_for_cell(code, name, depth=0):
        """(root, steps) of a closure cell, None for one that needs no guard, or
        ``_MISSING`` while no function object of ``code`` is known."""
        f = functions.get(code)
        if f is not None:
            root, steps = (("fn",), ()) if f is fn else _root_of(f)
            i = code.co_freevars.index(name)
            return root, steps + (("attr", "__closure__"), ("item", i), ("cell",))
        parent = parents.get(code)
        if parent is not None and depth < 64:
            if name in parent.co_cellvars:
                return None  # a local of the enclosing call: made inside the trace
            if name in parent.co_freevars:
                return root_for_cell(parent, name, depth + 1)
        if code.co_filename.startswith("<"):  # exec'd code (a dataclass's __init__): the
            return None  # cells of the code that made it, fixed
        return _MISSING

    def add(read: Read) -> None:
        """A chain, and the functions (their closure cells) and kernels it reaches."""
        reads.append(read)
        for value in _values_along(read, fn):
            for f in _functions_in(value):
                functions.setdefault(f.__code__, f)
            for kfn in _kernel_fns(value):  # a Triton kernel: its code never runs here
                if kfn.__code__ not in seen_kernels:
                    seen_kernels.add(kfn.__code__)
                    functions.setdefault(kfn.__code__, kfn)
                    todo.append((kfn.__code__, (kfn.__globals__, {})))

    # closure chains need the function objects that other chains reach (a helper held by a
    # global or by another closure): they are resolved as those are found
    pending: list = []
    k = 0
    while True:
        while k < len(todo):
            code, (g, params) = todo[k]
            k += 1
            for start, name, steps in _chains(code):
                if start == "global" and name == "globals" and steps[:1] == (("call0",),) and \
                        name not in g:
                    if len(steps) > 1 and steps[1][0] in ("item", "contains"):
                        start, name, steps = "global", steps[1][1], steps[2:]  # globals()["X"]
                    elif len(steps) > 2 and steps[1] == ("attr", "get") and \
                            steps[2][0] in ("call1", "call2"):  # globals().get("X")
                        start, name, steps = "global", steps[2][1], steps[3:]
                    else:  # globals()[name], globals().get(name), exec(..., globals()), ...
                        raise TridentError(f"{code.co_name} reads globals() otherwise than "
                                           "by a constant key: state no guard follows")
                steps = _resolve_names(steps, g)
                if start == "import":
                    root, path = _import_root(name, g)
                    read = _resolve_calls(root, path + steps, fn)
                    if read is not None:
                        add(read)
                    continue
                if start == "global":
                    root, kind = _globals_root(g)
                    if kind == "attr" and name not in g:
                        reads.append(Read(root, (("attr", name),), False))  # ABSENT: unbound
                        root, steps0 = ("builtins",), (("attr", name),)
                    else:
                        steps0 = ((kind, name),)
                    read = _resolve_calls(root, steps0 + steps, fn)
                elif start == "param":
                    read = _param_read(params.get(name, _MISSING), steps, fn)
                else:
                    pending.append((code, name, steps))
                    continue
                if read is not None:
                    add(read)
        before = len(pending)
        resolved = [(item, root_for_cell(item[0], item[1])) for item in pending]
        pending = [item for item, where in resolved if where is _MISSING]
        for (code, name, steps), where in resolved:
            if where is not None and where is not _MISSING:
                read = _resolve_calls(where[0], where[1] + steps, fn)
                if read is not None:
                    add(read)
        if len(pending) == before and k == len(todo):  # nothing more to find
            break
    if pending:
        code, name, _ = pending[0]
        raise TridentError(f"{code.co_name} reads the closure variable {name!r}, whose cell "
                           "Trident cannot find again")
    methods = {i.argval for code in rec.codes for i in dis.get_instructions(code)
               if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(i.argval, str)}
    for name in sorted(methods - _TENSOR_STATE):  # on any tensor (an intermediate's too): a
        if isinstance(vars(torch._C.TensorBase).get(name, vars(torch.Tensor).get(name)), (
                types.MethodDescriptorType, types.FunctionType)):  # method a user may patch
            reads.append(Read(("module", "torch"), (("attr", "Tensor"), ("attr", name))))
    for code, (_, params) in rec.codes.items():  # methods reached through an argument
        if code not in functions and code.co_argcount and code.co_varnames[0] in params:
            owner = params[code.co_varnames[0]]
            cls = owner if isinstance(owner, type) else type(owner)  # a classmethod's cls
            found = next(((name, f) for c in cls.__mro__ for name, v in (
                [(code.co_name, c.__dict__.get(code.co_name))] + list(vars(c).items()))
                for f in _functions_in(v) if f.__code__ is code), None)  # (a lambda's name)
            if found is not None:
                name, functions[code] = found
                # read through the value's own class, as Python finds the method: one a
                # subclass defines later (Net2.forward = ...) is seen; a method that the class
                # finds elsewhere (an override, which called this one through super()) from
                # the class that holds it
                owner = next(c for c in cls.__mro__ if any(
                    f is functions[code] for f in _functions_in(vars(c).get(name))))
                where = cls if next((c for c in cls.__mro__ if name in vars(c)), None) is \
                    owner else owner
                root, steps = _root_of(where)
                reads.append(Read(root, steps + (("attr", name),)))
    if rec.module_call:  # Module.__call__ reads torch's global hooks (Note [Library state])
        reads += [Read(("module", "torch.nn.modules.module"), (("attr", name),))
                  for name in _WHOLE_LIBRARY_STATE["torch.nn.modules.module"]]
    for f in [f for f in functions.values() if f.__code__ in rec.codes]:  # their defaults
        root, steps = (("fn",), ()) if f is fn else _root_of(f)
        for attr in ("__code__", "__defaults__", "__kwdefaults__"):
            reads.append(Read(root, steps + (("attr", attr),)))
    return list(dict.fromkeys(reads))


def _functions_in(value) -> list:
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, types.MethodType):
        return _functions_in(value.__func__)
    if isinstance(value, functools.partial):
        return _functions_in(value.func)
    if isinstance(value, (staticmethod, classmethod)):
        return _functions_in(value.__func__)
    if isinstance(value, property):  # its getter's cells (it is read by identity)
        return [f for f in (value.fget, value.fset, value.fdel)
                if isinstance(f, types.FunctionType)]
    if isinstance(value, type) and is_user_file(
            getattr(sys.modules.get(value.__module__), "__file__", "") or ""):
        # a user class's methods (an autograd.Function's decorated forward): their cells
        return [f for v in vars(value).values() if not isinstance(v, type)
                for f in _functions_in(v)]
    return []


def _is_user_class(c: type) -> bool:
    return c.__module__ != "builtins" and is_user_file(
        getattr(sys.modules.get(c.__module__), "__file__", "") or "")


# A tensor's attributes that are its own state (its argument guards' or the trace's), not
# methods a user may patch on torch.Tensor.
_TENSOR_STATE = frozenset({"data", "grad", "requires_grad", "is_leaf", "grad_fn", "_version",
                           "_base", "names", "shape", "dtype", "device", "layout", "ndim"})


def _instance_value(value, d, name: str):
    """``value``'s own attribute ``name`` (its ``__dict__``'s, or an nn.Module's submodule,
    parameter or buffer, which its argument tree reads), or ``_MISSING``."""
    if not isinstance(d, dict):
        return _MISSING
    if name in d:
        return d[name]
    if isinstance(value, torch.nn.Module):
        for kind in ("_modules", "_parameters", "_buffers"):
            held = d.get(kind)
            if isinstance(held, dict) and name in held:
                return held[name]
    return _MISSING


def _param_read(value, steps: tuple, fn, _depth: int = 0) -> Read | None:
    """``self.factor`` where the parameter's class holds ``factor``, ``type(self).K``,
    ``self.__class__.K`` and a classmethod's ``cls.s``: a chain from the class the value has
    (``type(self)``, read through its MRO in C as Python does: a subclass that shadows its
    base's attribute later is seen), wherever a user class of that MRO up to the one that holds
    the attribute may hold it."""
    if value is _MISSING or steps[0][0] != "attr":
        return None
    if steps[0] == ("attr", "__class__") and not isinstance(value, types.ModuleType):
        value, steps = type(value), steps[1:]
        if not steps:
            return None  # type(self) alone: the argument tree checks the exact class
        if steps[0][0] != "attr":
            return None
    if steps[0][0] == "eager":
        if isinstance(value, (type, types.ModuleType)):
            _resolve_calls(*_root_of(value), steps, fn)  # raises
        return None  # an instance's own attributes: its argument tree (not its class's)
    if isinstance(value, types.ModuleType):  # a module passed in (its tree checks identity)
        root, path = _root_of(value)
        return _resolve_calls(root, path + steps, fn)
    if isinstance(value, type):
        cls, name = value, steps[0][1]
    elif isinstance(value, torch.Tensor):  # (a fake tensor in the trace) its methods, which
        name = steps[0][1]  # a user may patch (torch.Tensor.add = ...)
        if name in _TENSOR_STATE or not hasattr(torch.Tensor, name):
            return None
        return _resolve_calls(("module", "torch"), (("attr", "Tensor"), steps[0]), fn)
    else:
        if isinstance(value, (types.ModuleType, *_BY_ID)) or type(value).__module__ == "builtins":
            return None
        cls, name = type(value), steps[0][1]
        d = getattr(value, "__dict__", None)
        held = _instance_value(value, d, name)
        if held is not _MISSING:  # an instance attribute: the argument tree or the chain to it
            if len(steps) > 1 and _depth < 16:  # has it; what is read through it may not be
                return _param_read(held, steps[1:], fn, _depth + 1)  # (a class's attribute)
            return None
    mro = cls.__mro__
    at = next((k for k, c in enumerate(mro) if name in c.__dict__), None)
    if at is None or not any(_is_user_class(c) for c in mro[:at + 1]):
        return None
    root, path = _root_of(cls)
    return _resolve_calls(root, path + steps, fn)


def _import_root(name: tuple, g: dict) -> tuple[tuple, tuple]:
    """(root, steps) of what ``import`` binds inside a function (:func:`_chains`): the top
    package (``import a.b``) or the module itself (``from a.b import c``, ``import a.b as
    c``'s ``a``, then ``.b``)."""
    module, level, top = name
    if level:
        import importlib.util

        package = g.get("__package__") or g.get("__name__", "").rpartition(".")[0]
        module = importlib.util.resolve_name("." * level + module, package)
    if top:
        first, *rest = module.split(".")
        return ("module", first), ()
    return ("module", module), ()


def _resolve_names(steps: tuple, g: dict) -> tuple:
    """``("gattr", NAME)`` (``getattr(obj, NAME)``), ``("gcall", NAME)`` (``d.get(NAME)``,
    ``os.getenv(NAME)``) and ``("gitem", NAME)`` (``d[NAME]``) as the attribute, call or item
    that the global ``NAME`` names now (its own chain guards it). A getattr name that is no str
    is Trident's not to follow; another key ends the chain at the container, read whole."""
    out = []
    for step in steps:
        if step[0] in ("gattr", "gcall", "gitem"):
            name = g.get(step[1], _MISSING)
            if step[0] != "gattr" and type(name) not in (str, int, bytes):
                break  # another key: the chain ends at the container (or method), whole
            if step[0] == "gattr" and type(name) is not str:
                out.append(("eager", f"getattr() with the global {step[1]} as its name"))
                break
            step = {"gattr": ("attr", name), "gcall": ("call1", name),
                    "gitem": ("item", name)}[step[0]]
        out.append(step)
    return tuple(out)


def _resolve_calls(root: tuple, steps: tuple, fn) -> Read | None:
    """Resolve ``call0`` / ``call1`` steps: ``globals()`` becomes its module's root,
    ``d.get("k")`` and ``os.getenv("k")`` an item that may be absent; any other call ends the
    chain at its callee."""
    obj = _resolve_root(root, fn)
    done: list = []
    for step in steps:
        if step[0] == "eager":
            path = ".".join(str(s[-1]) for s in done if s[0] != "cell")
            raise TridentError(f"the function reads {path or 'a global'} through {step[1]}: "
                               "state that no guard can follow")
        if step[0] == "contains":  # "k" in d: d's item k or its absence; in another
            if obj is os.environ or type(obj) is dict:  # container: the container, whole
                done.append(("get", step[1]))
            break
        if step[0] == "item" and obj is sys.modules and type(step[1]) is str and \
                step[1] in sys.modules:  # sys.modules["m"]: the module m
            root, done, obj = ("module", step[1]), [], sys.modules[step[1]]
            continue
        if step[0] == "call1" and type(step[1]) is str and step[1] in sys.modules and (
                obj is builtins.__import__ or obj is importlib.import_module):
            # importlib.import_module("a.b") is a.b, __import__("a.b") is a
            name = step[1] if obj is importlib.import_module else step[1].partition(".")[0]
            root, done, obj = ("module", name), [], sys.modules[name]
            continue
        if step[0] in ("call0", "call1", "call2"):
            if step[0] == "call0" and obj is builtins.globals and len(done) == 1:
                return None  # globals() alone: its items are read by the chains after it
            if step[0] != "call0" and done and done[-1] == ("attr", "get") and len(done) > 1:
                done[-1] = ("get", step[1])
                obj = _MISSING
                continue
            if step[0] != "call0" and obj is os.getenv:
                return Read(("module", "os"), (("attr", "environ"), ("get", step[1])))
            if step[0] == "call0" and _is_getter(obj):  # sys.getrecursionlimit()
                done.append(("call",))
                obj = obj()
                continue
            break
        done.append(step)
        obj = _step(obj, step) if obj is not _MISSING else _MISSING
    return Read(root, tuple(done), True)


def _values_along(read: Read, fn):
    obj = _resolve_root(read.root, fn)
    yield obj
    for step in read.steps:
        obj = _step(obj, step)
        if obj is _MISSING or obj is _STOP:
            return
        yield obj


_STOP = object()  # a read that Python code (a property, __getattr__) would serve


def _step(obj, step):
    """One step of a chain in Python: the value, ``_MISSING`` (absent), or ``_STOP``."""
    kind = step[0]
    if obj is _MISSING or obj is _STOP:
        return obj
    if kind == "call":
        return obj() if _is_getter(obj) else _STOP
    if kind == "cell":
        try:
            return obj.cell_contents
        except (ValueError, AttributeError):
            return _MISSING
    if kind in ("item", "get"):
        if obj is os.environ:
            obj, key = obj._data, os.environ.encodekey(step[1])
        else:
            key = step[1]
        if not isinstance(obj, (dict, list, tuple)) or type(obj).__getitem__ not in (
                dict.__getitem__, list.__getitem__, tuple.__getitem__):
            return _STOP
        try:
            return obj[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    name = step[1]
    if isinstance(obj, types.ModuleType):
        if type(obj) is not types.ModuleType and any(  # a module's class serves it
                name in c.__dict__ for c in type(obj).__mro__[:-2]):
            return _STOP
        value = obj.__dict__.get(name, _MISSING)
        return _STOP if value is _MISSING and ("__getattr__" in obj.__dict__ or any(
            "__getattr__" in c.__dict__ for c in type(obj).__mro__[:-2])) else value
    if isinstance(obj, type) and type(obj).__getattribute__ is type.__getattribute__ and \
            not any(name in m.__dict__ for m in type(obj).__mro__[:-2]):
        # a class's own attribute (its metaclass adds none): what getattr makes of each
        # kind is fixed by the kind (a property or function itself, a classmethod bound)
        static = next((c.__dict__[name] for c in obj.__mro__ if name in c.__dict__), _MISSING)
        if static is _MISSING:
            return _STOP if any("__getattr__" in m.__dict__ for m in type(obj).__mro__[:-2]) \
                else (getattr(obj, name) if hasattr(type, name) else _MISSING)
        if not hasattr(type(static), "__get__") or isinstance(static, (
                types.FunctionType, staticmethod, classmethod, property, type,
                types.MemberDescriptorType, types.GetSetDescriptorType,
                types.MethodDescriptorType, types.WrapperDescriptorType,
                types.BuiltinFunctionType, types.ClassMethodDescriptorType)):
            try:
                return getattr(obj, name)
            except AttributeError:
                return _MISSING
        return _STOP
    try:
        static = inspect.getattr_static(obj, name)
    except AttributeError:
        return _STOP if hasattr(type(obj), "__getattr__") else _MISSING
    if isinstance(static, property) or (
            hasattr(type(static), "__get__") and not isinstance(
                static, (types.FunctionType, staticmethod, classmethod, types.MemberDescriptorType,
                         types.GetSetDescriptorType, types.MethodDescriptorType,
                         types.WrapperDescriptorType, types.BuiltinFunctionType,
                         types.ClassMethodDescriptorType)) and not isinstance(static, type)):
        return _STOP
    try:
        return getattr(obj, name)
    except AttributeError:
        return _MISSING


# ---- state trees -----------------------------------------------------------------------------

@dataclasses.dataclass
class StateTree:
    """The nodes of a set of reads (Note [State guards]), with each node's path and words."""

    nodes: list[Node]
    description: list[str]

    def program(self) -> tuple | None:
        """As the Dispatcher's ``_set_state`` reads it (None: nothing to check)."""
        if not self.nodes:
            return None
        return (0, tuple((n.parent, n.access, n.key, n.check, n.expect, n.length, n.keys)
                         for n in self.nodes))

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.description).encode()).hexdigest()[:32]


def _words(obj) -> str:
    """Stable words for an object checked by identity: the same in every process where the
    object means the same (functions by their code, kernels by their source)."""
    if isinstance(obj, (types.FunctionType, types.CodeType)):
        h = hashlib.sha256()
        hash_code(h, getattr(obj, "__code__", obj))
        return f"{type(obj).__name__} {getattr(obj, '__qualname__', '')} {h.hexdigest()[:16]}"
    if isinstance(obj, property):
        return "property " + " ".join(_words(f) if f is not None else "-"
                                      for f in (obj.fget, obj.fset, obj.fdel))
    if isinstance(obj, (types.MethodDescriptorType, types.GetSetDescriptorType,
                        types.WrapperDescriptorType, types.MemberDescriptorType,
                        types.ClassMethodDescriptorType)):  # a C type's method: by its name
        owner = obj.__objclass__
        return f"{type(obj).__name__} {owner.__module__}.{owner.__qualname__}.{obj.__name__}"
    if isinstance(obj, (staticmethod, classmethod)):
        return f"{type(obj).__name__} {_words(obj.__func__)}"
    if isinstance(obj, _kernel_types()):  # its function's reads are chains of their own
        return f"triton {type(obj).__name__} of {_words(obj.fn)}"
    if isinstance(obj, logging.Logger):
        return f"logger {obj.name}"
    if isinstance(obj, _op_types()[0]):  # a custom op: one per name, in every process
        return f"custom op {obj._namespace}::{obj._name}"
    return identity_words(obj)


def _tensor_words(t: torch.Tensor) -> str:
    data = t.detach().cpu().contiguous().reshape(-1)  # (a 0-dim tensor has no byte view)
    digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return f"tensor {t.dtype} {tuple(t.shape)} {t.device} {digest.hexdigest()[:16]}"


class _StateFlattener(_Flattener):
    what = "global"

    def add(self, value, node: Node, words: str) -> int:
        index = super().add(value, node, words)
        if node.access == ROOT:  # its key is the object: named by the words alone
            self.description[index] = f"root|{words}"
        return index

    def words(self, value) -> str:
        return _words(value)

    def tensor(self, value, node: Node) -> None:
        if value.is_inference():  # (torch.inference_mode): written there without a trace
            raise TridentError(f"the global {node.path} is an inference tensor, which has no "
                               "version counter to guard its values by; pass it as an argument")
        self.add(value, dataclasses.replace(node, check=TENSOR, expect=value,
                                            length=value._version), _tensor_words(value))


@functools.cache
def _op_types() -> tuple:
    """Operators (a ``torch.library.custom_op``, ``triton_op``, ``torch.ops`` packets): their
    calls are steps of the plan, which the dispatcher serves on every call; checked by
    identity."""
    from torch._library.custom_ops import CustomOpDef

    return (CustomOpDef, torch._ops.OpOverload, torch._ops.OpOverloadPacket)


def _by_id(value) -> bool:
    return isinstance(value, (_BY_ID, logging.Logger, *_op_types())) or \
        bool(_kernel_fns(value)) or \
        type(value).__name__ == "JitFunction"


def build(reads: list[Read], fn) -> StateTree:
    """The state tree of ``reads`` as they evaluate now (Note [State guards]).

    Raises:
        TridentError: a value read that no check can see the contents of (a numpy array, an
            object with ``__slots__``), or more than ``MAX_NODES`` values."""
    f = _StateFlattener()
    trie: dict = {}  # (root, steps prefix) -> node index
    for read in sorted(reads, key=lambda r: (repr(r.root), repr(r.steps))):
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
    return f"object {root[1]}:{PROCESS}:fn@{id(fn)}"


def _add_read(f: _StateFlattener, trie: dict, read: Read, fn) -> None:
    obj = _resolve_root(read.root, fn)
    if obj is _MISSING:
        raise TridentError(f"the state root {read.root} is gone")
    key = (read.root,)
    if key not in trie:
        if read.root[0] in ("fn", "builtins"):
            text = getattr(fn, "__qualname__", "fn") if read.root[0] == "fn" else "builtins"
        else:
            text = "" if read.root[1] == getattr(fn, "__module__", None) else read.root[1]
        trie[key] = f.add(obj, Node(-1, ROOT, obj, ID, obj, 0, text), _root_words(read.root, fn))
    parent, parent_obj = trie[key], obj
    came = None  # how the parent was read: (its parent, access, key, trie key)
    library = False  # reading a library's module state (Note [Library state])
    for n, step in enumerate(read.steps):
        last = n == len(read.steps) - 1
        value = _step(parent_obj, step)
        if not library and isinstance(parent_obj, types.ModuleType) and \
                _is_library_module(parent_obj) and value is not os.environ:
            if parent_obj is builtins:
                return  # builtins: fixed (a global that would shadow one is ABSENT)
            library = True
        if library:
            if _library_step(f, trie, key, parent, parent_obj, step, value, last):
                key = key + (step,)
                parent, parent_obj = trie[key], value
                continue
            return
        if value is _STOP and isinstance(parent_obj, types.ModuleType) and \
                type(parent_obj) is types.ModuleType and step[0] == "attr":
            # a module's __getattr__ (PEP 562) serves it: it runs in the trace (its reads are
            # chains) while the name stays unbound in the module
            kid = key + (step,)
            if kid not in trie:
                trie[kid] = f.add(None, Node(parent, GETATTR, step[1], ABSENT, None, 0,
                                             _path_text(f.nodes[parent].path, step)), "absent")
            return
        if value is _STOP:  # Python code serves it (a property, a tensor's __getitem__): the
            if came is not None:  # object it is read from, whole
                grand, access, k, pkey = came
                _use(f, trie, pkey, parent_obj, grand, access, k, f.nodes[parent].path)
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
        if key not in trie:
            trie[key] = f.add(value, _through(value, parent, access, k, path),
                              _through_words(value))
        came = (parent, access, k, key)
        parent, parent_obj = trie[key], value


# Note [Library state]: a library's code and its module state are taken as fixed (its reads
# are not chains), but what user code reads from a library module is guarded, since users
# patch it: `F.gelu = torch.tanh`, `mock.patch("torch.relu", torch.neg)`, `math.pi = 3`.
# Modules and classes are read through by identity, functions and other objects are checked by
# identity (not read into: their contents are the library's), numbers and strings by value.
# torch's global module hooks are checked whole (a hook registered later is seen), and a flag
# that a `torch.backends` module serves from C (`torch.backends.mkldnn.enabled`, a
# `ContextProp`) is read by calling its getter in C; any other value a library module serves
# through Python code (a config module's `__getattr__`, a module-level `__getattr__`) is not
# followed: the function runs eagerly.
_WHOLE_LIBRARY_STATE = {
    "torch.nn.modules.module": ("_global_backward_pre_hooks", "_global_backward_hooks",
                                "_global_forward_hooks", "_global_forward_hooks_always_called",
                                "_global_forward_hooks_with_kwargs", "_global_forward_pre_hooks",
                                "_global_is_full_backward_hook"),
}


def _is_getter(obj) -> bool:
    """A C function of no arguments that reads an interpreter or torch setting without side
    effects: a chain may call it (in C, on every call) and check its result by value."""
    if not isinstance(obj, types.BuiltinFunctionType):
        return False
    if obj.__self__ is sys:
        return obj.__name__ in ("getrecursionlimit", "getswitchinterval",
                                "get_int_max_str_digits", "getdefaultencoding",
                                "getfilesystemencoding")
    return getattr(obj.__self__, "__name__", None) == "torch._C" and \
        obj.__name__.startswith("_get_") and any(
            getattr(p, "getter", None) is obj for m in _backends_modules()
            for p in vars(type(m)).values())


def _backends_modules() -> list:
    return [m for n, m in list(sys.modules.items()) if n.startswith("torch.backends.")
            and type(m) is not types.ModuleType]


def _library_step(f: _StateFlattener, trie: dict, key: tuple, parent: int, parent_obj, step,
                  value, last: bool) -> bool:
    """One step of a chain in a library's state (Note [Library state]): the node it makes;
    True where the chain reads on through ``value`` (a module, a class, a getter's call).

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
        if isinstance(parent_obj, types.ModuleType):  # a config module, a module __getattr__
            raise TridentError(f"the function reads {path}, which the library serves through "
                               "Python code that no guard follows")
        return False
    if value is _STOP or value is _MISSING:
        return False
    access, k = (GETATTR, ()) if step[0] == "call" else (
        (GETATTR, name) if step[0] == "attr" else (GETITEM, name))
    key = key + (step,)
    if key in trie:
        return not last and isinstance(value, (types.ModuleType, type))
    if name in _WHOLE_LIBRARY_STATE.get(getattr(parent_obj, "__name__", None), ()):
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
        me = trie[key] = f.add(value, Node(parent, access, k, TYPE, type(value), 0, path),
                               "method")
        for attr in ("__func__", "__self__"):
            if hasattr(value, attr):
                part = getattr(value, attr)
                f.add(part, Node(me, GETATTR, attr, ID, part, 0, f"{path}.{attr}"),
                      _words(part))
        return False
    if type(value) in _CONSTS and (step[0] == "call" or not callable(value)):
        f.visit(value, parent, access, k, path, True)
        trie[key] = len(f.nodes) - 1
        return False
    trie[key] = f.add(value, Node(parent, access, k, ID, value, 0, path), _words(value))
    return not last and _is_getter(value)  # sys.getrecursionlimit, then its call


def _path_text(parent: str, step: tuple) -> str:
    if step[0] == "call":
        return f"{parent}()"
    if step[0] == "attr":
        return f"{parent}.{step[1]}" if parent else step[1]
    if step[0] == "cell":
        return f"{parent}.cell_contents"
    return f"{parent}[{step[1]!r}]"


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
    if isinstance(value, types.BuiltinMethodType) and not isinstance(
            value.__self__, types.ModuleType) and value.__self__ is not None:
        # a C method of an object (d.items, lst.copy): the object, whole
        me = f.add(value, Node(parent, access, k, TYPE, type(value), 0, path), "builtin method")
        trie[whole] = me
        _use(f, trie, whole + ("s",), value.__self__, me, GETATTR, "__self__",
             owner[1] if owner[1] and value.__self__ is owner[0] else f"{path}.__self__")
        return
    if _by_id(value):
        trie[whole] = me = f.add(value, Node(parent, access, k, ID, value, 0, path),
                                 _words(value))
        if isinstance(value, type) and _is_user_class(value):
            # a user class used whole may reach a local the scan does not follow (returned
            # by a call: c = pick(); c.k): its numbers and strings, through its MRO
            names = {n for c in value.__mro__ if _is_user_class(c) for n in vars(c)
                     if not (n.startswith("__") and n.endswith("__"))}
            for name in sorted(names):
                data = _step(value, ("attr", name))
                if type(data) in _CONSTS and (whole + ("attr", name)) not in trie:
                    trie[whole + ("attr", name)] = len(f.nodes)
                    f.visit(data, me, GETATTR, name, f"{path}.{name}", True)
        return
    before = len(f.nodes)
    try:
        f.visit(value, parent, access, k, path, True)
    except RecursionError:
        raise TridentError(f"the global {path} is nested too deeply to guard") from None
    trie[whole] = before

