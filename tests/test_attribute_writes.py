"""Note [Attribute writes] (trident/lower/writes.py): an attribute a function sets on an object
its arguments reach is set again by every hit, as eager sets it; a write no specialization can
replay runs eagerly, with one warning."""

from __future__ import annotations

import warnings

import pytest
import torch

import trident


class Box:
    def __init__(self, n: int = 0):
        self.n = n
        self.t = torch.zeros(2)


def state(obj) -> list:
    """An object's attributes in order: name, exact type, value (tensors by value)."""
    return [(k, type(v), v.tolist() if isinstance(v, torch.Tensor) else v)
            for k, v in vars(obj).items()]


def run_both(fn, make, calls: int = 4):
    """``fn`` through trident.jit and eagerly on twin objects, call by call; returns the jit."""
    jf = trident.jit(fn)
    for i in range(calls):
        x = torch.arange(3.0) + i
        mine, theirs = make(), make()
        out = jf(x, mine)
        ref = fn(x, theirs)
        assert torch.equal(out, ref)
        assert state(mine) == state(theirs)
    return jf


def test_an_int_counter_is_written_back_and_symbolic_after_one_change():
    def step(x, b):
        b.n += x.shape[0]
        return x * b.n

    box = Box(5)
    jf = trident.jit(step)
    for i in range(5):
        x = torch.ones(3 + i % 2)
        ref_box = Box(box.n)
        ref = step(x, ref_box)
        assert torch.equal(jf(x, box), ref)
        assert type(box.n) is int and box.n == ref_box.n
    # n by value, then n a symbol and x's length symbolic (n + len(x) computed in C)
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (2, 0, 3), jf.stats


def test_new_attributes_are_added_in_eager_order_with_eager_types():
    def init(x, b):
        b.ready = True
        b.device = x.device
        b.size = x.shape[0]
        b.t = torch.zeros(x.shape[0], 4)
        b.scale = 0.5
        b.name = "box"
        return x + 1

    jf = run_both(init, Box)
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 3, 0), jf.stats


def test_a_tensor_written_twice_is_one_object_and_an_argument_stays_itself():
    def keep(x, b):
        y = x * 2
        b.a = y
        b.b = y
        b.x = x
        return y

    jf = trident.jit(keep)
    for _ in range(2):
        x, b = torch.randn(3), Box()
        out = jf(x, b)
        assert b.a is b.b and b.a is out and b.x is x
        assert torch.equal(b.a, x * 2)
    assert (jf.stats.compiles, jf.stats.hits) == (1, 1)


class Guarded(Box):
    def __setattr__(self, name, value):  # a class's own __setattr__ may do anything
        object.__setattr__(self, name, value)


def _as_list(x, b):
    b.items = [x.shape[0]]
    return x + 1


def _deleted(x, b):
    del b.n
    return x + 1


def _through_setattr(x, b):
    b.n = b.n + 1
    return x + 1


@pytest.mark.parametrize("fn, make, path", [
    (_as_list, Box, "b.items"), (_deleted, Box, "b.n"), (_through_setattr, Guarded, "b.n")])
def test_writes_no_specialization_replays_run_eagerly_with_one_warning(fn, make, path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jf = run_both(fn, make)
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1 and f"assigns to {path} " in said[0], said
    assert (jf.stats.compiles, jf.stats.fallbacks) == (0, 4), jf.stats


class Lazy:
    def __init__(self):
        self.keys = None


def fill_and_sum(x, cache):
    cache.keys = x * 2
    return cache.keys.sum()


def fill_and_return(x, cache):
    cache.keys = x * 2
    return x + 1, cache.keys


@pytest.mark.parametrize("fn, stored", [(fill_and_sum, {1}), (fill_and_return, {1})])
def test_stored_outputs_are_the_written_values(fn, stored):
    """``OutputRecipe.stored`` (Note [Stored outputs] in frontend/graphs.py): the flat outputs
    that a write stores into the caller's object, which a CUDA graph copies out from its first
    capture; a stored tensor that the result returns too is one flat output."""
    jf = trident.jit(fn)
    x = torch.arange(3.0)
    mine, theirs = Lazy(), Lazy()
    got, want = jf(x, mine), fn(x, theirs)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) if isinstance(got, tuple) \
        else torch.equal(got, want)
    assert torch.equal(mine.keys, theirs.keys)
    (spec,) = jf._specs
    assert set(spec.recipe.stored()) == stored
