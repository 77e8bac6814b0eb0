"""What a new user met in session 50 (user51): counts under threads, listings, the demo."""

from __future__ import annotations

import threading

import torch

import trident


def rms_gate(x, w, g, eps: float):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return torch.nn.functional.silu(h @ g.t()) * 0.5


def test_threads_that_waited_for_a_compile_are_hits():
    """Note [Miss counts] in frontend/policy.py: 8 threads make the same first call at once;
    one compiles, the 7 that waited for its compile (or came after it) run its specialization
    and are counted as hits, not misses: exactly 1 miss, 1 compile, 7 hits, every result
    eager's."""
    f = trident.jit(rms_gate)
    w, g = torch.randn(64), torch.randn(32, 64)
    xs = [torch.randn(4, 64) for _ in range(8)]
    start, equal = threading.Barrier(8), [None] * 8

    def job(i):
        start.wait()
        equal[i] = torch.equal(f(xs[i], w, g, 1e-6), rms_gate(xs[i], w, g, 1e-6))

    threads = [threading.Thread(target=job, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert equal == [True] * 8
    s = f.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (7, 1, 1, 0)
    assert s.miss_reasons == ["first call"]
