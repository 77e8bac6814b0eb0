"""Indexed assignment while tracing with symbolic sizes (Note [Leading ones of a stored value]).

Note [Leading ones of a stored value]: ``dst[:, :, index] = value`` (``Tensor.__setitem__``
with one integer index tensor) is ATen's ``index_put_`` after torch's Python binding strips
the value's leading dims of size 1 (``slicePrefix1sSize`` in
torch/csrc/autograd/python_variable_indexing.cpp, torch 2.11-2.13: numpy's rule, so that a
value with more dims than the indexed slot still broadcasts). The binding asks ``size != 1``
of each leading dim, a plain ``guard_bool``: where the dim is a symbolic batch (Note [Batch
dims] in frontend/batch.py) the trace gains a guard ``batch != 1``, and a batch of one
compiled a specialization of its own. transformers' ``StaticSlidingWindowLayer.update`` does
this at every decode step of a full window (``new_keys[:, :, index] = key_states``, 5.17 and
5.25): a sliding-window sweep compiled its decode step once more for its first batch of one.

Where the value has no more dims than ``dst`` (so no more than the indexed slot: one index
tensor of one or more dims replaces one dim of ``dst``), stripping leading ones changes
nothing: broadcasting aligns dims from the right and adds leading ones back. So while a
trace's value has a symbolic size, such an assignment calls ``aten::index_put_`` itself,
with the value whole, the op eager's binding calls, and asks nothing of the sizes. Any other
assignment (several index tensors, a bool mask, an int, a value with more dims, another
dtype or device: the binding's own errors and conversions) goes through the binding as
before.
"""

from __future__ import annotations

import torch

_FULL = slice(None)


def _put(dst: torch.Tensor, indices: list, value: torch.Tensor) -> None:
    torch.ops.aten.index_put_.default(dst, indices, value)


def remap(func, args: tuple, kwargs: dict):
    """``(func, args)`` to call instead of ``Tensor.__setitem__(dst, index, value)`` (Note
    [Leading ones of a stored value]); None where the call stays as it is."""
    if func is not torch.Tensor.__setitem__ or kwargs or len(args) != 3:
        return None
    dst, index, value = args
    if not isinstance(dst, torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    if not any(isinstance(s, torch.SymInt) for s in value.shape):
        return None  # nothing to ask of a static size
    parts = index if type(index) is tuple else (index,)
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    if len(tensors) != 1 or len(parts) > dst.dim() or any(
            not isinstance(p, torch.Tensor) and not (type(p) is slice and p == _FULL)
            for p in parts):
        return None
    idx = tensors[0]
    if idx.dtype not in (torch.long, torch.int) or idx.dim() < 1 or value.dim() > dst.dim() \
            or value.dtype != dst.dtype or value.device != dst.device:
        return None
    return _put, (dst, [p if isinstance(p, torch.Tensor) else None for p in parts], value)
