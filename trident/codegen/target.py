"""Codegen's targets: one module per device type (``target_cpu.py``, ``target_cuda.py``),
each with what an SCM does differently there: how a Triton launch runs (``launch``), the runtime
headers it needs (``HEADERS``), and how buffers are reused (``REUSE``, ``prologue``; Note
[Buffer reuse] in plan.py). Codegen asks the target instead of testing for CUDA; a new device
type is a new module here.
"""

from __future__ import annotations

import dataclasses

from trident.codegen.cprint import c_comment, c_string


@dataclasses.dataclass
class CStep:
    """One step as the template prints it. ``kind``: ``aten`` (a boxed dispatcher call),
    ``aten_out`` (the same, writing into a reused buffer: Note [Buffer reuse] in plan.py),
    ``cuda`` (a Triton launch through the driver), ``callback`` (a Triton launch through
    Triton's interpreter, in Python) or ``int`` (size arithmetic, its one statement in
    ``locals``)."""

    kind: str
    where: str
    text: str
    op: str
    locals: list[str]
    args: list[str]
    releases: list[str]
    op_index: int = 0
    nrets: int = 0
    takes: list[str] = dataclasses.field(default_factory=list)
    kernel: str = ""  # cuda: the trt_kernel variable
    device: int = 0
    grid: tuple = (1, 1, 1)
    slot: int = 0  # callback: index into the module's callback table
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
        if self.kind == "cuda":
            return (f"trt_cuda_launch(&{self.kernel}, {self.device}, stream, "
                    f"{', '.join(self.grid)}, params)")
        if self.kind == "callback":
            return f"rt->python_callback(callbacks[{self.slot}], args, {len(self.args)})"
        return f"rt->call(ops[{self.op_index}], args, {len(self.args)}, r, {self.nrets})"

    @property
    def call_out(self) -> str:
        """aten_out: the ``.out`` call that writes the reused buffer."""
        return f"rt->call(ops[{self.out_op_index}], args, {len(self.args) + 1}, r, 1)"

    @property
    def stream_call(self) -> str:
        """cuda: the call that reads the current stream."""
        return f"rt->cuda_stream({self.device}, &stream)"

    @property
    def error_at(self) -> str:
        """Where an error of this step is reported, as a C string: ``"f.py:12 (aten::mm)"``."""
        suffix = ", interpreted" if self.kind == "callback" else ""
        return c_string(f"{self.where} ({self.op}{suffix})")

    @property
    def error_at_out(self) -> str:
        """``error_at`` of the ``.out`` call that writes a reused buffer."""
        return c_string(f"{self.where} ({self.op}, out)")
