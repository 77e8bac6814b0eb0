"""Questions user code asks Python about a trace's stand-ins, which a trace answers for the
stand-in and eager for the call's value: ``type``, ``isinstance``, ``is`` of a symbolic int
(Note [Questions about symbolic values]). Reads of a tensor's own attributes are
tensor_reads.py's, which runs these scans too (``check_questions``).

Note [Questions about symbolic values]: where an int is symbolic (a size under dynamic shapes,
an int leaf: Note [Int leaves] in frontend/policy.py), the function's Python holds a
torch.SymInt (SymFloat, SymBool for what it computes from one). What it computes with it is
traced; its text is the value's (Note [Symbolic values as text] in source_lines.py). But
``type(n)``, ``n.__class__``, ``isinstance(n, int)``, ``case int()``, ``n is 0``,
``operator.is_`` and ``id(n)`` answer for the SymInt, with no call torch sees: the trace bakes
that answer, and every hit of the symbolic specialization returned what eager never does
(Dynamo, which interprets the bytecode, answers them for an int). No hook sees them (``type``
is no function the profile hook reports, ``is`` no call at all, and ``isinstance`` reads
``__class__`` only where the type's own check fails), so after a symbolic trace the bytecode of
each user function that ran is scanned (``symbolic_question``; every instruction counts, taken
or not): a question whose operand may be symbolic makes the symbolic trace fail, and the call is
traced again at exact sizes and ints (``_compile_dynamic_or_static`` in frontend/dynamic.py:
automatic dynamic specializes from then on, as it does after any failed dynamic trace), where
Python answers with ints. A question is let through where its answer cannot differ: an operand the
code alone knows (a constant, a global, a parameter never rebound whose value at the call is no
SymInt, SymFloat or SymBool: ``type(self)``); ``isinstance`` with classes that hold alike of a
SymInt and an int (``tuple``, ``torch.Tensor``); ``type(v)`` only compared with other classes
than ``int``, ``float``, ``bool`` and the symbolic ones; ``a is b`` where one side is known to
be no number (``x is None``, a sentinel). An int an object's attribute holds is not trusted as
known (an int leaf is put back after the trace). Library code's questions are not scanned
(torch asks ``isinstance(n, torch.SymInt)`` on purpose); its ``isinstance`` and
``issubclass``, and the function's own with a class the code does not name, are judged as the
trace calls them (Note [Questions asked in the trace] in asked.py).
"""

from __future__ import annotations

import functools
import operator
import string
import types

import torch

from trident.lower.state import flow
from trident.lower.state.flow import _UNKNOWN

_PAIRS = ((torch.SymInt, int), (torch.SymFloat, float), (torch.SymBool, bool))
_SYMBOLIC = tuple(s for s, _ in _PAIRS)
_TYPE_ANSWERS = frozenset(c for pair in _PAIRS for c in pair)  # type(n) compared with these
_NUMBERS = (int, float, complex, *_SYMBOLIC)  # (bool is an int)
_LOAD_FAST = ("LOAD_FAST", "LOAD_FAST_CHECK")
_STORES = ("STORE_FAST", "DELETE_FAST", "STORE_DEREF", "DELETE_DEREF")


