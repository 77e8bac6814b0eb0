"""Note [Lengths of written state] (trident/frontend/ints.py): a first compile whose trace stores
tensors of new sizes into its arguments' objects (a cache it fills) is traced again with those
lengths symbolic; what a specialization stores symbolic is read back symbolic. Values against
eager with ``torch.equal``, exact compile and trace counts.
"""

from __future__ import annotations

import pytest
import torch

import trident
from trident.errors import TridentError


class Cache:  # a plain object: a layer's keys, None until the first step fills them
    def __init__(self):
        self.keys = None


class Buffer:  # a buffer of fixed shape, rewritten at every call
    def __init__(self):
        self.last = torch.zeros(2, 5, 4)


class Layer(torch.nn.Module):
    """A step over a sequence: stores its projection of ``x`` (``[batch, n, 4]``) after what
    the cache holds (``[batch, length, 8]``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(4, 8).requires_grad_(False)  # (inference)

    def forward(self, cache, x):
        k = self.proj(x)
        cache.keys = k if cache.keys is None else torch.cat([cache.keys, k], 1)
        return cache.keys.sum(1)


def serve(layer, fn, lengths, new=2, batch=2):
    """A ``generate`` per prompt length: a fresh cache, the prompt, ``new`` one-token steps;
    every result and the cache compared with eager's (``layer``)."""
    for length in lengths:
        torch.manual_seed(length)
        ours, ref = Cache(), Cache()
        for n in [length] + [1] * new:
            x = torch.randn(batch, n, 4)
            assert torch.equal(fn(ours, x), layer(ref, x))
            assert torch.equal(ours.keys, ref.keys)


def test_a_function_that_fills_its_cache_compiles_its_first_call_symbolic():
    layer = Layer()
    jf = trident.jit(layer)
    serve(layer, jf, [5, 7, 3, 6])
    # the prefill: traced at exact sizes, then with x's dim 1 symbolic (the stored keys' dim
    # 1; their dim 2, 8, is no size of x; x alone has that batch: none); the decode step: symbolic at once (the keys the
    # prefill stored with a symbolic dim 1); every later prompt length and step hits
    stats = jf.stats
    assert (stats.compiles, stats.traces, stats.fallbacks) == (2, 3, 0), stats.miss_reasons
    assert stats.hits == 4 * 3 - 2
    prefill, decode = jf.specializations
    assert "x: float32[2, ?, 4]" in prefill, prefill
    # (the batch with them: Note [Batch dims]; x's dim 1 of size 1 stays static)
    assert "cache.keys: float32[?, ?, 8]" in decode and "x: float32[?, 1, 4]" in decode, decode


def test_a_one_token_first_call_stores_no_length():
    """A cache of length 1 is no length (sizes 1 stay static): the first call compiles at
    exact sizes, one trace, as automatic dynamic does."""
    layer = Layer()
    jf = trident.jit(layer)
    x = torch.randn(2, 1, 4)
    assert torch.equal(jf(Cache(), x), layer(Cache(), x))
    assert (jf.stats.compiles, jf.stats.traces) == (1, 1)
    assert "?" not in jf.specializations[0]


def test_a_buffer_rewritten_at_its_shape_keeps_automatic_dynamic():
    def rewrite(buf, x):
        buf.last = x + 1
        return x * 3

    jf = trident.jit(rewrite)
    ours, ref = Buffer(), Buffer()
    x = torch.randn(2, 5, 4)
    assert torch.equal(jf(ours, x), rewrite(ref, x))
    assert torch.equal(ours.last, ref.last)
    assert (jf.stats.compiles, jf.stats.traces) == (1, 1)  # exact, one trace


def test_a_symbolic_trace_that_fails_keeps_the_exact_one(monkeypatch):
    """The symbolic trace's compile fails: the exact trace is compiled (no second exact trace),
    and automatic dynamic specializes on the sizes from then on."""
    from trident.lower import compiler

    compile_specialization = compiler.compile_specialization

    def refuse_symbolic(captured, args, names, dynamic, *rest):
        if dynamic:
            raise TridentError("a symbolic size this test refuses")
        return compile_specialization(captured, args, names, dynamic, *rest)

    monkeypatch.setattr(compiler, "compile_specialization", refuse_symbolic)
    layer = Layer()
    jf = trident.jit(layer)
    x = torch.randn(2, 5, 4)
    ours, ref = Cache(), Cache()
    assert torch.equal(jf(ours, x), layer(ref, x))
    assert torch.equal(ours.keys, ref.keys)
    assert (jf.stats.compiles, jf.stats.traces, jf.stats.fallbacks) == (1, 2, 0)
    assert "?" not in jf.specializations[0]
    x = torch.randn(2, 6, 4)  # another length: exact again (automatic gave up)
    assert torch.equal(jf(Cache(), x), layer(Cache(), x))
    assert (jf.stats.compiles, jf.stats.traces, jf.stats.fallbacks) == (2, 3, 0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_asked_dynamic_modes_are_not_changed(dynamic):
    """``dynamic=False`` specializes on every size; ``dynamic=True`` is symbolic at once: one
    trace each."""
    layer = Layer()
    jf = trident.jit(layer, dynamic=dynamic)
    x = torch.randn(2, 5, 4)
    assert torch.equal(jf(Cache(), x), layer(Cache(), x))
    assert (jf.stats.compiles, jf.stats.traces) == (1, 1)
