"""What a function does that a hit would not do again (Note [State guards]): writes outside its
frame and arguments, and prints or warnings, read from its bytecode."""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import logging
import sys
import types
import warnings

import torch

from trident import frames
from trident.errors import TridentError
from trident.lower.state import flow, supers


def outside_write(code: types.CodeType, g: dict, fn=None, values=None) -> str | None:
    """Note [Write targets] (state/flow.py): what ``code`` writes outside its frame and its
    arguments (a ``global`` or ``nonlocal`` assignment, an item or attribute of an object that
    is not the frame's own or a parameter's, a mutating method of one, a helper that writes
    the object passed to it), or None. Only the trace runs the function's Python code: a hit
    would skip the write, so such a function runs eagerly."""
    return _outside(code, g, fn, values)


def terminal_output(code: types.CodeType, g: dict) -> str | None:
    """A call in ``code`` that prints or warns (``print``, ``warnings.warn`` or
    ``warn_explicit``, ``sys.stdout.write``, ``sys.stderr.write``, named by a global or a
    builtin, through modules) or logs (Note [Logging calls]), or None. Only the trace runs the
    function's Python code: eager prints and warns at every call (as Python's warning filters
    allow), a hit would not, so such a function runs eagerly. Every instruction counts, as for writes: a ``print`` in a branch
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
                                                for s in streams)) or _logs(obj, ins[j + 1:]):
            return f"{name} at {code.co_filename.rsplit('/', 1)[-1]}:{i.positions.lineno}"
    return None


# Note [Logging calls]: a logging call (``LOG.info(...)``, ``logging.warning(...)``,
# ``logging.getLogger(name).debug(...)``) emits a record at every eager call, through handlers
# that write files and streams, and what it emits depends on levels and handlers set at any
# time; a hit would emit nothing. So a function that names one (by a global: the logger, or the
# ``logging`` module) runs eagerly, decided from the bytecode like a print. A logger the
# function reaches otherwise (``self.log``, a parameter, a closure's, ``getLogger(__name__)``
# through a local) is seen when the trace calls it: the recording's profile hook refuses the
# trace at the ``call`` event of logging's method (``_logging_codes`` in recording.py), before
# its body runs, so the trace emits nothing and the call runs eagerly, emitting once.
_LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical",
                          "fatal", "log"})


def _logs(obj, after: list) -> bool:
    """Whether the global ``obj``, followed by the instructions ``after``, is a logging call."""
    if isinstance(obj, (logging.Logger, logging.LoggerAdapter)) or obj is logging:
        for step in after[:12]:  # LOG.info, logging.info, logging.getLogger("x").info
            if step.opname in ("LOAD_ATTR", "LOAD_METHOD") and step.argval in _LOG_METHODS:
                return True
            if step.opname in ("LOAD_ATTR", "LOAD_METHOD") and step.argval != "getLogger":
                return False
    return False


def check_write(code: types.CodeType, g: dict, fn=None, values=None,
                writes: bool = True) -> None:
    """``writes=False``: only its output (a code that another's check read, as it made it).

    Raises:
        TridentError: ``code`` (of ``fn``, when known, called with the parameters' ``values``
            when known) writes outside its arguments (:func:`outside_write`) or prints or warns
            (:func:`terminal_output`), or reads an attribute through ``super()``
            (Note [Reads through super] in supers.py)."""
    written = outside_write(code, g, fn, values) if writes else None
    if written is not None:
        raise TridentError(f"the function writes to {written}: Python state outside its "
                           "arguments, which a hit would not write")
    output = terminal_output(code, g)
    if output is not None:
        raise TridentError(f"the function prints or warns ({output}): eager does at every "
                           "call, a hit would not")
    read = supers.super_read(code)  # Note [Reads through super]
    if read is not None:
        raise TridentError(f"the function reads {read}: an attribute looked up through "
                           "super(), which no guard follows")


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


class EntryCheck:
    """Note [Writes at entry]: the user functions a trace reaches through a callee that the
    bytecode does not name (``FNS[0](LOG)``, ``TABLE["f"](LOG)``, ``getattr(M, name)(LOG)``,
    ``make()(LOG)``, a ``functools.partial``, ``MODELS[0](x)`` through ``Module.__call__``)
    are checked when their frame starts, before their first instruction runs: the recording's
    profile hook calls this at the ``call`` event of each user code the first time it runs in
    the trace. A code that writes outside its frame and arguments, prints or warns
    (:func:`check_write`), or writes one of its parameters whose value is an object that user
    state holds (:meth:`parameter_write`), makes the hook raise: the frame unwinds before its
    body runs, so the trace wrote nothing, and the call runs eagerly, writing once, as eager
    does. ``refused`` keeps the reason, in case user code catches the error (the trace is then
    refused after it ends)."""

    def __init__(self, top):
        self.top = top  # the function's code: checked before the trace, with its arguments
        self.refused: str | None = None
        self.nested: set = set()  # codes that a code already run makes (checked with it)
        self._outside: dict | None = None  # id -> object that user state holds
        self._globals: set = set()  # ids of the globals dicts whose values are in it

    def __call__(self, frame, rec) -> None:
        """Raises:
            TridentError: the code of ``frame`` (just started) writes outside, prints or
                warns; ``rec`` holds every user code started before it."""
        code = frame.f_code
        self.nested.update(c for c in code.co_consts if isinstance(c, types.CodeType))
        if code is self.top:
            return
        try:
            check_write(code, frame.f_globals, writes=code not in self.nested)
            self.parameter_write(code, frame, rec)
        except TridentError as e:
            self.refuse(str(e))

    def refuse(self, why: str) -> None:
        """Raises:
            TridentError: ``why``, kept in case user code catches it."""
        self.refused = why
        e = TridentError(why)
        e.any_sizes = True  # (policy.py: a trace of other sizes would be refused alike)
        raise e

    def parameter_write(self, code, frame, rec) -> None:
        """Raises:
            TridentError: ``code`` writes one of its parameters (itself or through a helper:
                Note [Write targets]) whose value in ``frame`` is an object that user state
                holds (three steps from a user module's globals: a global, its items or
                attributes, a function's defaults and closure cells, a bound method's
                ``self``, a partial's arguments) and that the call's arguments do not."""
        local = frame.f_locals
        names = [n for n in flow.Flow(code, frame.f_globals).written_parameters()
                 if n in local and not flow.immutable(local[n]) and
                 not isinstance(local[n], torch.Tensor)]
        if not names:
            return
        groups = [g for g, _ in rec.codes.values()] + [frame.f_globals]
        new = [g for g in groups if id(g) not in self._globals]
        if new or self._outside is None:
            self._globals.update(id(g) for g in new)
            roots = [v for g in groups for v in g.values()
                     if not isinstance(v, types.ModuleType)]
            top = rec.codes.get(self.top, (None, {}))[1]
            arguments = _reachable(list(top.values()), 4)
            self._outside = {k: v for k, v in _reachable(roots, 3).items()
                             if k not in arguments}
        for name in names:
            if id(local[name]) in self._outside:
                raise TridentError(
                    f"the function writes to {type(local[name]).__name__} object passed as "
                    f"{name} to {code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]}:"
                    f"{code.co_firstlineno}): Python state outside its arguments, which a "
                    "hit would not write")


@functools.lru_cache(maxsize=256)
def _user_module(name: str) -> bool:
    return frames.user_file(getattr(sys.modules.get(name), "__file__", None) or "")


def _reachable(roots: list, depth: int) -> dict:
    """{id: object} of ``roots`` and what they hold (container items, ``__dict__`` values, a
    user class's attributes, a function's defaults and closure cells, a bound method's
    ``self``, a partial's function and arguments), ``depth`` steps deep; modules, library
    classes and tensors are not entered."""
    seen: dict = {}
    level = roots
    for _ in range(depth + 1):
        following = []
        for v in level:
            if id(v) in seen or flow.immutable(v) or isinstance(
                    v, (types.ModuleType, torch.Tensor)):
                continue
            seen[id(v)] = v
            if isinstance(v, (list, tuple, set, frozenset)):
                following.extend(v)
            elif isinstance(v, dict):
                following.extend(v.values())
            elif isinstance(v, types.FunctionType):
                following.extend((v.__defaults__ or ()) + tuple(
                    (v.__kwdefaults__ or {}).values()))
                for cell in v.__closure__ or ():
                    try:
                        following.append(cell.cell_contents)
                    except ValueError:  # an empty cell
                        pass
            elif isinstance(v, types.MethodType):
                following.extend((v.__func__, v.__self__))
            elif isinstance(v, functools.partial):
                following.extend((v.func, *v.args, *v.keywords.values()))
            elif isinstance(v, type):
                if _user_module(v.__module__):
                    following.extend(vars(v).values())
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


def _outside(code: types.CodeType, g: dict, fn=None, values: dict | None = None,
            cells: dict | None = None, depth: int = 0) -> str | None:
    """Note [Write targets]: the first write of ``code`` or of the code it makes (a
    comprehension, a lambda, an inner function: its free variables bound as ``code`` binds
    them) whose target is outside its frame and arguments, as ``"what (why) (file:line)"``,
    or None."""
    walk = flow.Flow(code, g, fn, values=values, cells=cells)
    for k, what, (why, _) in walk.writes():
        if why is not None:
            line = walk.ins[k].positions.lineno if walk.ins[k].positions else "?"
            return f"{why} ({what}, {code.co_filename.rsplit('/', 1)[-1]}:{line})"
    for inner in code.co_consts if depth < 8 else ():
        if isinstance(inner, types.CodeType):
            bound = {n: walk._local(n) if n in code.co_cellvars or n in code.co_varnames else
                     walk.cells.get(n, (f"closure variable {n}", frozenset()))
                     for n in inner.co_freevars}
            found = _outside(inner, g, None, None, bound, depth + 1)
            if found is not None:
                return found
    return None
