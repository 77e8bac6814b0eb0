"""Never stale (issue 28): files that libraries read for the function, ``functools.partial``
objects changed in place, and the miss reasons of issue 27. Every case compares each call with
eager (``torch.equal``) and counts hits, misses, compiles and fallbacks exactly."""

from __future__ import annotations

import configparser
import functools
import types
import warnings

import numpy as np
import pytest
import torch

import trident
from _trident_helpers import as_in_a_new_process


def _trident_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "trident" in str(w.message)]


# ---- Note [Files read by libraries] (lower/state/recording.py) -------------------------------

def _by_torch_load(path):
    def fn(x):
        return x * torch.load(path / "state.pt")["k"]
    return fn


def _by_configparser(path):
    def fn(x):
        cfg = configparser.ConfigParser()
        cfg.read(path / "model.ini")
        return x * float(cfg["model"]["k"])
    return fn


def _by_numpy(path):
    def fn(x):
        return x * float(np.loadtxt(path / "k.txt"))
    return fn


def _write(path, k: float) -> None:
    torch.save({"k": k}, path / "state.pt")
    (path / "model.ini").write_text(f"[model]\nk = {k}\n")
    (path / "k.txt").write_text(f"{k}\n")


@pytest.mark.parametrize("reader", [_by_torch_load, _by_configparser, _by_numpy],
                         ids=["torch.load", "configparser", "numpy.loadtxt"])
def test_a_file_a_library_reads_is_read_at_every_call(reader, tmp_path):
    """A file that library code opens for the function: its contents are no guard's, so the
    call runs eagerly and reads the file as edited, with one warning."""
    _write(tmp_path, 2.0)
    fn, x = reader(tmp_path), torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in (2.0, 2.0, 5.0, 7.0):
            _write(tmp_path, k)
            assert torch.equal(jf(x), fn(x)), k
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (0, 4, 0, 4), s
    said = _trident_warnings(caught)
    assert len(said) == 1 and "which opens a file" in said[0], said


# ---- Note [Partials in arguments] (frontend/tracing.py) --------------------------------------

def _mul(a, b):
    return a * b


def _add(a, b):
    return a + b


