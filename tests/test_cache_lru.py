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


def fourth(x):
    return torch.relu(x) + 4


def test_an_entry_deleted_between_listing_and_reading_its_specializations(trident_cache,
                                                                         monkeypatch):
    """Issue 27's fault, in the window test_cache.py's processes do not reach: the entry
    goes after its spec files were listed, before they are read. The call compiles again
    (its result eager's), with the one warning that the entry was deleted meanwhile."""
    import pathlib
    import shutil
    import warnings

    x = torch.arange(-2.0, 2.0)
    assert torch.equal(trident.jit(fourth)(x), fourth(x))
    as_in_a_new_process()
    read = pathlib.Path.read_text

    def deleted_first(path, *args, **kwargs):
        if path.suffix == ".json" and path.parent.name == "specs":
            shutil.rmtree(path.parent.parent, ignore_errors=True)
        return read(path, *args, **kwargs)

    with warnings.catch_warnings(record=True) as caught, monkeypatch.context() as patch:
        warnings.simplefilter("always")
        patch.setattr(pathlib.Path, "read_text", deleted_first)
        again = trident.jit(fourth)
        assert torch.equal(again(x), fourth(x))  # (its first call loads the entry)
        patch.undo()
        assert torch.equal(again(x), fourth(x))
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1 and "was deleted while this process loaded it" in said[0], said
    assert (again.stats.compiles, again.stats.hits, again.stats.fallbacks) == (1, 1, 0)
    assert "fourth" in _cached()  # stored again


def fifth(x):
    return torch.relu(x) + 5


def test_a_bound_smaller_than_one_entry_through_the_backend(trident_cache, monkeypatch):
    """Issue 27's fault through ``torch.compile(backend="trident")``, as test_cache.py's
    processes through ``trident.jit``: the graph's entry is stored and stays, with one
    warning, and its calls hit."""
    import warnings

    monkeypatch.setattr(config, "CACHE_SIZE", 1)
    x = torch.arange(-2.0, 2.0)
    f = torch.compile(fifth, backend="trident")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(f(x), fifth(x)) and torch.equal(f(x), fifth(x))
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1 and "bound of 1 bytes" in said[0], said
    s = trident.backend_stats(f)
    assert (s.compiles, s.hits, s.fallbacks) == (1, 1, 0), s
    assert len(_cached()) == 1
