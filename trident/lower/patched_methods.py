"""Tensor methods a user replaced on ``torch.Tensor``, as a trace's TorchFunctionMode is handed
them (Note [Patched tensor methods]).

Note [Patched tensor methods]: a tensor method written in C (``Tensor.add``, ``Tensor.mul``,
methods of ``torch._C.TensorBase``) asks the active TorchFunctionMode for an override with the
function that ``torch.Tensor`` holds under the method's name now (torch's C
``handle_torch_function`` looks the name up on the class: torch 2.11 to 2.13). Where a user put
a wrapper there that calls the original (``orig = torch.Tensor.add; torch.Tensor.add = lambda
t, o: orig(t, o * 10)``), the original's call inside the wrapper handed the trace's mode the
wrapper, whose call ran the wrapper a second time: ``x.add(1)`` gave ``x + 100`` at the trace and
every hit, where eager (no mode) gives ``x + 10`` (``torch.compile`` too: Dynamo inlines the
wrapper and calls the original). So a function the mode is handed that is no torch code and
that ``torch.Tensor`` holds under the name of a ``TensorBase`` method is taken for that method,
which is what ran; a function held under the names of two such methods, whichever ran, makes the
call run eagerly. (A torch function written in Python asks through ``handle_torch_function``
in Python: Note [Patched torch functions] in source_lines.py.)
"""

from __future__ import annotations

import types

import torch

from trident import frames
from trident.errors import TridentError

_C_METHODS = (types.MethodDescriptorType, types.WrapperDescriptorType)


def method_run(func):
    """Note [Patched tensor methods]: the ``TensorBase`` method that ran where the mode is
    handed ``func``, a user's function in its place on ``torch.Tensor``; else ``func``.

    Raises:
        TridentError: ``torch.Tensor`` holds ``func`` under the names of two such methods."""
    if not isinstance(func, types.FunctionType) or frames.torch_file(func.__code__.co_filename):
        return func
    base = vars(torch._C.TensorBase)
    names = [n for n, v in vars(torch.Tensor).items()
             if v is func and isinstance(base.get(n), _C_METHODS)]
    if not names:
        return func
    if len(names) > 1:
        raise TridentError(f"torch.Tensor holds {func.__qualname__} as the methods "
                           f"{', '.join(names)}: which of them ran is not known to the trace")
    return getattr(torch._C.TensorBase, names[0])
