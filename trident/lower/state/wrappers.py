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
bound method's ``self``), else the call's arguments. A mutating function passed to a call
(``itertools.starmap(operator.setitem, [(D, "k", v)])``, ``map(setattr, ...)``,
``functools.reduce(operator.iadd, ..., LOG)``) is called from C the same way: such
a call writes what its arguments hold.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import operator
import types

import torch

from trident import frames

FRESH = (None, frozenset())  # (why outside or None, the parameters it derives from)

# Methods that change the container or object they are called on.
MUTATORS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem",
    "add", "discard", "appendleft", "popleft", "extendleft", "rotate", "sort", "reverse",
    "difference_update", "intersection_update", "symmetric_difference_update",
    "__setitem__", "__delitem__", "__setattr__", "__delattr__", "__iadd__", "__ior__",
    "__imul__", "__isub__", "__iand__", "__ixor__", "__setstate__", "move_to_end"})
# Library functions that change their first argument.
_MUTATING_FUNCTIONS = frozenset((
    setattr, delattr, object.__setattr__, object.__delattr__, __import__("random").shuffle,
    *(getattr(__import__(module), n) for module, names in (
        ("operator", "setitem delitem iadd iand iconcat ior imul isub ixor"),
        ("heapq", "heappush heappop heapify heapreplace heappushpop"),
        ("bisect", "insort insort_left insort_right")) for n in names.split())))
_UNKNOWN = object()  # a value the code alone does not say


def _join(*origins) -> tuple:
    why = next((o[0] for o in origins if o[0] is not None), None)
    return why, frozenset().union(*(o[1] for o in origins))


def _user_function(callee):
    """The user function that calling ``callee`` runs: a function, a bound method's, or an
    object's ``forward`` (an ``nn.Module``, through ``Module.__call__``) or ``__call__``; or
    None."""
    f = getattr(callee, "__func__", callee)
    if not isinstance(f, (types.FunctionType, type)) and callee is not _UNKNOWN:
        klass = type(callee)
        f = getattr(klass, "forward" if isinstance(callee, torch.nn.Module) else "__call__",
                    None)
    if isinstance(f, types.FunctionType) and frames.user_file(f.__code__.co_filename):
        return f
    return None


def call_write(walk, k: int, callee, args: list, depths: list) -> tuple | None:
    """``(what, origin of the target)`` of the call at ``walk.ins[k]`` (a ``CALL`` or
    ``CALL_FUNCTION_EX`` of ``callee``, its arguments' origins ``args`` at ``depths``) where it
    writes its first argument (``setattr``, ``list.append(L, v)``, ``dict.update(D, ...)``) or
    a bound method's ``self`` (``APPEND = LOG.append``), else :func:`write_through`'s."""
    i = walk.ins[k]
    star = i.opname == "CALL_FUNCTION_EX"
    if _writes_first(callee) and (star or i.arg):
        return f"{getattr(callee, '__name__', 'a call')}()", \
            _join(FRESH, *args) if star else args[i.arg - 1]
    if _writes_self(callee):
        return f".{callee.__name__}()", walk.origin(k, 1 + (i.arg & 1) if star else i.arg)
    for d in depths:  # Note [Writes through wrappers]: map(operator.setitem, [D], ...)
        passed = walk.static(k, d)
        if passed is not _UNKNOWN and passed is not callee and _writes_first(passed):
            return f"{getattr(passed, '__name__', 'a call')}() passed to a call", \
                _join(FRESH, *(a for a, e in zip(args, depths) if e != d))  # (not its own)
    return write_through(walk, k, callee, depths)


def _writes_first(func) -> bool:
    """A function that writes its first argument: a known one, or a mutating method of a
    class called through the class."""
    try:
        if func in _MUTATING_FUNCTIONS:
            return True
    except TypeError:  # unhashable
        pass
    return getattr(func, "__name__", None) in MUTATORS and \
        isinstance(getattr(func, "__objclass__", None), type)


def _writes_self(func) -> bool:
    """A mutating method of a built-in object, bound to it (``LOG.append``)."""
    return isinstance(func, types.BuiltinMethodType) and func.__name__ in MUTATORS and \
        not isinstance(func.__self__, (types.ModuleType, type(None)))


def write_through(walk, k: int, callee, depths: list) -> tuple | None:
    """Note [Writes through wrappers]: ``(what, origin of the target)`` of the call at
    ``walk.ins[k]`` (a ``CALL`` or ``CALL_FUNCTION_EX`` of ``callee``, its arguments at
    ``depths``) where it calls a wrapper of a mutating callable, else None."""
    i = walk.ins[k]
    star = i.opname == "CALL_FUNCTION_EX"
    where = (1 + (i.arg & 1)) if star else i.arg + (1 if len(depths) > i.arg else 0)
    func, bound, held, name = _UNKNOWN, False, FRESH, None
    if isinstance(callee, functools.partial):
        func, bound, held = callee.func, bool(callee.args or callee.keywords), walk.origin(k, where)
    elif isinstance(callee, operator.methodcaller):
        name = callee.__reduce__()[1][0]
    elif callee is _UNKNOWN:
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
            held = _join(FRESH, *(walk.origin(p, d) for d in range(n - 1)))  # bound
        elif parts[0] is operator.methodcaller:
            name = walk.static(p, n - 1)
    called = _join(FRESH, *(walk.origin(k, d) for d in depths))  # its arguments
    if name is not None:
        return (f".{name}() through operator.methodcaller", called) \
            if isinstance(name, str) and name in MUTATORS else None
    if func is _UNKNOWN:
        return None
    what = f"{getattr(func, '__name__', 'a call')}() through functools.partial"
    if _writes_first(func):
        return what, held if bound else called  # its first argument
    if _writes_self(func):
        return what, held  # LOG.append: its self
    user = _user_function(func)
    if user is not None and walk.depth < 4 and type(walk)(
            user.__code__, user.__globals__, user, walk.depth + 1).written_parameters():
        return what, _join(held, called)
    return None


# Note [Library results]: a library function's result is state the function does not own as
# often as it is a new object: ``logging.getLogger(name)`` returns the logging manager's
# logger, ``threading.current_thread()`` the thread's object, a registry's getter its entry. A
# write to it (``logging.getLogger("x").disabled = True``) changes state that later calls see,
# which a hit would not write again, and the walk cannot tell such a getter from a maker by its
# code. So a Python function of a library (not torch's or Triton's, whose results are new
# tensors and objects of the call) returns an outside object, and a write to it makes the call
# run eagerly, unless it is one known to return a new object (``copy.deepcopy(CFG).k = 1`` stays
# served). A class called makes a new object; a built-in function's result is taken as new
# (``decimal.getcontext()``'s context is compared by its state: Note [The decimal context]).
_NEW_RESULTS = frozenset({copy.copy, copy.deepcopy, dataclasses.replace, dataclasses.asdict,
                          dataclasses.astuple, json.loads})
_NEW_RESULT_PACKAGES = ("torch", "triton", "trident", "functorch")


def _shared_result(callee) -> str | None:
    """Why the result of the library callable ``callee`` may be an object that state outside
    the call holds (Note [Library results]), or None for a new object."""
    if not isinstance(callee, types.FunctionType) or callee in _NEW_RESULTS:
        return None
    module = getattr(callee, "__module__", None) or ""
    if module.partition(".")[0] in _NEW_RESULT_PACKAGES:
        return None
    return f"the result of {module}.{callee.__qualname__}(), a library function's"
