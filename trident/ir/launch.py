"""A resolved Triton launch, as the plan stores it (JSON-able; the kernel object travels
separately, found again by ``lower.kernels.find_kernel``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Launch:
    """A resolved Triton launch (JSON-able parts only; the kernel object travels separately).

    Attributes:
        kernel: the kernel's function name.
        ref: ``{"module", "qualname"}`` to find the ``JITFunction`` again in a new process.
        params: per kernel parameter, in order: ``{"name", "kind": "tensor", "aligned"}``,
            ``{"name", "kind": "scalar", "value"}`` or ``{"name", "kind": "constexpr", "value"}``
            (a constexpr ``torch.dtype`` as ``"torch.float16"``, a ``tl.dtype`` as
            ``{"triton_dtype": "fp16"}``, a ``@triton.jit`` function as
            ``{"triton_function": {"module", "qualname"}}``; ``_constexpr`` makes them again).
            A scalar computed from dynamic dims also has ``"size"``: the expression (a SymInt
            while capturing, then Note [Size expressions]' text, in sizes.py); ``value`` is its
            value in the traced call.
        grid: three entries, each an int or, computed from dynamic dims, an expression like a
            scalar's ``size``.
        options: Triton compile options (``num_warps``, ``num_stages``, ``num_ctas``, ...).
        device: ``"cpu"`` or ``"cuda:N"`` of the tensor arguments.
        pre_hook: ``{"module", "name", "config"}``: the autotune config whose ``pre_hook`` runs
            before each (interpreted) launch, as ``Autotuner.run`` runs it; the autotuner is the
            global ``name`` of ``module`` (Note [Pre-hooks]).
    """

    kernel: str
    ref: dict
    params: list[dict]
    grid: list
    options: dict
    device: str
    pre_hook: dict | None = None
