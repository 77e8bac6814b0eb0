"""Questions about a trace's stand-ins seen as they are asked (Note [Questions asked in the
trace]): ``isinstance`` and ``issubclass`` of a fake tensor or a symbolic number, whatever class
they are given and however the code computed it.

Note [Questions asked in the trace]: the trace runs the function on stand-ins (a
``FakeTensor`` for each tensor, a ``torch.SymInt`` for a symbolic size or a value ``.item()``
read), and ``isinstance(v, C)`` answers for the stand-in: where eager's answer for the call's
value (a ``torch.Tensor`` or ``nn.Parameter``, an ``int``) differs, every hit returned the
branch eager never takes. The bytecode scans (``tensor_type_read`` in bytecode.py,
``symbolic_question`` in questions.py) see a question only where the code names its class (a
global, a constant) and its operand's origin (a parameter); a class from a local import, a
closure, an argument or ``getattr(module, name)``, an operand from an attribute, and library
code's questions about a symbolic value passed them by. So while a trace runs, ``isinstance``
and ``issubclass`` of the builtins module are wrappers (``watch``) that answer as the builtins
do and, when this thread is tracing, the operand is a stand-in (``issubclass``: a stand-in's
class, ``type(x)``) and the caller is user code or scanned library code (Note [Library code
that ran] in library.py; torch's own tracing machinery asks ``isinstance(x, FakeTensor)`` and
``isinstance(n, torch.SymInt)`` on purpose), compare the answer with eager's:

* eager's is ``issubclass`` of the value's eager class (``torch.Tensor`` and ``nn.Parameter``
  for a fake tensor, the two its argument guards accept: Note [Tensor types and attributes] in
  ir/guards.py; ``int``, ``float``, ``bool`` for ``SymInt``, ``SymFloat``, ``SymBool``) for
  each class asked; ``nn.Parameter`` and ``nn.Buffer`` answer by the flag torch gives the fake
  (guarded), and the stand-in that traced code gets for ``torch._subclasses.FakeTensor`` by
  its own eager answer (Note [Value reads] in lower/values.py);
* a class whose metaclass answers by code of its own (not ``type``'s or ``ABCMeta``'s check)
  answers unknowably. (A stand-in's class given as the class, ``isinstance(y, type(x))``, is
  the scans' ``type(x)``.)

A question answered otherwise, or unknowably, is kept (``Asked``), and ``raise_asked`` makes
the trace fail with it: a fake tensor's at every size (the call runs eagerly), a symbolic
value's as the scans' do (traced again at exact sizes; a value ``.item()`` read runs
eagerly). Questions whose answer is eager's (``isinstance(x, torch.Tensor)``, liger-kernel's
``isinstance(X, DTensor)``, ``isinstance(n, (int, torch.SymInt))``) are served. Code that
bound the builtin before the trace (``_isinstance = isinstance`` at a module's top) calls it
unseen: ``tensor_type_read`` (bytecode.py) makes such a call of a tensor parameter with a
class its code does not name run eagerly (``seen``).

``type(x) is C`` calls no function. Of a tensor, the bytecode scan keeps it (a ``type(x)``
compared with a class the code does not name runs eagerly); of a symbolic number given to
library code, ``library_symbolic_question`` (tensor_reads.py) scans that code (the recording
keeps the symbolic numbers library frames are given: ``library.KEPT``). Open: library code's
``type(x)`` of a tensor it reached otherwise than as a parameter (``type(self.w)``), and an
``isinstance`` bound before the trace asked of such a tensor (``tests/test_questions47.py``,
strict xfails).
"""

from __future__ import annotations

import _thread
import abc
import builtins
import contextlib
import dataclasses
import sys
import threading
import types

import torch
from torch._subclasses.fake_tensor import FakeTensor

from trident import frames
from trident.errors import TridentError
from trident.lower.state.library import library_kind

_isinstance, _issubclass = builtins.isinstance, builtins.issubclass
# a stand-in's class -> the classes of the values it stands for in eager
_EAGER = {FakeTensor: (torch.Tensor, torch.nn.Parameter), torch.SymInt: (int,),
          torch.SymFloat: (float,), torch.SymBool: (bool,)}
_BY_FLAG = (torch.nn.Parameter, *filter(None, [getattr(torch.nn, "Buffer", None)]))
_CHECKS = {True: (type.__instancecheck__, abc.ABCMeta.__instancecheck__),  # answer by the
           False: (type.__subclasscheck__, abc.ABCMeta.__subclasscheck__)}  # class alone
_ACTIVE: dict = {}  # thread id -> its trace's list of Asked
_LOCK = threading.Lock()
_JUDGED: dict = {}  # id of a caller's code -> (the code, whether its questions are judged)


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
    if _isinstance(classinfo, types.UnionType):
        classinfo = classinfo.__args__
    if _isinstance(classinfo, type):
        return [classinfo]
    if not _isinstance(classinfo, tuple):
        return None
    out: list = []
    for c in classinfo:
        found = _classes(c)
        if found is None:
            return None
        out += found
    return out


