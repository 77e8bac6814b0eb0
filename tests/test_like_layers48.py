"""Note [Symbols of like layers] (trident/frontend/ints.py): in a symbolic trace, the dynamic
leaves at paths that differ only in the index of an attribute's items (``cache.layers[0].keys``,
``cache.layers[1].keys``), through objects of the same types, share one symbol per dim and
size; a call whose layers part misses on the equality and compiles, never runs the graph
traced for equal sizes. Values against eager with ``torch.equal``, exact counts.
"""

from __future__ import annotations

import torch

import trident


class Layer:
    def __init__(self, keys: torch.Tensor, capacity: int):
        self.keys = keys
        self.capacity = capacity


class Wide(Layer):  # another structure of layer
    pass


class Cache:
    def __init__(self, *layers):
        self.layers = list(layers)


def step(x, cache):
    """``x``: ``[n]``; each layer's keys ``[m]`` and capacity (an int): their sums."""
    out = x.sum()
    for layer in cache.layers:
        out = out + layer.keys.sum() * layer.capacity + layer.keys[:2].sum()
    return out


def cache(sizes, capacities, kinds=(Layer, Layer)):
    torch.manual_seed(sum(sizes))
    return Cache(*(kind(torch.randn(n), c) for kind, n, c in zip(kinds, sizes, capacities)))


def run(jf, x, sizes, capacities, kinds=(Layer, Layer)):
    c = cache(sizes, capacities, kinds)
    assert torch.equal(jf(x, c), step(x, c))


def test_layers_of_one_structure_share_their_symbols_and_guard_them_equal():
    jf = trident.jit(step)
    x = torch.randn(3)
    run(jf, x, (4, 4), (8, 8))
    run(jf, x, (5, 5), (9, 9))  # changed: the keys' dim 0 and the capacities symbolic, shared
    run(jf, x, (7, 7), (12, 12))  # hits
    assert (jf.stats.compiles, jf.stats.hits) == (2, 1), jf.stats
    # parted layers: the equality of the shared symbols fails; a compile, as eager's values
    run(jf, x, (6, 7), (12, 12))
    run(jf, x, (7, 7), (10, 11))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (4, 1, 0), jf.stats
    assert "layers[1]" in jf.explain(x, cache((6, 9), (12, 12)))


def test_layers_of_other_types_and_items_of_a_list_keep_symbols_of_their_own():
    jf = trident.jit(step)
    x = torch.randn(3)
    kinds = (Layer, Wide)
    run(jf, x, (4, 4), (8, 8), kinds)
    run(jf, x, (5, 5), (9, 9), kinds)
    run(jf, x, (6, 7), (12, 10), kinds)  # another type: no shared symbol, a hit
    assert (jf.stats.compiles, jf.stats.hits) == (2, 1), jf.stats

    def sums(xs):
        return xs[0].sum() + xs[1][:2].sum()

    jg = trident.jit(sums)
    for n, m in ((4, 4), (5, 5), (6, 7)):
        xs = [torch.randn(n), torch.randn(m)]
        assert torch.equal(jg(xs), sums(xs))
    assert (jg.stats.compiles, jg.stats.hits) == (2, 1), jg.stats
