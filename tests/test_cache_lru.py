"""Note [Cache size]: eviction takes the least recently *used* function first, where a use is a
process loading the function's stored specializations as much as storing one (issue 27: a
bounded cache, least-recently-used eviction). A new ``trident.jit`` object after
``as_in_a_new_process`` stands for a new process that loads from disk."""

from __future__ import annotations

import torch

import trident
from trident import config
from _trident_helpers import as_in_a_new_process


def first(x):
    return torch.relu(x) + 1


def second(x):
    return torch.relu(x) + 2


def third(x):
    return torch.relu(x) + 3


def _cached() -> dict[str, int]:
    """Each cached function's name -> its bytes."""
    return {r["about"]["qualname"]: r["bytes"] for r in trident.list_cache()}


def test_a_function_loaded_again_outlives_one_stored_after_it(trident_cache, monkeypatch):
    x = torch.arange(-2.0, 2.0)
    for fn in (first, second):
        assert torch.equal(trident.jit(fn)(x), fn(x))
    as_in_a_new_process()
    again = trident.jit(first)  # loads first's entry: its last use is now, after second's
    assert torch.equal(again(x), first(x))
    assert (again.stats.compiles, again.stats.misses, again.stats.hits) == (0, 0, 1)  # from disk
    sizes = _cached()
    assert set(sizes) == {"first", "second"}
    monkeypatch.setattr(config, "CACHE_SIZE", int(2.5 * max(sizes.values())))  # two fit
    assert torch.equal(trident.jit(third)(x), third(x))
    assert set(_cached()) == {"first", "third"}  # second, the least recently used, went
