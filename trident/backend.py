"""``torch.compile(fn, backend="trident")``: Dynamo's graphs served by Specialization Cache Modules.

Registered through the ``torch_dynamo_backends`` entry point (setup.py), so no ``import trident``
is needed. Dynamo keeps its own guards and graph breaks; each graph it hands over becomes a
``@trident.jit`` function of the graph's inputs, whose SCM replaces Inductor's wrapper and launch
path. Symbolic sizes (``dynamic=True``) reach the SCM as ints and are specialized by value.

User Triton kernels appear in Dynamo's graph as ``triton_kernel_wrapper_mutation`` nodes; they
are rewritten to ordinary launches of the same kernel, which Trident's capture then records like
a launch written in the user's function.

Calls that need autograd (an input that requires grad, with grad mode on) run Dynamo's graph
eagerly, so gradients are PyTorch's own; ``fn.stats.fallbacks`` counts them.
"""

from __future__ import annotations

import torch.fx as fx

from .errors import TridentError
from .jit import jit_function_class


def _launch(kernel_idx, constant_args_idx, grid, tma_descriptor_metadata, kwargs):
    """A Dynamo-recorded Triton launch, made again as ``kernel[grid](**args)``."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    if tma_descriptor_metadata:
        raise TridentError("Triton tensor descriptors are not supported yet")
    kernel = kernel_side_table.get_kernel(kernel_idx)
    args = {**kernel_side_table.get_constant_args(constant_args_idx), **kwargs}
    if len(grid) == 1:
        kernel[tuple(grid[0])](**args)
        return
    # Dynamo evaluated a grid callable once per autotune config (torch 2.11's
    # triton_kernel_wrap does the same): pick the one of the config the autotuner chooses.
    configs = getattr(kernel, "configs", None)
    if configs is None or len(configs) != len(grid):
        raise TridentError(f"{len(grid)} grids for a kernel with "
                           f"{len(configs or ())} autotune configs")

    def grid_of_config(meta):
        for config, g in zip(configs, grid):
            if all(meta.get(k) == v for k, v in config.kwargs.items()):
                return tuple(g)
        raise TridentError(f"no grid recorded for the autotune config {meta}")

    kernel[grid_of_config](**args)


def _route_triton_launches(gm: fx.GraphModule) -> fx.GraphModule:
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is triton_kernel_wrapper_mutation:
            node.target = _launch
            changed = True
    if changed:
        gm.recompile()
    return gm


def trident_backend(gm: fx.GraphModule, example_inputs: list, **options):
    """Compile one Dynamo graph. ``options`` go to ``trident.jit`` (``max_specializations``)."""
    gm = _route_triton_launches(gm)
    if hasattr(gm, "real_recompile"):  # a _LazyGraphModule: generate forward's code now
        gm.real_recompile()
    # The cache key of the bound GraphModule.forward is its generated code: the graph itself.
    # The GraphModule is Trident's own (Dynamo passes parameters as graph inputs): its state is
    # not an argument tree to read on every call.
    fn = jit_function_class()()
    fn._constant_self = True
    fn._setup(gm.forward, options.get("max_specializations"), True, None, None)
    return fn
