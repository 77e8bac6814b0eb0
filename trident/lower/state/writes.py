"""What a function does that a hit would not do again (Note [State guards]): writes outside its
frame and arguments, and prints or warnings, read from its bytecode."""

from __future__ import annotations

import builtins
import dis
import inspect
import sys
import types
import warnings

import torch

from trident import frames
from trident.errors import TridentError
from trident.lower.state import flow


def outside_write(code: types.CodeType, g: dict, fn=None, values=None) -> str | None:
    """Note [Write targets] (state/flow.py): what ``code`` writes outside its frame and its
    arguments (a ``global`` or ``nonlocal`` assignment, an item or attribute of an object that
    is not the frame's own or a parameter's, a mutating method of one, a helper that writes
    the object passed to it), or None. Only the trace runs the function's Python code: a hit
    would skip the write, so such a function runs eagerly."""
    return flow.outside(code, g, fn, values)


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


def check_write(code: types.CodeType, g: dict, fn=None, values=None,
                writes: bool = True) -> None:
    """``writes=False``: only its output (a code that another's check read, as it made it).

    Raises:
        TridentError: ``code`` (of ``fn``, when known, called with the parameters' ``values``
            when known) writes outside its arguments (:func:`outside_write`) or prints or warns
            (:func:`terminal_output`)."""
    written = outside_write(code, g, fn, values) if writes else None
    if written is not None:
        raise TridentError(f"the function writes to {written}: Python state outside its "
                           "arguments, which a hit would not write")
    output = terminal_output(code, g)
    if output is not None:
        raise TridentError(f"the function prints or warns ({output}): eager does at every "
                           "call, a hit would not")


def check_writes_before_trace(fn, args: tuple = (), kwargs: dict | None = None) -> None:
    """:func:`check_write` of ``fn`` and of the user functions it names by global or closure
    (four calls deep), before a trace runs them: a trace that wrote (or printed) would leave
    the write done twice once the call runs eagerly.

    Raises:
        TridentError: one of them writes outside its arguments, prints or warns."""
    seen: set = set()
    values = None
    if isinstance(getattr(fn, "__func__", fn), types.FunctionType):
        try:  # the call's arguments by parameter: what a method of one runs is named
            values = dict(inspect.signature(fn).bind_partial(*args, **(kwargs or {})).arguments)
            if isinstance(fn, types.MethodType):
                values[fn.__func__.__code__.co_varnames[0]] = fn.__self__
        except (TypeError, ValueError):
            values = None
    top = getattr(fn, "__func__", fn)
    todo = [(top, 0)]
    while todo:
        f, depth = todo.pop()
        if not isinstance(f, types.FunctionType):
            continue
        code = f.__code__
        if code in seen or not frames.user_file(code.co_filename):
            continue
        seen.add(code)
        check_write(code, f.__globals__, f, values if f is top else None)
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


def check_parameter_writes(rec, fn) -> None:
    """Note [Write targets] (state/flow.py), for the helpers the trace reached through a call
    the bytecode does not name (``MODEL(x)`` runs ``forward`` through ``Module.__call__``,
    ``self.helper(L)``): a user function that writes an object one of its parameters holds,
    called with an object that user modules' globals or closure cells hold (three steps deep:
    a global, its attributes or items, theirs) and that is not the call's own argument, wrote
    outside. Checked after the trace (that trace's write is done once more by the eager call).

    Raises:
        TridentError: such a write."""
    top = getattr(fn, "__code__", None)
    written = {}
    for code, (g, params) in rec.codes.items():
        if code is top:
            continue
        names = flow.Flow(code, g).written_parameters()
        for name in names:
            value = params.get(name)
            if name in params and not flow.immutable(value) and \
                    not isinstance(value, torch.Tensor):
                written[id(value)] = (code, name, value)
    if not written:
        return
    arguments = _reachable(list(rec.codes.get(top, (None, {}))[1].values()), 4)
    roots = []
    for code, (g, _) in rec.codes.items():
        roots.extend(v for v in g.values() if not isinstance(v, types.ModuleType))
    for key in _reachable(roots, 3).keys() - arguments.keys():
        if key in written:
            code, name, value = written[key]
            raise TridentError(
                f"the function writes to {type(value).__name__} object passed as {name} to "
                f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]}:"
                f"{code.co_firstlineno}): Python state outside its arguments, which a hit "
                "would not write")


def _reachable(roots: list, depth: int) -> dict:
    """{id: object} of ``roots`` and what they hold (container items, ``__dict__`` values),
    ``depth`` steps deep; modules, classes and tensors are not entered."""
    seen: dict = {}
    level = roots
    for _ in range(depth + 1):
        following = []
        for v in level:
            if id(v) in seen or flow.immutable(v) or isinstance(
                    v, (types.ModuleType, types.FunctionType, type, torch.Tensor)):
                continue
            seen[id(v)] = v
            if isinstance(v, (list, tuple, set, frozenset)):
                following.extend(v)
            elif isinstance(v, dict):
                following.extend(v.values())
            else:
                try:  # (not through a __getattr__)
                    d = object.__getattribute__(v, "__dict__")
                except Exception:
                    d = None
                if isinstance(d, dict):
                    following.extend(d.values())
        level = following
        if len(seen) > 100_000:
            break
    return seen
