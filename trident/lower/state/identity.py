"""Questions user code asks about an object's identity (``id``, ``hash``), which a trace answers
for its own objects and process (Note [Identity questions]); run by tensor_reads.py's
``check_questions`` over the code a trace ran.

Note [Identity questions]: ``id(v)`` is an object's address and ``hash(v)`` is, for a tensor, a
module or any object without its own ``__hash__``, derived from it; for a ``str`` or ``bytes``
it depends on the process's hash seed (``PYTHONHASHSEED``, random by default). A trace's
tensors are fake tensors, its other objects the call's, and what it computes from either answer
is baked into the plan: ``x * (2 if id(x) in SEEN else 3)`` returned the fake's branch at every
hit, ``ids.get(id(self.w), 3)`` the trace's object's after another object of equal contents
took its place, ``sorted(ts, key=id)`` the fakes' order, and a stored specialization the trace
process's ``hash(name)`` in another process (CPU machine, session 48: each a hit unlike eager).
No guard can hold an address or a seed, and neither builtin is a call torch sees, so the user
code a trace ran is scanned (every instruction counts, taken or not, as for the other
questions): a call of ``id``, ``hash`` or ``object.__hash__``, a load of ``__hash__``, or
either builtin passed to a call (``key=id``, ``map(hash, ...)``) makes the call run eagerly,
at any sizes, but where the value asked about is known to be a number or None, whose hash is
the same in every process (a constant, a global; Python 3.11 and 3.12). Library code's
questions are not scanned (torch's memo sets of modules ask for membership, not order). Where
``id``'s result is only compared by ``==`` or ``!=`` with another ``id``'s (``id(a) == id(b)``),
it asks what ``a is b`` asks, which a trace answers as the call does: let through.
"""

from __future__ import annotations

import types

from trident.lower.state.flow import _UNKNOWN
from trident.lower.state.questions import _Code

_ASKERS = (id, hash, object.__hash__)
_STABLE = (int, float, complex, type(None))  # (bool is an int) same hash in every process


def _asker(value) -> bool:
    return value is not _UNKNOWN and any(value is a for a in _ASKERS)


def _stable(value) -> bool:
    return value is not _UNKNOWN and type(value) in (*_STABLE, bool)


def _is_question(c: _Code, k: int) -> bool:
    """Whether the ``id()`` that the ``CALL`` at ``k`` makes is only compared by ``==`` or
    ``!=`` with another ``id()``'s: ``a is b`` asked another way, whose answer the trace's
    objects give as the call's do (one fake per tensor, the call's other objects)."""
    compared = False
    for j, i in enumerate(c.f.ins):
        pops = c.f._effect(j)[0] if i.opname != "CALL" else i.arg + 2
        for d in range(pops):
            if (k, 0) not in (c.f.producers(j, d) or ()):
                continue
            if i.opname != "COMPARE_OP" or i.argval not in ("==", "!=") or d > 1:
                return False
            others = c.f.producers(j, 1 - d) or ()
            if not others or not all(c.f.ins[p].opname == "CALL" and c.callee(p) is id
                                     for p, _ in others):
                return False
            compared = True
    return compared


def identity_question(code: types.CodeType, g: dict, params: dict) -> str | None:
    """Note [Identity questions]: the first ``id``, ``hash`` or ``__hash__`` in ``code`` (of
    globals ``g``, called with ``params``) asked of a value not known to be a number, as
    ``"id() (file.py:12)"``, or None."""
    names = code.co_names
    if not any(n in ("id", "hash", "__hash__") or _asker(g.get(n, _UNKNOWN)) for n in names) \
            and not any(_asker(v) for v in params.values()):
        return None  # (a name the code loads, or a parameter's default: ``key=id``)
    c = _Code(code, g, params)
    for k, i in enumerate(c.f.ins):
        what = None
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval == "__hash__":
            if not _stable(c.value(k, 0)):
                what = ".__hash__"
        elif i.opname == "CALL" and i.arg:
            callee = c.callee(k)
            if _asker(callee):
                if not _stable(c.value(k, 0)) and not (callee is id and _is_question(c, k)):
                    what = f"{getattr(callee, '__qualname__', '?')}()"
            else:
                passed = next((v for v in (c.value(k, d) for d in range(i.arg)) if _asker(v)),
                              None)
                if passed is not None:
                    what = f"{passed.__qualname__}() passed to a call"
        if what is not None:
            return f"{what} ({c.where(k)})"
    return None
