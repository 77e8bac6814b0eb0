"""A growing-KV decode loop of Liger-Kernel kernels on the GPU (skipped without CUDA): dynamic
dims keep the compile count at most 3 over 512 steps, and every step equals eager."""

import pytest
import torch

import trident

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytest.importorskip("liger_kernel")


def test_liger_decode_loop_of_512_steps():
    from trident import bench_gpu

    cfg = dict(D=256, H=4, KV=2, HD=64, I=512, L=2)
    weights, cos, sin = bench_gpu.growing_model(cfg)
    step = bench_gpu.make_growing_step(cfg)
    f = trident.jit(step)
    caches = bench_gpu.initial_caches(cfg, length=1)
    ref_caches = list(caches)
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for i in range(512):
            h = torch.randn(1, 1, cfg["D"], device="cuda", dtype=torch.bfloat16, generator=g)
            out, *caches = f(h, cos, sin, *weights, *caches)
            want, *ref_caches = step(h, cos, sin, *weights, *ref_caches)
            assert torch.equal(out, want), i
            assert all(torch.equal(a, b) for a, b in zip(caches, ref_caches)), i
    assert f.stats.compiles <= 3 and f.stats.fallbacks == 0, f.stats
    assert caches[0].shape[2] == 513
