"""The CPU target of codegen: what a Specialization Cache Module does differently when its
tensors are on the CPU. Triton kernels run in Triton's interpreter, called back in Python
(``trt_api.python_callback``); buffers are reused outside inference mode (Note [Buffer reuse]
in plan.py). The CUDA target is ``target_cuda.py``; codegen asks ``targets.of`` for one.
"""

from __future__ import annotations

from trident.ir import operands
from trident.codegen.cprint import c_comment, size_c
from trident.codegen.target import CStep

NAME = "cpu"
HEADERS: tuple[str, ...] = ()
REUSE = "!env->inference_mode"  # the C condition under which a step reuses its buffer


def prologue(r) -> list[str]:
    return []


def launch(r, index: int, s) -> CStep:
    """A Triton launch through Triton's interpreter: a Python callback with the tensors, the
    scalars (sizes computed in C, Note [Symbolic launches] in kernels.py) and the grid."""
    launch = s.launch
    tensors = iter(s.args)
    values = []
    for p in launch["params"]:
        if p["kind"] == "tensor":
            tensor = next(tensors)
            r.make_views(tensor, s)  # Note [Views in C]: the interpreter reads tensors
            values.append(r.operand(tensor))
        elif "size" in p:
            values.append(f"TRT_I({size_c(p['size'])})")
        elif p["kind"] == "scalar":
            values.append(r.operand(operands.constant(p["value"])))
    values += [f"TRT_I({g})" for g in r.grid(launch)]
    r.callbacks.append(index)
    return CStep("callback", s.where, c_comment(s.text), f"triton {s.overload}", r.locals,
                 values, r.releases(s), slot=len(r.callbacks) - 1)
