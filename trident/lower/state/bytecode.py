"""The bytecode scan (Note [State guards]): the chains a code object's instructions read."""

from __future__ import annotations

import dis
import types
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from trident import frames
from trident.lower.state import flow, type_strings

_LOAD_FAST = ("LOAD_FAST", "LOAD_FAST_CHECK")


def _single_stores(code: types.CodeType, ins: list) -> set:
    """The locals (not parameters) that ``code`` binds exactly once: a local bound to a chain
    there is an alias of that chain wherever it is loaded (``log = LOG``, ``import mod``)."""
    params = frames.parameter_names(code)
    counts: dict = {}
    for i in ins:
        if i.opname in ("STORE_FAST", "DELETE_FAST"):
            counts[i.argval] = counts.get(i.argval, 0) + 1
    return {n for n, c in counts.items() if c == 1 and n not in params}


def _chains(code: types.CodeType) -> list[tuple[str, Any, tuple]]:
    """(start kind, name, steps) per chain of ``code``'s bytecode: start ``global``, ``free``
    (a closure cell), ``param`` or ``import`` (``import m`` / ``from m import n`` inside the
    function: name is ``(module name, level, whether the top package is bound)``); steps as in
    :class:`Read` (chain.py), plus ``("call0",)`` and ``("call1", constant)`` / ``("call2",
    constant, constant)`` for a call with no argument or constant arguments (``globals()``,
    ``.get("k")``, ``os.getenv("k", "2")``), ``("gattr", global name)`` for ``getattr(obj,
    NAME)`` and ``("eager", why)`` for a read this scan cannot follow, resolved by
    :func:`reads_of` (reads.py). ``type(v)`` is the step ``("attr", "__class__")`` and
    ``vars(v)`` the step ``("attr", "__dict__")``; a local bound once to a chain (``log =
    LOG``, ``import mod``) continues that chain where it is loaded."""
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL")]
    params = set(frames.parameter_names(code))  # (*args and **kwargs too: read through items)
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
        called, first = op.argval, i + 1
        if op.opname == "LOAD_GLOBAL" and called in ("object", "type") and i + 2 < len(ins) \
                and ins[i + 1].opname in ("LOAD_ATTR", "LOAD_METHOD") and \
                ins[i + 1].argval == "__getattribute__":  # object.__getattribute__(v, "k"):
            called, first = "__getattribute__", i + 2  # getattr(v, "k") without a default
        if op.opname == "LOAD_GLOBAL" and called in ("type", "vars", "getattr", "hasattr",
                                                     "__getattribute__") \
                and depth < 8 and first < len(ins):
            inner = chain_at(first, depth + 1)
            if inner is not None:
                kind, name, isteps, j = inner
                if called == "type" and call_at(j, 1):
                    return _more(kind, name, list(isteps) + [("attr", "__class__")], j + 1)
                if called == "vars" and call_at(j, 1):  # Note [Module dicts] (chain.py)
                    out.append(("global", "vars", ()))  # the builtin's own read
                    return _more(kind, name, list(isteps) + [("attr", "__dict__")], j + 1)
                if called not in ("type", "vars"):
                    nargs = 2 if called in ("hasattr", "__getattribute__") else None
                    if const_at(j) and isinstance(ins[j].argval, str):
                        step, k = ("attr", ins[j].argval), j + 1
                    elif j < len(ins) and ins[j].opname == "LOAD_GLOBAL" and not (
                            j + 1 < len(ins) and ins[j + 1].opname in ("LOAD_ATTR",
                                                                          "LOAD_METHOD")):
                        out.append(("global", ins[j].argval, ()))  # the name's own read
                        step, k = ("gattr", ins[j].argval), j + 1
                    else:
                        out.append((kind, name, tuple(isteps) + (
                            ("eager", f"{called}() with a name computed at run time"),)))
                        return None
                    if nargs is None and k < len(ins) and ins[k].opname == "LOAD_CONST" and \
                            call_at(k + 1, 3):  # a default
                        return _more(kind, name, list(isteps) + [step], k + 2)
                    if call_at(k, 2):
                        return _more(kind, name, list(isteps) + [step], k + 1)
                    out.append((kind, name, tuple(isteps) + (
                        ("eager", f"{called}() called in a way Trident does not follow"),)))
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
                if steps and steps[-1] == ("attr", "__getattribute__") and \
                        isinstance(nxt.argval, str):  # v.__getattribute__("k") is v.k
                    steps[-1] = ("attr", nxt.argval)
                else:
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


# classes whose isinstance answers on a fake tensor argument are the real one's (tensor_type_read)
_ANSWERED = (torch.Tensor, torch.nn.Parameter, *filter(None, [getattr(torch.nn, "Buffer", None)]))


