"""Issue 28, session 46: reads through objects that no constant step names (items reached by a
loop, a comprehension, a key computed at run time; a helper or a method run on several
objects), and writes to what a library function returns. Every call is compared with eager
(``torch.equal``), with exact compile, hit and fallback counts, and the one warning where calls
run eagerly."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, said


# ---- Note [Items reached by iteration] (lower/state/instances.py) -------------------------------
# ``for l in cache.layers: x = x * l.K`` reads ``K`` of an object no constant step names: the
# class attribute changed (or the class gained a property) and every hit returned the trace's
# value. Each kind of loop and computed key, with the container an argument's, a global's and a
# closure's.

class _Base46:
    K = 2.0


class _Layer46(_Base46):
    def __init__(self):
        self.w = torch.ones(3)
        self.heads = [_Head46(), _Head46()]


class _Other46(_Base46):
    K = 3.0

    def __init__(self):
        self.w = torch.ones(3)
        self.heads = [_Head46()]


class _Head46:
    H = 1.5


class _Cache46:
    def __init__(self):
        self.layers = [_Layer46(), _Other46(), _Layer46()]
        self.by_name = {"a": self.layers[0], "b": self.layers[1]}
        self.more = (_Other46(), _Layer46(), _Layer46())
        self.pairs = [(0, self.layers[0]), (1, self.layers[1])]
        self.kinds = (_Layer46, _Other46)


LAYERS46 = [_Layer46(), _Other46()]

_LOOPS = {
    "for": "for l in cache.layers:\n        x = x * l.K",
    "enumerate": "for i, l in enumerate(cache.layers):\n        x = x * l.K + i",
    "items": "for k, l in cache.by_name.items():\n        x = x * l.K",
    "values": "for l in cache.by_name.values():\n        x = x * l.K",
    "zip": "for a, b in zip(cache.layers, cache.more):\n        x = x * b.K",
    "reversed": "for l in reversed(cache.layers):\n        x = x * l.K",
    "a slice": "for l in cache.layers[:2]:\n        x = x * l.K",
    "a computed index": "for i in range(len(cache.layers)):\n        x = x * cache.layers[i].K",
    "a generator expression": "x = x * sum(l.K for l in cache.layers)",
    "a list comprehension": "x = x * [l.K for l in cache.layers][1]",
    "a dict comprehension": "x = x * {k: l.K for k, l in cache.by_name.items()}['b']",
    "a comprehension over pairs": "x = x * [b.K for a, b in cache.pairs][1]",
    "enumerate in a generator": "x = x * sum(l.K for i, l in enumerate(cache.layers))",
    "zip in a comprehension": "x = x * [b.K for a, b in zip(cache.layers, cache.more)][0]",
    "a loop over classes": "for C in cache.kinds:\n        x = x * C.K",
    "nested loops": "for l in cache.layers:\n        for h in l.heads:\n"
                    "            x = x * h.H",
    "getattr of the item": "for l in cache.layers:\n        x = x * getattr(l, 'K')",
    "an alias of the container": "ls = cache.layers\n    for l in ls:\n        x = x * l.K",
    "next of iter": "x = x * next(iter(cache.layers[1:])).K",
    "unpacking": "a, b, c = cache.layers\n    x = x * b.K",
    "pairs unpacked": "for i, b in cache.pairs:\n        x = x * b.K",
    "an item of a copy": "x = x * list(cache.layers)[1].K",
    "a global list": "for l in LAYERS46:\n        x = x * l.K",
    "a closure's tuple": "for l in captured:\n        x = x * l.K",
}
_CHANGES = {
    "the class attribute": lambda: (_Other46, "K", 5.0),
    "the base's attribute": lambda: (_Base46, "K", 7.0),
    "a property on the class": lambda: (_Layer46, "K", property(lambda self: 11.0)),
    "a nested item's class": lambda: (_Head46, "H", 4.0),
}


def _make(loop: str):
    g = {"torch": torch, "LAYERS46": LAYERS46}
    exec(f"def make(captured):\n    def f(cache, x):\n        "
         f"{_LOOPS[loop].replace(chr(10), chr(10) + '    ')}\n        return x\n    return f\n", g)
    return g["make"](tuple(LAYERS46))


_SOME = ("for", "zip", "a computed index", "a generator expression", "a global list")
_CASES = [(loop, "the class attribute") for loop in _LOOPS if loop != "nested loops"] + \
    [(loop, change) for loop in _SOME for change in ("the base's attribute",
                                                     "a property on the class")] + \
    [("nested loops", "a nested item's class")]


@pytest.mark.parametrize("loop, change", _CASES, ids=[f"{a}-{b}" for a, b in _CASES])
def test_a_class_read_through_an_item_is_seen(loop, change):
    fn = _make(loop)
    jf, cache, x = trident.jit(fn), _Cache46(), torch.ones(3)
    cls, name, value = _CHANGES[change]()
    old = vars(cls).get(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert torch.equal(jf(cache, x), fn(cache, x))
        setattr(cls, name, value)
        try:
            for _ in range(2):
                assert torch.equal(jf(cache, x), fn(cache, x)), jf.stats.miss_reasons
        finally:
            if old is None:
                delattr(cls, name)
            else:
                setattr(cls, name, old)
    assert not said(caught, "trident"), said(caught, "trident")
    assert counts(jf) == (2, 2, 0) and "changed" in jf.stats.miss_reasons[1], \
        jf.stats.miss_reasons


def test_an_item_whose_class_the_container_changes_is_seen():
    """An item replaced by one of another class: the container's own check (its argument
    tree) sees it; the new item's class is read then."""
    def f(cache, x):
        for l in cache.layers:
            x = x * l.K
        return x

    jf, cache, x = trident.jit(f), _Cache46(), torch.ones(3)
    for k in range(4):
        if k == 2:
            cache.layers[0] = _Other46()
        assert torch.equal(jf(cache, x), f(cache, x))
    assert counts(jf) == (2, 2, 0), jf.stats.miss_reasons


