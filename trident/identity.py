"""Identity: what makes two functions, code objects or objects "the same" across calls and
processes. The cache keys a function's folder by it (Note [Function key]), argument and state
trees name what they check by identity with it.

Note [Function key]: the function's bytecode and constants, nested code objects, default
arguments, closure cells, the globals its code names (functions by their own key, modules by
name, plain values by repr, other objects by their attributes, their ``__slots__``, or by
repr, or, having none of these, by identity in this process only: Note [Identity serials] in serials.py), a bound method's ``self``
likewise, and the versions of Python, torch, triton, torch-mlir and Trident's own source. A
``torch.compile`` graph (a ``GraphModule``'s ``forward``, backend.py) is keyed by what decides
its code (``_hash_graph_module``), not by Dynamo's metadata, which holds a per-process uuid:
so identical runs find the graph's entry again.
"""

from __future__ import annotations

import dis
import enum
import functools
import hashlib
import importlib.metadata
import re
import sys
import types
import uuid
import weakref
from pathlib import Path
from typing import Any

import torch

from trident import config
from trident.serials import object_serial

PROCESS = uuid.uuid4().hex  # keys of objects hashed by identity never match another process
# The keyword arguments of torch's triton_kernel_wrapper_mutation: a graph node that has them
# launches a kernel of Dynamo's kernel_side_table (torch 2.11-2.13).
_LAUNCH_KWARGS = {"kernel_idx", "constant_args_idx"}


def jitted_code(value):
    """The function a ``trident.jit`` object compiles (its ``__trident_code__``), or None."""
    return getattr(type(value), "__trident_code__", None) and value.__trident_code__


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


# The command line and the entries of the benchmarks (which live in benchmarks/, outside the
# package) compile nothing: editing them must not invalidate every user's cached functions.
_OUTSIDE_THE_KEY = re.compile(r"bench\.py|demo\.py|__main__\.py")


def keyed_sources() -> list[Path]:
    """Trident's own files that shape what it compiles: every stage, the runtime, the
    templates; not the benchmarks, the demo or the command line."""

    here = config.PACKAGE_DIR
    files = sorted(p for p in here.rglob("*.py") if not _OUTSIDE_THE_KEY.fullmatch(p.name))
    files += sorted((here / "runtime").glob("*.[hc]*"))
    return files + sorted(p for d in config.TEMPLATE_DIRS for p in Path(d).glob("*.jinja"))


@functools.cache
def version_parts() -> dict[str, str]:
    """Python, torch, triton, torch-mlir, and Trident's own version and source
    (``keyed_sources``): a change to any of them makes new cache entries."""
    own = hashlib.sha256()
    for path in keyed_sources():
        own.update(path.read_bytes())
    return {"python": sys.version, "torch": torch.__version__, "triton": _dist_version("triton"),
            "torch-mlir": _dist_version("torch-mlir"),
            "trident": f"{config.VERSION}, source {own.hexdigest()}"}


_GLOBAL_OPS = {"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME",
               "DELETE_NAME", "LOAD_FROM_DICT_OR_GLOBALS"}  # (the last: Python 3.12)


def code_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code nested in it read or write (``co_names`` less its
    attribute and import names: ``x.t()`` names no global ``t``)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


_FX_FILE = re.compile(r"^<eval_with_key>\.\d+$")


def hash_code(h, code: types.CodeType) -> None:
    """Feeds ``h`` what decides a code object's behaviour: its file (generated C names it; errors
    quote it), bytecode, names, local and free variable names, constants and nested code."""
    # torch.fx's generated code is filed as "<eval_with_key>.N", N counting the process's
    # GraphModules so far: the code is hashed, not how many graphs came before it
    h.update(_FX_FILE.sub("<eval_with_key>", code.co_filename).encode())
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            hash_code(h, const)
        else:
            h.update(repr(const).encode())


