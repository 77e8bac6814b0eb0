"""What a function reads of its parameters: the attribute and item paths it reads through them.

Note [Parameter reads]: a hit checks what its argument tree holds (Note [Argument trees] in
flatten.py), and a tree that holds everything an argument reaches grows with the argument: a
function that reads one weight of a model passed whole would check every module of it. As
Dynamo guards what its trace read, and only that, the argument tree holds what the function's
own bytecode reads of each parameter (an argument's *uses*): ``def head(m, x): return
F.linear(x, m.lm_head.weight)`` reads ``m.lm_head.weight`` and ``x``, so ``m``'s tree holds the
path to ``lm_head.weight`` (and what decides where Python finds ``lm_head``: ``m.__dict__``'s
keys, ``m._parameters``' and ``m._buffers``' keys), not the 24 layers beside it.

A use is a path: a parameter, then attributes (``LOAD_ATTR``, ``LOAD_METHOD``) and items by a
constant (``x[0]``, ``d["k"]``); the value where the path ends is used **whole** (its whole tree
is held: it may be passed on, iterated, compared, written). The scan is sound by refusal: any
load of the parameter it does not read as such a path (a store or delete of it, a closure over
it, a comprehension or ``LOAD_FAST_LOAD_FAST`` that names it) makes the parameter whole, and so
does anything that reads the frame's locals by other means (``locals()``, ``vars()``, ``eval``,
``exec``, ``sys._getframe``, ``inspect.currentframe``, a zero-argument ``super()``, which reads
the first parameter), or a generator or coroutine (its frame outlives the call). Where a path's
next attribute is found (the instance's ``__dict__``, an ``nn.Module``'s ``_parameters``,
``_buffers`` or ``_modules``, or elsewhere: then the object is whole) is decided by
``flatten.py`` against the call's objects, as Python's attribute lookup would find it.

A tensor that a pruned path leaves out of the trace stays a real tensor in its object; a trace
that reads it after all would meet a real tensor among fake ones and fail (the call runs
eagerly), never bake it in.
"""

from __future__ import annotations

import dis
import inspect
import types
from typing import Any

import torch

WHOLE = None  # a path's value used whole: its whole tree is held
Uses = dict | None  # {("attr", name) | ("item", key): Uses}, or WHOLE

_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW")
_FRAME_READERS = {"locals", "vars", "eval", "exec", "breakpoint"}
_FRAME_ATTRS = {"_getframe", "currentframe", "f_locals", "f_back", "stack", "getouterframes"}


def parameter_uses(fn: Any, has_self: bool, params: list[str]) -> list[Uses]:
    """Per parameter of ``fn`` as called (``self`` first where ``has_self``: a bound method's
    object, a module's), what its code reads of it: a trie of paths, or ``WHOLE``. ``params``:
    the binding's parameter names, which must be the code's own (a callable that is not a
    Python function, or whose signature is not its code's, reads every parameter whole)."""
    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    code = getattr(func, "__code__", None) if isinstance(func, types.FunctionType) else None
    whole: list[Uses] = [WHOLE] * (has_self + len(params))
    if code is None:
        return whole
    flags = code.co_flags
    nargs = code.co_argcount + code.co_kwonlyargcount
    total = nargs + bool(flags & inspect.CO_VARARGS) + bool(flags & inspect.CO_VARKEYWORDS)
    names = list(code.co_varnames[:total])
    if names[has_self:] != list(params) or (has_self and not names) or \
            flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                     inspect.CO_ITERABLE_COROUTINE) or "__class__" in code.co_freevars:
        return whole
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL", "NOP")]
    for i in ins:
        if (i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and i.argval in _FRAME_READERS) or (
                i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in _FRAME_ATTRS):
            return whole
    uses: dict[str, Uses] = {n: {} for n in names[:nargs] if n not in code.co_cellvars}
    for k, op in enumerate(ins):
        named = op.argval if isinstance(op.argval, tuple) else (op.argval,)
        for name in [n for n in named if isinstance(n, str) and uses.get(n, WHOLE) is not WHOLE]:
            if op.opname in _LOADS:
                _add(uses, name, _path(ins, k + 1))
            elif op.opname.startswith(("LOAD_FAST", "STORE_FAST", "DELETE_FAST")) or \
                    op.opname in ("LOAD_CLOSURE", "MAKE_CELL", "LOAD_DEREF"):
                uses[name] = WHOLE
    return [uses.get(n, WHOLE) for n in names]


