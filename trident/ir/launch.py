"""A resolved Triton launch and its compiled binary, as the plan holds them (the kernel object
travels separately, found again by ``lower.kernels.find_kernel`` from its ``KernelRef``).

Each kind of kernel parameter is one class (``TensorParam``, ``ScalarParam``,
``ConstexprParam``); codegen dispatches on the class (``match``). ``to_json`` and ``from_json``
are the cache's form (plan.py's ``TritonStep`` calls them); ``from_json`` raises ``ValueError``,
``KeyError`` or ``TypeError`` for data ``to_json`` did not write.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from typing import Any, ClassVar

from trident.ir import sizes


# Note [Kernels of one name]: a launch names its kernel for the install that finds it again
# (``lower.kernels.find_kernel``, in this process too: the plan travels as data). A module and
# qualified name are not enough: a factory's ``@triton.jit`` kernels share theirs
# (``make.<locals>.kernel``), and the first of them found served every launch of the others (an
# add where eager multiplied). So the name holds a digest of the kernel's source too, and only
# a kernel of that source is found; one stored without it (an earlier version) matches by name.
# The digest is in the generated C too (a comment at the launch): a process loads one module per
# C source, whose callbacks (an interpreted launch) and cubins the last specialization to load
# sets, so two launches of kernels of one name and signature must not share a module.
def source_digest(jit_fn) -> str:
    """A digest of a ``@triton.jit`` function's source (Note [Kernels of one name])."""
    src = getattr(jit_fn, "src", None)
    return hashlib.sha256(src.encode()).hexdigest()[:16] if isinstance(src, str) else ""


@dataclasses.dataclass(frozen=True)
class KernelRef:
    """Where a ``@triton.jit`` function is found in a new process: its module and qualified
    name, and its source's digest (Note [Kernels of one name])."""

    module: str
    qualname: str
    source: str = ""

    @classmethod
    def of(cls, jit_fn) -> KernelRef:
        return cls(jit_fn.fn.__module__, jit_fn.fn.__qualname__, source_digest(jit_fn))

    def names(self, jit_fn) -> bool:
        """Whether ``jit_fn`` (a ``JITFunction``) is the kernel this names."""
        return jit_fn.fn.__qualname__ == self.qualname and jit_fn.fn.__module__ == \
            self.module and (not self.source or source_digest(jit_fn) == self.source)

    @property
    def comment(self) -> str:
        """For the launch's comment in the C (Note [Kernels of one name])."""
        return f" (kernel source {self.source})" if self.source else ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self) if self.source else {"module": self.module,
                                                              "qualname": self.qualname}


@dataclasses.dataclass(frozen=True)
class PreHook:
    """Note [Pre-hooks] (lower/kernels.py): the autotune config whose ``pre_hook`` runs before
    each (interpreted) launch, as ``Autotuner.run`` runs it: config index ``config`` of the
    autotuner that is the global ``name`` of ``module``."""

    module: str
    name: str
    config: int


_PARAMS: dict[str, type[LaunchParam]] = {}


@dataclasses.dataclass(frozen=True)
class LaunchParam:
    """One kernel parameter, in the kernel's order. ``KIND`` is the ``"kind"`` of its JSON."""

    KIND: ClassVar[str] = ""
    name: str

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _PARAMS[cls.KIND] = cls

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.KIND}
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)[1:]})
        return out

    @staticmethod
    def from_json(data: dict) -> LaunchParam:
        fields = {k: v for k, v in data.items() if k != "kind"}
        return _PARAMS[data["kind"]]._from_fields(fields)

    @classmethod
    def _from_fields(cls, fields: dict) -> LaunchParam:
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class TensorParam(LaunchParam):
    """A pointer: the tensor's dtype (``"torch.float16"``) and whether its address is aligned
    to 16 bytes (Note [Pointer alignment] in lower/kernels.py)."""

    KIND = "tensor"
    dtype: str
    aligned: bool


