"""Never stale (issue 28), for what a function reads of an argument (Note [Parameter reads] in
trident/lower/uses.py, Note [Instance lookups] in trident/lower/state/instances.py): an attribute
found in the instance's ``__dict__`` is found there only while its class does not gain the
name (a property shadows it) and an absent one stays absent only while the class gains
neither the name nor a ``__getattr__``."""

from __future__ import annotations

import pytest
import torch

import trident


class Cfg:
    def __init__(self):
        self.a = 2.0
        self.inner = Inner()


class Inner:
    def __init__(self):
        self.k = 3.0


def reads_a(x, cfg):
    return x * cfg.a


def reads_maybe_b(x, cfg):
    return x * (cfg.b if hasattr(cfg, "b") else 1.0)


def reads_deep(x, cfg):
    return x * cfg.inner.k


def _set(cls, name, value):
    setattr(cls, name, value)
    return lambda: delattr(cls, name)


CASES = {
    "a property on the class shadows the instance's attribute":
        (reads_a, lambda: _set(Cfg, "a", property(lambda self: 7.0))),
    "a class attribute for a name the instance lacks":
        (reads_maybe_b, lambda: _set(Cfg, "b", 5.0)),
    "a __getattr__ added to the class":
        (reads_maybe_b, lambda: _set(Cfg, "__getattr__", lambda self, name: 9.0)),
    "a property on an attribute's class":
        (reads_deep, lambda: _set(Inner, "k", property(lambda self: 4.0))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_class_change_that_changes_an_arguments_lookup_is_seen(case):
    fn, change = CASES[case]
    jf = trident.jit(fn)
    x, cfg = torch.ones(2), Cfg()
    before = fn(x, cfg)
    assert torch.equal(jf(x, cfg), before) and torch.equal(jf(x, cfg), before)
    undo = change()
    try:
        after = fn(x, cfg)
        assert not torch.equal(after, before), "the change must change eager's result"
        assert torch.equal(jf(x, cfg), after) and torch.equal(jf(x, cfg), after)
    finally:
        undo()
    assert torch.equal(jf(x, cfg), before)
    st = jf.stats
    assert (st.fallbacks, st.compiles, st.misses, st.hits) == (0, 2, 2, 3), st  # back: a hit
