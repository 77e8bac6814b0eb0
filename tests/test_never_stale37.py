"""Never stale on the hit path (issues 25 and 28): faults an adversarial pass found where a hit
returned an old result after a change of what the call reads, each with a test of its kind.

Every case jits a function, hits it, makes a change, and compares the next calls with eager
(``torch.equal``)."""

from __future__ import annotations

import array
import collections
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trident
from _trident_helpers import as_in_a_new_process


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 4)
        self.k = 2.0

    def forward(self, x):
        return self.head(x) * self.k


class Holder:
    def __init__(self, m):
        self.m = m


# ---- Note [Objects reached twice] (lower/flatten.py) -----------------------------------------
# The first place a model is reached reads a part of it (its head's parameters), the second
# reads it whole (calls it): the tree's node for the model must hold what both read.

def pruned_then_whole(m, h, x):
    return F.linear(x, m.head.weight, m.head.bias) + h.m(x)


def whole_then_pruned(h, m, x):
    return h.m(x) + F.linear(x, m.head.weight, m.head.bias)


def pruned_in_holder_then_whole(h, m, x):
    return F.linear(x, h.m.head.weight, h.m.head.bias) + m(x)


def pruned_then_other_path(m, h, x):
    return F.linear(x, m.head.weight, m.head.bias) * h.m.k


def through_shells(*args, **kwargs):
    m = args[0]
    return F.linear(args[1], m.head.weight, m.head.bias) + kwargs["h"].m(args[1])


CALLS = {
    "pruned_then_whole": lambda fn, m, h, x: fn(m, h, x),
    "whole_then_pruned": lambda fn, m, h, x: fn(h, m, x),
    "pruned_in_holder_then_whole": lambda fn, m, h, x: fn(h, m, x),
    "pruned_then_other_path": lambda fn, m, h, x: fn(m, h, x),
    "through_shells": lambda fn, m, h, x: fn(m, x, h=h),
}


def _float(m):
    m.k = 5.0


def _hook(m):
    m.head.register_forward_hook(lambda mod, args, out: out * 3)


def _swap(m):
    m.head = nn.Linear(4, 4)


def _vars(m):
    vars(m)["k"] = -1.0


@pytest.mark.parametrize("change", [_float, _hook, _swap, _vars],
                         ids=lambda c: c.__name__.strip("_"))
@pytest.mark.parametrize("fn", [pruned_then_whole, whole_then_pruned,
                                pruned_in_holder_then_whole, pruned_then_other_path,
                                through_shells], ids=lambda f: f.__name__)
def test_an_object_reached_twice_is_checked_for_what_both_places_read(fn, change):
    torch.manual_seed(0)
    m = Head().eval()
    h, x = Holder(m), torch.randn(2, 4)
    call = CALLS[fn.__name__]
    jf = trident.jit(fn)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert torch.equal(call(jf, m, h, x), call(fn, m, h, x))
        change(m)
        for _ in range(2):
            assert torch.equal(call(jf, m, h, x), call(fn, m, h, x)), change.__name__
    assert jf.stats.fallbacks == 0 and jf.stats.hits >= 3, jf.stats


# ---- an object whose C base holds its contents -----------------------------------------------

class Deque(collections.deque):
    pass


class Bytes(bytearray):
    pass


class Doubles(array.array):
    pass


def first_item(x, d):
    return x * d[0]


_GLOBAL = {}


def first_item_of_global(x):
    return x * _GLOBAL["d"][0]


@pytest.mark.parametrize("make", [lambda: Deque([2.0]), lambda: Bytes(b"\x02"),
                                  lambda: Doubles("d", [2.0])],
                         ids=["deque", "bytearray", "array"])
@pytest.mark.parametrize("where", ["argument", "global"])
def test_a_subclass_of_a_c_container_runs_eagerly_with_one_warning(make, where):
    """A Python subclass of a C container has a ``__dict__``, but its items live in the C
    object, which no node of the tree checks: a hit returned the old item after an edit."""
    d = make()
    x = torch.ones(3)
    fn = first_item if where == "argument" else first_item_of_global
    _GLOBAL["d"] = d
    call = (lambda f: f(x, d)) if where == "argument" else (lambda f: f(x))
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert torch.equal(call(jf), call(fn))
        d[0] = 5
        assert torch.equal(call(jf), call(fn))
    assert jf.stats.hits == 0 and jf.stats.fallbacks == 3, jf.stats
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1 and "cannot guard" in said[0], said


