"""Guards: the checks that select a specialization, as data.

One class per guard kind (as PyTorch's guard manager has), each a frozen dataclass that owns
how it reads its value from a call (``read``, over ``arg_facts``/``env_facts``, which mirror
``read_arg``/``read_args`` in ``runtime/args.cpp``) and its words (``words``, ``explain``).
Its C check, which the SCM evaluates on the hit path, is codegen's (``guard_c`` in
codegen/guards.py); ``holds`` is that check's Python twin, which explains a miss, and tests
(tests/test_guards.py) prove the two agree on random arguments.

Note [Guard order]: cheapest first. The argument count and call-wide state (grad mode,
inference mode, autocast, a tensor passed twice, the default dtype, torch.func transforms,
TorchFunctionModes, the default process group, the number of threads, torch's global flags),
then each argument's kind, then per tensor dtype, device, rank, then sizes and strides, then
flags (alignment, requires_grad, inference tensor), then scalar values. Both
the C function and ``first_failure`` evaluate guards in list order.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any, ClassVar, NamedTuple

import sympy
import torch

from trident.ir import sizes
from trident.runtime import ABI

# trt_arg_kind and the limits, as trident_rt.h defines them (runtime.ABI)
OTHER, TENSOR, INT, FLOAT, BOOL, NONE = (
    ABI[f"TRT_ARG_{k}"] for k in ("OTHER", "TENSOR", "INT", "FLOAT", "BOOL", "NONE"))
KIND_NAMES = {OTHER: "unsupported", TENSOR: "Tensor", INT: "int", FLOAT: "float", BOOL: "bool",
              NONE: "None"}
DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10::DeviceType
MAX_ARGS, MAX_OUTS = ABI["TRT_MAX_ARGS"], ABI["TRT_MAX_OUTS"]
# Call-wide facts (trt_env in trident_rt.h), guarded in every specialization.
# trt_env.flags, bit by bit (global_flags() in args.cpp): torch's global flags that eager ops
# obey when they run, or that picked what a trace holds (an SDPA backend). Fields of 4 bits
# from bit 16: the float32 matmul precision and the cuBLAS fp16 / bf16 reduction options.
FLAG_BITS = ("torch.are_deterministic_algorithms_enabled()",
             "torch.is_deterministic_algorithms_warn_only_enabled()",
             "torch.backends.cuda.flash_sdp_enabled()",
             "torch.backends.cuda.mem_efficient_sdp_enabled()",
             "torch.backends.cuda.math_sdp_enabled()", "torch.backends.cuda.cudnn_sdp_enabled()",
             "torch.backends.cudnn.allow_tf32", "torch.backends.cudnn.enabled",
             "torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic")
FLAG_FIELDS = ((16, "torch.get_float32_matmul_precision()"),
               (20, "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
               (24, "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"))
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


def arg_facts(obj: Any) -> dict:
    """What the native dispatcher reads from one argument (``read_arg`` in runtime/args.cpp)."""
    if type(obj) in (torch.Tensor, torch.nn.Parameter):
        if (obj.is_nested or obj.layout != torch.strided or obj.is_conj() or obj.is_neg()
                or obj.device.type not in DEVICE_TYPES):
            return {"kind": OTHER}
        try:
            data_ptr = obj.data_ptr()
        except RuntimeError:  # no storage: a torch.func wrapper (vmap, grad)
            return {"kind": OTHER}
        if any(torch._VF._unpack_dual(obj, level)[1] is not None for level in (0, 1)):
            return {"kind": OTHER, "dual": True}  # forward-AD: its tangent runs eagerly
        return {
            "kind": TENSOR,
            "id": id(obj),
            "dtype": dtype_codes()[obj.dtype],
            "device_type": DEVICE_TYPES[obj.device.type],
            "device_index": -1 if obj.device.index is None else obj.device.index,
            "dim": obj.dim(),
            "sizes": tuple(obj.shape),
            "strides": tuple(obj.stride()),
            "storage_offset": obj.storage_offset(),
            "aligned16": data_ptr % 16 == 0,
            "requires_grad": obj.requires_grad,
            "inference": obj.is_inference(),
        }
    if obj is None:
        return {"kind": NONE}
    if type(obj) is bool:
        return {"kind": BOOL, "value": obj}
    if type(obj) is int:
        return {"kind": INT, "value": obj} if -2**63 <= obj < 2**63 else {"kind": OTHER}
    if type(obj) is float:
        return {"kind": FLOAT, "value": float_bits(obj)}
    return {"kind": OTHER}


def env_facts(args: tuple) -> dict:
    """Call-wide state the native dispatcher reads (``read_args`` in runtime/args.cpp)."""
    tensors = [id(a) for a in args if type(a) in (torch.Tensor, torch.nn.Parameter)]
    return {
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "autocast": torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"),
        "aliased": len(set(tensors)) != len(tensors),
        "default_dtype": dtype_codes()[torch.get_default_dtype()],
        "transforms": torch._C._are_functorch_transforms_active(),
        "function_modes": torch._C._len_torch_function_stack() > 0,
        "process_group": process_group_fact(),  # Note [Process group guard]
        "num_threads": torch.get_num_threads(),
        "flags": _global_flags(),
    }


def _global_flags() -> int:
    from trident import runtime

    return runtime.load().global_flags()


def flags_changed(expected: int, actual: int) -> list[str]:
    """The flags (FLAG_BITS, FLAG_FIELDS) that differ between two ``trt_env.flags`` values."""
    names = [name for i, name in enumerate(FLAG_BITS) if (expected ^ actual) >> i & 1]
    return names + [name for shift, name in FLAG_FIELDS if (expected ^ actual) >> shift & 15]


class Facts(NamedTuple):
    """What the native dispatcher read from one call: ``arg_facts`` of each argument, their
    number, and ``env_facts``."""

    args: list[dict]
    nargs: int
    env: dict


KINDS: dict[str, type["Guard"]] = {}  # Guard.field -> its class, for from_json


@dataclasses.dataclass(frozen=True)
class Guard:
    """One check that selects a specialization (Note [Guard order]). Each kind (a subclass,
    named in JSON by its ``field``) owns how it reads its value from a call (``read``, over what
    the native dispatcher read; ``holds`` is the Python twin of its C check, ``guard_c`` in
    codegen/guards.py) and its words (``words``). The guard holds when the value read equals
    ``value``."""

    field: ClassVar[str] = ""
    value: Any

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("field"):
            KINDS[cls.field] = cls

    def read(self, call: Facts) -> Any:
        return call.env[self.field]

    def holds(self, call: Facts) -> bool:
        return self.read(call) == self.value

    def words(self, names: list[str]) -> str:
        raise NotImplementedError

    def said(self, actual: Any) -> str:
        """A value read, as ``words`` says values."""
        return repr(actual)

    def explain(self, call: Facts, names: list[str]) -> str:
        """Why ``call`` fails this guard: ``"x.size(0) == 4 expected, got 5"``."""
        return f"{self.words(names)} expected, got {self.said(self.read(call))}"

    def to_json(self) -> dict:
        return {"field": self.field, **dataclasses.asdict(self)}

    @staticmethod
    def from_json(data: dict) -> "Guard":
        """Raises KeyError (an unknown kind) or TypeError (fields it does not have)."""
        data = dict(data)
        return KINDS[data.pop("field")](**data)


@dataclasses.dataclass(frozen=True)
class ArgCount(Guard):
    field = "nargs"

    def read(self, call: Facts) -> int:
        return call.nargs

    def words(self, names: list[str]) -> str:
        return f"{self.value} positional arguments"


@dataclasses.dataclass(frozen=True)
class _EnvFlag(Guard):
    """A call-wide bool (``trt_env`` in trident_rt.h)."""

    says: ClassVar[str] = ""

    def words(self, names: list[str]) -> str:
        return self.says.format(self.value)


class GradEnabled(_EnvFlag):
    field, says = "grad_enabled", "torch.is_grad_enabled() is {}"


class InferenceMode(_EnvFlag):
    field, says = "inference_mode", "torch.is_inference_mode_enabled() is {}"


class Autocast(_EnvFlag):
    field = "autocast"

    def words(self, names: list[str]) -> str:
        return f"autocast is {'on' if self.value else 'off'}"


class Aliased(_EnvFlag):
    field, says = "aliased", "one tensor in two argument positions is {}"


class Transforms(_EnvFlag):
    field, says = "transforms", "a torch.func transform is active is {}"


class FunctionModes(_EnvFlag):
    field, says = "function_modes", "a TorchFunctionMode is active is {}"


@dataclasses.dataclass(frozen=True)
class DefaultDtype(Guard):
    field = "default_dtype"

    def words(self, names: list[str]) -> str:
        return f"torch.get_default_dtype() == {dtype_name(self.value)}"

    def said(self, actual: Any) -> str:
        return repr(dtype_name(actual))


@dataclasses.dataclass(frozen=True)
class ProcessGroup(Guard):
    """Note [Process group guard]."""

    field = "process_group"

    def words(self, names: list[str]) -> str:
        return describe_process_group(self.value)

    def explain(self, call: Facts, names: list[str]) -> str:
        return f"{self.words(names)} expected, but {describe_process_group(self.read(call))}"


@dataclasses.dataclass(frozen=True)
class NumThreads(Guard):
    field = "num_threads"

    def words(self, names: list[str]) -> str:
        return f"torch.get_num_threads() == {self.value}"


@dataclasses.dataclass(frozen=True)
class GlobalFlags(Guard):
    """``trt_env.flags``: FLAG_BITS and FLAG_FIELDS."""

    field = "flags"

    def words(self, names: list[str]) -> str:
        return f"torch's global flags == {self.value:#x}"

    def explain(self, call: Facts, names: list[str]) -> str:
        changed = flags_changed(self.value, self.read(call))
        return f"{', '.join(changed)} changed since the compile"


@dataclasses.dataclass(frozen=True)
class ArgGuard(Guard):
    """A fact of argument ``arg`` (``trt_arg`` in trident_rt.h, ``arg_facts`` here)."""

    arg: int = 0
    says: ClassVar[str] = ""  # words, with {who} and {v}

    def read(self, call: Facts) -> Any:
        return call.args[self.arg].get(self.field)

    def words(self, names: list[str]) -> str:
        return self.says.format(who=_who(self.arg, names), v=self.value)


def _who(arg: int, names: list[str]) -> str:
    return names[arg] if arg < len(names) else f"argument {arg}"


class Kind(ArgGuard):
    field = "kind"

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)} is {KIND_NAMES[self.value]}"

    def said(self, actual: Any) -> str:
        return repr(KIND_NAMES.get(actual, actual))


class Dtype(ArgGuard):
    field = "dtype"

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)}.dtype == {dtype_name(self.value)}"

    def said(self, actual: Any) -> str:
        return repr(actual if actual is None else dtype_name(actual))


class DeviceType(ArgGuard):
    field = "device_type"

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)}.device.type == {'cpu' if self.value == 0 else 'cuda'}"


class DeviceIndex(ArgGuard):
    field, says = "device_index", "{who}.device.index == {v}"


class Dim(ArgGuard):
    field, says = "dim", "{who}.dim() == {v}"


class SameAs(ArgGuard):
    """Argument ``arg`` is the tensor passed as argument ``value``."""

    field = "same_as"

    def read(self, call: Facts) -> int | None:
        same = call.args[self.arg].get("id") == call.args[self.value].get("id")
        return self.value if same else None

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)} is {_who(self.value, names).removeprefix('argument ')}"


@dataclasses.dataclass(frozen=True)
class Size(ArgGuard):
    field = "size"
    member: ClassVar[str] = "sizes"  # the fact read: arg_facts' (and trt_arg's) list
    index: int = 0

    def read(self, call: Facts) -> int:
        return call.args[self.arg][self.member][self.index]

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)}.{self.field}({self.index}) == {self.value}"


class Stride(Size):
    field, member = "stride", "strides"


class _Flag(ArgGuard):
    """A bit of ``trt_arg.flags``."""


class Aligned16(_Flag):
    field = "aligned16"

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)}.data_ptr() % 16 {'==' if self.value else '!='} 0"


class RequiresGrad(_Flag):
    field, says = "requires_grad", "{who}.requires_grad is {v}"


class Inference(_Flag):
    field, says = "inference", "{who}.is_inference() is {v}"


class IntValue(ArgGuard):
    """An int or bool argument's value."""

    field, says = "value", "{who} == {v!r}"


