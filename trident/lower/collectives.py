"""Collectives: ``torch.distributed`` inside a Trident function (tensor parallelism).

Note [Collectives]: the functional collectives (``torch.distributed._functional_collectives``:
``all_reduce``, ``all_gather_tensor``, ``reduce_scatter_tensor``, ...) are ordinary dispatcher
ops of the ``_c10d_functional`` namespace that name their process group by a string
(``_c10d_functional::all_reduce(Tensor input, str reduce_op, str group_name)``) and return a
tensor that ``_c10d_functional::wait_tensor`` completes. ``make_fx`` records them, Torch-MLIR
imports them as ``torch.operator "torch._c10d_functional.*"``, and the plan calls them through the
boxed dispatcher like any ATen op: the op resolves the group by its name on every call
(``c10d::resolve_process_group``), as eager does.

The legacy in-place collectives (``dist.all_reduce(t)``) call the process group's methods with
the ``ProcessGroup`` and ``ReduceOp`` objects themselves (``c10d::allreduce_`` takes
TorchScript objects a plan cannot hold). ``dist.all_reduce`` and its kin ask TorchFunctionModes
first ("non-strict export implements such a torch function mode", distributed_c10d.py), so
capture's mode redirects them while tracing (``remap``): ``dist.all_reduce(t, op, group)``
becomes ``_c10d_functional::all_reduce_(t, op, group_name)`` followed by ``wait_tensor(t)``,
the same reduction of ``t`` in place (no copy: the same kernel a CUDA graph of eager captures);
the others go through ``traceable_collective_remaps``, the table Dynamo and non-strict export
remap them with. ``async_op=True`` is not remapped (the function runs eagerly).

Note [Synchronous all-reduce]: the functional ``all_reduce_`` runs the group's ``allreduce``
with ``asyncOp`` on (``_c10d_functional`` ops always do, torch 2.11-2.13): ProcessGroupNCCL then
launches on its own stream, between an event its stream waits for and one the caller's stream
waits for (``wait_tensor``), two dependencies more per collective in a CUDA graph. Eager
``dist.all_reduce(t)`` (``async_op=False``) sets ``AllreduceOptions::asyncOp`` off, and NCCL
runs on the caller's stream. The runtime serves ``_c10d_functional::all_reduce_`` (the op the
remap above writes, with sum, avg, product, min or max) as eager does: the group resolved by
name (``c10d::resolve_process_group``), ``allreduce`` with ``asyncOp`` off, ``Work::wait``, the
GIL released; the ``wait_tensor`` after it finds no pending work. The same NCCL reduction, so
the same bits (docs/benchmarks.md, "Tensor parallel", has its cost).

Note [Process group guard] is in ir/guards.py.
"""

from __future__ import annotations

import functools
import inspect

import torch

from trident.errors import TridentError
from trident.ir.facts import process_group_fact


def remap(func, args: tuple, kwargs: dict):
    """Note [Collectives]: ``(func, args, kwargs)`` to call instead of a legacy collective
    while tracing, or None to call ``func`` itself."""
    if func not in _remappable() or not torch.distributed.is_initialized():
        return None  # outside a process group the call raises as it does eagerly
    import torch.distributed as dist
    from torch.distributed._functional_collectives import (REDUCE_OP_TO_STR,
                                                           traceable_collective_remaps)

    if func is dist.all_reduce:
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if a["async_op"] or a["tensor"].is_complex() or a["op"] not in REDUCE_OP_TO_STR:
            return None  # not compiled: the trace fails on the process group object
        group = a["group"] if a["group"] is not None else dist.group.WORLD
        return _all_reduce_inplace, (a["tensor"], REDUCE_OP_TO_STR[a["op"]],
                                     group.group_name), {}
    if func not in traceable_collective_remaps:
        return None
    # as non-strict export does (torch._export.non_strict_utils), after Dynamo
    kwargs = dict(inspect.signature(func).bind(*args, **kwargs).arguments)
    if "op" in kwargs and kwargs["op"] in REDUCE_OP_TO_STR:
        kwargs["op"] = REDUCE_OP_TO_STR[kwargs["op"]]
    return traceable_collective_remaps[func], (), kwargs


@functools.cache
def _remappable() -> frozenset:
    if not torch.distributed.is_available():
        return frozenset()
    from torch.distributed._functional_collectives import traceable_collective_remaps

    return frozenset([torch.distributed.all_reduce, *traceable_collective_remaps])


def _all_reduce_inplace(tensor: torch.Tensor, op: str, group_name: str) -> None:
    torch.ops._c10d_functional.all_reduce_(tensor, op, group_name)
    torch.ops._c10d_functional.wait_tensor(tensor)


def check_group(group_name: str, where: str) -> None:
    """Note [Process group guard]: a collective of the plan names the default group.

    Raises:
        TridentError: it names another group, whose membership no guard covers.
    """
    default = process_group_fact().partition(":")[0]
    if group_name != default:
        raise TridentError(f"{where}: a collective on process group {group_name!r}, not the "
                           f"default group ({default or 'none'}); Trident guards the default "
                           "group only")
