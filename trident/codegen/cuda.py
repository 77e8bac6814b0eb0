"""The CUDA target of codegen: what a Specialization Cache Module does differently when its
tensors are on a CUDA device. Triton kernels launch through the driver
(``runtime/trident_cuda.h``: each cubin a ``trt_kernel``, loaded per device at its first
launch, ``cuLaunchKernelEx`` on PyTorch's current stream); buffers are reused on the stream
that made them (Note [Buffer reuse] in plan.py). The CPU target is ``cpu.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib

from trident.ir import sizes
from trident.codegen.cprint import c_comment, c_float, c_string, size_c
from trident.codegen.target import Launch, Prologue, Renderer
from trident.ir.launch import CompiledBinary, ScalarParam, TensorParam
from trident.ir.operands import Arg, Item, Val
from trident.ir.plan import TritonStep

NAME = "cuda"
HEADERS = ("trident_cuda.h",)
REUSE = "f->reuse"  # set by the prologue: not in inference mode, on the buffers' stream
_SCALARS = {"int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
            "uint64_t"}


@dataclasses.dataclass(frozen=True)
class DriverLaunch(Launch):
    """A launch of cubin ``kernel`` (a ``trt_kernel`` variable) on CUDA device ``device`` with
    grid ``grid`` (three C expressions), on PyTorch's current stream; ``args`` are the addresses
    of its parameters (``params[]``)."""

    KIND = "cuda"
    kernel: str
    device: int
    grid: tuple[str, ...]

    @property
    def call(self) -> str:
        return (f"trt_cuda_launch(&{self.kernel}, {self.device}, stream, "
                f"{', '.join(self.grid)}, params)")

    @property
    def stream_call(self) -> str:
        """The call that reads the current stream, non-zero on failure."""
        return f"rt->cuda_stream({self.device}, &stream)"


class Kernels:
    """The module's compiled kernels, one ``trt_kernel`` per distinct binary (a kernel launched
    from every layer of a model is stored once). The source names each cubin by size and SHA-256;
    the bytes are handed over at install (``scm_set_cubin``, Note [Incremental modules] in
    build.py), not embedded as text."""

    def __init__(self):
        self.names: dict[tuple, str] = {}
        self.decls: list[str] = []
        self.externs: list[str] = []  # the parts' declarations (Note [Parallel C build])
        self.cubins: list[bytes] = []

    def add(self, kernel: str, binary: CompiledBinary) -> str:
        key = (binary.cubin, binary.name, binary.threads, binary.shared, binary.num_ctas,
               binary.cooperative, binary.pdl)
        if key in self.names:
            return self.names[key]
        name = f"kernel{len(self.names)}"
        cubin = binary.cubin
        self.decls.append(
            f"/* {kernel}: {binary.arch} cubin, {len(cubin)} bytes, sha256 "
            f"{hashlib.sha256(cubin).hexdigest()} */\n"
            f"TRT_SHARED trt_kernel {name} = {{{c_string(binary.name)}, NULL, "
            f"{binary.threads}, {binary.shared}, {binary.num_ctas}, "
            f"{int(binary.cooperative)}, {int(binary.pdl)}, {{0}}}};")
        self.externs.append(f"extern TRT_SHARED trt_kernel {name};")
        self.names[key] = name
        self.cubins.append(cubin)
        return name


def prologue(r: Renderer) -> Prologue:
    """Note [Buffer reuse] in plan.py: buffers are reused on the stream that made them, and a
    call on another stream allocates."""
    device = r.spec.cuda_device
    stream = "buffer_stream"
    return Prologue(
        ("int reuse;  /* Note [Buffer reuse]: the buffers are on this call's stream */",),
        (f"static void* {stream};  /* the stream the buffers are used on */",
         f"static int {stream}_set;"),
        ("void* stream;  /* Note [Buffer reuse]: buffers stay on the stream that made them */",
         f"if (rt->cuda_stream({device}, &stream)) {{ rt->set_error(\"current stream\", "
         f"NULL); goto fail; }}",
         f"if (!{stream}_set) {{ {stream} = stream; {stream}_set = 1; }}",
         f"f->reuse = !env->inference_mode && stream == {stream};"))


def _pointer(r: Renderer, var: str, o: Arg | Val | Item, where: str) -> list[str]:
    """Statements that set ``CUdeviceptr var`` to a tensor operand's data pointer, for a
    kernel parameter."""
    if isinstance(o, Arg):
        return [f"CUdeviceptr {var} = (CUdeviceptr)a[{o.i}].data_ptr;"]
    if isinstance(o, Val) and o.i in r.views:  # Note [Views in C]: no tensor needed
        w = f"w[{r.views[o.i][0]}]"
        return [f"CUdeviceptr {var} = (CUdeviceptr)({w}.data + {w}.offset * {w}.itemsize);"]
    tensor = r.tensor(o)
    return [f"void* {var}_data;",
            f"if (rt->data_ptr({tensor}, &{var}_data)) {{ rt->set_error({c_string(where)}, "
            f"NULL); goto {r.on_error}; }}",
            f"CUdeviceptr {var} = (CUdeviceptr){var}_data;"]


def launch(r: Renderer, index: int, s: TritonStep) -> DriverLaunch:
    """A Triton launch of the step's cubin through the driver: one local per kernel parameter
    (Triton 3.6's: non-constexpr arguments, then the global and profile scratch pointers)."""
    launch, binary = s.launch, s.binary
    tensors = iter(s.args)
    name = r.kernels.add(launch.kernel, binary)
    statements: list[str] = []
    params = []
    for p, ctype in zip(launch.params, binary.arg_types):
        if isinstance(p, TensorParam):
            operand = next(tensors)
        if ctype is None:
            continue
        var = f"p{len(params)}"
        if isinstance(p, TensorParam):
            statements += _pointer(r, var, operand, f"{s.where} (triton {launch.kernel})")
            statements[-1] += f"  /* {p.name} */"
        elif isinstance(p, ScalarParam) and p.size is not None:
            # Note [Symbolic launches] in lower/kernels.py: computed from the call's sizes
            words = c_comment(sizes.words(p.size, r.spec.arg_names))
            statements.append(f"{ctype} {var} = ({ctype}){size_c(p.size)};  "
                              f"/* {p.name} = {words} */")
        elif ctype in _SCALARS:
            statements.append(f"{ctype} {var} = {int(p.value)};  /* {p.name} */")
        else:
            statements.append(f"{ctype} {var} = {c_float(float(p.value))};  "
                              f"/* {p.name} */")
        params.append(f"&{var}")
    statements.append("CUdeviceptr scratch[2] = {0, 0};  "
                      "/* Triton's global and profile scratch */")
    params += ["&scratch[0]", "&scratch[1]"]
    device = int(launch.device.split(":")[1]) if ":" in launch.device else 0
    return DriverLaunch(tuple(statements), tuple(params), name, device, tuple(r.grid(launch)))