# ---- Note [Classes of one name] (frontend/install.py) ----------------------------------------

_NET = '''
class Net(nn.Module):
    K = 2.0

    def forward(self, x):
        return x * self.K
'''


def calls_it(m, x):
    return m(x)


@pytest.mark.parametrize("edit", [("K = 2.0", "K = 5.0"), ("x * self.K", "x - self.K"),
                                  ("K = 2.0", "K = 2.0")],
                         ids=["class attribute", "forward", "same source"])
def test_a_class_defined_again_under_its_name_is_another_class(edit):
    """A notebook cell run again defines a new class of the same module and name: its
    instances are not served the old class's specialization, nor the old instances the new
    one's."""
    space = {"nn": nn, "__name__": __name__}
    exec(_NET, space)
    old = space["Net"]()
    x = torch.ones(2)
    jf = trident.jit(calls_it)
    for _ in range(2):
        assert torch.equal(jf(old, x), calls_it(old, x))
    exec(_NET.replace(*edit), space)
    new = space["Net"]()
    for m in (new, new, old, new):
        assert torch.equal(jf(m, x), calls_it(m, x))
    stats = jf.stats
    assert (stats.hits, stats.misses, stats.compiles, stats.fallbacks) == (4, 2, 2, 0), stats


def test_classes_a_factory_makes_are_told_apart():
    def make(k):
        class Scaled:
            def __init__(self):
                self.on = True

        Scaled.K = k
        return Scaled()

    def scale(o, x):
        return x * type(o).K if o.on else x

    x = torch.ones(2)
    jf = trident.jit(scale)
    objs = [make(2.0), make(3.0), make(2.0)]
    for o in objs + objs:
        assert torch.equal(jf(o, x), scale(o, x))
    stats = jf.stats
    assert (stats.hits, stats.misses, stats.compiles, stats.fallbacks) == (3, 3, 3, 0), stats


def test_a_module_class_rebound_to_another_class_of_its_name():
    """A class of a module defined again there (its name rebound): the new class's instances
    take their own key, and a new process still finds the first class's specializations."""
    import sys

    module = sys.modules[__name__]
    old, x = Head().requires_grad_(False), torch.ones(4)
    jf = trident.jit(calls_it)
    assert torch.equal(jf(old, x), calls_it(old, x))
    as_in_a_new_process()
    again = trident.jit(calls_it)  # a new process's first call: the stored specialization
    assert torch.equal(again(old, x), calls_it(old, x))
    assert (again.stats.traces, again.stats.hits) == (0, 1), again.stats
    saved = module.Head
    try:
        class Again(nn.Module):  # the module's Head, defined again
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(4, 4)
                self.k = 2.0

            def forward(self, x):
                return self.head(x) - self.k

        Again.__name__ = Again.__qualname__ = "Head"
        module.Head = Again
        new = Again().requires_grad_(False)
        for m in (new, new, old, new, old):
            assert torch.equal(jf(m, x), calls_it(m, x))
    finally:
        module.Head = saved
    stats = jf.stats
    assert (stats.hits, stats.misses, stats.compiles, stats.fallbacks) == (3, 3, 3, 0), stats


# ---- Note [Instance lookups]: a class's attribute lookup replaced after the trace -----------

class KnobBase:
    pass


class Knob(KnobBase):
    def __init__(self):
        self.k = 2.0


def reads_k(o, x):
    return x * o.k


def _seven(self, name):
    return 7.0 if name == "k" else object.__getattribute__(self, name)


@pytest.mark.parametrize("owner", [Knob, KnobBase], ids=["its class", "a base class"])
def test_a_getattribute_assigned_on_the_class_after_the_trace_is_seen(owner):
    o, x = Knob(), torch.ones(2)
    jf = trident.jit(reads_k)
    try:
        for _ in range(2):
            assert torch.equal(jf(o, x), reads_k(o, x))
        owner.__getattribute__ = _seven
        for _ in range(2):
            assert torch.equal(jf(o, x), reads_k(o, x))
        assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 2, 0), jf.stats
    finally:
        if "__getattribute__" in owner.__dict__:
            del owner.__getattribute__
    for _ in range(2):  # the first specialization again, installed without a compile
        assert torch.equal(jf(o, x), reads_k(o, x))
    stats = jf.stats
    assert (stats.hits, stats.misses, stats.compiles, stats.fallbacks) == (4, 2, 2, 0), stats
    assert stats.miss_reasons[1].startswith("Knob.__getattribute__ changed"), stats