class _Code:
    """One code object's instructions (``flow.Flow``) with its parameters' values at the
    trace's call (the recording's)."""

    def __init__(self, code: types.CodeType, g: dict, params: dict):
        self.code, self.f = code, flow.Flow(code, g)
        stored = {i.argval for i in self.f.ins if i.opname in _STORES}
        self.params = {n: v for n, v in params.items() if n not in stored}

    def value(self, k: int, d: int):
        """The value at depth ``d`` before instruction ``k`` where the code and the call's
        parameters say it, else ``_UNKNOWN``: a number is known only as a constant or a
        global (an object's int attribute may be an int leaf, put back after the trace)."""
        found = self.f.producers(k, d)
        if not found or len(found) != 1:
            return _UNKNOWN
        p, _ = found[0]
        i = self.f.ins[p]
        if i.opname in _LOAD_FAST and isinstance(i.argval, str) and i.argval in self.params:
            return self.params[i.argval]
        if i.opname == "LOAD_CONST":
            return i.argval
        value = self.f.static(k, d)
        if i.opname != "LOAD_GLOBAL" and isinstance(value, _NUMBERS):
            return _UNKNOWN
        return value

    def callee(self, k: int):
        """The static value of what the ``CALL`` at ``k`` calls, or ``_UNKNOWN``."""
        argc = self.f.ins[k].arg
        upper = self.known(k, argc + 1)
        if upper is not _UNKNOWN and upper is not None:
            return upper
        lower = self.known(k, argc)
        return lower if lower is not _UNKNOWN else self.item(k, argc)

    def item(self, k: int, d: int, depth: int = 0):
        """The value at depth ``d`` before ``k`` where it is an item, by a constant key, of a
        container the code names (``vars(builtins)["type"]``, ``builtins.__dict__["type"]``,
        ``[type][0]``, ``{"t": type}["t"]``: session 43, each a question the scan missed),
        else ``_UNKNOWN``."""
        found = self.f.producers(k, d)
        if not found or len(found) != 1 or depth > 4:
            return _UNKNOWN
        p = found[0][0]
        i = self.f.ins[p]
        if (i.opname == "CALL" and i.arg == 1 and self.callee(p) is vars) or (
                i.opname == "LOAD_ATTR" and i.argval == "__dict__"):
            base = self.known(p, 0)
            if isinstance(base, (types.ModuleType, type)):  # (no Python code serves these)
                return vars(base)
            return _UNKNOWN
        try:
            if i.opname in ("BUILD_LIST", "BUILD_TUPLE"):
                items = [self.known(p, e) for e in range(i.arg - 1, -1, -1)]
                return _UNKNOWN if any(v is _UNKNOWN for v in items) else items
            if i.opname == "BUILD_MAP":
                parts = [self.known(p, e) for e in range(2 * i.arg - 1, -1, -1)]
                return _UNKNOWN if any(v is _UNKNOWN for v in parts) else \
                    dict(zip(parts[::2], parts[1::2]))
            if i.opname == "BUILD_CONST_KEY_MAP":
                keys = self.known(p, 0)
                values = [self.known(p, e) for e in range(i.arg, 0, -1)]
                return _UNKNOWN if not isinstance(keys, tuple) or any(
                    v is _UNKNOWN for v in values) else dict(zip(keys, values))
        except TypeError:  # (an unhashable key)
            return _UNKNOWN
        if i.opname != "BINARY_SUBSCR":
            return _UNKNOWN
        key = self.known(p, 0)
        base = self.known(p, 1)
        if base is _UNKNOWN:
            base = self.item(p, 1, depth + 1)
        try:
            return base[key] if isinstance(base, (dict, list, tuple, types.MappingProxyType)) \
                and flow.immutable(key) else _UNKNOWN
        except (KeyError, IndexError, TypeError):
            return _UNKNOWN

    def known(self, k: int, d: int):
        """``Flow.static``, or the call's value of a parameter never rebound (``t=type``)."""
        value = self.f.static(k, d)
        if value is _UNKNOWN:
            found = self.f.producers(k, d)
            if found and len(found) == 1:
                i = self.f.ins[found[0][0]]
                if i.opname in _LOAD_FAST and isinstance(i.argval, str) and \
                        i.argval in self.params:
                    return self.params[i.argval]
        return value

    def where(self, k: int) -> str:
        i = self.f.ins[k]
        line = i.positions.lineno if i.positions and i.positions.lineno else "?"
        return f"{self.code.co_filename.rsplit('/', 1)[-1]}:{line}"


def _maybe_symbolic(value) -> bool:
    return value is _UNKNOWN or isinstance(value, _SYMBOLIC)


def _no_number(value) -> bool:
    return value is not _UNKNOWN and not isinstance(value, _NUMBERS)


def _classes(c: _Code, k: int, d: int) -> list | None:
    """The classes of ``isinstance``'s second argument at depth ``d`` before ``k`` (a class,
    a tuple of them, a union), or None where the code does not say."""
    found = c.f.producers(k, d)
    if found and len(found) == 1 and c.f.ins[found[0][0]].opname == "BUILD_TUPLE":
        p = found[0][0]
        parts = [_classes(c, p, e) for e in range(c.f.ins[p].arg)]
        return None if any(part is None for part in parts) else [x for part in parts
                                                                 for x in part]
    value = c.f.static(k, d)
    if isinstance(value, types.UnionType):
        value = value.__args__
    if isinstance(value, type):
        return [value]
    if isinstance(value, tuple) and all(isinstance(x, type) for x in value):
        return list(value)
    return None


