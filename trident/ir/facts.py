"""What the native dispatcher reads of a call, as Python reads it: each argument's facts
(``read_arg`` in runtime/args.cpp) and the call-wide state (``read_args``): the Python twins the
guards' ``read`` methods explain misses with."""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any, NamedTuple

import torch

from trident.runtime import ABI

# trt_arg_kind and the limits, as trident_rt.h defines them (runtime.ABI)
OTHER, TENSOR, INT, FLOAT, BOOL, NONE = (
    ABI[f"TRT_ARG_{k}"] for k in ("OTHER", "TENSOR", "INT", "FLOAT", "BOOL", "NONE"))
KIND_NAMES = {OTHER: "unsupported", TENSOR: "Tensor", INT: "int", FLOAT: "float", BOOL: "bool",
              NONE: "None"}
DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10::DeviceType
MAX_ARGS, MAX_OUTS = ABI["TRT_MAX_ARGS"], ABI["TRT_MAX_OUTS"]
# Call-wide facts (trt_env in trident_rt.h), guarded in every specialization.
# trt_env.flags (TRT_FLAG_* and TRT_FIELD_* in trident_rt.h; global_flags() in args.cpp): torch's
# global flags that eager ops obey when they run, or that picked what a trace holds (an SDPA
# backend), by their bit; and its settings held in fields of 4 bits, by their first bit.
FLAG_BITS = {ABI[f"TRT_FLAG_{k}"]: name for k, name in (
    ("DETERMINISTIC", "torch.are_deterministic_algorithms_enabled()"),
    ("DETERMINISTIC_WARN", "torch.is_deterministic_algorithms_warn_only_enabled()"),
    ("FLASH_SDP", "torch.backends.cuda.flash_sdp_enabled()"),
    ("MEM_EFFICIENT_SDP", "torch.backends.cuda.mem_efficient_sdp_enabled()"),
    ("MATH_SDP", "torch.backends.cuda.math_sdp_enabled()"),
    ("CUDNN_SDP", "torch.backends.cuda.cudnn_sdp_enabled()"),
    ("CUDNN_TF32", "torch.backends.cudnn.allow_tf32"), ("CUDNN", "torch.backends.cudnn.enabled"),
    ("CUDNN_BENCHMARK", "torch.backends.cudnn.benchmark"),
    ("CUDNN_DETERMINISTIC", "torch.backends.cudnn.deterministic"),
    ("CUDNN_TF32_MIXED", "torch.backends.cudnn.allow_tf32 raises (legacy and fp32_precision "
                         "settings disagree)"),
    ("WARN_ALWAYS", "torch.is_warn_always_enabled()"))}
