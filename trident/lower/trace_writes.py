"""Writes of a trace that outlive it: to tensors that are not the call's (Note [Tensors
written outside]) and to context variables (Note [Context variables]).

Note [Tensors written outside]: a traced op whose tensor arguments are all real (a global
buffer, a closure's tensor, a library module's: nothing the call's arguments hold, nothing a
traced op made) is not traced on fake tensors: make_fx's fake mode runs it on the real tensors,
as constant folding. An op that writes one (``BUF.add_(1)``, ``torch.add(BUF, 1, out=BUF)``,
``torch.Tensor.add_(BUF, 1)``, ``BUF += 1`` through a local, ``torch.nn.init.ones_(BUF)``)
wrote the real tensor once in the trace; the call then ran eagerly ("reads a tensor that is
not an argument") and wrote it again: eager's first result plus one. So the torch call that is
about to write a tensor that is not fake refuses the trace before it runs (``_SourceLines._call``
in source_lines.py, while the function's code runs): the call runs eagerly with a warning and
writes once. Which calls write is read from the call as torch names it: an in-place method
(a name ending in one ``_``: ``add_``, ``copy_``, ``zero_``, ``fill_``, ``requires_grad_``; its
first argument, or the tensors of a list there: ``torch._foreach_add_``), an in-place operator
or item assignment (``__iadd__``, ``__setitem__``), ``out=``, and an operator's arguments
that its schema writes (``torch.ops.aten.add_.Tensor``, a custom op's ``mutates_args``). A
write to a fake tensor (an argument's, or one a traced op made) is the trace's, as before.
"""

from __future__ import annotations

import contextvars
import decimal
import sys
import types

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.utils import _pytree as pytree

from trident import frames
from trident.errors import TridentError

_IN_PLACE_OPERATORS = frozenset({
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
    "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
    "__setitem__", "__delitem__", "__set__"})


def written_outside(func, args: tuple, kwargs: dict) -> bool:
    """Note [Tensors written outside]: whether the torch call ``func(*args, **kwargs)`` writes a
    tensor that is not fake (not the trace's own)."""
    name = getattr(func, "__name__", "") or ""
    written = [kwargs.get("out")]
    if args and (name in _IN_PLACE_OPERATORS or (name.endswith("_") and not name.endswith("__"))):
        written.append(args[0])
    for schema in _schemas(func):  # an op called as torch.ops names it (``aten.add_.Tensor``)
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                written.append(args[i] if i < len(args) and not a.kwarg_only else
                               kwargs.get(a.name))
    return any(isinstance(t, torch.Tensor) and not is_fake(t) for t in pytree.tree_leaves(written))


def _schemas(func) -> list:
    """The schemas of ``func`` where it is an operator (an ``OpOverload``, each overload of an
    ``OpOverloadPacket``: any of them may be the one called): Note [Tensors written outside],
    ``torch.ops.aten.add_.Tensor(BUF, 1)`` or a custom op that mutates its argument, whose
    name says nothing (such a write was made by the trace, then again eagerly)."""
    if isinstance(func, torch._ops.OpOverload):
        return [func._schema]
    if isinstance(func, torch._ops.OpOverloadPacket):
        try:
            return [getattr(func, n)._schema for n in func.overloads()]
        except Exception:  # noqa: BLE001 - an overload torch cannot resolve: names decide
            return []
    return []


def why(frame) -> str:
    """The reason of a refusal at ``frame`` (a ``traceback.FrameSummary`` or None)."""
    where = f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
    return (f"the function writes a tensor that is not an argument{where}, which a compiled "
            "call would not write; pass it as an argument")


# Note [Context variables]: a ``contextvars.ContextVar`` that the function (or library code it
# runs) sets and leaves set (``VAR.set(VAR.get() + 1)``) is state that outlives the call, written
# by a C method that no bytecode walk names a write (a library's global ContextVar is taken as
# fixed, and a user's is read unguarded only after the trace ran). The trace set it, a hit set
# nothing: stale; or the call then ran eagerly and set it again (eager's first result plus one).
# So the function's own run in the trace is in a copy of the current context
# (``contextvars.copy_context().run``): nothing it sets leaks out of the trace, and where a
# variable's value at its end is not the one it had at its start (compared by identity), the
# trace is refused: the call runs eagerly with a warning and sets it once, as eager does. A
# variable set and reset within the call (transformers' ``capture_outputs`` sets its
# ``_active_collector`` around each forward) leaves nothing changed: served natively. One
# variable is compared otherwise: Note [The decimal context].
#
# Note [The decimal context]: ``decimal`` keeps each thread's context (precision, rounding,
# flags, traps) in a context variable of its own, which ``decimal.getcontext()`` sets on first
# use, to a copy of ``decimal.DefaultContext``, where it is absent; sympy does so in every
# trace with dynamic dims (each was refused). Comparing that variable by identity is wrong both
# ways: its creation is not a change a later reader can see (its first reader creates the same
# default: so it is no reason to refuse), and a change of its state is not a change of identity
# (``decimal.getcontext().prec = 5``, or flags raised by the function's decimal arithmetic, were
# made by the trace once and by no hit: stale, and no bytecode walk sees them, since
# ``getcontext()`` looks like a library call that makes a new object). So this variable, found
# by identity (``_DECIMAL``: the one variable ``getcontext()`` sets in an empty context; no
# name is trusted, a user's variable may be called ``decimal_context`` too), is compared by its
# value's state (``_decimal_state``): unchanged where it was present, the default's where the
# trace created it; else the trace is refused and the call runs eagerly. The more general rule
# that would cover it, "a variable the trace created that nothing reads later", cannot be
# decided (any later code may read it); a lazily created default can, and only for the owner
# that knows its default: no other variable is created so (torch's own are set and reset by
# its config patches).
#
# The context is read, too: ``Decimal(1) / Decimal(3)`` rounds to its precision and rounding,
# ``getcontext().prec`` is its field, ``localcontext()`` copies it (its traps and rounding).
# No guard reads it (it is a thread's, behind a call), and no recording sees the reads (the
# arithmetic is C slots; the constructor is a type's call): a trace baked the answer in, and
# hits kept it after ``getcontext().prec = 3``. So a chain of user code that reads the decimal
# module, one of its classes or functions or a value of its types (``reads_decimal``) makes
# the call run eagerly.
_MISSING = object()
_DECIMAL_MODULES = frozenset({"decimal", "_decimal", "_pydecimal"})


