"""Reads of a tensor's type that answer alike on its fake (Note [Type reads alike]): the flow
of a type through its text to the comparisons that consume it.

Note [Type reads alike]: the trace runs a function's code on fake tensors, so a read of a
tensor argument's type (``type(x)``, ``x.__class__``) gets ``FakeTensor`` where eager gets
``torch.Tensor`` or ``nn.Parameter``; such a read makes the call run eagerly
(``tensor_type_read`` in bytecode.py). Some reads answer alike all the same: transformers'
``infer_framework_from_repr`` (5.x) tests ``str(type(x)).startswith("<class 'torch.")``,
which holds of all three (every ``ModelOutput`` whose fields but the first are None asks it: a
forward with ``use_cache=False``). The rule that lets such a read through is general, and
proven from the bytecode (``read_alike``), never from a function's name:

* the type is that of a parameter (a ``LOAD_FAST`` of it, the code never rebinds it) whose
  value was a tensor at the trace's call: a value derived from one (``x.shape[0]``, a SymInt
  in a symbolic trace) may have another type again, so it is not let through;
* the type is used only as text: ``str(t)``, ``repr(t)``, ``t.__name__``, ``t.__qualname__``,
  ``t.__module__``, passed on through a local bound once;
* the text is used only in comparisons with constants: ``s.startswith(c)``,
  ``s.endswith(c)``, ``s == c``, ``s != c``, ``c in s``, ``s in (c, ...)``;
* each such comparison answers the same for every class the trace may see there (the fake's
  class, the trace's value's) and every class eager may see at a call the specialization
  serves: ``torch.Tensor`` or ``nn.Parameter``, the only classes a tensor argument's native
  guard accepts (any other subclass misses and runs eagerly; which of the two is guarded:
  Note [Tensor types and attributes] in ir/guards.py).

Then the trace computed eager's answer, and every hit is a call whose answer is that one. Any
other use of the type or its text (returned, passed to a call, formatted, compared with a
computed value, kept in a local bound twice), a path the walk cannot follow (an exception
handler), or a comparison that tells the classes apart (``type(x).__name__ == "Tensor"``) is not
let through: the call runs eagerly, as before. Checked by tests/test_stale45.py, on
transformers' function and on each shape of the rule and its refusals.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

_TEXTS = {str: str, repr: repr}  # the builtins that turn a type into text
_NAMES = frozenset({"__name__", "__qualname__", "__module__"})
_TESTS = frozenset({"startswith", "endswith"})
_LOAD_FAST = ("LOAD_FAST", "LOAD_FAST_CHECK")
_LARGEST = 4000  # instructions: a longer code's type reads are not walked (they run eagerly)
_GUARDED = (torch.Tensor, torch.nn.Parameter)  # Note [Tensor types and attributes]


def read_alike(f, k: int, params: dict) -> bool:
    """Note [Type reads alike]: whether the type that ``f.ins[k]`` (a ``flow.Flow``'s ``type(v)``
    call or ``v.__class__`` load) pushes answers alike on the trace's fake tensor and on the
    tensor eager sees; ``params``: the code's parameters' values at the trace's call."""
    if len(f.ins) > _LARGEST:
        return False
    found = f.producers(k, 0)
    stored = {i.argval for i in f.ins if i.opname in ("STORE_FAST", "DELETE_FAST")}
    if not found or any(f.ins[p].opname not in _LOAD_FAST or slot != 0 or
                        f.ins[p].argval in stored or
                        not isinstance(params.get(f.ins[p].argval), torch.Tensor)
                        for p, slot in found):
        return False
    classes = {FakeTensor, *_GUARDED, *(type(params[f.ins[p].argval]) for p, _ in found)}
    return _type_used_as_text(f, k, classes)


def _consumers(f, k: int) -> list | None:
    """The (index, depth) of each instruction that pops the value ``f.ins[k]`` pushed last, or
    None where a path cannot be followed."""
    uses = f.consumers(k)
    if uses is None or not all(alone for _, _, alone in uses):
        return None  # (a value that is the type on one path only)
    return [(j, d) for j, d, _ in uses]


