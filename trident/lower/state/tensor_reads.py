"""Reads of a tensor's Python attributes that a trace's fake tensor answers unlike the call's
tensor: its ``__dict__`` through ``vars``, ``dir`` or ``object.__getattribute__``
(Note [Python attributes of tensors] in tensor_attributes.py), and the attributes only a fake
tensor has (Note [Fake tensors' own attributes]). ``check_questions`` runs these scans and
questions.py's (Note [Questions about symbolic values]) over the code a trace ran.
"""

from __future__ import annotations

import types

import torch

from trident.errors import TridentError
from trident.lower.state.flow import _UNKNOWN
from trident.lower.state.addresses import address_question, identity_question
from trident.lower.state.questions import (
    _DICT_READERS, _Code, _attribute_of_parameter, _held, symbolic_question)


def tensor_dict_read(code: types.CodeType, g: dict, params: dict,
                     library: bool = False) -> str | None:
    """Note [Python attributes of tensors] (tensor_attributes.py): the first ``vars(v)``,
    ``v.__dict__``, or another spelling of them (``dir(v)``, ``getattr(v, "__dict__")``,
    ``v.__getattribute__(name)``: ``_DICT_READERS``) in ``code`` whose ``v`` may be a tensor
    (not known to be another object), as ``"vars() (file.py:12)"``, or None. A trace's
    tensors are fake tensors, whose ``__dict__`` holds the fake's own entries, not the
    tensor's. ``library``: library code (Note [Library code that ran] in library.py), whose
    ``params`` are its tensor parameters only: there ``v`` is one known to be a tensor or
    derived from a tensor parameter (``vars(t)``, ``t.__dict__``, ``vars(t.data)``), not any
    object the code alone does not name (``vars(self)`` of a ``ModelOutput``)."""
    names = code.co_names
    if not any(n in ("vars", "dir", "getattr", "__dict__", "__getattribute__") or
               _held(g.get(n)) for n in names):
        return None  # (a name the code loads: a global, a builtin, an attribute)
    c = _Code(code, g, params)
    for k, i in enumerate(c.f.ins):
        what = None
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in ("__dict__",
                                                                     "__getattribute__"):
            what, d = f".{i.argval}", 0
        elif i.opname == "CALL":
            callee = c.callee(k)
            reader = _DICT_READERS.get(callee) if _held(callee) else None
            if reader is not None and reader[0] == i.arg:
                _, d, what = reader
            elif callee is getattr and i.arg in (2, 3) and \
                    c.value(k, i.arg - 2) == "__dict__":
                what, d = "getattr(..., '__dict__')", i.arg - 1
        if what is not None:
            v = c.value(k, d)
            if v is _UNKNOWN:
                v = _attribute_of_parameter(c, k, d)
            if isinstance(v, torch.Tensor) or v is _UNKNOWN and (
                    not library or c.f.origin(k, d)[1] & frozenset(params)):
                return f"{what} ({c.where(k)})"
    return None


_LIBRARY_DICTS: dict = {}  # (id of a code object, its tensor parameters) -> (code, answer)


def library_dict_read(code: types.CodeType, g: dict, params: dict) -> str | None:
    """``tensor_dict_read`` of library code (its ``params``: the tensors it was called with),
    kept per code object and tensor parameters (walked once per process)."""
    key = (id(code), frozenset(params))
    found = _LIBRARY_DICTS.get(key)
    if found is None or found[0] is not code:
        if len(_LIBRARY_DICTS) >= 65536:
            _LIBRARY_DICTS.clear()
        found = _LIBRARY_DICTS[key] = (code, tensor_dict_read(code, g, params, library=True))
    return found[1]


# Note [Fake tensors' own attributes]: a trace's fake tensors have attributes a tensor lacks:
# ``hasattr(x, "fake_mode")`` found the fake's (no failed lookup for the ``__getattr__`` of Note
# [Python attributes of tensors]), and every hit returned the branch eager never takes. So a user
# function that loads one from what may be a tensor (``x.fake_mode``, ``getattr``, ``hasattr``;
# ``constant``, a common name, as a string only) runs eagerly (library code's: not scanned).
_FAKE_ONLY = frozenset({
    "fake_mode", "fake_device", "_fake_device", "real_tensor", "constant", "nonzero_memo",
    "item_memo", "unique_memo", "unique_consecutive_memo", "nested_int_memo", "_mode_key",
    "from_tensor", "get_nested_int", "dispatch_keys", "pytype"})