def _path(ins: list, j: int) -> tuple:
    """The attribute and constant-item steps from ``ins[j]`` on."""
    steps: list = []
    while j < len(ins):
        op = ins[j]
        if op.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(op.argval, str):
            steps.append(("attr", op.argval))
            j += 1
        elif op.opname == "LOAD_CONST" and type(op.argval) in (str, int) and j + 1 < len(ins) \
                and ins[j + 1].opname == "BINARY_SUBSCR":
            steps.append(("item", op.argval))
            j += 2
        else:
            break
    return tuple(steps)


def _add(uses: dict, name: str, steps: tuple) -> None:
    """Adds the path ``name.steps`` (its end used whole) to ``uses``."""
    if not steps:
        uses[name] = WHOLE
        return
    node: Any = uses[name]
    for step in steps[:-1]:
        child = node.setdefault(step, {})
        if child is WHOLE:
            return
        node = child
    node[steps[-1]] = WHOLE


def merge(a: Uses, b: Uses) -> Uses:
    """Both ``a``'s and ``b``'s paths."""
    if a is WHOLE or b is WHOLE:
        return WHOLE
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if k in out else v
    return out


def covers(a: Uses, b: Uses) -> bool:
    """Whether ``a`` holds every path of ``b``."""
    if a is WHOLE:
        return True
    if b is WHOLE:
        return False
    return all(k in a and covers(a[k], sub) for k, sub in b.items())


def items_read(uses: Uses, keys) -> dict | None:
    """{key: its uses} of a dict's or a sequence's items that ``uses`` reads, or ``WHOLE``:
    an attribute of a container (a method: ``d.get``, ``t.index``; a namedtuple's field) reads
    it whole."""
    if uses is WHOLE or any(kind != "item" for kind, _ in uses):
        return WHOLE
    n = len(keys) if isinstance(keys, range) else None
    out: dict = {}
    for (_, k), sub in uses.items():
        if n is not None and type(k) is int and -n <= k < 0:
            k += n
        if k in keys:
            out[k] = merge(out[k], sub) if k in out else sub
    return out


def attributes_read(obj, entries: dict, uses: Uses) -> dict | None:
    """{entry of ``obj.__dict__``: its uses} for the attributes ``uses`` reads of ``obj``, where
    Python's lookup finds them: its ``__dict__``, or an ``nn.Module``'s ``_parameters``,
    ``_buffers`` and ``_modules`` in turn (``Module.__getattr__``: each of them is then read,
    its keys checked). ``WHOLE`` where the lookup runs other code: an attribute its class
    holds (a method, a property, a class attribute), a ``__getattribute__`` or ``__getattr__``
    of its own, an item read."""
    if uses is WHOLE:
        return WHOLE
    t = type(obj)
    if t.__getattribute__ is not object.__getattribute__:
        return WHOLE
    module = isinstance(obj, torch.nn.Module) and t.__getattr__ is torch.nn.Module.__getattr__
    out: dict = {}

    def add(entry, sub):
        out[entry] = merge(out[entry], sub) if entry in out else sub

    for (kind, name), sub in uses.items():
        if kind != "attr" or type(name) is not str or \
                any(name in vars(c) for c in t.__mro__):
            return WHOLE
        if name in entries:
            add(name, sub)
        elif module:
            for holder in ("_parameters", "_buffers", "_modules"):
                held = entries.get(holder)
                if type(held) is not dict:
                    return WHOLE
                add(holder, {("item", name): sub} if name in held else {})
                if name in held:
                    break
        elif hasattr(t, "__getattr__"):
            return WHOLE
    return out


# Note [Calls of a jitted module]: ``trident.jit(module)`` runs ``Module.__call__``, which reads
# the module's hook dicts (and torch's global ones: ``module_call`` in tracing.py) before and
# after ``forward``; the uses of ``forward``'s code alone left them out of ``self``'s tree, so a
# hook registered on the module after a hit was never run (CPU machine, session 48). Their
# paths join ``self``'s uses. (Its ``__dict__``'s keys are checked anyway: an instance
# ``forward`` or a ``compile()``'s ``_compiled_call_impl`` set later is seen.)
MODULE_CALL_READS = ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks",
                     "_forward_hooks_always_called", "_forward_hooks_with_kwargs",
                     "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
                     "_is_full_backward_hook")


def module_call_uses(self_uses: Uses) -> Uses:
    """Note [Calls of a jitted module]: ``self_uses`` (of ``forward``'s code) and the paths
    that ``Module.__call__`` reads of the module."""
    return merge(self_uses, {("attr", n): WHOLE for n in MODULE_CALL_READS})

