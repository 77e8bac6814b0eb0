"""Note [Writes probe] (trident/frontend/tracing.py): a first call that stores lengths in its
arguments' objects (a cache it fills) is run once with no graph to find its writes, then traced
symbolic, with no exact trace. The run is the function's like a trace's: what it would write
outside its arguments is refused before it lands (a library's state, the random state), a
warning it gives is not shown; so every call here equals eager's, in values and in the state
eager leaves, with exact counts. Each case's function fills a cache, so the probe runs first.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import WRITING_LIBRARY, counts, installed_package


class Cache:  # a layer's keys, None until the first call fills them
    def __init__(self):
        self.keys = None


def fill(cache, x):
    """The cache's keys grown by ``x`` (``[batch, n, 4]``): a length the call stores."""
    cache.keys = x if cache.keys is None else torch.cat([cache.keys, x], 1)
    return cache.keys.sum(1)


def test_a_call_that_fills_a_cache_is_probed_not_traced_exactly():
    """The prefill: one run with no graph (``writes probe``), one symbolic trace; the decode
    step symbolic at once: 2 traces (3 before: the prefill's exact trace first)."""
    before = trident.config.compile_times()["writes probe"]
    jf = trident.jit(fill)
    for length in (5, 7):
        ours, ref = Cache(), Cache()
        for n in (length, 1, 1):
            x = torch.randn(2, n, 4)
            assert torch.equal(jf(ours, x), fill(ref, x))
            assert torch.equal(ours.keys, ref.keys)
    s = jf.stats
    assert (s.compiles, s.traces, s.hits, s.fallbacks) == (2, 2, 4, 0), s.miss_reasons
    assert trident.config.compile_times()["writes probe"] > before


NAME = "trident_fakelib50"
_LIB = WRITING_LIBRARY  # (its count, memo and attribute)


@pytest.fixture
def lib(tmp_path):
    with installed_package(tmp_path, NAME, {"__init__": _LIB}) as module:
        yield module


@pytest.mark.parametrize("use", ["count", "memo", "attribute"])
def test_the_probe_writes_no_library_state(lib, use):
    """Note [Library code that writes its state]: the probe runs under the recording, which
    refuses the write before it lands, so each call runs eagerly and writes once (a probe run
    unrecorded wrote once more: the first result 2, not 1)."""
    step = getattr(lib, use)

    def f(cache, x):
        return step(fill(cache, x))

    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [jf(Cache(), torch.ones(1, 2, 4)) for _ in range(4)]
    assert [g.tolist() for g in got] == [[[float(n)] * 4] for n in (2, 4, 6, 8)]  # eager's
    assert counts(jf) == (0, 0, 4)
    assert sum("writes its own state" in str(w.message) for w in caught) == 1, \
        [str(w.message) for w in caught]


def test_the_probe_shows_no_warning_of_the_function():
    """Note [Warnings a trace gives]: a warning the function gives makes its calls eager; the
    probe's run shows none of its own, so the user sees one per call, as eager gives."""
    def f(cache, x):
        warnings.warn("filled")
        return fill(cache, x)

    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 4, 5):
            ours, ref = Cache(), Cache()
            x = torch.randn(1, n, 4)
            assert torch.equal(jf(ours, x), f(ref, x))
            assert torch.equal(ours.keys, ref.keys)
    assert [str(w.message) for w in caught].count("filled") == 6  # (3 of ours, 3 of eager's)
    assert counts(jf) == (0, 0, 3)


def test_the_probe_leaves_the_random_state_as_eager_does():
    """A call that fills a cache with random draws: the probe's run on fake tensors draws
    nothing from the generator, so every result and the generator's state after equal
    eager's."""
    def f(cache, x):
        return fill(cache, x + torch.rand_like(x))

    jf = trident.jit(f)
    for n in (3, 4, 1):
        x = torch.randn(2, n, 4)
        torch.manual_seed(n)
        ref_cache = Cache()
        ref = f(ref_cache, x)
        ref_state = torch.get_rng_state()
        torch.manual_seed(n)
        cache = Cache()
        assert torch.equal(jf(cache, x), ref)
        assert torch.equal(cache.keys, ref_cache.keys)
        assert torch.equal(torch.get_rng_state(), ref_state)
    s = jf.stats  # (one symbolic trace serves every prompt length: the draws are its ops)
    assert (s.compiles, s.traces, s.hits, s.fallbacks) == (1, 1, 2, 0), s.miss_reasons
