"""Codegen's targets: one module per device type (``target_cpu.py``, ``target_cuda.py``),
each with what an SCM does differently there: how a Triton launch runs (``launch``), the runtime
headers it needs (``HEADERS``), and how buffers are reused (``REUSE``, ``prologue``; Note
[Buffer reuse] in plan.py). Codegen asks the target instead of testing for CUDA; a new device
type is a new module here.
"""

from __future__ import annotations

from types import ModuleType


def of(device: str) -> ModuleType:
    """The target of tensors on ``device`` (``"cpu"``, ``"cuda:0"``)."""
    from . import target_cpu, target_cuda

    return target_cuda if device.startswith("cuda") else target_cpu


def of_spec(spec) -> ModuleType:
    """The target of a specialization's launch sequence: CUDA when its tensor arguments are all
    on one CUDA device, else the CPU's."""
    return of("cuda" if spec.cuda_device is not None else "cpu")
