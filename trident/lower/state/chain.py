"""A chain (Note [State guards]): :class:`Read`, a root and its steps; the objects a root names
(``_root_of``, ``_resolve_root``); one step's value in Python (``_step``: a value, an absent
name or item, or one that Python code serves); and the Triton kernels and C getters that a
chain may reach."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import importlib
import inspect
import os
import sys
import threading
import types
from typing import Any

from trident import frames
from trident.errors import TridentError
from trident.identity import named_at
from trident.serials import object_serial, serial_object

_MISSING = object()  # a read of a name or item that is absent
_STOP = object()  # a read that Python code (a property, __getattr__) would serve


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


# Note [Object roots]: ("object", token) roots name objects no module path reaches (a class
# defined in a function, the globals dict of exec'd code). A token is the object's serial
# (Note [Identity serials] in serials.py: one table for the package), never reused: a new
# object at a dead one's address gets a new token. The table does not keep its objects alive
# (a weak reference) or keeps a bounded number (an object that takes none: a dict). The state
# trees of the specializations hold their roots themselves while they live; a stored chain
# whose root has gone (died, or dropped from the table) no longer evaluates, and its
# specialization is not installed (install.py).


def _object_root(obj) -> tuple:
    """The ("object", token) root of ``obj`` (Note [Object roots])."""
    return ("object", f"{type(obj).__name__}#{object_serial(obj)}")


def _resolve_object(token: str) -> Any:
    serial = token.rpartition("#")[2]
    held = serial_object(int(serial)) if serial.isdigit() else None
    return _MISSING if held is None else held


def _root_of(obj) -> tuple[tuple, tuple]:
    """(root, steps) naming ``obj``: its module (one that ``sys.modules`` holds), then its
    qualified name, when that path reaches it (through a property to its getter, setter or
    deleter: ``m.C.prop.fget``), or else the module's own name for it (a
    ``namedtuple`` bound under another name: ``functools._CacheInfo``, qualname
    ``CacheInfo``); else the object itself, in this process only (Note [Object roots])."""
    if isinstance(obj, types.ModuleType) and sys.modules.get(obj.__name__) is obj:
        return ("module", obj.__name__), ()  # (one not in sys.modules: the object itself)
    name, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is not None and "<locals>" not in qualname:
        target = named_at(name, qualname)
        if target is obj:
            return ("module", name), tuple(("attr", part) for part in qualname.split("."))
        if isinstance(target, property):  # a property's getter, setter or deleter
            found = next((a for a in ("fget", "fset", "fdel") if getattr(target, a) is obj),
                         None)
            if found is not None:
                return ("module", name), tuple(("attr", part) for part in qualname.split(
                    ".")) + (("attr", found),)
    if module is not None and isinstance(obj, (type, types.FunctionType)):
        held = sorted(k for k, v in list(vars(module).items())
                      if v is obj and isinstance(k, str))
        if held:
            return ("module", name), (("attr", held[0]),)
    return _object_root(obj), ()


def _globals_root(g: dict) -> tuple[tuple, str]:
    """(root, step kind) for a globals dict: its module (read by getattr) or the dict itself."""
    name = g.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is not None and module.__dict__ is g:
        return ("module", name), "attr"
    return _root_of_dict(g), "item"


def _root_of_dict(g: dict) -> tuple:
    return _object_root(g)


def _resolve_root(root: tuple, fn) -> Any:
    """The object a root names now; ``_MISSING`` when it names none."""
    kind = root[0]
    if kind == "fn":
        return fn
    if kind == "builtins":
        return builtins
    if kind == "module":
        return sys.modules.get(root[1], _MISSING)
    return _resolve_object(root[1])


@functools.cache
def _kernel_types() -> tuple:
    """Triton's callables that wrap a Python function: kernels (autotuners and heuristics
    around them) and, in triton 3.6, ``JITCallable``s such as the ``ConstexprFunction``s
    ``triton.cdiv`` and ``triton.next_power_of_2`` that a launch's grid calls on the host."""
    from triton.runtime import jit
    from triton.runtime.interpreter import InterpretedFunction

    return (jit.KernelInterface, InterpretedFunction) + (
        (jit.JITCallable,) if hasattr(jit, "JITCallable") else ())


def _kernel_fns(value) -> list:
    """The Python functions of a Triton kernel (through autotuners and heuristics)."""
    fns = []
    while isinstance(value, _kernel_types()):
        value = value.fn
        if isinstance(value, types.FunctionType):
            fns.append(value)
    return fns


# torch's thread-local or global settings that no call-wide guard covers, read the same in a
# trace as at a call (not a trace's own state, as _is_torch_function_mode_enabled is); the
# settings of the second line, read through torch._C by user code, were taken as constants
# (``torch._C._get_deterministic_fill_uninitialized_memory()``: stale, session 49).
_TORCH_GETTERS = frozenset({"is_anomaly_enabled", "is_anomaly_check_nan_enabled",
                            "get_num_interop_threads", "_get_warnAlways",
                            "_get_deterministic_fill_uninitialized_memory",
                            "_get_cpu_allow_fp16_reduced_precision_reduction",
                            "_get_cublas_allow_fp16_accumulation", "_get_cublas_allow_tf32",
                            "_get_cublas_allow_fp16_reduced_precision_reduction",
                            "_get_cublas_allow_bf16_reduced_precision_reduction",
                            "_get_math_sdp_allow_fp16_bf16_reduction", "_get_qengine",
                            "_get_backcompat_broadcast_warn", "_get_backcompat_keepdim_warn",
                            "_get_autograd_fallback_mode"})