class FloatBits(ArgGuard):
    """A float argument's bit pattern (NaNs, -0.0)."""

    field = "float_bits"

    def read(self, call: Facts) -> int | None:
        return call.args[self.arg].get("value")

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)} == {self.said(self.value)}"

    def said(self, actual: Any) -> str:
        return repr(actual) if actual is None else repr(bits_float(actual))


@dataclasses.dataclass(frozen=True)
class SizeRelation(ArgGuard):
    """Note [Symbolic guards]: a condition over the arguments' sizes, strides and offsets,
    ``expr`` (Note [Size expressions] in sizes.py, as ``sympy.srepr`` text); ``arg`` is the
    highest argument it reads, ``value`` True."""

    field = "sym"
    expr: str = ""

    @property
    def condition(self):
        return sizes.loads(self.expr)

    def read(self, call: Facts) -> bool:
        try:
            return bool(sizes.evaluate(self.condition, call.args))
        except (KeyError, IndexError, TypeError, ZeroDivisionError):
            return False

    def words(self, names: list[str]) -> str:
        return sizes.words(self.condition, names)

    def explain(self, call: Facts, names: list[str]) -> str:
        """Names the places it read: ``x.size(0) >= 2 is false (x.size(0) = 1)``."""
        read = []
        for s in dict.fromkeys(e for e in sympy.preorder_traversal(self.condition)
                               if isinstance(e, sympy.Symbol)):
            kind, arg, dim = sizes.where(s)
            f = call.args[arg]
            if f.get("kind") != TENSOR:
                continue
            if dim is None:
                read.append(f"{_who(arg, names)}.storage_offset() = {f['storage_offset']}")
            else:
                values = f[kind + "s"]
                read.append(f"{_who(arg, names)}.{kind}({dim}) = "
                            f"{values[dim] if dim < len(values) else '-'}")
        return f"{self.words(names)} is false ({', '.join(read)})"


