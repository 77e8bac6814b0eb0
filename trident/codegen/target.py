"""Codegen's targets: one module per device type (``cpu.py``, ``cuda.py``), each a ``Target``:
what an SCM does differently there: how a Triton launch runs (``launch``), the runtime headers
it needs (``HEADERS``), and how buffers are reused (``REUSE``, ``prologue``; Note [Buffer reuse]
in plan.py). A target returns typed pieces (``Prologue``, a ``Launch``) that render.py places;
codegen asks the target instead of testing for CUDA, and a new device type is a new module here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol, runtime_checkable

from trident.codegen.cprint import c_comment, c_string
from trident.ir.operands import Arg, Drop, Item, List, Operand, Scalar, Val
from trident.ir.launch import TritonLaunch
from trident.ir.plan import TritonStep
from trident.ir.specialization import Specialization


@dataclasses.dataclass(frozen=True)
class Prologue:
    """What a target runs before the first step: members of the frame the steps share
    (``frame``; Note [Parallel C build] in build.py), module-level declarations (``statics``)
    and statements at the top of ``run()`` (``lines``)."""

    frame: tuple[str, ...] = ()
    statics: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Launch:
    """A Triton launch as its target runs it, which render places as a step of kind ``KIND``:
    the statements before the call (``locals``) and what the call passes (``args``)."""

    KIND: ClassVar[str] = ""
    locals: tuple[str, ...]
    args: tuple[str, ...]

    @property
    def call(self) -> str:
        """The launch's C call, non-zero on failure."""
        raise NotImplementedError


class Renderer(Protocol):
    """What a target reads of the renderer (render.py's ``_SpecRenderer``) and asks of it."""

    spec: Specialization
    kernels: Any  # cuda.Kernels: the module's cubins
    views: dict[int, tuple[int, bool]]  # Note [Views in C] in plan.py: value -> (slot, eager)
    on_error: str  # the label a failing step jumps to (Note [Errors inside try] in source_lines.py)

    def operand(self, o: Operand) -> str: ...

    def tensor(self, o: Arg | Val | Item) -> str: ...

    def grid(self, launch: TritonLaunch) -> list[str]: ...

    def view_tensors(self, o: Operand, s) -> list[str]: ...

    def callback_slot(self, index: int) -> int: ...


@runtime_checkable
class Target(Protocol):
    """A device type's target (a module). ``NAME``: the device type; ``HEADERS``: the runtime
    headers its SCMs include; ``REUSE``: the C condition under which a step writes into its
    reused buffer (Note [Buffer reuse] in plan.py)."""

    NAME: str
    HEADERS: tuple[str, ...]
    REUSE: str

    def prologue(self, r: Renderer) -> Prologue:
        """What runs before the first step of a launch sequence that reuses buffers."""
        ...

    def launch(self, r: Renderer, index: int, s: TritonStep) -> Launch:
        """Plan step ``index``, ``s`` (a Triton launch), as this target launches it."""
        ...


@dataclasses.dataclass(frozen=True)
class Take:
    """Return ``index`` of a step's call (``r[index]``), taken by the value it makes: a tensor
    (``Val``), a list (``List``) or a scalar (``Scalar``); a ``Drop`` gives back whatever came
    (an undefined tensor)."""

    index: int
    result: Val | List | Scalar | Drop

    @property
    def statement(self) -> str:
        j = self.index
        match self.result:
            case Val(i):
                return f"v[{i}] = r[{j}].u.t;"
            case Scalar(i):
                return f"s[{i}] = r[{j}];"
            case List(i):
                return f"l[{i}] = r[{j}];"
        return f"if (r[{j}].tag == TRT_TENSOR) rt->release(r[{j}].u.t);"


@dataclasses.dataclass(frozen=True)
class Release:
    """A value released once dead (Note [Handle ownership] in trident_rt.h): tensor ``v[i]``
    (``Val``; NULL, a view computed in C that no step made into a tensor, is left: Note [Views
    in C] in plan.py) or list ``l[i]`` (``List``)."""

    value: Val | List

    @property
    def statement(self) -> str:
        i = self.value.i
        if isinstance(self.value, List):
            return f"rt->release_list(&l[{i}]);"
        return f"trt_drop(rt, &v[{i}]);"  # (trident_steps.h; a NULL is a view never made)


@dataclasses.dataclass
class CStep:
    """One step as the template prints it. ``kind``: ``aten`` (a boxed dispatcher call),
    ``aten_out`` (the same, writing into a reused buffer: Note [Buffer reuse] in plan.py),
    ``view`` (Note [Views in C] in plan.py), a ``Launch``'s ``KIND`` (``cuda``: a Triton launch
    through the driver; ``callback``: through Triton's interpreter, in Python) or ``int`` (size
    arithmetic, its statements in ``locals``). ``locals``: statements before the call;
    ``takes``: the call's returns kept; ``releases``: the values dead after it."""

    kind: str
    where: str
    text: str
    op: str
    locals: list[str]
    args: list[str]
    releases: list[Release]
    op_index: int = 0
    nrets: int = 0
    takes: list[Take] = dataclasses.field(default_factory=list)
    launch: Launch | None = None  # cuda, callback: the target's launch
    buffer: str = ""  # aten_out: the static buffer the .out overload writes
    out_op_index: int = 0
    reuse: str = ""  # aten_out: the C condition under which the buffer is reused
    on_error: str = "fail"  # the label an error jumps to: "eager" (Note [Errors inside try])

    @property
    def comment(self) -> str:
        """The step's comment: the user's ``file.py:LINE: source text``."""
        return c_comment(f"{self.where}: {self.text}")

    @property
    def call(self) -> str:
        """The step's C call, non-zero on failure."""
        if self.launch is not None:
            return self.launch.call
        return f"rt->call(ops[{self.op_index}], args, {len(self.args)}, r, {self.nrets})"

    @property
    def call_at(self) -> str:
        """aten: the step's call, which on failure sets the error (trident_steps.h)."""
        return (f"trt_call_at(rt, ops[{self.op_index}], args, {len(self.args)}, r, "
                f"{self.nrets}, {self.error_at})")

    @property
    def call_into(self) -> str:
        """aten_out: the call that writes the reused buffer, or makes it (trident_steps.h's
        ``trt_call_into``; Note [Buffer reuse] in plan.py)."""
        return (f"trt_call_into(rt, ops[{self.op_index}], ops[{self.out_op_index}], args, "
                f"{len(self.args)}, &{self.buffer}, {self.reuse}, r, 1, {self.error_at}, "
                f"{self.error_at_out})")

    @property
    def error_at(self) -> str:
        """Where an error of this step is reported, as a C string: ``"f.py:12 (aten::mm)"``."""
        suffix = ", interpreted" if self.kind == "callback" else ""
        return c_string(f"{self.where} ({self.op}{suffix})")

    @property
    def error_at_out(self) -> str:
        """``error_at`` of the ``.out`` call that writes a reused buffer."""
        return c_string(f"{self.where} ({self.op}, out)")
