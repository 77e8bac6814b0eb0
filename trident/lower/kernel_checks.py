"""Checks that torch's kernels make and its fake kernels skip, run at the trace.

Note [Checks the fake kernels skip]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The trace runs on fake tensors (capture.py), whose kernels are torch's meta functions. Many of
those compute the output's dtype without the dtype checks of the real CPU and CUDA kernels: in
torch 2.13 (a probe of ``FakeTensorMode`` against eager on the CPU, session 50) ``aten::mm``,
``addmm``, ``mv``, ``convolution``, ``index_put``, ``index_copy``, ``index_add``, ``put``,
``native_layer_norm``, ``native_group_norm``, ``native_batch_norm``, ``linalg_cross``,
``_cdist_forward``, ``complex`` and ``polar`` accept a float32 and a float64 operand under
``FakeTensorMode`` where eager raises ``RuntimeError: expected m1 and m2 to have the same
dtype``. Such a trace succeeded, the specialization was compiled (seconds), and each call then
failed at that step and ran eagerly (a miss and a fallback per call).

So after the trace, each ATen op of the graph whose floating-point or complex operands do not
share one dtype, and that torch does not tag ``pointwise`` (pointwise ops promote; their meta
functions do what the kernels do) or ``nondeterministic_seeded`` (a random op would draw from
the generator the call draws from), runs once for real on zeros of its operands' shapes,
dtypes and devices. Where it raises, the trace fails with its error: the call runs eagerly,
which raises eager's error, with one warning, and the failed trace is remembered as any other
(no compile; later calls of the signature run eagerly at once).

Only ops that mix floating dtypes run (the mixed-precision ops of a model are pointwise, or take
an integer index, which does not count), and only up to ``_ELEMENTS`` elements in all; a larger
one, one of a dim without a size hint, and one of an empty operand (whose zero indices would
index an empty dim: on CUDA a device-side assert) are left to the compiled step, which fails and
runs eagerly as before. Each operand has its fake's sizes, strides and storage offset, since a
layout may choose the kernel's path (``F.linear`` of a 3-D input fuses a contiguous bias into
``addmm``, which refuses a float64 bias, and adds a sliced one in place after the product, which
takes it), but a storage of its own (two operands of one storage are two here), and zeros, not
the call's values: an op that fails on zeros where the call's values would pass (a check of
values) makes the trace fail and the call run eagerly (the same answer, slower); a check that
zeros pass and the call's values fail is left to the compiled step as before.
"""

from __future__ import annotations

import warnings

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from trident.errors import TridentError
from trident.lower.source_lines import source_line

# The most elements (all operands together) an op's check makes: 4 MiB of float32.
_ELEMENTS = 1 << 20


def check(gm: fx.GraphModule, name: str) -> None:
    """Run each op of ``gm`` that mixes floating dtypes on zeros (Note [Checks the fake
    kernels skip]).

    Raises:
        TridentError: one raised; the message names the user's line and the kernel's error.
    """
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                or node.target.namespace != "aten":  # (a custom op's body is the user's)
            continue
        if {torch.Tag.pointwise, torch.Tag.nondeterministic_seeded} & set(node.target.tags):
            continue  # (a random op would draw from the generator)
        vals = [a.meta.get("val") if isinstance(a, fx.Node) else a
                for a in pytree.tree_leaves((node.args, node.kwargs))]
        floats = {v.dtype for v in vals if isinstance(v, torch.Tensor)
                  and (v.dtype.is_floating_point or v.dtype.is_complex)}
        if len(floats) < 2:
            continue
        try:
            args = _real(node)
        except Exception:  # (zeros of a dtype or device torch cannot make here)
            continue
        if args is None:
            continue
        try:
            with warnings.catch_warnings():  # (what the kernel warns of zeros is not the call's)
                warnings.simplefilter("ignore")
                node.target(*args[0], **args[1])
        except torch.OutOfMemoryError:
            continue
        except Exception as e:
            where, text = source_line(node)
            raise TridentError(f"cannot trace {name} at {where} ({text}): {node.target.name()} "
                               f"raises {type(e).__name__}: {str(e).splitlines()[0]} (a check "
                               "of torch's kernel that its fake kernel skips)") from e


def _real(node: fx.Node) -> tuple[list, dict] | None:
    """``node``'s arguments with zeros for its tensors, each of its operand's sizes, strides
    and storage offset (a layout decides some kernels' path: ``linear`` fuses a contiguous bias
    into ``addmm``, which checks its dtype, and adds a sliced one after), or None (over
    ``_ELEMENTS`` elements, or a size without a hint)."""
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in leaves]
    layouts = {i: ([_hint(d) for d in v.shape], [_hint(d) for d in v.stride()],
                   _hint(v.storage_offset())) for i, v in enumerate(vals)
               if isinstance(v, torch.Tensor) and v.layout == torch.strided}
    if any(isinstance(a, fx.Node) and "val" not in a.meta for a in leaves):
        return None  # (an operand the trace did not describe)
    if any(0 in size for size, _, _ in layouts.values()):
        return None  # (a zero index into an empty dim: a device-side assert on CUDA)
    if len(layouts) != sum(isinstance(v, torch.Tensor) for v in vals) or any(
            None in (*size, *stride, offset) for size, stride, offset in layouts.values()) or any(
            _hint(v) is None for v in vals if isinstance(v, torch.SymInt | torch.SymFloat |
                                                         torch.SymBool)):
        return None
    if any(v.device.type not in ("cpu", "cuda") or v.device.type == "cuda"
           and not torch.cuda.is_available() for v in vals if isinstance(v, torch.Tensor)):
        return None
    extents = {i: offset + 1 + sum((n - 1) * st for n, st in zip(size, stride))
               for i, (size, stride, offset) in layouts.items()}
    if sum(extents.values()) > _ELEMENTS:
        return None
    made = [torch.zeros(extents[i], dtype=v.dtype, device=v.device).as_strided(*layouts[i])
            if i in layouts else
            _hint(v) if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool) else v
            for i, v in enumerate(vals)]
    return pytree.tree_unflatten(made, spec)


def _hint(v):
    """A plain number for ``v`` (a SymInt's hint: the size this call has), or None."""
    if not isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return v
    return v.node.hint