def tensor_type_read(code: types.CodeType, g: dict, params: dict) -> str | None:
    """A read of a tensor's Python type in ``code`` (``type(x)`` or ``x.__class__`` used
    otherwise than compared with a class that is no tensor's: ``type(y) is int`` holds of
    neither; ``isinstance(x, C)``, ``C`` a strict subclass of ``torch.Tensor``), with ``x`` a
    parameter whose value at the trace's call (``params``) is a tensor, or derived from one, as
    ``"text (file:line)"``; or None. The trace runs the code on fake tensors (``FakeTensor``),
    so its answer is not eager's: such a function runs eagerly. ``isinstance(x, torch.Tensor)``
    holds of both; ``isinstance(x, nn.Parameter)`` the fake of a Parameter answers as it does
    (torch marks it), and each tensor argument is guarded on it; ``isinstance(x, nn.Buffer)``
    asks the tensor's ``_is_buffer`` attribute, a lookup of Note [Python attributes of tensors]
    (Note [Tensor types and attributes] in ir/guards.py): none is one. A type used only as
    text compared with constants that answer alike on the fake is none either (Note [Type
    reads alike] in type_strings.py)."""
    tensors = {n for n, v in params.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        return None
    f = flow.Flow(code, g)
    compares = [j for j, i in enumerate(f.ins) if i.opname in ("IS_OP", "COMPARE_OP")]
    for k, i in enumerate(f.ins):
        depth = None
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval == "__class__":
            depth, what = 0, ".__class__"
        elif i.opname == "CALL" and i.arg in (1, 2):
            callee = f.call_parts(k)[0]
            if callee is type and i.arg == 1:
                depth, what = 0, "type()"
            elif callee in (isinstance, issubclass) and i.arg == 2:
                kinds = f.static(k, 0)
                kinds = kinds if isinstance(kinds, tuple) else (kinds,)
                if any(isinstance(c, type) and issubclass(c, torch.Tensor) and
                       c not in _ANSWERED and not _no_instance_reads(c, params) for c in kinds):
                    depth, what = 1, f"{callee.__name__}() with a subclass of torch.Tensor"
        if depth is None or not f.origin(k, depth)[1] & tensors:
            continue
        if depth == 0 and (_compared_with_other_classes(f, compares, k) or
                           type_strings.read_alike(f, k, params)):  # Note [Type reads alike]
            continue
        line = i.positions.lineno if i.positions else "?"
        return f"{what} ({code.co_filename.rsplit('/', 1)[-1]}:{line})"
    return None


# Note [Classes no traced tensor is]: ``isinstance(x, C)``, ``C`` a strict subclass of
# ``torch.Tensor``, asks a tensor's Python type, which the trace's fake tensor does not share.
# Library code asks it of every tensor it gets: liger-kernel 0.8 (``LigerRMSNormFunction``)
# tests ``isinstance(X, DTensor)`` to gather a tensor-parallel input first. The answer is
# False on both sides when the fake is no ``C`` (``C`` is no class of ``FakeTensor``, and
# answers by the class alone: no ``__instancecheck__`` of its own, as ``nn.Parameter`` has)
# and no tensor of the call is one: a tensor argument's guard accepts ``torch.Tensor`` and
# ``nn.Parameter`` only (Note [Tensor types and attributes] in ir/guards.py), torch's ops on
# them make ``torch.Tensor``s, and the code's parameters at the trace (``params``) hold no
# ``C``. Such a read is no reason to run eagerly; any other stays one.

def _no_instance_reads(c: type, params: dict) -> bool:
    """Note [Classes no traced tensor is]: whether ``isinstance(v, c)`` answers False on the
    trace's fake tensors and on the tensors of every call the specialization serves."""
    return (not issubclass(FakeTensor, c) and type(c).__instancecheck__ is type.__instancecheck__
            and not any(isinstance(v, c) for v in params.values()))


_TYPE_NAMES = frozenset({"type", "__class__", "isinstance", "issubclass"})
_LIBRARY_TYPES: dict = {}  # (id of a code object, its tensor parameters and their types) ->
# (code, answer)


def library_type_read(code: types.CodeType, g: dict, params: dict) -> str | None:
    """``tensor_type_read`` of library code (Note [Tensor types and attributes] in
    ir/guards.py), kept per code object and tensor parameters (a library's code is walked once
    per process); code that names none of ``type``, ``__class__``, ``isinstance`` and
    ``issubclass`` reads none."""
    if _TYPE_NAMES.isdisjoint(code.co_names):
        return None
    key = (id(code), frozenset((n, type(v)) for n, v in params.items()))
    found = _LIBRARY_TYPES.get(key)
    if found is None or found[0] is not code:
        if len(_LIBRARY_TYPES) >= 65536:
            _LIBRARY_TYPES.clear()
        found = _LIBRARY_TYPES[key] = (code, tensor_type_read(code, g, params))
    return found[1]


def _compared_with_other_classes(f, compares: list, k: int) -> bool:
    """Whether the type that ``f.ins[k]`` pushes is only compared (``is``, ``==``) with
    classes that are not tensors' (``int``, ``list``): the fake tensor's type compares as the
    tensor's does."""
    found = False
    for j in compares:
        for d in (0, 1):
            if (k, 0) in (f.producers(j, d) or ()):
                other = f.static(j, 1 - d)
                if not isinstance(other, type) or issubclass(other, torch.Tensor):
                    return False
                found = True
    return found