class _Iterable46:
    def __init__(self):
        self._items = [_Layer46(), _Other46()]

    def __iter__(self):
        return iter(self._items)


def test_items_trident_cannot_list_run_eagerly():
    """A user class's ``__iter__``: its items are no chain's, and an attribute of them is
    read: the call runs eagerly, with one warning."""
    def f(box, x):
        for l in box:
            x = x * l.K
        return x

    jf, box, x = trident.jit(f), _Iterable46(), torch.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for k in range(3):
                if k == 2:
                    _Other46.K = 9.0
                assert torch.equal(jf(box, x), f(box, x))
        finally:
            _Other46.K = 3.0
    assert counts(jf) == (0, 0, 3), jf.stats
    assert len(said(caught, "cannot list")) == 1, said(caught, "trident")


def test_items_of_tensors_stay_served():
    """A loop over a list of tensors reads no class's state: served, no warning."""
    def f(xs, x):
        for t in xs:
            x = x + t * t.shape[0]
        return x + sum(t.sum() for t in xs)

    jf, x = trident.jit(f), torch.ones(3)
    xs = [torch.ones(3), torch.full((3,), 2.0)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(jf(xs, x), f(xs, x))
    assert not said(caught, "trident") and counts(jf) == (1, 2, 0), jf.stats


# ---- Note [Calls of the same code] (lower/state/recording.py) ----------------------------------
# A helper (or a method that a base class defines) run on several objects of different classes
# read each one's class: its parameters were those of its first call only, so the other
# objects' classes were not read.

def _gain46(l):
    return l.K


class _Scaled46(torch.nn.Module):
    K = 2.0

    def forward(self, x):
        return x * self.K


class _ScaledA46(_Scaled46):
    pass


class _ScaledB46(_Scaled46):
    K = 3.0


_HELPERS = {
    "a helper per item": lambda: (lambda cache, x: x * _gain46(cache.layers[0]) *
                                  _gain46(cache.layers[1]), _Cache46(), _Other46, "K"),
    "map with a lambda": lambda: (lambda cache, x: x * sum(map(lambda l: l.K, cache.layers)),
                                  _Cache46(), _Other46, "K"),
    "a base's method": lambda: (lambda mods, x: mods[1](mods[0](x)),
                                torch.nn.ModuleList([_ScaledA46(), _ScaledB46()]),
                                _ScaledB46, "K"),
}


@pytest.mark.parametrize("kind", list(_HELPERS), ids=list(_HELPERS))
def test_the_same_code_run_on_objects_of_several_classes(kind):
    fn, arg, cls, name = _HELPERS[kind]()
    jf, x = trident.jit(fn), torch.ones(3)
    old = vars(cls)[name]
    try:
        for k in range(4):
            if k == 2:
                setattr(cls, name, 13.0)
            assert torch.equal(jf(arg, x), fn(arg, x)), (k, jf.stats.miss_reasons)
    finally:
        setattr(cls, name, old)
    assert counts(jf) == (2, 2, 0), jf.stats.miss_reasons


# ---- Note [Library results] (lower/state/flow.py) -----------------------------------------------
# A write to what a library function returns: a logger, the thread's object, a registry's
# entry: eager writes at every call, a hit did not. It runs eagerly; a copy stays served.

_REGISTRY46: dict = {}


def _entry46(name):
    return _REGISTRY46.setdefault(name, {"calls": 0})


def test_a_write_to_what_a_library_getter_returns_runs_eagerly():
    import threading

    def f(x):
        t = threading.current_thread()
        t.trident_calls46 = getattr(t, "trident_calls46", 0) + 1
        return x * 2.0

    jf, x = trident.jit(f), torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = getattr(threading.current_thread(), "trident_calls46", 0)
        for _ in range(3):
            assert torch.equal(jf(x), f(x))
    assert threading.current_thread().trident_calls46 == before + 6
    assert counts(jf) == (0, 0, 3) and len(said(caught, "library function")) == 1, jf.stats


def test_a_write_to_a_copy_stays_served():
    import copy

    class Cfg:
        def __init__(self):
            self.k = 2.0

    cfg = Cfg()

    def f(x):
        c = copy.deepcopy(cfg)
        c.k = 3.0
        d = copy.copy(cfg)
        d.k = c.k + 1.0
        return x * d.k

    jf, x = trident.jit(f), torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(jf(x), f(x))
    assert cfg.k == 2.0 and not said(caught, "trident") and counts(jf) == (1, 2, 0), jf.stats


# ---- Reads that no chain names, made in C -----------------------------------------------------
# ``operator.attrgetter("K")`` reads ``K`` of what it is given in C: of the items of a container
# that the argument tree holds by identity and exact class, their class's ``K`` is read by no
# chain: the class of every object the tree holds is used whole (Note [Classes of held
# objects]; tests/test_class_attrs47.py). An ``lru_cache``'d helper's result comes from its cache
# when the trace calls it (its own reads then run in no trace): the call runs eagerly.

def test_a_class_attribute_that_attrgetter_reads_of_an_item():
    """Note [Classes of held objects] (lower/state/wholes.py): the items' classes are used
    whole."""
    import operator

    def f(cache, x):
        return x * max(map(operator.attrgetter("K"), cache.layers))

    jf, cache, x = trident.jit(f), _Cache46(), torch.ones(3)
    try:
        for k in range(3):
            if k == 2:
                _Other46.K = 9.0
            assert torch.equal(jf(cache, x), f(cache, x))
    finally:
        _Other46.K = 3.0
    assert counts(jf) == (2, 1, 0), jf.stats


SCALE46 = 2.0


@functools.lru_cache(maxsize=None)
def _factor46(n):
    return SCALE46 * n


def test_an_lru_cached_helper_whose_cache_is_cleared():
    """The cache answered the trace (the helper did not run, so its read of SCALE46 was no
    chain's); the cache cleared and SCALE46 changed, eager computes again."""
    global SCALE46

    def f(x):
        return x * _factor46(3)

    _factor46.cache_clear()
    _factor46(3)  # cached before the trace
    jf, x = trident.jit(f), torch.ones(2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k in range(4):
                if k == 2:
                    SCALE46 = 5.0
                    _factor46.cache_clear()
                assert torch.equal(jf(x), f(x)), (k, jf.stats.miss_reasons)
    finally:
        SCALE46 = 2.0
        _factor46.cache_clear()
    assert counts(jf) == (0, 0, 4) and len(said(caught, "functools._lru_cache_wrapper")) == 1, \
        jf.stats.miss_reasons
