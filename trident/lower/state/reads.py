"""The reads of a recorded trace (Note [State guards]): the chains of every user function that
ran, resolved to :class:`Read` roots and steps that a new call evaluates."""

from __future__ import annotations

import builtins
import dis
import importlib
import os
import sys
import types

import torch

from trident import frames
from trident.errors import TridentError
from trident.ir.trees import _BY_ID
from trident.lower import orders
from trident.lower.state.bytecode import _chains, library_type_read, tensor_type_read
from trident.lower.state.callables import _SCAN_BOUND, _called_arguments, _functions_in
from trident.lower.state.chain import (_MISSING, _STOP, Read, _globals_root, _is_getter,
                                       _kernel_fns, _resolve_root, _root_of, _root_of_dict,
                                       _step, _values_along)
from trident.lower.state.library import library_reads
from trident.lower.state.recording import Recording
from trident.lower.state.roots import forward_reads, reach, reached_root, registry_reads
from trident.lower.state.tree import _WHOLE_LIBRARY_STATE


def reads_of(rec: Recording, fn) -> list[Read]:
    """Note [State guards]: the chains of every user function that ran in ``rec`` (and of the
    Triton kernels they name), rooted where a new call reads them.

    Raises:
        TridentError: the function calls something whose result no guard keeps, started a
            user function that writes outside its arguments (Note [Writes at entry], when
            user code caught the refusal), reads a tensor's Python type, or reads a closure
            variable whose cell cannot be found again."""
    drawn = rec.put_back_draws()  # Note [Draws of a trace] (draws.py)
    if rec.impure:
        raise TridentError(f"the function calls {rec.impure[0]}(), whose result a "
                           "specialization would keep (Python's random state, a "
                           "torch.Generator's, the clock, the OS, a file, the interpreter's "
                           "frames, eval'd code, the trace's own state)")
    if drawn:
        raise TridentError(f"the function draws from a {drawn[0]}, whose result a "
                           "specialization would keep (its state is put back: the call runs "
                           "eagerly and draws once)")
    slot = orders.slot_loaded(rec, ordered_dicts=True)  # Note [Orders of an OrderedDict]
    if rec.storage_orders or slot:  # (recording.py)
        raise TridentError(f"the function reads an OrderedDict through "
                           f"{rec.storage_orders[0] + '()' if rec.storage_orders else slot}, in "
                           "the order of the dict it is built on, which Trident does not guard")
    if rec.refused:  # (a user function the trace started writes outside: Note [Writes at
        raise TridentError(rec.refused)  # entry]; the error was caught by user code)
    for code, (g, params) in rec.codes.items():
        typed = tensor_type_read(code, g, params)
        if typed is not None:
            raise TridentError(f"the function reads a tensor's Python type, {typed}: the "
                               "trace's fake tensors have another")
    # Note [Tensor types and attributes] in ir/guards.py: library code's reads of a type
    for code, g, params in rec.library_tensors.values():
        typed = library_type_read(code, g, params)
        if typed is not None:
            raise TridentError(f"library code the function runs ({code.co_qualname}) reads a "
                               f"tensor's Python type, {typed}: the trace's fake tensors have "
                               "another")
    functions = {}  # code -> function object, for closure cells
    if isinstance(fn, types.FunctionType):
        functions[fn.__code__] = fn
    called, truncated = _called_arguments(rec, fn)
    for value in called:  # functions passed in: their code, defaults and cells, as a global
        functions.setdefault(value.__code__, value)  # helper's
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

    reached: dict = {}  # id of an object -> (root, steps) of a chain that reached it
    # (Note [Reached roots])

    def add(read: Read) -> None:
        """A chain, and the functions (their closure cells) and kernels it reaches."""
        reads.append(read)
        served = _module_getattr(read, fn)
        if served is not None:  # a module's __getattr__ serves a name: the function too
            add(served)
        for n, value in enumerate(_values_along(read, fn)):
            reach(reached, read, n, value)  # Note [Reached roots] (roots.py)
            for f in _functions_in(value):
                functions.setdefault(f.__code__, f)
            for kfn in _kernel_fns(value):  # a Triton kernel: its code never runs here
                if kfn.__code__ not in seen_kernels:
                    seen_kernels.add(kfn.__code__)
                    functions.setdefault(kfn.__code__, kfn)
                    todo.append((kfn.__code__, (kfn.__globals__, {})))

    for read in forward_reads(rec.module_classes.values()):  # Note [Module forwards]
        add(read)  # (roots.py)
    for read in library_reads(rec.library):  # Note [Library code that ran] (library.py):
        add(read)  # a user function patched into a library module is then found
    # closure chains need the functions other chains reach: resolved as those are found
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
                    if name not in g:
                        # ABSENT: unbound (a dict subclass's __missing__ may serve it: whole)
                        reads.append(Read(root, ((kind, name),), kind == "item"))
                        root, steps0 = _builtins_root(functions.get(code), g, name)
                    else:
                        steps0 = ((kind, name),)
                    read = _resolve_calls(root, steps0 + steps, fn)
                elif start == "param":
                    value, steps = _through_items(params.get(name, _MISSING), steps)
                    for shadow in _lookup_reads(value, steps):
                        add(shadow)
                    read = _param_read(value, steps, fn) if steps else None
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
                if root[0] != "object":
                    reached.setdefault(id(functions[code]), (root, steps + (("attr", name),)))
    unfound = [c for c in rec.codes if c not in functions and c not in parents and
               not c.co_filename.startswith("<")]
    if unfound and truncated:  # Note [Callable arguments] (callables.py): past the scan's bound
        raise TridentError(f"the function calls {unfound[0].co_qualname}, which Trident did not "
                           f"find in the first {_SCAN_BOUND} objects of its arguments: its "
                           "code, defaults and cells are no guard's")
    if unfound:  # Note [Library registries] (roots.py)
        reads += registry_reads(unfound, functions)
    if rec.module_call:  # Module.__call__ reads torch's global hooks (Note [Library state]
        # in tree.py)
        reads += [Read(("module", "torch.nn.modules.module"), (("attr", name),))
                  for name in _WHOLE_LIBRARY_STATE["torch.nn.modules.module"]]
    for f in [f for f in functions.values() if f.__code__ in rec.codes]:  # their defaults
        root, steps = (("fn",), ()) if f is fn else _root_of(f)
        for attr in ("__code__", "__defaults__", "__kwdefaults__"):
            reads.append(Read(root, steps + (("attr", attr),)))
    reads = [reached_root(r, reached, functions, fn) for r in reads]
    return list(dict.fromkeys(reads))


