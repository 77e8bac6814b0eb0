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
    # the prefill: run once with no graph (Note [Writes probe] in frontend/tracing.py: its
    # writes), then traced with x's dim 1 symbolic (the stored keys' dim 1; their dim 2, 8,
    # is no size of x; x alone has that batch: none), with no exact trace; the decode step:
    # symbolic at once (the keys the prefill stored with a symbolic dim 1); every later
    # prompt length and step hits
    stats = jf.stats
    assert (stats.compiles, stats.traces, stats.fallbacks) == (2, 2, 0), stats.miss_reasons
    assert stats.hits == 4 * 3 - 2
    prefill, decode = jf.specializations
    assert "x: float32[2, ?, 4]" in prefill, prefill
    # (the batch with them: Note [Batch dims]; x's dim 1 of size 1 stays static)
    assert "cache.keys: float32[?, ?, 8]" in decode and "x: float32[?, 1, 4]" in decode, decode


@pytest.mark.parametrize("batch", [1, 2])
def test_a_one_token_first_call_stores_a_length(batch):
    """A cache of length 1 is a length too: the one-token first call is traced at exact
    sizes, then with x's dim 1 a symbol of range >= 1 (size-oblivious, as a batch of one:
    Note [Batch dims]); its decode step reads the keys' dim 1 symbolic from its first call
    (a length of 1, then 2...), so the longer prompts and their steps hit: 2 compiles, as a
    longer first prompt gives, not 4 (the one-token prefill and its decode step at exact
    sizes, the decode step again at the cache's next length, the longer prompts' prefill)."""
    layer = Layer()
    jf = trident.jit(layer)
    serve(layer, jf, [1, 5, 7, 1, 3], batch=batch)
    stats = jf.stats  # (the exact trace not run: Note [Writes probe])
    assert (stats.compiles, stats.traces, stats.fallbacks) == (2, 2, 0), stats.miss_reasons
    assert stats.hits == 5 * 3 - 2
    prefill, decode = jf.specializations
    assert f"x: float32[{batch}, ?, 4]" in prefill, prefill
    assert "cache.keys: float32[?, ?, 8]" in decode and "x: float32[?, 1, 4]" in decode, decode


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


class Branchy(Layer):
    """Doubles a one-token step's projection: code that branches on a length of one."""

    def forward(self, cache, x):
        k = self.proj(x)
        if x.shape[1] == 1:
            k = k * 2
        cache.keys = k if cache.keys is None else torch.cat([cache.keys, k], 1)
        return cache.keys.sum(1)


def test_a_branch_on_a_length_of_one_is_guarded():
    """The one-token first call's length is a symbol of range >= 1 with hint 1: the branch
    ``x.shape[1] == 1`` is a guard, so its specialization serves one token only (a prompt of
    two misses it); the keys it stored are lengths all the same (the exact trace's), so the
    decode step is symbolic from its first call; every call equal to eager's."""
    layer = Branchy()
    jf = trident.jit(layer)
    serve(layer, jf, [1, 2, 5, 1, 3])
    stats = jf.stats  # (the one-token call's exact trace not run: Note [Writes probe])
    assert (stats.compiles, stats.traces, stats.fallbacks) == (3, 3, 0), stats.miss_reasons
    assert "x.size(1) == 1 is false (x.size(1) = 2)" in stats.miss_reasons[2]
    one, decode, prefill = jf.specializations
    assert "cache.keys: float32[?, ?, 8]" in decode, decode
    assert "x: float32[2, ?, 4]" in prefill, prefill


class Attention(Layer):
    """transformers' SDPA integration in small: causal for a prompt of more than one token,
    ``q_length > 1 and ...``, which is a SymBool where the length is a symbol of hint 1."""

    causal = True

    def forward(self, cache, x):
        k = self.proj(x)
        cache.keys = k if cache.keys is None else torch.cat([cache.keys, k], 1)
        is_causal = x.shape[1] > 1 and self.causal
        return torch.nn.functional.scaled_dot_product_attention(
            k, cache.keys, cache.keys, is_causal=is_causal)


def test_a_length_of_one_that_cannot_be_traced_keeps_automatic_dynamic():
    """The one-token first call: traced at exact sizes, then with its length symbolic, which
    fails (SDPA's ``is_causal`` a SymBool); the exact trace is compiled, and the keys it stored
    are read back symbolic: the decode step compiles once for a cache of any length, 1
    included, and the longer prompts' prefill once, symbolic (automatic dynamic kept)."""
    layer = Attention()
    jf = trident.jit(layer)
    serve(layer, jf, [1, 5, 1, 3])
    stats = jf.stats
    assert (stats.compiles, stats.traces, stats.fallbacks) == (3, 4, 0), stats.miss_reasons
    one, decode, prefill = jf.specializations
    assert "?" not in one, one
    assert "cache.keys: float32[?, ?, 8]" in decode, decode
    assert "x: float32[2, ?, 4]" in prefill, prefill