def _holds_alike(cls: type) -> bool:
    """``isinstance(v, cls)`` answers alike for a SymInt and an int (SymFloat, float ...)."""
    try:
        return all(issubclass(s, cls) == issubclass(p, cls) for s, p in _PAIRS)
    except TypeError:
        return False


def _compared_with_others(c: _Code, k: int) -> bool:
    """Whether the type that ``ins[k]`` pushes is only compared (``is``, ``==``) with classes
    other than ``int``, ``float``, ``bool`` and the symbolic ones."""
    found = False
    for j, i in enumerate(c.f.ins):
        if i.opname not in ("IS_OP", "COMPARE_OP"):
            continue
        for d in (0, 1):
            if (k, 0) in (c.f.producers(j, d) or ()):
                other = c.f.static(j, 1 - d)
                if not isinstance(other, type) or other in _TYPE_ANSWERS:
                    return False
                found = True
    return found


def symbolic_question(code: types.CodeType, g: dict, params: dict) -> str | None:
    """Note [Questions about symbolic values]: the first question in ``code`` whose answer
    may differ for a symbolic value, as ``"type() (file.py:12)"``, or None."""
    c = _Code(code, g, params)
    for k, i in enumerate(c.f.ins):
        what = None
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval == "__class__":
            if _maybe_symbolic(c.value(k, 0)) and not _compared_with_others(c, k):
                what = ".__class__"
        elif i.opname == "IS_OP":
            a, b = c.value(k, 0), c.value(k, 1)
            if (_maybe_symbolic(a) or _maybe_symbolic(b)) and not (_no_number(a) or
                                                                   _no_number(b)):
                what = "is" if not i.arg else "is not"
        elif i.opname == "MATCH_CLASS":  # match n: case int(): (subject, class, names)
            classes = _classes(c, k, 1)
            if (classes is None or not all(_holds_alike(x) for x in classes)) and \
                    _maybe_symbolic(c.value(k, 2)):
                what = "match ... case"
        elif i.opname == "CALL" and i.arg in (1, 2):
            callee = c.callee(k)
            if callee is type and i.arg == 1:
                if _maybe_symbolic(c.value(k, 0)) and not _compared_with_others(c, k):
                    what = "type()"
            elif callee is id and i.arg == 1:
                if _maybe_symbolic(c.value(k, 0)):
                    what = "id()"
            elif callee is isinstance and i.arg == 2:
                classes = _classes(c, k, 0)
                if (classes is None or not all(_holds_alike(x) for x in classes)) and \
                        _maybe_symbolic(c.value(k, 1)):
                    what = "isinstance()"
            elif callee in (operator.is_, operator.is_not) and i.arg == 2:
                a, b = c.value(k, 0), c.value(k, 1)
                if (_maybe_symbolic(a) or _maybe_symbolic(b)) and not (_no_number(a) or
                                                                       _no_number(b)):
                    what = f"operator.{callee.__name__}()"
        if what is None and i.opname == "CALL":
            what = _introspection(c, k, i.arg)
        if what is not None:
            return f"{what} ({c.where(k)})"
    return None