def _builtins_root(f, g: dict, name: str) -> tuple[tuple, tuple]:
    """(root, steps) of the builtin ``name`` that a function of globals ``g`` finds there:
    the function's own ``__builtins__`` (Python takes it from ``g["__builtins__"]`` when the
    function is made), the ``builtins`` module's or a dict of its own (code exec'd with
    ``{"__builtins__": {...}}``), read by item.

    Raises:
        TridentError: builtins of another kind (a mapping that Python code serves)."""
    held = getattr(f, "__builtins__", None) if f is not None else None
    if held is None:
        held = g.get("__builtins__", builtins)
    if held is builtins or held is builtins.__dict__:
        return ("builtins",), (("attr", name),)
    if type(held) is dict:
        return _root_of_dict(held), (("item", name),)
    raise TridentError(f"the function reads the builtin {name} from a {type(held).__name__} "
                       "as its __builtins__: state no guard follows")


def _module_getattr(read: Read, fn) -> Read | None:
    """The chain to the ``__getattr__`` (PEP 562) of the module where ``read`` reads a name
    that it serves, or None. The state tree holds the name as absent (tree.py), and this chain
    the function (by identity; its code, defaults and cells as any function that ran): a
    ``__getattr__`` swapped, edited or deleted is seen."""
    obj = _resolve_root(read.root, fn)
    for n, step in enumerate(read.steps):
        value = _step(obj, step)
        if value is _STOP and type(obj) is types.ModuleType and step[0] == "attr" and \
                "__getattr__" in obj.__dict__:
            return Read(read.root, read.steps[:n] + (("attr", "__getattr__"),))
        if value is _MISSING or value is _STOP:
            return None
        obj = value
    return None


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
        return next((h[name] for h in map(d.get, ("_modules", "_parameters", "_buffers"))
                     if isinstance(h, dict) and name in h), _MISSING)
    return _MISSING


def _through_items(value, steps: tuple) -> tuple:
    """(value, the steps after) of an argument read through its items first (``kw["o"].k``,
    ``args[0].k``, ``d.get("o").k``): the items of a plain dict, list or tuple are the
    argument tree's (checked by identity); what is read through them, a class's attribute
    above all, is the chains' (:func:`_lookup_reads`, :func:`_param_read`)."""
    while steps and type(value) in (dict, list, tuple):
        if steps[0][0] == "item":
            key, steps = steps[0][1], steps[1:]
        elif type(value) is dict and steps[:1] == (("attr", "get"),) and \
                len(steps) > 1 and steps[1][0] == "call1":
            key, steps = steps[1][1], steps[2:]
        else:
            break
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING, ()
    return value, steps