def _has(value, name: str) -> bool:
    """``hasattr``, for objects whose ``__getattr__`` raises something else than
    AttributeError for names they lack (a KeyError)."""
    try:
        return hasattr(value, name)
    except Exception:  # noqa: BLE001 (the object's own error: it has no such attribute)
        return False


def _hash_value(h, value: Any, seen: set[int], depth: int) -> None:
    if id(value) in seen or depth > 4:
        h.update(b"<seen>")
        return
    seen.add(id(value))
    if isinstance(value, types.FunctionType):
        _hash_function(h, value, seen, depth + 1)
    elif jitted_code(value) is not None:  # its code, not its counters and graphs
        h.update(b"trident.jit:")
        _hash_value(h, jitted_code(value), seen, depth + 1)
    elif isinstance(value, torch.fx.GraphModule):
        _hash_graph_module(h, value, seen, depth + 1)
    elif isinstance(value, types.ModuleType):
        h.update(f"module:{value.__name__}".encode())
    elif isinstance(value, type):
        h.update(f"type:{value.__module__}.{value.__qualname__}".encode())
    elif isinstance(value, (int, float, str, bool, bytes, type(None), torch.dtype, torch.device)):
        h.update(f"{type(value).__name__}:{value!r}".encode())
    elif isinstance(value, (tuple, list)):
        for item in value:
            _hash_value(h, item, seen, depth + 1)
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _hash_value(h, value[k], seen, depth + 1)
    elif _has(value, "fn") and _has(value, "src"):  # a Triton JITFunction
        h.update(f"triton:{value.src}".encode())
    elif _has(value, "fn"):  # Triton's Autotuner / Heuristics wrap another kernel
        for tuned in getattr(value, "configs", None) or ():
            h.update(repr(tuned).encode())
        for name, heuristic in (getattr(value, "values", None) or {}).items():
            h.update(name.encode())
            _hash_value(h, heuristic, seen, depth + 1)
        _hash_value(h, value.fn, seen, depth + 1)
    elif isinstance(value, torch.Tensor):  # one-element tensors are baked in: their value too
        h.update(f"tensor:{value.dtype}{tuple(value.shape)}".encode())
        if value.numel() == 1:
            h.update(repr(value.item()).encode())
    elif hasattr(value, "__dict__"):  # plain objects (configs, namespaces): their attributes
        h.update(f"object:{type(value).__module__}.{type(value).__qualname__}".encode())
        _hash_value(h, dict(vars(value)), seen, depth + 1)
    elif type(value).__repr__ is not object.__repr__ and not _ADDRESS.search(repr(value)):
        # numpy scalars, enums, ...: their repr (not one that shows an address: a lock's)
        h.update(f"repr:{type(value).__module__}.{type(value).__qualname__}:{value!r}".encode())
    elif _slots(type(value)):  # __slots__ objects: their slots' values
        h.update(f"slots:{type(value).__module__}.{type(value).__qualname__}".encode())
        for name in _slots(type(value)):
            h.update(name.encode())
            _hash_value(h, getattr(value, name, _Unset), seen, depth + 1)
    elif isinstance(value, types.BuiltinFunctionType) and _module_builtin(value):
        h.update(f"builtin:{value.__module__}.{value.__name__}".encode())  # Note [Builtins by name]
    else:  # no content to hash (a C object): this object, in this process only
        _IDENTITY_HASHES[0] += 1  # (Note [Key parts])
        h.update(f"object:{type(value).__qualname__}#{object_serial(value)}:{PROCESS}".encode())


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}|@\d{6,}")


def named_at(module, qualname: str):
    """What the dotted ``qualname`` names in ``sys.modules[module]``, or None: no such module or
    name (a module ``__getattr__`` that raises anything: none)."""
    target = sys.modules.get(module) if isinstance(module, str) else None
    if target is None:
        return None
    try:
        for part in qualname.split("."):
            target = getattr(target, part, None)
    except Exception:  # noqa: BLE001 (the module's own error: no such name)
        return None
    return target


