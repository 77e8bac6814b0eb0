"""CUDA tensors through the native hit path (run on the GPU machine; skipped without CUDA)."""

import sys

import pytest
import torch

import trident

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def block(x, w1, w2, eps: float):
    h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
    a = torch.nn.functional.silu(h @ w1)
    return torch.nn.functional.linear(a, w2) + x, h


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_values_equal_eager(dtype):
    f = trident.jit(block)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 256, device="cuda", dtype=dtype, generator=g)
    w1 = torch.randn(256, 512, device="cuda", dtype=dtype, generator=g) / 16
    w2 = torch.randn(256, 512, device="cuda", dtype=dtype, generator=g) / 16
    for _ in range(3):
        got, want = f(x, w1, w2, 1e-6), block(x, w1, w2, 1e-6)
        for a, b in zip(got, want):
            assert a.device == b.device and a.dtype == b.dtype
            assert torch.equal(a, b)
    assert (f.stats.misses, f.stats.compiles, f.stats.hits) == (1, 1, 2)


def test_cuda_hit_path_runs_no_python_and_uses_current_stream():
    f = trident.jit(block)
    x = torch.randn(2, 64, device="cuda")
    w1, w2 = torch.randn(64, 128, device="cuda"), torch.randn(64, 128, device="cuda")
    f(x, w1, w2, 1e-5)
    f(x, w1, w2, 1e-5)  # captures the CUDA graph that the hits below replay
    assert f.stats.graph_captures == 1
    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame) if event == "call" else None)
    try:
        for _ in range(1000):
            f(x, w1, w2, 1e-5)
    finally:
        sys.setprofile(None)
    assert calls == []
    assert f.stats.graph_replays == 1001
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = f(x, w1, w2, 1e-5)
    stream.synchronize()
    assert torch.equal(out[0], block(x, w1, w2, 1e-5)[0])


def test_cpu_and_cuda_are_separate_specializations():
    f = trident.jit(block)
    x = torch.randn(3, 32)
    w1, w2 = torch.randn(32, 48), torch.randn(32, 48)
    f(x, w1, w2, 1e-5)
    f(x.cuda(), w1.cuda(), w2.cuda(), 1e-5)
    assert f.stats.compiles == 2
    assert "device" in f.stats.miss_reasons[-1]
    out = f(x.cuda(), w1.cuda(), w2.cuda(), 1e-5)
    assert out[0].is_cuda and torch.equal(out[0], block(x.cuda(), w1.cuda(), w2.cuda(), 1e-5)[0])