def _type_used_as_text(f, k: int, classes: set) -> bool:
    uses = _consumers(f, k)
    if not uses:
        return False
    for j, d in uses:
        i = f.ins[j]
        if i.opname == "CALL" and i.arg == 1 and d == 0:
            parts = f.call_parts(j)
            text = _TEXTS.get(parts[0]) if parts is not None and _hashable(parts[0]) else None
            if text is None:
                return False
            texts = {c: text(c) for c in classes}
        elif i.opname == "LOAD_ATTR" and i.argval in _NAMES and d == 0 and \
                f.effect(j)[1] == 1:
            texts = {c: getattr(c, i.argval) for c in classes}
        else:
            return False
        if not _text_compared(f, j, texts, 0):
            return False
    return True


def _text_compared(f, k: int, texts: dict, depth: int) -> bool:
    """Whether the text ``f.ins[k]`` pushes (``texts``: its value per class) is only compared
    with constants, each comparison answering the same for every class."""
    uses = _consumers(f, k)
    if not uses or depth > 4:
        return False
    for j, d in uses:
        i = f.ins[j]
        if i.opname == "STORE_FAST" and _bound_once(f, i.argval):
            loads = [m for m, o in enumerate(f.ins) if o.opname in _LOAD_FAST and
                     o.argval == i.argval]
            if not all(_text_compared(f, m, texts, depth + 1) for m in loads):
                return False
            continue
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in _TESTS and d == 0 and \
                j + 2 < len(f.ins) and f.ins[j + 1].opname == "LOAD_CONST" and \
                f.ins[j + 2].opname == "CALL" and f.ins[j + 2].arg == 1:
            const = f.ins[j + 1].argval
            answer = lambda s, c=const, name=i.argval: getattr(s, name)(c)
        elif i.opname == "COMPARE_OP" and i.argrepr.replace("bool(", "").rstrip(")") in (
                "==", "!="):
            const = _named(f, j, 1 - d)
            answer = lambda s, c=const: s == c  # (!= is its negation)
        elif i.opname == "CONTAINS_OP":
            const = _named(f, j, 1 - d)
            answer = (lambda s, c=const: c in s) if d == 0 else (lambda s, c=const: s in c)
        else:
            return False
        if not _constant(const) or not _alike(answer, texts):
            return False
    return True


def _named(f, j: int, d: int):
    """The constant at depth ``d`` before ``f.ins[j]`` where a ``LOAD_CONST`` alone pushes it
    (a global may be rebound), else None."""
    found = f.producers(j, d)
    if not found or len(found) != 1 or f.ins[found[0][0]].opname != "LOAD_CONST":
        return None
    return f.ins[found[0][0]].argval


def _bound_once(f, name: str) -> bool:
    """A local (not a parameter, no closure's cell) that one ``STORE_FAST`` binds and that
    only ``LOAD_FAST`` reads: nothing else binds, deletes or reads it (3.13's paired
    instructions, which name two locals, count as other)."""
    if name in f.params or name in f.code.co_cellvars:
        return False
    named = [i.opname for i in f.ins if ("FAST" in i.opname or "DEREF" in i.opname) and (
        name == i.argval or (isinstance(i.argval, tuple) and name in i.argval))]
    return named.count("STORE_FAST") == 1 and all(
        o in _LOAD_FAST or o == "STORE_FAST" for o in named)


def _constant(value) -> bool:
    """A str, or a tuple or frozenset of them: a constant the code names."""
    if isinstance(value, (tuple, frozenset)):
        return all(type(v) is str for v in value)
    return type(value) is str


def _alike(answer, texts: dict) -> bool:
    try:
        return len({bool(answer(t)) for t in texts.values()}) == 1
    except Exception:  # (a comparison that raises on some class: not alike)
        return False


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