# Note [Builtins by name]: a builtin function that its module holds under its own name
# (``torch._C._is_tracing``: a pybind11 function, whose repr shows the address of its
# function record) is hashed by that name, the same in every process of the versions the key
# holds. It was hashed by identity (its repr shows an address), so a closure over one had a
# key of one process only: Dynamo's wrapper of a compiled call closes over
# ``torch._C._is_tracing``, and a model that transformers' ``CompileConfig`` had compiled (its
# ``_compiled_call``) gave every new process another argument tree for ``trident.jit`` of its
# forward: no stored specialization of it was ever loaded. A builtin method bound to an object
# (``[].append``) is not its module's, and stays hashed by identity.

def _module_builtin(fn) -> bool:
    """Note [Builtins by name]: whether ``fn`` is what its module holds under its name."""
    return named_at(getattr(fn, "__module__", None), getattr(fn, "__name__", "")) is fn


class _Unset:  # an empty __slots__ slot
    pass


def _slots(t: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``t`` and its bases (empty for a type without them)."""
    names = []
    for base in t.__mro__:
        declared = base.__dict__.get("__slots__", ())
        names += [declared] if isinstance(declared, str) else list(declared)
    return tuple(n for n in names if n not in ("__dict__", "__weakref__"))


def _hash_graph_module(h, gm: torch.fx.GraphModule, seen: set[int], depth: int) -> None:
    """A GraphModule (``torch.compile``'s graph, backend.py) by what decides its code: its
    generated ``forward`` (the function: its source, file name and globals), every attribute a
    node reads (a constant tensor by its bytes, a subgraph by its own code), and the Triton
    kernel and constant arguments of each launch, which Dynamo's graph names by their index in
    a table of this process (``kernel_side_table``). Not Dynamo's metadata (``meta``, a
    ``backend_id`` of a per-process uuid), which never reaches the code."""
    h.update(f"graph:{gm.code}".encode())
    _hash_function(h, type(gm).forward, seen, depth)
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            h.update(node.target.encode())
            if isinstance(value, torch.Tensor):
                h.update(f"tensor:{value.dtype}{tuple(value.shape)}{value.stride()}".encode())
                h.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8)
                         .numpy().tobytes())
            else:
                _hash_value(h, value, seen, depth + 1)
        elif node.op == "call_function" and _LAUNCH_KWARGS <= node.kwargs.keys():
            from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

            kernel, constants = node.kwargs["kernel_idx"], node.kwargs["constant_args_idx"]
            _hash_value(h, kernel_side_table.get_kernel(kernel), seen, depth + 1)
            _hash_value(h, kernel_side_table.get_constant_args(constants), seen, depth + 1)


def _hash_function(h, fn: types.FunctionType, seen: set[int], depth: int) -> None:
    parts = h if isinstance(h, _KeyParts) else None  # the key's top level (Note [Key parts])
    if parts:
        h = parts.part("function", f"{fn.__module__}.{fn.__qualname__}")
    h.update(f"{fn.__module__}.{fn.__qualname__}".encode())
    if isinstance(fn, types.MethodType):  # a bound method: what it reads through self
        graph = isinstance(fn.__self__, torch.fx.GraphModule)
        if parts:
            h = parts.part("graph" if graph else "self", _what(fn.__self__))
        _hash_value(h, fn.__self__, seen, depth)
        if graph:  # its forward was hashed with it
            return
    if parts:
        h = parts.part("code", "bytecode and constants")
    hash_code(h, fn.__code__)
    for i, default in enumerate(fn.__defaults__ or ()):
        if parts:
            h = parts.part(f"default {i}", _what(default))
        _hash_value(h, default, seen, depth)
    for name, default in sorted((fn.__kwdefaults__ or {}).items()):
        if parts:
            h = parts.part(f"default {name}", _what(default))
        h.update(name.encode())
        _hash_value(h, default, seen, depth)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        if parts:
            h = parts.part(f"closure {name}", _what(_cell(cell)))  # (_Unset: empty)
        try:
            _hash_value(h, cell.cell_contents, seen, depth)
        except ValueError:  # empty cell
            h.update(b"<empty>")
    for name in sorted(code_names(fn.__code__)):
        if name in fn.__globals__:
            if parts:
                h = parts.part(f"global {name}", _what(fn.__globals__[name]))
            h.update(name.encode())
            _hash_value(h, fn.__globals__[name], seen, depth)


# Note [Key parts]: a function key (Note [Function key]) hashes the SHA-256 of each part in
# turn (each version, the name, self or its graph, the code, each default, closure cell and
# global; one walk: an object two parts reach is hashed in the first). ``function.json`` keeps
# each part's words (``_what``) and digest, so ``python3 -m trident list`` names what tells two
# folders of one function apart: a global that is a Triton ``InterpretedFunction`` in one
# (``TRITON_INTERPRET=1``), another torch, an object hashed by identity ("this process only").
_IDENTITY_HASHES = [0]  # objects hashed by identity so far (``_hash_value``'s last branch)


class _KeyParts:
    def __init__(self) -> None:
        self.parts: dict[str, list] = {}  # label -> [words, its SHA-256, identity hashes before]

    def part(self, label: str, words: str):  # a new part's hash, to feed
        self.parts[label] = [words, hashlib.sha256(), _IDENTITY_HASHES[0]]
        return self.parts[label][1]


def _what(value: Any) -> str:
    """Note [Key parts]: a key part's words (an empty closure cell: ``_Unset``)."""
    if value is _Unset:
        return "empty"
    if isinstance(value, (int, float, bool, type(None), torch.dtype, torch.device)) or \
            isinstance(value, str) and len(value) <= 40:
        return repr(value)
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, (type, types.FunctionType, types.MethodType)):
        return f"{'class' if isinstance(value, type) else 'function'} " \
            f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return f"{type(value).__module__}.{type(value).__qualname__}"


