"""Liger-Kernel models with dynamic dims on the GPU (skipped without CUDA): a growing-KV decode
loop keeps the compile count at most 3 over 512 steps, a prefill over changing sequence lengths
launches its kernels with sizes computed in C; every call equals eager."""

import pytest
import torch

import trident

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytest.importorskip("liger_kernel")


def test_liger_decode_loop_of_512_steps():
    """Each step's output and caches equal eager's on the same inputs (eager's caches feed the
    next step of both). Where they differ, eager must differ from itself on those inputs: at KV
    lengths above 288 a step's attention does not repeat bit for bit in eager on H100/H200
    (torch 2.11, cuDNN SDPA; docs/benchmarks.md, "Growing KV cache")."""
    from benchmarks import bench_gpu

    cfg = dict(D=256, H=4, KV=2, HD=64, I=512, L=2)
    weights, cos, sin = bench_gpu.growing_model(cfg)
    step = bench_gpu.make_growing_step(cfg)
    f = trident.jit(step)
    caches = bench_gpu.initial_caches(cfg, length=1)
    g = torch.Generator(device="cuda").manual_seed(1)
    unrepeatable = []
    with torch.no_grad():
        for i in range(512):
            h = torch.randn(1, 1, cfg["D"], device="cuda", dtype=torch.bfloat16, generator=g)
            got = f(h, cos, sin, *weights, *caches)
            want = step(h, cos, sin, *weights, *caches)
            if not all(torch.equal(a, b) for a, b in zip(got, want)):
                again = step(h, cos, sin, *weights, *caches)
                assert not all(torch.equal(a, b) for a, b in zip(again, want)), i
                unrepeatable.append(i)
            caches = list(want[1:])
    assert f.stats.compiles <= 3 and f.stats.fallbacks == 0, f.stats
    assert caches[0].shape[2] == 513 and len(unrepeatable) < 32, unrepeatable


def test_liger_prefill_over_sequence_lengths():
    """Note [Symbolic launches]: Liger's rms_norm, rope and swiglu launch with grids and row
    counts computed from the sequence length; one dynamic specialization per Triton
    specialization class of those ints serves every length, bit-equal to eager."""
    from liger_kernel.transformers import functional as liger

    D, H, HD = 256, 4, 64

    def prefill(x, w_norm, w_qk, w_gate, w_up, cos, sin):
        # F.linear on 2-D rows: on CUDA, torch 2.11's aten::linear of a 3-D input reads
        # numel() in C++, which a trace with a symbolic sequence length cannot do
        h = liger.liger_rms_norm(x, w_norm, 1e-6).view(-1, D)
        qk = torch.nn.functional.linear(h, w_qk).view(1, -1, 2 * H, HD)
        q, k = qk.transpose(1, 2).chunk(2, 1)
        q, k = liger.liger_rope(q.contiguous(), k.contiguous(), cos, sin)
        mlp = liger.liger_swiglu(torch.nn.functional.linear(h, w_gate),
                                 torch.nn.functional.linear(h, w_up))
        return q, k, mlp

    g = torch.Generator(device="cuda").manual_seed(4)

    def w(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.05).to(torch.bfloat16)

    weights = (torch.ones(D, device="cuda", dtype=torch.bfloat16), w(2 * H * HD, D), w(512, D),
               w(512, D))
    f = trident.jit(prefill)
    with torch.no_grad():
        for seq in (7, 9, 13, 17, 33, 40, 57):
            x = w(1, seq, D) * 20
            cos, sin = w(1, seq, HD) * 20, w(1, seq, HD) * 20
            got, want = f(x, *weights, cos, sin), prefill(x, *weights, cos, sin)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), seq
    assert f.stats.fallbacks == 0 and f.stats.compiles <= 4, f.stats
    assert any("?" in s for s in f.specializations)
