"""Note [Frozen heap] in trident/config.py: while a compile runs, the objects made before it are
kept out of the garbage collector's collections (``gc.freeze``), and put back after it; a
process that froze objects itself, or turned the collector off, is left as it was."""

from __future__ import annotations

import gc

import torch

import trident


def block(x, w):
    return torch.relu(x @ w) * 2


def _compile_watching_collections():
    """Compile ``block`` once; the frozen-object counts the collections during it saw."""
    seen: list[int] = []

    def watch(phase, info):
        if phase == "start":
            seen.append(gc.get_freeze_count())

    f = trident.jit(block)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gc.callbacks.append(watch)
    try:
        assert torch.equal(f(x, w), block(x, w))
    finally:
        gc.callbacks.remove(watch)
    assert (f.stats.compiles, f.stats.hits) == (1, 0)
    return seen


def test_a_compile_freezes_the_heap_and_puts_it_back(monkeypatch):
    # a process that froze nothing since Trident last looked (an earlier test of this worker
    # may have left objects frozen, as Python 3.12's start-up does: Note [Frozen heap])
    gc.unfreeze()
    monkeypatch.setattr(trident.config, "_freeze_count", gc.get_freeze_count())
    before = gc.get_freeze_count()
    objects = len(gc.get_objects())  # tracked by the collector, all frozen during the compile
    seen = _compile_watching_collections()
    assert seen and max(seen) >= objects  # (the compile's collections walked none of them)
    assert gc.get_freeze_count() <= before  # nothing the compile froze stays frozen
    assert gc.isenabled()


def test_objects_the_process_froze_stay_frozen():
    gc.freeze()  # a server after its start-up
    try:
        frozen = gc.get_freeze_count()
        seen = _compile_watching_collections()
        # no freeze of its own (the count only falls, as frozen objects are freed) and no
        # unfreeze (which empties it)
        assert seen and max(seen) <= frozen
        assert frozen // 2 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_disabled_collector_stays_disabled():
    before = gc.get_freeze_count()
    gc.disable()
    try:
        f = trident.jit(block)
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        assert torch.equal(f(x, w), block(x, w))
        assert f.stats.compiles == 1
        assert not gc.isenabled() and gc.get_freeze_count() == before
    finally:
        gc.enable()