def key_parts(fn) -> dict[str, tuple[str, str]]:
    """Note [Key parts]: each part of ``fn``'s function key: (its words, its SHA-256)."""
    h = _KeyParts()
    for label, version in version_parts().items():
        h.part(label, version.split()[0] if label == "python" else version[:38]).update(
            version.encode())
    _hash_function(h, fn, set(), 0)
    ends = [before for _, _, before in h.parts.values()][1:] + [_IDENTITY_HASHES[0]]
    return {label: (words + " (this process only)" * (end > before), sha.hexdigest())
            for (label, (words, sha, before)), end in zip(h.parts.items(), ends)}


def key_of(parts: dict[str, tuple[str, str]]) -> str:
    """The function key (Note [Function key]) of its parts (``key_parts``)."""
    h = hashlib.sha256()
    for label, (_, digest) in parts.items():
        h.update(f"{label}={digest};".encode())
    return h.hexdigest()[:20]


def function_key(fn) -> str:
    """Note [Function key]."""
    return key_of(key_parts(fn))


# Note [Objects of one name]: an argument checked by identity (an ID node: a function, a
# bound method, a module, a builtin) is described by words that name it in every process where
# they can (``stable_words``): a function by its key (Note [Function key]), a module by its
# name. Two live objects can share those words: two closures of one ``def`` whose cells differ
# where the key does not look (past its depth, a tensor's values, a cell rebound after the
# words were fixed at its first sight), two module objects of one name. The dispatcher's tree
# checks the object itself, but a call of the other object goes to the miss path, whose tree
# has the same key: the specialization traced with the first object served the second (its
# state guards check the first object's cells). So the miss path keys such a call's tree apart
# (Note [Classes of one name] in frontend/install.py) unless ``same_object`` says the two
# objects behave alike: the same object; bound methods of the same function and object (or
# of an object the words name by its path in the tree, which checks it there); or
# functions of one code object and globals dict whose defaults, keyword defaults, attributes
# and closure cells hold the same objects or equal numbers, strings and tuples of them (read at
# each miss, so a cell rebound since is seen).

