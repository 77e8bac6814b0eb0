"""User objects that a torch call converts inside the op (Note [Conversions inside ops])."""

from __future__ import annotations

import inspect

import torch

from trident import frames

# Note [Conversions inside ops]: torch converts some arguments of an op with Python's number
# and sequence protocols from C, inside the op (``x[o]``: ``Tensor.__getitem__`` calls
# ``o.__index__()``; ``F.pad(x, (o, o))``; torch 2.11-2.13), after the trace's
# TorchFunctionMode took the call. An object of a user class whose protocol method is Python
# code runs that code there, where the recording does not watch (Note [Unrecorded ops] in
# source_lines.py): its reads (``Ix.v`` in ``def __index__(self): return Ix.v``) were no
# guard's, and a hit returned the trace's ``x[1]`` after ``Ix.v = 0``. So such a call is
# refused, and the call runs eagerly with one warning (``tests/test_break47.py``). Some ops
# convert while torch parses their arguments, before the mode takes the call, from the
# function's own frame (``x.flip(o)``, ``torch.zeros(o)``), and were guarded; they run eagerly
# too, one rule for every op. A class of a library (an ``IntEnum``, numpy's scalars, torch's
# ``SymInt``) is not the user's: its protocols read no user state.
_PROTOCOLS = ("__index__", "__int__", "__float__", "__complex__", "__bool__", "__len__",
              "__iter__", "__getitem__", "__array__")
_PLAIN = frozenset({int, float, bool, str, type(None), complex, torch.dtype, torch.device,
                    torch.layout, torch.memory_format, torch.SymInt, torch.SymFloat,
                    torch.SymBool})  # (a dynamic trace's sizes: torch's, asked of at each op)


def converted(args: tuple, kwargs: dict) -> str | None:
    """The first object among ``args`` and ``kwargs`` (through tuples, lists, slices and dict
    values; not inside tensors) whose class has a protocol method in user code, as
    ``"Cls.__index__"``, or None."""
    todo = [*args, *kwargs.values()]
    while todo:
        v = todo.pop()
        t = type(v)
        if t in _PLAIN or isinstance(v, torch.Tensor):
            continue
        if isinstance(v, (tuple, list)):
            todo.extend(v)
        elif t is slice:
            todo.extend((v.start, v.stop, v.step))
        elif t is dict:
            todo.extend(v.values())
        else:
            for name in _PROTOCOLS:
                code = getattr(inspect.getattr_static(t, name, None), "__code__", None)
                if code is not None and frames.user_file(code.co_filename):
                    return f"{t.__qualname__}.{name}"
    return None
