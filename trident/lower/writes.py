"""Attribute writes that a specialization replays (Note [Attribute writes]): which assignments
to the arguments' Python state ``substitute.substituted`` hands to the output recipe."""

from __future__ import annotations

import functools
import weakref

import torch

# ---- Note [Attribute writes] ----------------------------------------------------------------
#
# A function that assigns an attribute of an object its arguments reach (a sliding-window cache
# layer's ``cumulative_length_int += 1`` at every decode step; a static cache layer's lazy
# ``self.keys = torch.zeros(...)``, ``self.is_initialized = True`` at its first call) changes
# Python state that no launch sequence touches. The trace sees the write in the object's
# ``__dict__`` when the function returns (``substitute.substituted``). Where the object's class sets
# attributes as ``object.__setattr__`` does (no ``__setattr__`` of its own, no data descriptor
# of that name: the write was a plain store into ``__dict__``), no key was deleted, and the
# value is one the specialization makes (a tensor of the trace, an int, float or bool, a SymInt
# the trace computed from symbolic sizes and ints, None, a str, a dtype or a device), the write
# becomes part of the specialization: the value is one more output of the graph, and the
# output recipe ends with ``(R_WRITE, node, name, tensor attributes)`` and the value's ops
# (outputs.py). After the launch sequence, the runtime (``apply_recipe`` in
# runtime/recipes.cpp) sets each attribute with ``PyObject_SetAttr`` in the order the trace
# left them in ``__dict__`` (a new attribute after the others, as eager adds it), the same value
# of the same type as eager's. A constant attribute a written tensor carries
# (``torch._dynamo.mark_static_address`` sets ``_dynamo_static_input_type``) is set on it too,
# and so is one the function set on a tensor argument. The next call's argument tree reads the
# new value: an int written with another value at every call is a leaf after one change (Note
# [Int leaves] in frontend/policy.py), a new tensor a leaf. Any other change (a deleted key, a
# key deleted and set again, which eager moves to the end of ``__dict__``, a list or dict item,
# an object with its own ``__setattr__``, a value of another type) is undone, in the order the
# keys had, and the call runs eagerly, with one warning naming the path and the class.


def plain_setattr(t: type) -> bool:
    """``t``'s instances set attributes as ``object.__setattr__`` does (Note [Attribute
    writes])."""
    return t.__setattr__ is object.__setattr__ and t.__delattr__ is object.__delattr__


_REPLAYED = (int, float, bool, str, type(None), torch.dtype, torch.device)


def constant(v) -> bool:
    return type(v) in _REPLAYED


def replayable(t: type, now: dict, before: dict) -> list | None:
    """The ``(name, value)`` of each attribute the function set on an object of class ``t``
    (``now`` and ``before``: its ``__dict__``'s entries), in ``__dict__`` order, or None where
    a specialization cannot replay them (Note [Attribute writes])."""
    if any(k not in now for k in before) or list(now)[:len(before)] != list(before):
        return None  # a key deleted, or deleted and set again (eager moves it to the end)
    out = []
    for k, v in now.items():
        if k in before and v is before[k]:
            continue
        if type(k) is not str or any(hasattr(vars(c).get(k), "__set__") for c in t.__mro__) \
                or not (constant(v) or isinstance(v, (torch.Tensor, torch.SymInt,
                                                       torch.SymFloat, torch.SymBool))):
            return None
        out.append((k, v))
    return out


# Note [Finalizers of written values]: an attribute write drops the old value's reference, and
# where it was the last, eager runs the value's finalizers there, in the middle of the call
# (``weakref.finalize``, a weak reference's callback, ``__del__``): one that writes what the
# call reads next (``layer.scale``) changed eager's result, and a trace, whose object held a
# fake in its place, ran none (every compiled call read the value from before it: CPU
# machine, session 45). So a replayed write whose old value has a finalizer of its own (not a
# weak reference of torch's: a fake tensor's converter keeps one to each real tensor) makes
# the call run eagerly, and the eager fallback holds no reference of its own to the call's
# values while the function runs (``_eager`` in frontend/policy.py): the finalizer runs at
# the write, as in eager. One attached after the specialization compiled is seen on a hit:
# before the launch sequence, the runtime reads the value each replayed write would drop, and
# where its class has ``__del__`` or it has weak references (``weakref.getweakrefcount``, the
# weakref module's public count; a type that takes none is skipped), this function decides
# and the call runs eagerly (``finalized_write`` in runtime/dispatcher.cpp, ``_finalized_write``
# in frontend/policy.py; a hit that Python runs, ``_capture_path``, asks the same). A finalizer
# that only runs on another value the old one held (an item of a dropped list) is not seen.
def finalized(v) -> str | None:
    """What finalizes ``v`` where its last reference goes (Note [Finalizers of written
    values]): ``"__del__"``, ``"a weakref.finalize"``, ``"a weak reference's callback"``, or
    None."""
    if getattr(type(v), "__del__", None) is not None:
        return "__del__"
    try:
        refs = weakref.getweakrefs(v)
    except TypeError:
        return None
    for r in refs:
        callback = getattr(r, "__callback__", None)
        if isinstance(callback, weakref.finalize):
            return "a weakref.finalize"
        owner = getattr(callback, "__self__", callback)
        if callback is not None and not str(getattr(type(owner), "__module__", "")).startswith(
                "torch") and not str(getattr(callback, "__module__", "")).startswith("torch"):
            return "a weak reference's callback"
    return None


@functools.cache
def fake_keys() -> frozenset:
    """The attributes a fake tensor carries of its own (FakeTensorMode's, torch 2.11-2.13)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return frozenset(vars(torch.empty(1)))


def tensor_attributes(v) -> tuple:
    """The constant Python attributes the function set on a tensor it writes (Note [Attribute
    writes]), as ``((name, value), ...)``."""
    if not isinstance(v, torch.Tensor):
        return ()
    return tuple((k, a) for k, a in vars(v).items() if k not in fake_keys())