@dataclasses.dataclass(frozen=True)
class ScalarParam(LaunchParam):
    """A runtime int, float, bool or None. ``size``: for an int computed from dynamic dims, its
    expression (a SymInt while capturing, then a sympy expression, Note [Size expressions] in
    sizes.py; stored as its ``sympy.srepr`` text); ``value`` is then its value in the traced
    call (Note [Symbolic launches] in lower/kernels.py)."""

    KIND = "scalar"
    value: Any
    size: Any = None

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.KIND, "value": self.value}
        if self.size is not None:
            out["size"] = sizes.dumps(self.size)
        return out

    @classmethod
    def _from_fields(cls, fields: dict) -> ScalarParam:
        if "size" in fields:
            fields = {**fields, "size": sizes.loads(fields["size"])}
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class ConstexprParam(LaunchParam):
    """A ``tl.constexpr``, as JSON-able data: a ``torch.dtype`` as ``"torch.float16"``, a
    ``tl.dtype`` as ``{"triton_dtype": "fp16"}``, a ``@triton.jit`` function as
    ``{"triton_function": {"module", "qualname", "source"}}`` (``lower.kernels._constexpr`` makes the
    object again)."""

    KIND = "constexpr"
    value: Any


@dataclasses.dataclass(frozen=True)
class TritonLaunch:
    """A resolved Triton launch.

    Attributes:
        kernel: the kernel's function name.
        ref: where to find the ``JITFunction`` again in a new process.
        params: per kernel parameter, in order.
        grid: three entries, each an int or, computed from dynamic dims, an expression like a
            ``ScalarParam``'s ``size`` (stored as its text).
        options: Triton compile options (``num_warps``, ``num_stages``, ``num_ctas``, ...).
        device: ``"cpu"`` or ``"cuda:N"`` of the tensor arguments.
        pre_hook: Note [Pre-hooks], or None.
    """

    kernel: str
    ref: KernelRef
    params: tuple[LaunchParam, ...]
    grid: tuple
    options: dict
    device: str
    pre_hook: PreHook | None = None

    @property
    def on_cuda(self) -> bool:
        """Launched through the driver (compiled to a cubin), not through the interpreter."""
        return self.device.startswith("cuda")

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "ref": self.ref.to_json(),
                "params": [p.to_json() for p in self.params],
                "grid": [g if isinstance(g, int) else sizes.dumps(g) for g in self.grid],
                "options": self.options, "device": self.device,
                "pre_hook": dataclasses.asdict(self.pre_hook) if self.pre_hook else None}

    @classmethod
    def from_json(cls, data: dict) -> TritonLaunch:
        hook = data["pre_hook"]
        return cls(data["kernel"], KernelRef(**data["ref"]),
                   tuple(LaunchParam.from_json(p) for p in data["params"]),
                   tuple(g if isinstance(g, int) else sizes.loads(g) for g in data["grid"]),
                   data["options"], data["device"], PreHook(**hook) if hook else None)


@dataclasses.dataclass(frozen=True)
class CompiledBinary:
    """A launch compiled for an NVIDIA GPU (``lower.cubins.compile_cuda``).

    Attributes:
        cubin: the cubin's bytes.
        name: the kernel's symbol in the cubin.
        threads: threads per block (32 * ``num_warps``).
        shared: dynamic shared memory, in bytes.
        num_ctas: CTAs per cluster.
        arg_types: per kernel parameter, the C type of its runtime argument (``CUdeviceptr``
            for a pointer), or None for one Triton specialized away (an int equal to 1).
        cooperative: ``launch_cooperative_grid``.
        pdl: ``launch_pdl`` (programmatic dependent launch).
        arch: ``"sm_90"``.
    """

    cubin: bytes
    name: str
    threads: int
    shared: int
    num_ctas: int
    arg_types: tuple[str | None, ...]
    cooperative: bool
    pdl: bool
    arch: str

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["cubin"] = base64.b64encode(self.cubin).decode()
        out["arg_types"] = list(self.arg_types)
        return out

    @classmethod
    def from_json(cls, data: dict) -> CompiledBinary:
        return cls(**{**data, "cubin": base64.b64decode(data["cubin"]),
                      "arg_types": tuple(data["arg_types"])})
