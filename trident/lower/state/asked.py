"""``isinstance`` and ``issubclass`` as the trace's code calls them, judged against eager's
answer (Note [Questions asked in the trace]).

Note [Questions asked in the trace]: the trace runs the function on stand-ins (a
``FakeTensor`` for each tensor, a ``torch.SymInt`` for a symbolic size or a value ``.item()``
read), and ``isinstance(v, C)`` answers for the stand-in: where eager's answer for the call's
value (a ``torch.Tensor`` or ``nn.Parameter``, an ``int``) differs, every hit returned the
branch eager never takes. The bytecode scans (``tensor_type_read`` in bytecode.py,
``symbolic_question`` in questions.py) see a question where the code names its class (a
global, a constant) and its operand is a parameter; a class from a local import, a closure or
an argument, and library code's questions about a symbolic value passed them by.

Both builtins are C functions, so the recording's profile hook is told of each call as a
``c_call`` event, from the frame that calls it, with the builtin itself (compared by identity:
the builtins are never replaced, since Dynamo keeps their identities the first time it needs
them: tests/test_break47.py). The frame's last instruction is the ``CALL``; its two
arguments are read back from what put them on the stack (``flow.Flow.producers``): a local or
a cell read from the frame's locals (no store to it between the load and the call), a class,
tuple or module stored as an attribute of such a module or class (``inspect.getattr_static``:
no code runs; ``getattr(m, "name")`` too), a tuple of such values, or what the code alone
says (a global, a constant, a module's or a class's
attribute: ``Flow.static``). Where the operand is a stand-in (``issubclass``: a stand-in's
class), the answer is compared with eager's:

* eager's is ``issubclass`` of the value's eager class (``torch.Tensor`` and ``nn.Parameter``
  for a fake tensor, the two its argument guards accept: Note [Tensor types and attributes] in
  ir/guards.py; ``int``, ``float``, ``bool`` for ``SymInt``, ``SymFloat``, ``SymBool``) for
  each class asked; ``nn.Parameter`` and ``nn.Buffer`` answer by the flag torch gives the fake
  (guarded), and the stand-in that traced code gets for ``torch._subclasses.FakeTensor`` by
  its own eager answer (Note [Value reads] in lower/values.py);
* a class whose metaclass answers by code of its own (not ``type``'s or ``ABCMeta``'s check),
  and a class argument that cannot be read back, answer unknowably.

Judged: user code, and library code whose reads are scanned (Note [Library code that ran] in
library.py), but torch's own questions about a symbolic value (it asks ``isinstance(n,
torch.SymInt)`` on purpose). A question answered otherwise, or unknowably, is kept and makes
the trace fail (``raise_asked``): a fake tensor's at every size (the call runs eagerly), a
symbolic value's as the scans' do (traced again at exact sizes; a value ``.item()`` read runs
eagerly). An operand that cannot be read back (``isinstance(self.w, C)``, a call's result) is
left to the bytecode scans, as before. CPython 3.11 and 3.12 report C calls to a profile
function so (3.12 through ``sys.monitoring``'s legacy events).
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import inspect
import types

import torch
from torch._subclasses.fake_tensor import FakeTensor

from trident.errors import TridentError
from trident.lower.state import flow
from trident.lower.state.flow import _UNKNOWN

ASKERS = (builtins.isinstance, builtins.issubclass)
# a stand-in's class -> the classes of the values it stands for in eager
_EAGER = {FakeTensor: (torch.Tensor, torch.nn.Parameter), torch.SymInt: (int,),
          torch.SymFloat: (float,), torch.SymBool: (bool,)}
_BY_FLAG = (torch.nn.Parameter, *filter(None, [getattr(torch.nn, "Buffer", None)]))
_CHECKS = {True: (type.__instancecheck__, abc.ABCMeta.__instancecheck__,  # answer by the
                  *{type(c).__instancecheck__ for c in _BY_FLAG}),  # class alone (torch's
           False: (type.__subclasscheck__, abc.ABCMeta.__subclasscheck__)}  # _ParameterMeta:
# by the flag for Parameter itself, by the class for its subclasses, UninitializedParameter)
_LOCAL_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLOSURE"})
_FLOWS: dict = {}  # id of a code object -> (the code, its flow.Flow)


@dataclasses.dataclass(frozen=True)
class Asked:
    """A question whose answer for the stand-in may not be eager's: ``what`` (``"isinstance()
    (f.py:3)"``), ``who`` (``"the function"`` or ``"library code the function runs (name)"``),
    ``tensor``: of a fake tensor (else of a symbolic number)."""

    what: str
    who: str
    tensor: bool


def _classes(classinfo) -> list | None:
    """The classes of ``isinstance``'s second argument (a class, a tuple of them nested, a
    ``X | Y`` union), or None for another object (``typing.Union``: answers by its code)."""
    if isinstance(classinfo, types.UnionType):
        classinfo = classinfo.__args__
    if isinstance(classinfo, type):
        return [classinfo]
    if not isinstance(classinfo, tuple):
        return None
    out: list = []
    for c in classinfo:
        found = _classes(c)
        if found is None:
            return None
        out += found
    return out


def _eager_alike(obj, stand_in: type, classinfo, instance: bool) -> bool:
    """Whether eager answers as the trace does, for every class ``stand_in`` stands for
    (``instance``: ``isinstance(obj, classinfo)``, else ``issubclass(stand_in, classinfo)``)."""
    classes = _classes(classinfo)
    if classes is None:
        return False
    answer = isinstance(obj, classinfo) if instance else issubclass(stand_in, classinfo)
    for eager in _EAGER[stand_in]:
        got = False
        for c in classes:
            if instance and stand_in is FakeTensor and (
                    c in _BY_FLAG or getattr(type(c), "answers_as_eager", False)):
                got = got or isinstance(obj, c)  # (the fake carries the flag: guarded; the
                # stand-in for torch._subclasses.FakeTensor: Note [Value reads] in values.py)
            elif getattr(type(c), "__instancecheck__" if instance else "__subclasscheck__",
                         None) in _CHECKS[instance]:
                got = got or issubclass(eager, c)
            else:
                return False  # (a metaclass's own check)
        if got != answer:
            return False
    return True


def _flow(frame) -> flow.Flow:
    code = frame.f_code
    found = _FLOWS.get(id(code))
    if found is None or found[0] is not code:
        if len(_FLOWS) >= 4096:
            _FLOWS.clear()
        found = _FLOWS[id(code)] = (code, flow.Flow(code, frame.f_globals))
    return found[1]


def _value(f: flow.Flow, k: int, d: int, local: dict):
    """The value at depth ``d`` of the stack before ``f.ins[k]``, read back from the frame's
    ``local``s or from what the code alone says; ``_UNKNOWN`` where neither tells."""
    found = f.producers(k, d)
    if not found or len(found) != 1:
        return _UNKNOWN
    p, slot = found[0]
    i = f.ins[p]
    if i.opname in _LOCAL_LOADS and slot == 0:
        if i.argval not in local or any(
                j.opname.startswith(("STORE_", "DELETE_")) and j.argval == i.argval
                for j in f.ins[p + 1:k]):
            return _UNKNOWN
        return local[i.argval]
    if i.opname == "LOAD_ATTR" and slot == 0 and f.effect(p)[1] == 1:  # lib.C
        return _attribute(_value(f, p, 0, local), i.argval)
    if i.opname == "CALL" and slot == 0 and i.arg == 2 and (f.call_parts(p) or (None,))[
            0] is getattr:  # getattr(torch, "_subclasses")
        return _attribute(_value(f, p, 1, local), _value(f, p, 0, local))
    if i.opname == "BUILD_TUPLE" and slot == 0:
        parts = [_value(f, p, i.arg - 1 - e, local) for e in range(i.arg)]
        return _UNKNOWN if any(v is _UNKNOWN for v in parts) else tuple(parts)
    return f.static(k, d)


def _attribute(base, name):
    """``base.name`` for a module or a class, as stored (``inspect.getattr_static``: no code
    runs), where it is a class, a tuple or a module; what a module's ``__getattr__`` serves
    traced code where it says so (``torch._subclasses.FakeTensor``: Note [Value reads] in
    lower/values.py); else ``_UNKNOWN``."""
    if not isinstance(base, (types.ModuleType, type)) or not isinstance(name, str):
        return _UNKNOWN
    try:
        found = inspect.getattr_static(base, name)
    except AttributeError:
        served = vars(base).get("__getattr__") if isinstance(base, types.ModuleType) else None
        found = getattr(served, "answers", {}).get(name, _UNKNOWN)
    return found if isinstance(found, (type, tuple, types.ModuleType)) else _UNKNOWN


def judge(frame, asker, who: str, symbolic: bool) -> Asked | None:
    """Note [Questions asked in the trace]: the question that ``frame`` asks by calling
    ``asker`` (``isinstance`` or ``issubclass``) where eager may answer otherwise, else None;
    ``symbolic``: questions about a symbolic number count too."""
    f = _flow(frame)
    k = f.at.get(frame.f_lasti)
    if k is None or f.ins[k].opname != "CALL" or f.ins[k].arg != 2:
        return None
    local = frame.f_locals
    obj = _value(f, k, 1, local)
    instance = asker is ASKERS[0]
    stand_in = type(obj) if instance else obj
    if obj is _UNKNOWN or not isinstance(stand_in, type) or stand_in not in _EAGER or (
            stand_in is not FakeTensor and not symbolic):
        return None
    classinfo = _value(f, k, 0, local)
    if classinfo is not _UNKNOWN and _eager_alike(obj, stand_in, classinfo, instance):
        return None
    line = f.ins[k].positions.lineno if f.ins[k].positions else "?"
    return Asked(f"{asker.__name__}() ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{line})",
                 who, stand_in is FakeTensor)


def raise_asked(asked: list) -> None:
    """Raises for the first question of ``asked`` (Note [Questions asked in the trace])."""
    if not asked:
        return
    first = asked[0]
    if first.tensor:
        error = TridentError(f"{first.who} reads a tensor's Python type, {first.what}: the "
                             "trace's fake tensors have another")
        error.any_sizes = True  # (policy.py: a trace at exact sizes reads it alike)
        raise error
    raise TridentError(f"{first.who} asks Python what a symbolic value is, {first.what}: a "
                       "trace answers for a torch.SymInt, eager for an int")
