"""Cubins: a resolved Triton launch compiled for an NVIDIA GPU with ``triton.compile``, as
``JITFunction.run`` would compile it (triton 3.6's binder and specialization), without a GPU."""

from __future__ import annotations

import torch

from trident.errors import TridentError
from trident.ir.launch import CompiledBinary, ConstexprParam, TensorParam, TritonLaunch
from trident.lower.kernels import _constexpr


class _Pointer:
    """What Triton's binder reads from a tensor argument: its dtype and address alignment."""

    def __init__(self, dtype: torch.dtype, aligned: bool):
        self.dtype = dtype
        self._address = 16 if aligned else 8

    def data_ptr(self) -> int:
        return self._address


_C_TYPES = {"i1": "int8_t", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t",
            "i64": "int64_t", "u1": "uint8_t", "u8": "uint8_t", "u16": "uint16_t",
            "u32": "uint32_t", "u64": "uint64_t", "fp32": "float", "f32": "float",
            "fp64": "double"}


def compile_cuda(jit_fn, launch: TritonLaunch, capability: tuple[int, int]) -> CompiledBinary:
    """Compile a resolved launch for an NVIDIA GPU of ``capability`` with ``triton.compile``.

    Works without a GPU. Returns the cubin and what the launch needs: the kernel's symbol name,
    threads, dynamic shared memory, CTAs per cluster, and the C type of each runtime parameter
    (``None`` for a parameter Triton specialized away, e.g. an int equal to 1).

    Raises:
        TridentError: the kernel needs global scratch memory (not supported yet).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    values = []
    for p in launch.params:
        match p:
            case TensorParam(dtype=dtype, aligned=aligned):
                values.append(_Pointer(getattr(torch, dtype[len("torch."):]), aligned))
            case ConstexprParam(value=value):
                values.append(_constexpr(value, jit_fn))
            case _:
                values.append(p.value)
    kwargs = {k: v for k, v in launch.options.items() if v is not None}
    kwargs["debug"] = jit_fn.debug or False
    bound, specialization, options = binder(*values, **kwargs)
    options, signature, constexprs, attrs = jit_fn._pack_args(backend, kwargs, bound,
                                                              specialization, options)
    compiled = triton.compile(ASTSource(jit_fn, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    meta = compiled.metadata
    if meta.global_scratch_size > 0 or getattr(meta, "profile_scratch_size", 0) > 0:
        raise TridentError(f"{launch.kernel}: kernels that need global scratch memory are not "
                           "supported yet")
    arg_types = []
    for (kind, _), name in zip(specialization, signature):
        if kind == "constexpr":
            arg_types.append(None)
        elif kind.startswith("*"):
            arg_types.append("CUdeviceptr")
        elif kind in _C_TYPES:
            arg_types.append(_C_TYPES[kind])
        else:
            raise TridentError(f"{launch.kernel}: unsupported kernel parameter type {kind} "
                               f"for {name!r}")
    return CompiledBinary(
        cubin=bytes(compiled.asm["cubin"]),
        name=meta.name,
        threads=32 * meta.num_warps,
        shared=meta.shared,
        num_ctas=meta.num_ctas,
        arg_types=tuple(arg_types),
        cooperative=bool(getattr(meta, "launch_cooperative_grid", False)),
        pdl=bool(getattr(meta, "launch_pdl", False)),
        arch=f"sm_{target.arch}",
    )