class _Holds(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = act

    def forward(self, x):
        return self.act(x)


_LIBRARY = functools.partial(torch.mul, other=2.0)
_PLACES = {  # how the function reaches a partial of the call: (fn, args of the partial)
    "a parameter": (lambda x, p: p(x), lambda x, p: (x, p)),
    "a default": (None, lambda x, p: (x,)),
    "an attribute of an argument": (lambda x, c: c.act(x),
                                    lambda x, p: (x, types.SimpleNamespace(act=p))),
    "a list item": (lambda x, fns: fns[0](x), lambda x, p: (x, [p])),
    "a module's attribute": (lambda m, x: m(x), lambda x, p: (_Holds(p), x)),
}


@pytest.mark.parametrize("change", ["__setstate__", "keywords in place"])
@pytest.mark.parametrize("library", [False, True], ids=["user function", "torch.mul"])
@pytest.mark.parametrize("place", sorted(_PLACES))
def test_a_partial_of_the_call_changed_in_place_is_seen(place, library, change):
    """``partial.__setstate__`` replaces the function, arguments and keywords of the same
    object; its keywords dict can be written in place. A partial the call's tree holds is
    also a state read of its own (Note [Partials in arguments] in frontend/tracing.py): the
    change recompiles. One of a user function, where Note [Callable arguments] finds it
    (not in a SimpleNamespace), runs eagerly, with one warning."""
    part = functools.partial(torch.mul, other=2.0) if library else functools.partial(_mul, b=2.0)
    fn, args = _PLACES[place]
    if fn is None:
        def fn(x, p=part):
            return p(x)
    x = torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            if i == 2 and change == "__setstate__":
                part.__setstate__((torch.add, (), {"other": 3.0}, None) if library else
                                  (_add, (), {"b": 3.0}, None))
            elif i == 2:
                part.keywords["other" if library else "b"] = 5.0
            assert torch.equal(jf(*args(x, part)), fn(*args(x, part))), i
    s = jf.stats
    said = _trident_warnings(caught)
    if not library and place != "an attribute of an argument":
        assert (s.hits, s.misses, s.compiles, s.fallbacks) == (0, 4, 0, 4), s
        assert len(said) == 1 and "functools.partial passed as an argument" in said[0], said
    else:
        assert (s.hits, s.misses, s.compiles, s.fallbacks) == (2, 2, 2, 0), s
        assert not said, said


GLOBAL_PARTIAL = functools.partial(_mul, b=2.0)


class _Cfg:
    act = functools.partial(_mul, b=2.0)


def _reads_global(x):
    return GLOBAL_PARTIAL(x)


def _reads_class(x):
    return _Cfg.act(x)


@pytest.mark.parametrize("fn, part", [(_reads_global, GLOBAL_PARTIAL),
                                      (_reads_class, _Cfg.__dict__["act"])],
                         ids=["a global", "a class attribute"])
def test_a_partial_of_the_state_changed_by_setstate_recompiles(fn, part):
    """A partial that the function reads from a global or a class: its ``func``, ``args``
    and ``keywords`` are chains (state/tree.py), read at every call: ``__setstate__`` is
    seen, and setting the first state back reinstalls the first specialization."""
    x, first = torch.ones(3), part.__reduce__()[2]
    jf = trident.jit(fn)
    try:
        for state in (None, None, (_add, (), {"b": 3.0}, None), None, first):
            if state is not None:
                part.__setstate__(state)
            assert torch.equal(jf(x), fn(x))
    finally:
        part.__setstate__(first)
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (3, 2, 2, 0), s


# ---- Note [Identity serials] (identity.py) ---------------------------------------------------

def test_an_object_known_by_its_identity_is_named_by_a_serial_not_its_address():
    """A global with nothing to hash but its identity (a lock, whose repr shows its address)
    was named by its address in the function's key: the next lock at a dead one's address
    took its key. A serial number is never reused."""
    import threading

    from trident import identity

    space: dict = {}
    exec("def uses_lock(x):\n    return x if LOCK else x", space)
    fn = space["uses_lock"]
    keys, addresses = set(), set()
    for _ in range(50):
        space["LOCK"] = threading.Lock()  # the one before dies: its address is free again
        addresses.add(id(space["LOCK"]))
        keys.add(identity.function_key(fn))
        assert identity.function_key(fn) == identity.function_key(fn)
    # 50 keys whatever the addresses: where the allocator gives a dead lock's block to the next
    # (CPython 3.11 on the CPU machine: fewer than 50 addresses), naming by address repeated keys
    assert len(keys) == 50, (len(addresses), len(keys))
    held = object()  # (takes no weak reference: held by the table while it names it)
    assert identity.identity_words(held) == identity.identity_words(held) != \
        identity.identity_words(object())


# ---- miss reasons (issue 27) -----------------------------------------------------------------

class _Cache:
    def __init__(self, n):
        self.n = n


def _scaled(x, c):
    return x * c.n


def test_a_new_processs_miss_names_the_int_that_differs():
    """Note [Stored int constants] (policy.py): a new process's call whose tree differs from
    a stored specialization's only in an int names the int and both values, as a miss of the
    process that compiled it does."""
    x = torch.ones(3)
    first = trident.jit(_scaled)
    assert torch.equal(first(x, _Cache(2)), _scaled(x, _Cache(2)))
    as_in_a_new_process()
    jf = trident.jit(_scaled)
    assert torch.equal(jf(x, _Cache(3)), _scaled(x, _Cache(3)))
    assert torch.equal(jf(x, _Cache(2)), _scaled(x, _Cache(2)))  # the stored one
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (1, 1, 1, 0), s
    assert s.miss_reasons == ["c.n: int 3 where int 2 was compiled (specialization 0)"], s


class _Knobs:
    factor = 2.0


def _knobbed(x):
    return x * _Knobs.factor


def test_stored_specializations_the_state_turns_away_are_named_only_if_another_process_made_them():
    """In-process, the specializations a state change sets aside are this process's own:
    the reason names the change alone; a new process names those the state turned away."""
    x = torch.ones(3)
    jf = trident.jit(_knobbed)
    try:
        assert torch.equal(jf(x), _knobbed(x))
        _Knobs.factor = 3.0
        assert torch.equal(jf(x), _knobbed(x))
        _Knobs.factor = 4.0
        assert torch.equal(jf(x), _knobbed(x))
        assert jf.stats.miss_reasons == ["first call"] + [
            "_Knobs.factor changed since the last call"] * 2, jf.stats
        as_in_a_new_process()
        _Knobs.factor = 5.0
        again = trident.jit(_knobbed)
        assert torch.equal(again(x), _knobbed(x))
        assert again.stats.miss_reasons == [
            "first call; 3 specialization(s) that another process stored not installed: the "
            "state they read differs from this process's"], again.stats
    finally:
        _Knobs.factor = 2.0