def _facts(args: tuple) -> Facts:
    return Facts([arg_facts(a) for a in args], len(args), env_facts(args))


def explain_failure(guard: Guard, args: tuple, names: list[str]) -> str:
    """``"x.size(0) == 4 expected, got 5"`` for a guard that ``args`` fail."""
    if isinstance(guard, ArgGuard) and guard.arg >= len(args):
        return f"{guard.words(names)} expected, but only {len(args)} arguments were passed"
    return guard.explain(_facts(args), names)


def first_failure(guards: list[Guard], args: tuple) -> Guard | None:
    """The first guard (in Note [Guard order]) that ``args`` fail, or None if all hold."""
    call = _facts(args)
    for g in guards:
        if isinstance(g, ArgGuard) and g.arg >= len(args):
            return g
        if not g.holds(call):
            return g
    return None


def failures(guards: list[Guard], args: tuple, most: int = 4) -> list[Guard]:
    """The guards ``args`` fail, in guard order, at most ``most`` (for ``explain``). After an
    argument's first failing guard its later ones are not read (they may not apply: the size of
    what is no longer a tensor), nor is a guard that cannot be read of these facts."""
    call, out, failed_args = _facts(args), [], set()
    for g in guards:
        arg = g.arg if isinstance(g, ArgGuard) else None
        if arg is not None and arg in failed_args:
            continue
        try:
            holds = not (arg is not None and arg >= len(args)) and g.holds(call)
        except Exception:  # noqa: BLE001 - a fact this guard reads is missing
            continue
        if not holds:
            out.append(g)
            failed_args.add(arg)
            if len(out) == most:
                break
    return out