# Note [Questions about symbolic values], the builtins: a C function that takes the value
# itself (not its ``__index__``, ``__float__`` or text) answers for the SymInt object, which no
# hook sees: ``pickle.dumps(n)`` pickles the SymInt, ``sys.getsizeof(n)``, ``dir(n)``,
# ``hasattr(n, "node")``, ``getattr(n, "__class__")``, ``type.__call__(type, n)``,
# ``int.__instancecheck__(n)``, ``weakref.ref(n)``. So a call whose callee the code names
# (statically) as a builtin function, a slot of a class or a class no Python code makes, other
# than those whose answer is the int's (``_ANSWER_AS_INT``: what converts the value, does
# arithmetic or makes text of it, and torch's, math's and operator's functions), or as a dunder
# attribute (``int.__instancecheck__``, ``n.__reduce__``), with an argument that may be
# symbolic, is a question; so is a call given such a builtin beside a value that may be
# symbolic (``map(type, x.shape)``, ``sorted(sizes, key=id)``), a call of what ``getattr``,
# ``operator.attrgetter``/``methodcaller`` or ``functools.partial`` made (``getattr(builtins,
# "type")(n)``), and ``str.format`` of a text that reads a field's attribute or item
# (``"{0.__class__}".format(n)``). A parameter never rebound is known by its value at the call
# (``def f(x, t=type)``), and an item by a constant key of a container the code names
# (``vars(builtins)["type"](n)``, ``builtins.__dict__["type"]``, ``[type][0]``, ``{"t":
# type}["t"]``: ``_Code.item``). A callee the code does not name (a
# tensor's method, a local the code computed) is not one: torch's methods take SymInts.
_ANSWER_AS_INT = frozenset({
    abs, all, any, bool, bytearray, bytes, chr, complex, dict, divmod, enumerate, filter,
    float, format, frozenset, hash, hex, bin, oct, int, iter, len, list, map, max, min, next,
    ord, pow, print, range, repr, reversed, round, set, slice, sorted, str, sum, tuple, zip,
    type, id, isinstance})  # (the last three: asked above, with their own exceptions)
_ANSWERING_MODULES = ("torch", "math", "cmath", "operator", "_operator", "builtins")
_C_CALLABLES = (types.BuiltinFunctionType, types.MethodDescriptorType,
                types.WrapperDescriptorType, types.MethodWrapperType,
                types.ClassMethodDescriptorType)


def _introspection(c: _Code, k: int, argc: int) -> str | None:
    """Note [Questions about symbolic values], the builtins: ``"name()"`` where the ``CALL`` at
    ``k`` asks a builtin about an argument that may be symbolic, else None."""
    callee = c.callee(k)
    if callee is _UNKNOWN:
        found = c.f.producers(k, argc + 1) or []
        found = found + (c.f.producers(k, argc) or [])
        for p, _ in found:  # getattr(builtins, "type")(n), operator.attrgetter(...)(n)
            if c.f.ins[p].opname == "CALL" and _held(c.callee(p), _MAKERS):
                if any(_maybe_symbolic(c.value(k, d)) for d in range(argc)):
                    return f"{getattr(c.callee(p), '__name__', '?')}(...)()"
            i = c.f.ins[p]  # "{0.__class__}".format(n)
            if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in ("format", "format_map") \
                    and _fields_read(c.f.static(p, 0)):
                if any(_maybe_symbolic(c.value(k, d)) for d in range(argc)):
                    return "str.format() of an attribute"
        named = [c.f.ins[p].argval for p, _ in found
                 if c.f.ins[p].opname in ("LOAD_ATTR", "LOAD_METHOD")]
        if not any(isinstance(n, str) and n[:2] == n[-2:] == "__" for n in named):
            return None
        name = next(n for n in named if n[:2] == n[-2:] == "__")
        receiver = _UNKNOWN  # (n.__reduce__(): the receiver is an argument too)
    else:
        try:
            if callee in _ANSWER_AS_INT or not (isinstance(callee, _C_CALLABLES) or
                                                _made_in_c(callee)):
                return _passed_asker(c, k, argc)
        except TypeError:  # an unhashable callee
            return None
        owner = getattr(callee, "__self__", None)
        module = getattr(callee, "__module__", None) or getattr(
            getattr(callee, "__objclass__", None), "__module__", None) or (
            owner.__name__ if isinstance(owner, types.ModuleType) else None)
        if isinstance(module, str) and module.partition(".")[0] in _ANSWERING_MODULES and \
                module != "builtins":
            return None
        name = getattr(callee, "__qualname__", None) or getattr(callee, "__name__", "?")
        if (isinstance(owner, (str, bytes)) and not _fields_read(owner)) or (
                isinstance(owner, type) and (
                name.rpartition(".")[2] == "__new__" or name[-2:] != "__")):
            return None  # "{}".format(n): the value's text; a namedtuple's tuple.__new__
        receiver = None
    values = [c.value(k, d) for d in range(argc)]
    if receiver is _UNKNOWN:
        values.append(_UNKNOWN)
    if any(_maybe_symbolic(v) for v in values):
        return f"{name}()"
    return None