_PROBES = (getattr, hasattr)


def fake_attribute_read(code: types.CodeType, g: dict, params: dict) -> str | None:
    """Note [Fake tensors' own attributes]: the first such load, ``".fake_mode (f.py:2)"``."""
    if _FAKE_ONLY.isdisjoint(code.co_names + tuple(k for k in code.co_consts if type(k) is str)):
        return None
    c = _Code(code, g, params)
    for k, i in enumerate(c.f.ins):
        name = i.argval if i.opname in ("LOAD_ATTR", "LOAD_METHOD") else None
        if name in _FAKE_ONLY and name != "constant":
            what, d = f".{name}", 0
        elif i.opname == "CALL" and i.arg in (2, 3) and (f := c.callee(k)) in _PROBES and \
                isinstance(name := c.value(k, i.arg - 2), str) and name in _FAKE_ONLY:
            what, d = f"{f.__name__}(..., {name!r})", i.arg - 1
        else:
            continue
        v = c.value(k, d)
        v = _attribute_of_parameter(c, k, d) if v is _UNKNOWN else v
        if v is _UNKNOWN or isinstance(v, torch.Tensor):
            return f"{what} ({c.where(k)})"
    return None


def _dict_reads(rec):
    """(code, ``tensor_dict_read``'s answer) of each user code object that ran, then of each
    library code object that ran with tensor parameters (Note [Python attributes of
    tensors])."""
    for code, (g, params) in rec.codes.items():
        yield code, tensor_dict_read(code, g, params)
    for code, g, params in rec.library_tensors.values():
        yield code, library_dict_read(code, g, params)


def check_questions(rec, symbolic: bool) -> None:
    """Raises where a user function that ran in the trace recorded by ``rec`` asks a question
    the trace answers for a stand-in: ``vars`` of a tensor, ``id`` or ``hash`` of an object
    (Note [Identity questions] in addresses.py; the call runs eagerly, at any sizes) or, where the trace was ``symbolic``, ``type``, ``isinstance`` or ``is`` of a value
    that may be symbolic (traced again at exact sizes: Note [Questions about symbolic
    values])."""
    for code, read in _dict_reads(rec):
        if read is not None:
            who = "the function" if code in rec.codes else \
                f"library code the function runs ({code.co_qualname})"
            error = TridentError(f"{who} reads a tensor's __dict__, {read}: the trace's fake "
                                 "tensors hold their own entries, not the tensor's")
            error.any_sizes = True  # (policy.py: a trace at exact sizes reads it alike)
            raise error
    for code, (g, params) in rec.codes.items():
        read = fake_attribute_read(code, g, params)  # (Note [Fake tensors' own attributes])
        if read is not None:
            error = TridentError(f"the function reads an attribute that only a trace's fake "
                                 f"tensors have, {read}: a hit would answer as the trace did")
            error.any_sizes = True
            raise error
        asked = identity_question(code, g, params)  # (Note [Identity questions])
        if asked is not None:
            error = TridentError(f"the function asks for an object's identity or hash, "
                                 f"{asked}: the trace answers for its own objects and process, "
                                 "eager for the call's")
            error.any_sizes = True
            raise error
        asked = rec.hashed or address_question(code, g, params)  # Note [Answers from
        if asked is not None:  # addresses] (addresses.py)
            error = TridentError(f"the function takes an answer from an object's address, "
                                 f"{asked}: the trace answers for its own objects (a tensor's "
                                 "fake), eager for the call's")
            error.any_sizes = True
            raise error
    for code, (g, params) in rec.codes.items() if symbolic else ():
        asked = symbolic_question(code, g, params)
        if asked is not None:
            raise TridentError(f"the function asks Python what a symbolic value is, {asked}: "
                               "a trace answers for a torch.SymInt, eager for an int")
