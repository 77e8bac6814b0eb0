"""What a function does that a hit would not do again (Note [State guards]): writes outside its
frame and arguments, and prints or warnings, read from its bytecode."""

from __future__ import annotations

import builtins
import dis
import sys
import types
import warnings

from trident import frames
from trident.errors import TridentError
from trident.lower.state.bytecode import _LOAD_FAST


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
        if code in seen or not frames.user_file(code.co_filename):
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
