"""What a call writes (Note [Write targets] in flow.py): a mutating function's first argument,
a mutating bound method's ``self``, and through a callable that wraps one of them (Note
[Writes through wrappers]).

Note [Writes through wrappers]: a ``functools.partial`` of a function or method that writes
(``partial(operator.setitem, MEMO, "n")``, ``partial(LOG.append)``, ``partial(push, LOG)``
with a user helper ``push`` that writes its parameter) and an ``operator.methodcaller`` of a
mutating method (``methodcaller("append", 1)(LOG)``) write when called, from C: the call's
callee is neither a mutating function nor a user function (Note [Write targets] in flow.py),
and the wrapped call makes no bytecode. So a hit returned the trace's value and left the state
as it was: stale, in user and in library code. The call of such a wrapper is a write, whether
the wrapper is made in the code (its construction's arguments read from the bytecode) or held
(a global ``BUMP = partial(...)``: its ``func`` and ``args`` read from the object). Its target
is what the wrapper holds where it binds the written object (the partial's bound arguments, a
bound method's ``self``), else the call's arguments.
"""

from __future__ import annotations

import functools
import operator
import types

from trident.lower.state import flow


def call_write(walk: flow.Flow, k: int, callee, args: list, depths: list) -> tuple | None:
    """``(what, origin of the target)`` of the call at ``walk.ins[k]`` (a ``CALL`` or
    ``CALL_FUNCTION_EX`` of ``callee``, its arguments' origins ``args`` at ``depths``) where it
    writes its first argument (``setattr``, ``list.append(L, v)``, ``dict.update(D, ...)``) or
    a bound method's ``self`` (``APPEND = LOG.append``), else :func:`write_through`'s."""
    i = walk.ins[k]
    star = i.opname == "CALL_FUNCTION_EX"
    if _writes_first(callee) and (star or i.arg):
        return f"{getattr(callee, '__name__', 'a call')}()", \
            flow._join(flow.FRESH, *args) if star else args[i.arg - 1]
    if _writes_self(callee):
        return f".{callee.__name__}()", walk.origin(k, 1 + (i.arg & 1) if star else i.arg)
    return write_through(walk, k, callee, depths)


def _writes_first(func) -> bool:
    """A function that writes its first argument: a known one, or a mutating method of a
    class called through the class."""
    try:
        if func in flow._MUTATING_FUNCTIONS:
            return True
    except TypeError:  # unhashable
        pass
    return getattr(func, "__name__", None) in flow.MUTATORS and \
        isinstance(getattr(func, "__objclass__", None), type)


def _writes_self(func) -> bool:
    """A mutating method of a built-in object, bound to it (``LOG.append``)."""
    return isinstance(func, types.BuiltinMethodType) and func.__name__ in flow.MUTATORS and \
        not isinstance(func.__self__, (types.ModuleType, type(None)))


def write_through(walk: flow.Flow, k: int, callee, depths: list) -> tuple | None:
    """Note [Writes through wrappers]: ``(what, origin of the target)`` of the call at
    ``walk.ins[k]`` (a ``CALL`` or ``CALL_FUNCTION_EX`` of ``callee``, its arguments at
    ``depths``) where it calls a wrapper of a mutating callable, else None."""
    i = walk.ins[k]
    star = i.opname == "CALL_FUNCTION_EX"
    where = (1 + (i.arg & 1)) if star else i.arg + (1 if len(depths) > i.arg else 0)
    func, bound, held, name = flow._UNKNOWN, False, flow.FRESH, None
    if isinstance(callee, functools.partial):
        func, bound, held = callee.func, bool(callee.args or callee.keywords), walk.origin(k, where)
    elif isinstance(callee, operator.methodcaller):
        name = callee.__reduce__()[1][0]
    elif callee is flow._UNKNOWN:
        made = [m for w in (where, where + 1) for m in (walk.producers(k, w) or ())
                if walk.ins[m[0]].opname == "CALL" and m[1] == 0]  # (3.12: above its NULL)
        if len(made) != 1:
            return None
        p = made[0][0]
        parts = walk.call_parts(p)
        n = walk.ins[p].arg
        if parts is None or n < 1:
            return None
        if parts[0] is functools.partial:
            func, bound = walk.static(p, n - 1), n > 1
            held = flow._join(flow.FRESH, *(walk.origin(p, d) for d in range(n - 1)))  # bound
        elif parts[0] is operator.methodcaller:
            name = walk.static(p, n - 1)
    called = flow._join(flow.FRESH, *(walk.origin(k, d) for d in depths))  # its arguments
    if name is not None:
        return (f".{name}() through operator.methodcaller", called) \
            if isinstance(name, str) and name in flow.MUTATORS else None
    if func is flow._UNKNOWN:
        return None
    what = f"{getattr(func, '__name__', 'a call')}() through functools.partial"
    if _writes_first(func):
        return what, held if bound else called  # its first argument
    if _writes_self(func):
        return what, held  # LOG.append: its self
    user = flow._user_function(func)
    if user is not None and walk.depth < 4 and flow.Flow(
            user.__code__, user.__globals__, user, walk.depth + 1).written_parameters():
        return what, flow._join(held, called)
    return None
