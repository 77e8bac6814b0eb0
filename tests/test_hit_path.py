"""The hit path runs no Python and leaks nothing (Note [Hit path] in runtime.cpp)."""

from __future__ import annotations

import gc
import os
import sys
import warnings
import tracemalloc
import weakref

import pytest
import torch
import torch.nn.functional as F

import trident
from _trident_helpers import python_calls


def block(x, w1, b1, w2, eps, flag, none):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    a = F.linear(torch.relu(h @ w1 + b1), w2)
    return (a + x, [h[:, :2], None], flag, 3, eps) if flag else a


def block_args():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(4, 16, generator=gen), torch.randn(16, 32, generator=gen),
            torch.randn(32, generator=gen), torch.randn(16, 32, generator=gen), 1e-6, True, None)


@pytest.mark.parametrize("case", ["block", "identity", "views", "inplace", "scalars"])
def test_hits_run_no_python_frames(case):
    def identity(x, y):
        return x

    def views(x):
        return x.t(), x[1:], x.split(1)

    def inplace(x, out):
        out.copy_(x + 1)

    def scalars(x, n, f, b):
        return x * n + f if b else x

    x = torch.randn(3, 4)
    fn, args = {
        "block": (block, block_args()),
        "identity": (identity, (x, torch.ones(2))),
        "views": (views, (x,)),
        "inplace": (inplace, (x, torch.empty(3, 4))),
        "scalars": (scalars, (x, 3, -0.5, True)),
    }[case]
    jf = trident.jit(fn)
    jf(*args)  # miss: compile
    hits0 = jf.stats.hits
    assert python_calls(jf, args, 1000) == []
    assert jf.stats.hits - hits0 == 1000
    assert jf.stats.compiles == 1 and jf.stats.fallbacks == 0


def test_profiler_does_see_python_on_a_miss():
    """The probe itself works: a miss does enter Python (trident's slow path)."""
    jf = trident.jit(lambda x: x + 1)
    events = python_calls(jf, (torch.ones(2),), 1)
    assert any("policy.py" in e for e in events)  # _slow_path


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_many_hits_do_not_grow_rss():
    # every call allocates ~64 KiB of intermediates and a 16 KiB output: a leak of any handle
    # shows up as hundreds of MiB over 20000 calls
    def f(x, w):
        y = torch.relu(x * 2 + 1)
        z = y.sum(0, keepdim=True) + w
        return z, y[0], [x], 1.5

    x = torch.randn(4, 4096)
    w = torch.randn(1, 4096)
    jf = trident.jit(f)
    for _ in range(2000):  # warm up allocator caches
        jf(x, w)
    gc.collect()
    start = _rss_bytes()
    limit = 40 * 2**20
    for i in range(10):
        for _ in range(2000):
            jf(x, w)
        grown = _rss_bytes() - start
        assert grown < limit, f"RSS grew {grown / 2**20:.1f} MiB after {(i + 1) * 2000} hits"
    assert jf.stats.hits == 22000 - 1 and jf.stats.misses == 1


def test_many_hits_do_not_grow_python_memory():
    def f(x, n, s):
        return (x + n, [None, n, s, True], (x,)), x[0]

    jf = trident.jit(f)
    x = torch.randn(8)
    for _ in range(1000):
        jf(x, 2, 0.5)
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(20000):
            jf(x, 2, 0.5)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 64 * 1024, f"Python heap grew {after - before} bytes over 20000 hits"


def test_hits_keep_reference_counts_balanced():
    def f(x, y):
        return x, y + 1, x.t(), None

    jf = trident.jit(f)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    jf(x, y)
    rx, ry = sys.getrefcount(x), sys.getrefcount(y)
    for _ in range(1000):
        out = jf(x, y)
    # (computed outside `assert`: pytest's assertion rewriting holds extra references)
    item_refs, tuple_refs = sys.getrefcount(out[1]), sys.getrefcount(out)
    assert item_refs == 2  # the tuple + getrefcount's argument
    assert tuple_refs == 2  # `out` + getrefcount's argument
    del out
    after = sys.getrefcount(x), sys.getrefcount(y)
    assert after == (rx, ry)


def test_inputs_and_outputs_are_freed_after_hits():
    def f(x):
        return x[1:], x * 2, x

    jf = trident.jit(f)
    jf(torch.randn(5))
    x = torch.randn(5)
    outs = [jf(x) for _ in range(100)]
    assert all(o[2] is x for o in outs)
    refs = [weakref.ref(x)] + [weakref.ref(t) for o in outs for t in o[:2]]
    del x, outs
    gc.collect()
    # a handle the runtime forgot to release would keep the TensorImpl, and with it the
    # Python object, alive
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("after_a_write", [False, True], ids=["reruns-eagerly", "raises"])
def test_errors_on_the_hit_path_do_not_leak(after_a_write):
    """A step that fails releases what the steps before it made (a 256 KiB intermediate here),
    whether the call then runs again eagerly (nothing visible happened yet: eager's IndexError)
    or raises from the launch sequence (after a write to an argument: a TridentIndexError)."""
    def f(x, i, calls):
        if after_a_write:
            calls.add_(1)
        y = x * 2
        return y[i] + 1

    jf = trident.jit(f)
    x, calls = torch.randn(64, 1024), torch.zeros(())
    good, bad = torch.tensor([1]), torch.tensor([99])
    jf(x, good, calls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rerun's warning, once
        for _ in range(20):
            with pytest.raises(IndexError) as error:
                jf(x, bad, calls)
            assert isinstance(error.value, trident.TridentError) == after_a_write
        gc.collect()
        rx = sys.getrefcount(x)
        start = _rss_bytes()
        for _ in range(300):  # (each error formats a C++ backtrace: slow-ish)
            try:
                jf(x, bad, calls)
            except IndexError:
                pass
    gc.collect()
    after = sys.getrefcount(x)
    assert after == rx
    grown = _rss_bytes() - start
    assert grown < 32 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over 300 failing calls"
    assert torch.equal(jf(x, good, calls), f(x, good, calls))  # still serves hits
    assert jf.stats.compiles == 1


def test_concurrent_hits_from_threads_are_correct():
    import threading

    def f(x, y):
        return torch.relu(x @ y) + 1, x[0]

    jf = trident.jit(f)
    gen = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(4, 8, generator=gen), torch.randn(8, 4, generator=gen))
              for _ in range(4)]
    jf(*inputs[0])
    errors = []

    def worker(x, y):
        want = f(x, y)
        try:
            for _ in range(300):
                got = jf(x, y)
                if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                    errors.append("mismatch")
                    return
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=a) for a in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert jf.stats.hits == 1200 and jf.stats.compiles == 1


def test_hit_profile_keeps_the_result():
    """``_hit_profile(args, kwargs, n, thread, keep=True)`` (benchmarks: a decode step timed
    inside ``generate``) returns the parts and the last call's result, a hit's as eager's."""
    jf = trident.jit(block)
    args = block_args()
    jf(*args)
    jf(*args)
    parts, out = jf._hit_profile(args, None, 3, False, True)
    assert parts["hits"] == 3 and parts["argument tree"] >= 0
    expect = block(*args)
    assert torch.equal(out[0], expect[0]) and torch.equal(out[1][0], expect[1][0])
    assert out[2:] == expect[2:]
    assert isinstance(jf._hit_profile(args, None, 1), dict)
