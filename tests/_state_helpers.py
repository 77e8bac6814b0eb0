"""Module state that test_state.py's functions read (not a test module itself): a config
constant, a helper in another module, a class attribute, a deep config, a Triton kernel's
``tl.constexpr`` global."""

import types

import triton
import triton.language as tl

SCALE = 2.0
CFG = types.SimpleNamespace(model=types.SimpleNamespace(attn=types.SimpleNamespace(scale=0.5)))
KERNEL_SCALE = tl.constexpr(2.0)


def act(x):
    return x * SCALE


class Knobs:
    factor = 1.0


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * KERNEL_SCALE, mask=mask)