# Note [Python attributes of tensors], the other spellings: ``vars`` under another name
# (``V = vars``), ``getattr(x, "__dict__")``, ``dir(x)`` (the fake's attributes),
# ``object.__getattribute__(x, name)`` and ``x.__getattribute__(name)`` (which raise without
# calling ``__getattr__``, the hook) read the fake's answer alike.
_DICT_READERS = {vars: (1, 0, "vars()"), dir: (1, 0, "dir()"),
                 object.__getattribute__: (2, 1, "object.__getattribute__()")}


# what makes a callable that asks Python about its argument: getattr(builtins, "type"),
# operator.attrgetter("__class__"), functools.partial(isinstance)
_MAKERS = (getattr, operator.attrgetter, operator.methodcaller, functools.partial)


def _fields_read(text) -> bool:
    """Whether ``text``, a str whose ``format`` is called, reads an attribute or an item of
    an argument (``"{0.__class__}"``): its answer is the object's."""
    if not isinstance(text, str):
        return False
    try:
        return any(name and ("." in name or "[" in name)
                   for _, name, _, _ in string.Formatter().parse(text))
    except ValueError:
        return True


def _made_in_c(cls) -> bool:
    """A class whose objects no Python code makes (``weakref.ref``, ``array.array``: it may
    hold the SymInt object itself), other than those that answer as for an int."""
    if not isinstance(cls, type):
        return False
    return not any(isinstance(vars(k).get(m), (types.FunctionType, staticmethod, classmethod))
                   for k in cls.__mro__ for m in ("__new__", "__init__"))


def _asker(value) -> bool:
    """A builtin that answers for the object it is given (``type``, ``id``, ``dir``,
    ``sys.getsizeof``), not for its int."""
    try:
        if value in (type, id, isinstance):
            return True
        if value in _ANSWER_AS_INT or not isinstance(value, _C_CALLABLES):
            return False
    except TypeError:
        return False
    module = getattr(value, "__module__", None)
    return not (isinstance(module, str) and module != "builtins" and
                module.partition(".")[0] in _ANSWERING_MODULES)


def _passed_asker(c: _Code, k: int, argc: int) -> str | None:
    """``map(type, x.shape)``, ``sorted(sizes, key=id)``: an asking builtin passed as an
    argument of the ``CALL`` at ``k`` beside one that may be symbolic."""
    values = [c.value(k, d) for d in range(argc)]
    askers = [v for v in values if v is not _UNKNOWN and _asker(v)]
    if askers and any(_maybe_symbolic(v) for v in values if v is not askers[0]):
        return f"{getattr(askers[0], '__name__', '?')}() passed to a call"
    return None


def _held(value, among=None) -> bool:
    """Whether ``value`` is one of ``among`` (``_DICT_READERS``)."""
    try:
        return value in (_DICT_READERS if among is None else among)
    except TypeError:  # unhashable
        return False


def _attribute_of_parameter(c: _Code, k: int, d: int, depth: int = 0):
    """The value at depth ``d`` before ``k`` where it is an attribute chain of a parameter
    (``self.config``, ``m.weight``), read from the call's objects without running code (a
    module's parameters, buffers and submodules; an object's ``__dict__``; a class's), else
    ``_UNKNOWN``. The trace's leaves are back in place: a tensor is a tensor there as it was a
    fake tensor in the trace, and any other object the same object."""
    found = c.f.producers(k, d)
    if not found or len(found) != 1 or depth > 8:
        return _UNKNOWN
    p, _ = found[0]
    i = c.f.ins[p]
    if i.opname in _LOAD_FAST and isinstance(i.argval, str) and i.argval in c.params:
        return c.params[i.argval]
    if i.opname != "LOAD_ATTR":
        return _UNKNOWN
    base = _attribute_of_parameter(c, p, 0, depth + 1)
    if isinstance(base, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            held = vars(base).get(table)
            if isinstance(held, dict) and i.argval in held:
                return held[i.argval]
    return _UNKNOWN if base is _UNKNOWN else flow._static_attr(base, i.argval)