def _lookup_reads(value, steps: tuple) -> list[Read]:
    """Note [Instance lookups]: ``cfg.a`` of an argument, found in its ``__dict__`` (or an
    nn.Module's submodules, parameters, buffers: the argument tree's), is found there only while
    no class of its MRO holds ``a`` as a data descriptor or the like (``Cfg.a = property(...)``
    shadows it; the tree checks the class by identity, not its contents); a name that is absent
    stays absent only while no class gains it or a ``__getattr__``; and either holds only while
    the class's ``__getattribute__`` is the one the trace ran (``Cfg.__getattribute__ = ...``
    assigned later serves every name). So each such step of a user class's instance reads the
    class's ``a`` (``ABSENT``, through its MRO in C) and its ``__getattribute__`` (``ID``:
    ``object``'s slot wrapper, named the same in every process), and for an absent name its
    ``__getattr__`` too. A class with no importable name (``<locals>``) is read as the class
    itself, one of a metaclass that looks names up as ``type`` does (``abc.ABC``'s) like any
    other: neither is taken as fixed."""
    out: list = []
    for step in steps[:16]:
        if step[0] == "item" and type(value) in (dict, list, tuple):  # the argument tree's
            try:  # items (``cache.layers[0].keys``: a property the class gets later)
                value = value[step[1]]
            except (KeyError, IndexError, TypeError):
                break
            continue
        if step[0] != "attr" or not isinstance(step[1], str) or isinstance(
                value, (type, types.ModuleType, torch.Tensor, *_BY_ID)) or value is _MISSING:
            break
        cls, name = type(value), step[1]
        if not any(frames.user_class(c) for c in cls.__mro__) or any(
                name in vars(c) for c in cls.__mro__):
            break  # a library's class (fixed), or one that holds it: _param_read's
        if not _plain_lookup(type(cls)):
            break
        root, path = _root_of(cls)  # (a class with no importable name: the class itself)
        out.append(Read(root, path + (("attr", name),)))
        out.append(Read(root, path + (("attr", "__getattribute__"),)))  # assigned later
        try:  # (not through a __getattr__)
            own = object.__getattribute__(value, "__dict__")
        except Exception:
            own = None
        held = _instance_value(value, own, name)
        if held is _MISSING:
            out.append(Read(root, path + (("attr", "__getattr__"),)))
            break
        value = held
    return out


def _plain_lookup(meta: type) -> bool:
    """Whether classes of metaclass ``meta`` find attributes as ``type`` does (``abc.ABCMeta``,
    an ``nn.Module``'s ``type``): the lookup through the MRO that the reads follow in C."""
    return meta.__getattribute__ is type.__getattribute__ and not any(
        "__getattr__" in vars(m) for m in meta.__mro__)


def _param_read(value, steps: tuple, fn, _depth: int = 0) -> Read | None:
    """``self.factor`` where the parameter's class holds ``factor``, ``type(self).K``,
    ``self.__class__.K`` and a classmethod's ``cls.s``: a chain from the class the value has
    (``type(self)``, read through its MRO in C as Python does: a subclass that shadows its
    base's attribute later is seen), wherever a user class of that MRO up to the one that holds
    the attribute may hold it."""
    if value is _MISSING or steps[0][0] not in ("attr", "eager"):
        return None
    if steps[0] == ("attr", "__class__") and not isinstance(value, types.ModuleType):
        value, steps = type(value), steps[1:]
        if not steps:
            return None  # type(self) alone: the argument tree checks the exact class
        if steps[0][0] != "attr":
            return None
    if steps[0][0] == "eager":
        if isinstance(value, (type, types.ModuleType)):  # (it raised TypeError)
            # Note [Modules used whole] in wholes.py: the parameter's kind
            root, path = _root_of(value)
            _resolve_calls(root, path + steps, fn)  # raises
        cls = type(value)  # its own attributes are its argument tree's; its class's, which
        if isinstance(value, (torch.Tensor, *_BY_ID)) or not any(  # the name may be, are
                frames.user_class(c) for c in cls.__mro__):  # the class's, used whole
            return None
        return Read(*_root_of(cls), True)
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
    if at is None or not any(frames.user_class(c) for c in mro[:at + 1]):
        return None
    root, path = _root_of(cls)
    return _resolve_calls(root, path + steps, fn)


def _imported(name: str) -> tuple[tuple, tuple]:
    """(root, steps) of the module an import inside the function binds: ``sys.modules[name]``
    as it is at each call (a module replaced there is what the next ``import`` returns)."""
    return ("module", "sys"), (("attr", "modules"), ("item", name))


def _import_root(name: tuple, g: dict) -> tuple[tuple, tuple]:
    """(root, steps) of what ``import`` binds inside a function (``_chains`` in bytecode.py):
    the top package (``import a.b``) or the module itself (``from a.b import c``, ``import a.b
    as c``'s ``a``, then ``.b``), read from ``sys.modules`` (:func:`_imported`)."""
    module, level, top = name
    if level:
        import importlib.util

        package = g.get("__package__") or g.get("__name__", "").rpartition(".")[0]
        module = importlib.util.resolve_name("." * level + module, package)
    if top:
        first, *rest = module.split(".")
        return _imported(first)
    return _imported(module)


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
