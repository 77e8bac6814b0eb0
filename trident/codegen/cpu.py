"""The CPU target of codegen: what a Specialization Cache Module does differently when its
tensors are on the CPU. Triton kernels run in Triton's interpreter, called back in Python
(``trt_api.python_callback``); buffers are reused outside inference mode (Note [Buffer reuse]
in plan.py). The CUDA target is ``cuda.py``.
"""

from __future__ import annotations

import dataclasses

from trident.codegen.cprint import size_c
from trident.codegen.target import Launch, Prologue, Renderer
from trident.ir import operands
from trident.ir.launch import ScalarParam, TensorParam
from trident.ir.plan import TritonStep

NAME = "cpu"
HEADERS: tuple[str, ...] = ()
REUSE = "!env->inference_mode"  # the C condition under which a step reuses its buffer


@dataclasses.dataclass(frozen=True)
class InterpreterLaunch(Launch):
    """A launch through Triton's interpreter: Python callback ``slot`` of the module's table,
    called with ``args`` (``trt_value``s)."""

    KIND = "callback"
    slot: int

    @property
    def call(self) -> str:
        return f"rt->python_callback(callbacks[{self.slot}], args, {len(self.args)})"


def prologue(r: Renderer) -> Prologue:
    return Prologue()


def launch(r: Renderer, index: int, s: TritonStep) -> InterpreterLaunch:
    """A Triton launch through Triton's interpreter: a Python callback with the tensors, the
    scalars (sizes computed in C, Note [Symbolic launches] in kernels.py) and the grid."""
    tensors = iter(s.args)
    statements: list[str] = []
    values = []
    for p in s.launch.params:
        match p:
            case TensorParam():
                tensor = next(tensors)
                # Note [Views in C] in plan.py: the interpreter reads tensors
                statements += r.view_tensors(tensor, s)
                values.append(r.operand(tensor))
            case ScalarParam(size=size) if size is not None:
                values.append(f"TRT_I({size_c(size)})")
            case ScalarParam(value=value):
                values.append(r.operand(operands.constant(value)))
    values += [f"TRT_I({g})" for g in r.grid(s.launch)]
    return InterpreterLaunch(tuple(statements), tuple(values), r.callback_slot(index))