def _is_getter(obj) -> bool:
    """A C function of no arguments that reads an interpreter or torch setting without side
    effects: a chain may call it (in C, on every call) and check its result by value."""
    if not isinstance(obj, types.BuiltinFunctionType):
        return False
    if obj.__self__ is sys:
        return obj.__name__ in ("getrecursionlimit", "getswitchinterval",
                                "get_int_max_str_digits", "getdefaultencoding",
                                "getfilesystemencoding")
    if getattr(obj.__self__, "__name__", None) == "torch._C" and obj.__name__ in _TORCH_GETTERS:
        return True
    return getattr(obj.__self__, "__name__", None) == "torch._C" and \
        obj.__name__.startswith("_get_") and any(
            getattr(p, "getter", None) is obj for m in _backends_modules()
            for p in vars(type(m)).values())


# Note [Library objects read into]: an attribute of a library's object that user code reads
# through its module (``torch._tensor_str.PRINT_OPTS.precision``, which ``torch.
# set_printoptions`` sets; ``json._default_encoder.indent``) ended the chain at the object,
# checked by identity only, so a hit returned the trace's answer after the attribute changed
# (stale, CPU machine, session 49), where the same object bound to a user global was read into.
# A plain object (``_plain_object``; not one that tree.py's ``_by_id`` names) is now read into
# as a user's object is: its exact type, then each attribute read, by its kind, at every call;
# an attribute that Python code serves (a property) makes the call eager, and so does a chain
# that reads on through a logger (``logging.root.level``: a logger is checked by identity). An
# object whose class has a ``__getattr__`` (``torch.backends.cuda.matmul``, whose flags are
# call-wide guards) is still checked by identity only.
_READ_INTO = object()  # what tree.py's _library_step answers for such an object


def _plain_object(value) -> bool:
    kind = type(value)
    return kind.__getattribute__ is object.__getattribute__ and \
        not hasattr(kind, "__getattr__") and \
        isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, (
            types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
            types.MethodType, functools.partial, threading.local))


def _backends_modules() -> list:
    return [m for n, m in list(sys.modules.items()) if n.startswith("torch.backends.")
            and type(m) is not types.ModuleType]


def _values_along(read: Read, fn):
    obj = _resolve_root(read.root, fn)
    yield obj
    for step in read.steps:
        obj = _step(obj, step)
        if obj is _MISSING or obj is _STOP:
            return
        yield obj



# Note [Module dicts]: a module's attributes are read from its dict (in C too: ``read_state``
# in runtime/trees.cpp), where ``__dict__`` itself is not: ModuleType serves it. So
# ``m.__dict__["K"]``, ``vars(m)["K"]`` and ``m.__dict__.get("K")`` read ``__dict__`` as an
# absent name, which held at every call, and K was no guard's: a hit returned the trace's K
# after ``m.K = ...``. Both read ``__dict__`` of a plain module as the module's dict, whose
# items are then read by key as any dict's.


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
        if not isinstance(obj, (dict, list, tuple, types.MappingProxyType)) or \
                type(obj).__getitem__ not in (dict.__getitem__, list.__getitem__,
                                              tuple.__getitem__,
                                              types.MappingProxyType.__getitem__):
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
        if value is _MISSING and name == "__dict__":  # Note [Module dicts]
            return obj.__dict__
        if value is _MISSING and name in vars(types.ModuleType):  # mod.__getattribute__: a
            return getattr(obj, name)  # method of its object (Note [Modules used whole])
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


def _imported(name: str) -> tuple[tuple, tuple]:
    """(root, steps) of the module an import inside the function binds: ``sys.modules[name]``
    as it is at each call (a module replaced there is what the next ``import`` returns)."""
    return ("module", "sys"), (("attr", "modules"), ("item", name))



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
        if step[0] == "call1" and type(step[1]) is str and step[1] in sys.modules and (
                obj is builtins.__import__ or obj is importlib.import_module):
            # importlib.import_module("a.b") is a.b, __import__("a.b") is a
            name = step[1] if obj is importlib.import_module else step[1].partition(".")[0]
            (root, path), obj = _imported(name), sys.modules[name]
            done = list(path)
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


def _descriptor_owner(obj, step: tuple):
    """The user class whose ``__dict__`` holds the descriptor object that serves ``obj.name``
    (an instance of a user class with ``__get__``: not a function, property or method, whose
    state is Python's), or None."""
    name = step[1]
    classes = (*type(obj).__mro__, *obj.__mro__) if isinstance(obj, type) else type(obj).__mro__
    for klass in classes:
        found = vars(klass).get(name, _MISSING)
        if found is not _MISSING:
            kind = type(found)
            return klass if frames.user_class(kind) and hasattr(kind, "__get__") and \
                frames.user_class(klass) else None
    return None