def reads_decimal(value, root: tuple, fn) -> bool:
    """Note [The decimal context]: whether ``value``, read by a chain from ``root`` that is not
    a library module's other than the jitted ``fn``'s (library code's loads are its own:
    sympy's), is the decimal module, one of its classes or functions, or a ``Decimal`` or
    ``Context``: decimal arithmetic that reads the thread's context."""
    module = sys.modules.get(root[1]) if root[0] == "module" else None
    if module is not None and root[1] != getattr(fn, "__module__", None) and \
            frames.library_module(module):
        return False
    if isinstance(value, types.ModuleType):
        return value.__name__ in _DECIMAL_MODULES
    if isinstance(value, (decimal.Decimal, decimal.Context)):
        return True
    try:
        module = getattr(value, "__module__", None) if isinstance(value, (
            type, types.FunctionType, types.BuiltinFunctionType)) else None
    except Exception:  # noqa: BLE001 (an object's own error: not decimal's)
        return False
    return module in _DECIMAL_MODULES


def decimal_refusal(path: str) -> TridentError:
    """Note [The decimal context]: why a chain that reads decimal (at ``path``) runs eagerly."""
    return TridentError(f"the function reads {path}: decimal arithmetic reads this thread's "
                        "decimal context, which no guard checks")


def _decimal_var():
    """Note [The decimal context]: the variable ``decimal.getcontext()`` sets."""
    context = contextvars.Context()
    context.run(decimal.getcontext)
    found = list(context)
    return found[0] if len(found) == 1 else None


_DECIMAL = _decimal_var()


_FIELDS = ("prec", "rounding", "Emin", "Emax", "capitals", "clamp")


def _decimal_state(context) -> tuple | None:
    """Note [The decimal context]: a context's fields, raised flags and set traps."""
    if not isinstance(context, decimal.Context):
        return None
    return (tuple(getattr(context, n) for n in _FIELDS),
            tuple(sorted((k.__name__, k) for k, v in context.flags.items() if v)),
            tuple(sorted((k.__name__, k) for k, v in context.traps.items() if v)))


def _restore(context, state: tuple) -> None:
    """Puts the state ``_decimal_state`` gave back on ``context`` (the trace's changes are not
    made twice: the call then runs eagerly)."""
    fields, flags, traps = state
    for name, value in zip(_FIELDS, fields):
        setattr(context, name, value)
    for table, on in ((context.flags, flags), (context.traps, traps)):
        raised = {k for _, k in on}
        for k in list(table):
            table[k] = k in raised


def run_in_own_context(fn, args: tuple):
    """Note [Context variables]: ``fn(*args)`` in a copy of the current context.

    Raises:
        TridentError: ``fn`` left a context variable with another value than it had, or
            changed the decimal context's state (Note [The decimal context]: put back)."""
    context = contextvars.copy_context()
    before = dict(context)
    start = before.get(_DECIMAL, _MISSING)
    state = _decimal_state(decimal.DefaultContext if start is _MISSING else start)
    try:
        result = context.run(fn, *args)
    finally:
        if start is not _MISSING and _decimal_state(start) != state:
            _restore(start, state)  # (shared with the caller's context: not copied)
            start = None  # (changed)
    changed = sorted(v.name for v, value in context.items() if v is not _DECIMAL and
                     before.get(v, _MISSING) is not value)
    end = context.get(_DECIMAL, _MISSING) if _DECIMAL is not None else _MISSING
    if end is not start and (start is not _MISSING or _decimal_state(end) != state):
        changed.append(f"{_DECIMAL.name} (the decimal module's context: its precision, "
                       "rounding, flags or traps)")
    if changed:
        raise TridentError(f"the function sets the context variable {', '.join(changed)} and "
                           "leaves it set, which a compiled call would not do")
    return result
