"""Guards: the checks that select a specialization, as data.

One class per guard kind (as PyTorch's guard manager has), each a frozen dataclass that owns
how it reads its value from a call (``read``, over ``arg_facts``/``env_facts``, which mirror
``read_arg``/``read_args`` in ``runtime/args.cpp``) and its words (``words``, ``explain``).
Its C check, which the SCM evaluates on the hit path, is codegen's (``guard_c`` in
codegen/guards.py); ``holds`` is that check's Python twin, which explains a miss, and tests
(tests/test_guards.py) prove the two agree on random arguments.

Note [Guard order]: cheapest first. The argument count, then the kind and value of leaf 0
where it is an int (a call's argument tree key, Note [Argument trees]: the dispatcher tries its
modules in order, and a module of another tree with as many leaves fails there rather than
after all its checks, thousands for a model), call-wide state (grad mode,
inference mode, autocast, a tensor passed twice, the default dtype, torch.func transforms,
TorchFunctionModes, the default process group, the number of threads, torch's global flags),
then each argument's kind, then per tensor dtype, device, rank, then sizes and strides, then
flags (alignment, requires_grad, inference tensor), then scalar values. Both
the C function and ``first_failure`` evaluate guards in list order, except that the C function
checks an argument's kind, dtype, device, rank and flags as one compare of its record's header
word at the place of its kind (Note [Argument records] in codegen/guards.py): all are pure
reads, so only which check fails first differs, and the miss reason is Python's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import sympy

from trident.ir import sizes
from trident.ir.facts import (KIND_NAMES, TENSOR, Facts, arg_facts, bits_float,
                               describe_process_group, dtype_name, env_facts, flags_changed)

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
        return getattr(call.env, self.field)

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
        """Raises KeyError (an unknown kind), TypeError (fields it does not have) or
        ValueError (a value its kind cannot read back)."""
        data = dict(data)
        return KINDS[data.pop("field")]._from_fields(data)

    @classmethod
    def _from_fields(cls, data: dict) -> "Guard":
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class ArgCount(Guard):
    field = "nargs"

    def read(self, call: Facts) -> int:
        return call.nargs

    def words(self, names: list[str]) -> str:
        """``names[0]`` is the call's structure (the tree key), the rest the leaves' paths."""
        leaves = names[1:self.value]
        shown = ", ".join(leaves[:4]) + (f" and {len(leaves) - 4} more" if len(leaves) > 4 else "")
        count = f"{len(leaves)} leaf" if len(leaves) == 1 else f"{self.value - 1} leaves"
        return f"the call's structure and {count}" + (f" ({shown})" if shown else "")


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
    """Note [Thread count guard]: every specialization guards ``torch.get_num_threads()``. The ATen
    kernels a plan calls read the count when they run, as eager's do (a CPU ``sum`` of 2**20 float32
    values differs in its last bits between 1 and 2 threads, torch 2.13), so they need no guard; the
    trace does: a read of the count while tracing (the function's own ``torch.get_num_threads()``,
    or C++ that the recording of Note [State guards] in ``lower/state`` cannot see) is a constant of
    the plan. Dynamo's ``GlobalStateGuard`` holds it too (``num_threads``), so the torch.compile
    doors recompile on a new count whatever this guard does."""

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
        return getattr(call.args[self.arg], self.field)

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
        same = call.args[self.arg].id == call.args[self.value].id
        return self.value if same else None

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)} is {_who(self.value, names).removeprefix('argument ')}"


@dataclasses.dataclass(frozen=True)
class Size(ArgGuard):
    field = "size"
    member: ClassVar[str] = "sizes"  # the fact read: arg_facts' (and trt_arg's) list
    index: int = 0

    def read(self, call: Facts) -> int:
        return getattr(call.args[self.arg], self.member)[self.index]

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


# Note [Tensor types and attributes]: the native guards read an nn.Parameter as a tensor
# (THPVariable_CheckExact holds of both; any other subclass is TRT_ARG_OTHER, a miss that runs
# eagerly), and code asks which one it has: ``isinstance(w, nn.Parameter)``, which the trace's
# fake of a Parameter answers as the Parameter (torch marks it ``_is_param``). A tensor also
# carries Python attributes in its instance dict (``w.scale = 3.0``, a quantizer's
# ``quant_state``), which code reads with a default (``getattr(t, "scale", 1.0)``,
# ``hasattr(x, "jax")``) and which the fake does not carry (Note [Python attributes of tensors]
# in lower/tensor_attributes.py). So every tensor argument is guarded on whether it is an
# nn.Parameter, a flag bit of its record's header (one compare with its other header guards:
# Note [Argument records] in codegen/guards.py), and each tensor argument whose attributes the
# trace looked up on whether its instance dict is non-empty (its record's ``i``, a check of its
# own: a static cache's tensors gain attributes after the first call that no code looks up). A
# Parameter and a plain tensor are two specializations; a tensor traced without attributes and
# looked up serves only calls whose tensor has none, so the lookup fails the same way at every
# hit. The type itself (``type(t) is torch.Tensor``, ``t.__class__``) is the fake's
# (FakeTensor) in the trace: user code's and library code's reads of it make the call run
# eagerly (``tensor_type_read`` in lower/state/bytecode.py).
class IsParameter(_Flag):
    field, says = "parameter", "isinstance({who}, nn.Parameter) is {v}"


class Attributes(ArgGuard):
    """A tensor with Python attributes (its record's ``i``: trident_rt.h)."""

    field, says = "attributes", "bool(vars({who})) is {v}"


class IntValue(ArgGuard):
    """An int or bool argument's value."""

    field, says = "value", "{who} == {v!r}"


class FloatBits(ArgGuard):
    """A float argument's bit pattern (NaNs, -0.0)."""

    field = "float_bits"

    def read(self, call: Facts) -> int | None:
        return call.args[self.arg].value

    def words(self, names: list[str]) -> str:
        return f"{_who(self.arg, names)} == {self.said(self.value)}"

    def said(self, actual: Any) -> str:
        return repr(actual) if actual is None else repr(bits_float(actual))


@dataclasses.dataclass(frozen=True)
class SizeRelation(ArgGuard):
    """Note [Symbolic guards]: a condition over the arguments' sizes, strides and offsets,
    ``expr`` (Note [Size expressions] in sizes.py; stored as its ``sympy.srepr`` text);
    ``arg`` is the highest argument it reads, ``value`` True."""

    field = "sym"
    expr: sympy.Basic = sympy.true

    def to_json(self) -> dict:
        return {"field": self.field, "value": self.value, "arg": self.arg,
                "expr": sizes.dumps(self.expr)}

    @classmethod
    def _from_fields(cls, data: dict) -> "SizeRelation":
        return cls(**{**data, "expr": sizes.loads(data["expr"])})

    def read(self, call: Facts) -> bool:
        try:
            return bool(sizes.evaluate(self.expr, call.args))
        except (KeyError, IndexError, TypeError, ZeroDivisionError):
            return False

    def words(self, names: list[str]) -> str:
        return sizes.words(self.expr, names)

    def explain(self, call: Facts, names: list[str]) -> str:
        """Names the places it read: ``x.size(0) >= 2 is false (x.size(0) = 1)``."""
        read = []
        for s in dict.fromkeys(e for e in sympy.preorder_traversal(self.expr)
                               if isinstance(e, sympy.Symbol)):
            kind, arg, dim = sizes.where(s)
            f = call.args[arg]
            if kind == "value" and f.value is not None:  # Note [Symbolic ints] in lower/guards.py
                read.append(f"{_who(arg, names)} = {f.value}")
            if f.kind != TENSOR:
                continue
            if dim is None:
                read.append(f"{_who(arg, names)}.storage_offset() = {f.storage_offset}")
            else:
                values = getattr(f, kind + "s")
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
