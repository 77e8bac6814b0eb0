"""The reads of a recorded trace (Note [State guards]): the chains of every user function that
ran, resolved to :class:`Read` roots and steps that a new call evaluates."""

from __future__ import annotations

import builtins
import types

from trident.errors import TridentError
from trident.lower import orders
from trident.lower.state.bytecode import (EACH, _chains, comprehension_items,
                                          library_type_read, tensor_type_read)
from trident.lower.state.callables import _SCAN_BOUND, _called_arguments, _functions_in
from trident.lower.state.chain import (_MISSING, _STOP, Read, _globals_root,
                                       _imported, _kernel_fns, _resolve_calls, _resolve_root,
                                       _root_of, _root_of_dict, _step, _values_along)
from trident.lower.state.instances import (_CALLS, _EACH_BOUND, _end_of,
                                           each_reads, object_reads)
from trident.lower.state.library import library_reads
from trident.lower.state.recording import _CALLS_BOUND, Recording
from trident.lower.state.roots import forward_reads, reach, reached_root, registry_reads
from trident.lower.state.tensor_methods import tensor_method_reads
from trident.lower.state.library_steps import _WHOLE_LIBRARY_STATE


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
    for code, calls in rec.calls.items():  # Note [Calls of the same code] (recording.py)
        if len(calls) > _CALLS_BOUND:
            raise TridentError(f"the function runs {code.co_qualname} with more than "
                               f"{_CALLS_BOUND} sets of objects: Trident does not read the "
                               "classes of them all")
        todo += [(code, (rec.codes[code][0], params)) for params in calls.values()]
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
    budget = [_EACH_BOUND]  # Note [Items reached by iteration] (instances.py)
    scanned: dict = {}  # code -> its chains

    def chains_of(code):
        if code not in scanned:
            scanned[code] = _chains(code)
        return scanned[code]

    def chain_reads(root, steps) -> list[Read]:
        """The chain ``steps`` from ``root``; through ``EACH``, the container read whole and
        the reads through each of its items (Note [Items reached by iteration])."""
        n = steps.index(EACH) if EACH in steps else len(steps)
        read = _resolve_calls(root, steps[:n], fn)
        if read is None or n == len(steps) or any(s[0] in _CALLS for s in steps[:n]):
            return [read] if read is not None else []  # (a call's result: no chain names it)
        return [read, *each_reads(_end_of(read, fn), steps[n + 1:], fn, budget)]

    def todo_chain(code, g, params, start, name, steps) -> None:
        """The reads of one chain of ``code`` (its globals ``g``, parameters ``params``)."""
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
            found = chain_reads(root, path + steps)
        elif start == "global":
            root, kind = _globals_root(g)
            if name not in g:
                # ABSENT: unbound (a dict subclass's __missing__ may serve it: whole)
                reads.append(Read(root, ((kind, name),), kind == "item"))
                root, steps0 = _builtins_root(functions.get(code), g, name)
            else:
                steps0 = ((kind, name),)
            found = chain_reads(root, steps0 + steps)
        elif start == "param":  # (Note [Instance lookups], a class's attribute)
            found = object_reads(params.get(name, _MISSING), steps, fn, budget)
        else:
            pending.append((code, name, steps))
            return
        for read in found:
            add(read)

    comprehension: list = []  # (code, steps from its .0's EACH, depth)
    k = 0
    while True:
        while k < len(todo):
            code, (g, params) = todo[k]
            k += 1
            for start, name, steps in chains_of(code):
                if start == "iterates":  # (read from the comprehension's own code)
                    continue
                if start == "param" and name == ".0" and steps[:1] == (EACH,):
                    comprehension.append((code, steps, 0))  # (its maker's chains, below)
                    continue
                todo_chain(code, g, params, start, name, steps)
        while comprehension:  # a comprehension's items: its maker's container's (Note
            code, steps, depth = comprehension.pop()  # [Items reached by iteration])
            maker = parents.get(code)
            sources = [s for kind, c, s in chains_of(maker) if kind == "iterates" and
                       c is code] if maker is not None else []
            g, params = rec.codes.get(maker, (None, None))
            for start, name, through in comprehension_items(sources, steps) if g else ():
                if start == "param" and name == ".0" and through[:1] == (EACH,) and depth < 8:
                    comprehension.append((maker, through, depth + 1))
                    continue
                for values in [params, *rec.calls.get(maker, {}).values()]:
                    todo_chain(maker, g, values, start, name, through)
        before = len(pending)
        resolved = [(item, root_for_cell(item[0], item[1])) for item in pending]
        pending = [item for item, where in resolved if where is _MISSING]
        for (code, name, steps), where in resolved:
            if where is not None and where is not _MISSING:
                for read in chain_reads(where[0], where[1] + steps):
                    add(read)
        if len(pending) == before and k == len(todo):  # nothing more to find
            break
    if pending:
        code, name, _ = pending[0]
        raise TridentError(f"{code.co_name} reads the closure variable {name!r}, whose cell "
                           "Trident cannot find again")
    # the methods of any tensor (an intermediate's too) that user and library code call, by
    # name or through an operator: Note [Tensor methods and operators] (tensor_methods.py)
    reads += tensor_method_reads([*rec.codes, *(c for c, _ in rec.library.values())])
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


