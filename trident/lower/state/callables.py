"""Note [Callable arguments]: the user functions that ran which the jitted function was passed
(reads.py reads their code, defaults and cells as a global helper's)."""

from __future__ import annotations

import functools
import sys
import types

from trident import frames
from trident.errors import TridentError
from trident.lower.state.recording import Recording

def _called_arguments(rec: Recording, fn) -> list:
    """Note [Callable arguments]: the user functions that ran which the jitted function was
    passed (a parameter, an item of a list, tuple or dict argument, ``*args`` and
    ``**kwargs`` included, or an attribute of a user class's instance there: ``cfg.act``).
    The argument tree checks such a function by identity; its ``__code__``, defaults and
    closure cells are read as a global helper's are. A bound method passed in is checked by
    identity too, but what it binds (the method's object) is no argument tree's and no
    chain's: the call runs eagerly (a ``functools.partial`` makes the call eager before, as
    its argument tree is made: Note [Partials in arguments] in lower/partials.py). The scan stops after ``_SCAN_BOUND`` objects (its cost, at every trace); then
    ``truncated`` is True, and a user function that ran and that nothing else names makes the
    call eager (reads_of): it may be one passed in deeper, whose code no guard would read.

    Returns:
        (the functions, truncated).

    Raises:
        TridentError: a bound method of an object, or a partial, passed in and called."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)  # (fn: the jit's _code_fn)
    if code not in rec.codes:
        return [], False
    todo, out, seen = list(rec.codes[code][1].values()), [], set()
    while todo and len(seen) < _SCAN_BOUND:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if type(value) in (list, tuple):
            todo += value
        elif type(value) is dict:
            todo += value.values()
        elif frames.user_class(type(value)) and type(getattr(value, "__dict__", None)) is dict:
            todo += vars(value).values()  # (cfg.act: an instance's attributes)
        elif isinstance(value, types.FunctionType) and value.__code__ in rec.codes:
            out.append(value)
        elif isinstance(value, types.MethodType) and any(
                f.__code__ in rec.codes for f in _functions_in(value)):
            if not isinstance(value.__self__, (type, types.ModuleType)):
                raise TridentError(f"the function calls the bound method {value.__qualname__} "
                                   "passed as an argument: its object is no argument's that "
                                   "a guard reads")
            out += _functions_in(value)
        elif isinstance(value, functools.partial) and any(
                f.__code__ in rec.codes for f in _functions_in(value)):
            raise TridentError("the function calls a functools.partial passed as an argument: "
                               "its arguments and keywords are no argument's that a guard "
                               "reads")
    return out, bool(todo)


_SCAN_BOUND = 4096


def _functions_in(value) -> list:
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, (types.MethodType, functools.partial, staticmethod, classmethod)):
        return _functions_in(value.func if isinstance(value, functools.partial)
                             else value.__func__)
    if isinstance(value, property):  # its getter's cells (it is read by identity)
        return [f for f in (value.fget, value.fset, value.fdel)
                if isinstance(f, types.FunctionType)]
    if isinstance(value, type) and frames.user_file(
            getattr(sys.modules.get(value.__module__), "__file__", "") or ""):
        # a user class's methods (an autograd.Function's decorated forward): their cells
        return [f for v in vars(value).values() if not isinstance(v, type)
                for f in _functions_in(v)]
    return []