def same_object(a: Any, b: Any, bound_by_path: bool = False) -> bool:
    """Note [Objects of one name]: whether ``b``, checked by identity where ``a`` was, behaves
    as ``a`` does in every call. ``bound_by_path``: their words bind a method to the object at
    a path of the tree, which the tree checks (so its object need not be the same)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, types.MethodType):
        return (bound_by_path or a.__self__ is b.__self__) and same_object(a.__func__,
                                                                          b.__func__)
    if isinstance(a, types.FunctionType):
        return (a.__code__ is b.__code__ and a.__globals__ is b.__globals__
                and _same_values(a.__defaults__ or (), b.__defaults__ or ())
                and _same_values(sorted((a.__kwdefaults__ or {}).items()),
                                 sorted((b.__kwdefaults__ or {}).items()))
                and _same_values(sorted(vars(a).items()), sorted(vars(b).items()))
                and _same_values([_cell(c) for c in a.__closure__ or ()],
                                 [_cell(c) for c in b.__closure__ or ()]))
    if jitted_code(a) is not None:
        return same_object(jitted_code(a), jitted_code(b), bound_by_path)
    return False


def _cell(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # empty
        return _Unset


def _same_values(a, b) -> bool:
    """Items of ``a`` and ``b`` are the same objects, equal immutable values of one type
    (floats by their repr: -0.0, nan) or functions ``same_object`` makes alike."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if type(x) in (int, bool, str, bytes):
            ok = x == y
        elif type(x) in (float, complex):
            ok = repr(x) == repr(y)
        elif type(x) is tuple:
            ok = _same_values(x, y)
        else:
            ok = isinstance(x, (types.FunctionType, types.MethodType)) and same_object(x, y)
        if not ok:
            return False
    return True

# An identity-checked function's words, fixed at its first sight in this process: the native
# check is by identity, and its Python twin must agree with it. Recomputed at each miss, a
# function whose globals change between calls (a wrapper that counts its calls) would give an
# unchanged call a new tree, and a recompile, on every slow-path call.
_FUNCTION_WORDS: "weakref.WeakKeyDictionary[types.FunctionType, str]" = weakref.WeakKeyDictionary()


def stable_words(obj: Any) -> str:
    """Words for an object checked by identity, the same in every process where they can be."""
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        fn = obj.__func__ if isinstance(obj, types.MethodType) else obj
        if fn not in _FUNCTION_WORDS:
            _FUNCTION_WORDS[fn] = f"function {fn.__module__}.{fn.__qualname__} {function_key(fn)}"
        return _FUNCTION_WORDS[fn]
    return identity_words(obj)


# Note [Enum values]: an enum member is one object per member in a process, checked by identity
# where it is read (``E.A``, ``E.A.value``: a ``value`` that Python code serves, read through
# the member whole), and named the same in every process. Its value is fixed in a process but
# not between two: a source that edits ``A = 2.0`` into ``A = 3.0`` made the same words, and a
# new process loaded the stored specialization of the old value. So a member's words hold its
# value's hash (a value without contents to hash names this process only).


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
    if isinstance(obj, enum.Enum):  # one object per member of its class, in every process;
        # its value too (Note [Enum values])
        h = hashlib.sha256()
        _hash_value(h, obj._value_, set(), 0)
        return (f"enum {type(obj).__module__}.{type(obj).__qualname__}.{obj.name} "
                f"= {h.hexdigest()[:16]}")
    # this process only (Note [Identity serials])
    return f"object {type(obj).__qualname__}#{object_serial(obj)}:{PROCESS}"