FLAG_FIELDS = {ABI[f"TRT_FIELD_{k}"]: name for k, name in (
    ("MATMUL_PRECISION", "torch.get_float32_matmul_precision()"),
    ("FP16_REDUCTION", "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
    ("BF16_REDUCTION", "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"))}
_DTYPES = [getattr(torch, name) for name in dir(torch)
           if isinstance(getattr(torch, name, None), torch.dtype)]


# Note [Process group guard]: a plan names its groups by string and bakes in what the trace read
# of them: the group's size (an all-gather's output shape, ``group_size`` arguments) and the rank
# (``dist.get_rank()`` is a Python int, a constant of the trace). Every specialization is therefore
# guarded on the default process group, ``"<name>:<rank>/<size>"`` or ``""`` when none is
# initialized (``process_group`` in ``trt_env``, read once per call from
# ``torch.distributed.distributed_c10d._world`` by ``read_args`` in runtime/args.cpp; ``process_group_fact``
# is its Python twin). A call after ``destroy_process_group``/``init_process_group`` with another size or
# rank misses and is traced again; one outside any group misses and its trace raises as eager does
# (the call runs eagerly, with a warning). A collective on any other group than the default one is
# not compiled (``collectives.check_group``): its membership is not guarded.


def process_group_fact() -> str:
    """The default process group as ``"<group name>:<rank>/<world size>"``, ``""`` when none is
    initialized (or torch.distributed is not built). Python twin of ``process_group_fact`` in
    runtime/collectives.cpp."""
    if not torch.distributed.is_available():
        return ""
    from torch.distributed.distributed_c10d import _world

    group = _world.__dict__.get("_default_pg")
    if group is None:
        return ""
    return f"{group.group_name}:{group.rank()}/{group.size()}"


def describe_process_group(value: str) -> str:
    if not value:
        return "no default process group is initialized"
    name, _, ranks = value.partition(":")
    rank, _, size = ranks.partition("/")
    return f"the default process group is {name!r}, rank {rank} of {size}"


@functools.cache
def dtype_codes() -> dict[torch.dtype, int]:
    """torch.dtype -> c10::ScalarType code, as PyTorch itself numbers them (runtime/module.cpp)."""
    from trident import runtime

    rt = runtime.load()
    return {d: rt.dtype_code(d) for d in _DTYPES}


def dtype_name(code: int) -> str:
    return next((str(d).replace("torch.", "") for d, c in dtype_codes().items() if c == code),
                str(code))


def float_bits(f: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", f))[0]


def bits_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


@dataclasses.dataclass(frozen=True)
class ArgFacts:
    """What the native dispatcher reads from one argument (``trt_arg`` in trident_rt.h,
    ``read_arg`` in runtime/args.cpp). A fact the argument's kind does not have is None; a
    guard reads a fact by its name (``Guard.field``), which is ``trt_arg``'s.

    Attributes:
        kind: TENSOR, INT, FLOAT, BOOL, NONE or OTHER (``trt_arg_kind``).
        value: an int's or bool's value; a float's bit pattern (``float_bits``).
        dual: an OTHER that is a forward-AD dual tensor (its tangent runs eagerly).
        id: a tensor's ``id()`` (the same tensor in two positions).
        dtype: c10::ScalarType code (``dtype_codes``).
        device_type, device_index: c10::DeviceType code, index (-1 for none).
        dim, sizes, strides, storage_offset: the tensor's geometry, in elements.
        aligned16: its data pointer is divisible by 16 (Note [Pointer alignment] in
            lower/kernels.py).
        requires_grad, inference: ``requires_grad``, ``is_inference()``.
        parameter, attributes: ``type(x) is nn.Parameter``, a non-empty ``vars(x)`` (Note
            [Tensor types and attributes] in ir/guards.py).
    """

    kind: int
    value: int | bool | None = None
    dual: bool = False
    id: int | None = None
    dtype: int | None = None
    device_type: int | None = None
    device_index: int | None = None
    dim: int | None = None
    sizes: tuple[int, ...] | None = None
    strides: tuple[int, ...] | None = None
    storage_offset: int | None = None
    aligned16: bool | None = None
    requires_grad: bool | None = None
    inference: bool | None = None
    parameter: bool | None = None
    attributes: bool | None = None


def has_attributes(obj: Any) -> bool:
    """A tensor with Python attributes: a non-empty instance dict (a tensor record's ``i``)."""
    return isinstance(obj, torch.Tensor) and bool(getattr(obj, "__dict__", None))


def arg_facts(obj: Any) -> ArgFacts:
    """What the native dispatcher reads from one argument (``read_arg`` in runtime/args.cpp)."""
    if type(obj) in (torch.Tensor, torch.nn.Parameter):
        if (obj.is_nested or obj.layout != torch.strided or obj.is_conj() or obj.is_neg()
                or obj._is_zerotensor() or obj.device.type not in DEVICE_TYPES):
            return ArgFacts(OTHER)
        try:
            data_ptr = obj.data_ptr()
        except RuntimeError:  # no storage: a torch.func wrapper (vmap, grad)
            return ArgFacts(OTHER)
        if any(torch._VF._unpack_dual(obj, level)[1] is not None for level in (0, 1)):
            return ArgFacts(OTHER, dual=True)  # forward-AD: its tangent runs eagerly
        return ArgFacts(
            TENSOR,
            id=id(obj),
            dtype=dtype_codes()[obj.dtype],
            device_type=DEVICE_TYPES[obj.device.type],
            device_index=-1 if obj.device.index is None else obj.device.index,
            dim=obj.dim(),
            sizes=tuple(obj.shape),
            strides=tuple(obj.stride()),
            storage_offset=obj.storage_offset(),
            aligned16=data_ptr % 16 == 0,
            requires_grad=obj.requires_grad,
            inference=obj.is_inference(),
            parameter=type(obj) is torch.nn.Parameter,
            attributes=has_attributes(obj),
        )
    if obj is None:
        return ArgFacts(NONE)
    if type(obj) is bool:
        return ArgFacts(BOOL, obj)
    if type(obj) is int:
        return ArgFacts(INT, obj) if -2**63 <= obj < 2**63 else ArgFacts(OTHER)
    if type(obj) is float:
        return ArgFacts(FLOAT, float_bits(obj))
    return ArgFacts(OTHER)


@dataclasses.dataclass(frozen=True)
class EnvFacts:
    """Call-wide state the native dispatcher reads (``trt_env`` in trident_rt.h,
    ``read_args`` in runtime/args.cpp); a guard reads a fact by its name (``Guard.field``).

    Attributes:
        grad_enabled, inference_mode: ``torch.is_grad_enabled()``,
            ``torch.is_inference_mode_enabled()``.
        autocast: autocast is on for the CPU or CUDA.
        aliased: one tensor is passed in two argument positions.
        default_dtype: ``torch.get_default_dtype()``'s c10::ScalarType code.
        transforms, function_modes: a torch.func transform, a TorchFunctionMode is active.
        process_group: Note [Process group guard].
        num_threads: ``torch.get_num_threads()``.
        flags: torch's global flags (FLAG_BITS, FLAG_FIELDS).
    """

    grad_enabled: bool
    inference_mode: bool
    autocast: bool
    aliased: bool
    default_dtype: int
    transforms: bool
    function_modes: bool
    process_group: str
    num_threads: int
    flags: int


def env_facts(args: tuple) -> EnvFacts:
    """Call-wide state the native dispatcher reads (``read_args`` in runtime/args.cpp)."""
    tensors = [id(a) for a in args if type(a) in (torch.Tensor, torch.nn.Parameter)]
    return EnvFacts(
        grad_enabled=torch.is_grad_enabled(),
        inference_mode=torch.is_inference_mode_enabled(),
        autocast=torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"),
        aliased=len(set(tensors)) != len(tensors),
        default_dtype=dtype_codes()[torch.get_default_dtype()],
        transforms=torch._C._are_functorch_transforms_active(),
        function_modes=torch._C._len_torch_function_stack() > 0,
        process_group=process_group_fact(),  # Note [Process group guard]
        num_threads=torch.get_num_threads(),
        flags=_global_flags(),
    )


def _global_flags() -> int:
    from trident import runtime

    return runtime.load().global_flags()


def flags_changed(expected: int, actual: int) -> list[str]:
    """The flags (FLAG_BITS, FLAG_FIELDS) that differ between two ``trt_env.flags`` values."""
    names = [name for bit, name in FLAG_BITS.items() if (expected ^ actual) >> bit & 1]
    return names + [name for bit, name in FLAG_FIELDS.items() if (expected ^ actual) >> bit & 15]


class Facts(NamedTuple):
    """What the native dispatcher read from one call: ``arg_facts`` of each argument, their
    number, and ``env_facts``."""

    args: list[ArgFacts]
    nargs: int
    env: EnvFacts