def _eager_alike(obj, stand_in: type, classinfo, answer: bool, instance: bool) -> bool:
    """Whether eager answers ``answer`` too, for every class ``stand_in`` stands for
    (``instance``: ``isinstance(obj, classinfo)``, else ``issubclass(stand_in, classinfo)``)."""
    classes = _classes(classinfo)
    if classes is None:
        return False
    for eager in _EAGER[stand_in]:
        got = False
        for c in classes:
            if instance and stand_in is FakeTensor and (
                    c in _BY_FLAG or getattr(type(c), "answers_as_eager", False)):
                got = got or _isinstance(obj, c)  # (the fake carries the flag: guarded; the
                # stand-in for torch._subclasses.FakeTensor: Note [Value reads] in values.py)
            elif getattr(type(c), "__instancecheck__" if instance else "__subclasscheck__",
                         None) in _CHECKS[instance]:
                got = got or _issubclass(eager, c)
            else:
                return False  # (a metaclass's own check)
        if got != answer:
            return False
    return True


def _judged(frame) -> bool:
    """Whether questions asked by ``frame``'s code are compared: user code, and library code
    whose tensor type reads are scanned (Note [Library code that ran] in library.py)."""
    code = frame.f_code
    found = _JUDGED.get(id(code))
    if found is None or found[0] is not code:
        judged = not frames.inside_trident(code.co_filename) and (
            frames.user_frame(frame) or library_kind(frame, 1, 2) == 1)
        found = _JUDGED[id(code)] = (code, judged)
    return found[1]


def _ask(obj, stand_in: type, classinfo, answer: bool, instance: bool) -> None:
    """Keeps the question in this thread's list where eager may answer otherwise."""
    asked = _ACTIVE.get(_thread.get_ident())
    if asked is None:
        return
    frame = sys._getframe(2)
    tensor = stand_in is FakeTensor
    if not _judged(frame) or (not tensor and frame.f_globals.get("__name__", "").partition(
            ".")[0] == "torch") or _eager_alike(obj, stand_in, classinfo, answer, instance):
        return  # (torch asks of its symbolic values on purpose: Note [Questions about
    code = frame.f_code  # symbolic values])
    who = "the function" if frames.user_frame(frame) else \
        f"library code the function runs ({code.co_qualname})"
    name = "isinstance" if instance else "issubclass"
    asked.append(Asked(f"{name}() ({code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})",
                       who, tensor))


def isinstance(obj, class_or_tuple, /):
    """The builtin's answer (Note [Questions asked in the trace])."""
    answer = _isinstance(obj, class_or_tuple)
    stand_in = type(obj)
    if stand_in in _EAGER:
        _ask(obj, stand_in, class_or_tuple, answer, True)
    return answer


def issubclass(cls, class_or_tuple, /):
    """The builtin's answer (Note [Questions asked in the trace])."""
    answer = _issubclass(cls, class_or_tuple)
    if _isinstance(cls, type) and cls in _EAGER:
        _ask(None, cls, class_or_tuple, answer, False)
    return answer


_WRAPPERS = {"isinstance": isinstance, "issubclass": issubclass}


def seen(f, k: int, g: dict) -> bool:
    """Whether the ``CALL`` at ``f.ins[k]`` (a ``flow.Flow`` of code whose globals are ``g``)
    calls ``isinstance`` or ``issubclass`` by the builtins' name, which the trace's wrapper
    answers; not one bound before the trace (``_isinstance = isinstance``), which
    ``tensor_type_read`` (bytecode.py) keeps where the code does not name the class."""
    argc = f.ins[k].arg
    return any(f.ins[p].opname == "LOAD_GLOBAL" and f.ins[p].argval in _WRAPPERS and
               f.ins[p].argval not in g for d in (argc, argc + 1)
               for p, _ in f.producers(k, d) or ())


@contextlib.contextmanager
def watch(on: bool = True):
    """Note [Questions asked in the trace]: the builtins' wrappers installed while this thread
    (and any other tracing) runs; yields this thread's list of :class:`Asked` (``on``
    False: none installed, for a Dynamo graph of torch.compile's backend, which runs no user
    code: Dynamo answered its questions)."""
    asked: list = []
    if not on:
        yield asked
        return
    thread = _thread.get_ident()
    with _LOCK:
        outer = _ACTIVE.get(thread)  # (a trace inside a trace: a nested jitted call)
        if not _ACTIVE:
            vars(builtins).update(_WRAPPERS)
        _ACTIVE[thread] = asked
    try:
        yield asked
    finally:
        with _LOCK:
            if outer is None:
                del _ACTIVE[thread]
            else:
                _ACTIVE[thread] = outer
            if not _ACTIVE:
                builtins.isinstance, builtins.issubclass = _isinstance, _issubclass


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
