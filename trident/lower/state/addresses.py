"""What Python answers from an object's address, which a trace answers for its own objects and
process: user code's questions about an object's identity (``id``, ``hash``: Note [Identity
questions]), a set's order and an object's default text (Note [Answers from addresses]); run
by tensor_reads.py's ``check_questions`` over the code a trace ran.

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

import dis
import types

from trident.lower.state.flow import _UNKNOWN
from trident.lower.state.questions import _Code, _attribute_of_parameter

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
    uses = c.f.consumers(k)
    if not uses:
        return False  # (unused, or a path the walk cannot follow)
    for j, d, _ in uses:
        i = c.f.ins[j]
        if i.opname != "COMPARE_OP" or i.argval not in ("==", "!=") or d > 1:
            return False
        others = c.f.producers(j, 1 - d) or ()
        if not others or not all(c.f.ins[p].opname == "CALL" and c.callee(p) is id
                                 for p, _ in others):
            return False
    return True


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


# Note [Answers from addresses]: besides ``id`` and ``hash`` (Note [Identity questions]), Python
# answers from an object's address where it hashes an object whose class keeps
# ``object.__hash__`` (a set or frozenset iterates in the order of its items' hashes) and where
# it makes the default text of one (``object.__repr__`` names the address, and ``str``,
# ``format`` and f-strings reach it through ``object.__str__`` and ``object.__format__``). The
# trace's tensors are fakes, and its other objects the trace's call's: ``list(set(ts))`` of
# tensors came back in the fakes' order at every hit, ``repr(o)`` with the first object's
# address for another object of equal contents (CPU machine, session 48). A tensor hashed by
# user code (``torch.Tensor.__hash__`` is Python: the recording's profile hook sees its frame
# called from the function's code) makes the call run eagerly, whatever the container (a set,
# a dict's key, ``in`` a set). An object's own hash and text are C slots that no hook reports,
# so the user code a trace ran is scanned (every instruction counts, taken or not):
# * a set made of items not all known to hash by value (``set(objs)``, ``{a, b}``, a set
#   comprehension, ``s.add(o)`` into one), used otherwise than for its membership, size or
#   sorted items (``in``, ``len``, ``bool``, ``sorted``, ``any``, ``all``, ``==``, its
#   ``add``, ``discard``, ``remove``, ``update``, ``issubset`` ...: iterated, passed to a
#   call, popped, returned, stored other than in a local), through locals it is stored in;
# * the text of a value (``repr``, ``str``, ``ascii``, ``format``, an f-string, ``%``,
#   ``str.format``) that is an object whose class keeps ``object.__repr__`` (and, but for
#   ``repr``, ``object.__str__``), a function or a bound method, or a tuple, list or dict
#   holding one, where the scan reads the value back (a constant, a global, a parameter or an
#   attribute chain of one), or an object the code makes of such a class there.
# Either makes the call run eagerly. Not seen: a text whose operand the scan cannot read back
# (an item of a list, a call's result other than a class's), and library code's sets and texts
# (torch's memo sets of modules ask for membership only).
_ORDER_FREE_CALLS = (len, bool, sorted, any, all)
_ORDER_FREE_METHODS = frozenset({
    "add", "discard", "remove", "update", "clear", "issubset", "issuperset", "isdisjoint",
    "__contains__", "__len__", "difference_update", "intersection_update",
    "symmetric_difference_update"})
_BY_VALUE = (int, float, complex, str, bytes, type(None))  # (bool is an int)
_TEXT_CALLS = (repr, str, ascii, format)
_FORMATS = ("FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE")


def _hashed_by_value(v, depth: int = 0) -> bool:
    if isinstance(v, tuple) and depth < 3:
        return all(_hashed_by_value(i, depth + 1) for i in v)
    return v is not _UNKNOWN and type(v) in (*_BY_VALUE, bool)


def _order_free(c: _Code, k: int, depth: int = 0) -> bool:
    """Whether every use of the set that ``k`` pushes asks only for its membership, size or
    sorted items (Note [Answers from addresses])."""
    uses = c.f.consumers(k)
    if depth > 4 or uses is None:  # (a path the walk cannot follow: any use)
        return False
    for j, d, _ in uses:
        i = c.f.ins[j]
        if i.opname == "CONTAINS_OP" and d == 0 or i.opname == "COMPARE_OP" or \
                i.opname.startswith(("POP_JUMP", "TO_BOOL")):
            continue
        if i.opname == "CALL" and d == i.arg - 1 and c.callee(j) in _ORDER_FREE_CALLS:
            continue
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in _ORDER_FREE_METHODS:
            continue
        if i.opname in ("SET_ADD", "SET_UPDATE") and d == i.arg:
            continue  # (items added: the set's uses are its other consumers')
        if i.opname == "STORE_FAST" and all(
                _order_free(c, m, depth + 1) for m, u in enumerate(c.f.ins)
                if u.opname in ("LOAD_FAST", "LOAD_FAST_CHECK") and u.argval == i.argval):
            continue
        return False
    return True


def _address_text(v, plain: bool, depth: int = 0) -> bool:
    """Whether the text of ``v`` names an address (``plain``: as ``str`` makes it, else
    ``repr``)."""
    if isinstance(v, (tuple, list)) and depth < 2:
        return any(_address_text(i, False, depth + 1) for i in v)
    if isinstance(v, dict) and depth < 2:
        return any(_address_text(i, False, depth + 1) for i in (*v, *v.values()))
    if v is _UNKNOWN or isinstance(v, type):
        return False
    t = type(v)
    return isinstance(v, (types.FunctionType, types.MethodType)) or t.__repr__ is \
        object.__repr__ and (not plain or t.__str__ is object.__str__ and
                             t.__format__ is object.__format__)


def _text_operand(c: _Code, k: int, d: int, plain: bool) -> bool:
    v = c.value(k, d)
    v = _attribute_of_parameter(c, k, d) if v is _UNKNOWN else v
    if v is _UNKNOWN:  # an object the code makes of a class: its instances' text
        found = c.f.producers(k, d) or ()
        cls = c.callee(found[0][0]) if len(found) == 1 and \
            c.f.ins[found[0][0]].opname == "CALL" else _UNKNOWN
        return isinstance(cls, type) and cls.__repr__ is object.__repr__ and not issubclass(
            cls, BaseException)
    return _address_text(v, plain)


def _str_format(c: _Code, k: int) -> bool:
    """Whether the ``CALL`` at ``k`` calls ``format`` of a ``str`` (``"{}".format(o)``)."""
    for d in (c.f.ins[k].arg, c.f.ins[k].arg + 1):
        found = c.f.producers(k, d) or ()
        if len(found) == 1:
            p = found[0][0]
            i = c.f.ins[p]
            if i.opname in ("LOAD_METHOD", "LOAD_ATTR") and i.argval == "format":
                return isinstance(c.value(p, 0), str)
    return False


_OPCODES = frozenset(dis.opmap[n] for n in ("BUILD_SET", *_FORMATS) if n in dis.opmap)
_NAMES = frozenset({"set", "frozenset", "repr", "str", "ascii", "format"})


def _may_ask(code: types.CodeType) -> bool:
    """Whether ``code`` has an instruction or a name that ``address_question`` looks at (a
    cheap test before the walk: most code has none)."""
    raw = code.co_code
    return not _NAMES.isdisjoint(code.co_names) or any(
        raw[j] in _OPCODES for j in range(0, len(raw), 2)) or any(
        type(k) is str and "%" in k for k in code.co_consts)


def address_question(code: types.CodeType, g: dict, params: dict) -> str | None:
    """Note [Answers from addresses]: the first order-dependent use of a set of objects that
    may hash by address, or text of an object that names its address, in ``code``, as
    ``"a set's order (file.py:12)"``, or None."""
    if not _may_ask(code):
        return None
    c = _Code(code, g, params)
    for k, i in enumerate(c.f.ins):
        what = None
        if i.opname == "BUILD_SET":  # (empty: its items come later, by add or a comprehension)
            if not (i.arg and all(_hashed_by_value(c.value(k, d)) for d in range(i.arg))) \
                    and not _order_free(c, k):
                what = "a set's order"
        elif i.opname in _FORMATS:  # (3.11-3.12: FORMAT_VALUE; 3.13: the other three)
            d = 1 if i.opname == "FORMAT_WITH_SPEC" or i.opname == "FORMAT_VALUE" and \
                i.arg & 4 else 0
            conversion = i.arg & 3 if i.opname in ("FORMAT_VALUE", "CONVERT_VALUE") else 0
            if _text_operand(c, k, d, conversion not in (2, 3)):  # (!r, !a: repr)
                what = "an object's default text"
        elif i.opname == "BINARY_OP" and i.argrepr == "%" and isinstance(c.value(k, 1), str):
            if _text_operand(c, k, 0, True):
                what = "an object's default text"
        elif i.opname == "CALL":
            callee = c.callee(k)
            if callee in (set, frozenset):
                if not _hashed_by_value(c.value(k, 0)) and not _order_free(c, k):
                    what = "a set's order"
            elif i.arg and (callee in _TEXT_CALLS or _str_format(c, k)):
                plain = callee is not repr and callee is not ascii
                if any(_text_operand(c, k, d, plain) for d in range(i.arg)):
                    what = "an object's default text"
        if what is not None:
            return f"{what} ({c.where(k)})"
    return None
