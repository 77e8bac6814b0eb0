"""Words for the values a state tree checks (its description, which the digest hashes): the
same in every process where the value means the same (Note [State guards])."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import sys
import types

import torch

from trident import frames
from trident.identity import hash_code, identity_words
from trident.lower.state.chain import _kernel_types


def _words(obj) -> str:
    """Stable words for an object checked by identity: the same in every process where the
    object means the same (functions by their code, kernels by their source)."""
    if isinstance(obj, (types.FunctionType, types.CodeType)):
        h = hashlib.sha256()
        hash_code(h, getattr(obj, "__code__", obj))
        return f"{type(obj).__name__} {getattr(obj, '__qualname__', '')} {h.hexdigest()[:16]}"
    if isinstance(obj, property):
        return "property " + " ".join(_words(f) if f is not None else "-"
                                      for f in (obj.fget, obj.fset, obj.fdel))
    if isinstance(obj, (types.MethodDescriptorType, types.GetSetDescriptorType,
                        types.WrapperDescriptorType, types.MemberDescriptorType,
                        types.ClassMethodDescriptorType)):  # a C type's method: by its name
        owner = obj.__objclass__
        return f"{type(obj).__name__} {owner.__module__}.{owner.__qualname__}.{obj.__name__}"
    if isinstance(obj, (staticmethod, classmethod)):
        return f"{type(obj).__name__} {_words(obj.__func__)}"
    if isinstance(obj, _kernel_types()):  # its function's reads are chains of their own
        return f"triton {type(obj).__name__} of {_words(obj.fn)}"
    if isinstance(obj, logging.Logger):
        return f"logger {obj.name}"
    if isinstance(obj, _op_types()[0]):  # a custom op: one per name, in every process
        return f"custom op {obj._namespace}::{obj._name}"
    return _library_value_words(obj) or identity_words(obj)


def _library_value_words(obj) -> str | None:
    """Words for an object of a library's class that its ``repr`` names (``tl.int32``, a
    triton ``dtype``: ``int32``): the class and the repr, the same in every process where the
    library makes the same value (a library's state is taken as fixed, Note [Library state]);
    None for a repr that shows an address or none of its own (the object, this process
    only)."""
    cls = type(obj)
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    if module is None or cls.__repr__ is object.__repr__ or not frames.library_module(module):
        return None
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 (the library's repr failed: no words of its own)
        return None
    if len(text) > 200 or re.search(r"0x[0-9a-fA-F]{4,}|@\d{6,}", text):
        return None
    return f"object {cls.__module__}.{cls.__qualname__} {text}"


def _tensor_words(t: torch.Tensor) -> str:
    data = t.detach().cpu().contiguous().reshape(-1)  # (a 0-dim tensor has no byte view)
    digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return f"tensor {t.dtype} {tuple(t.shape)} {t.device} {digest.hexdigest()[:16]}"


@functools.cache
def _op_types() -> tuple:
    """Operators (a ``torch.library.custom_op``, ``triton_op``, ``torch.ops`` packets): their
    calls are steps of the plan, which the dispatcher serves on every call; checked by
    identity."""
    from torch._library.custom_ops import CustomOpDef

    return (CustomOpDef, torch._ops.OpOverload, torch._ops.OpOverloadPacket)
