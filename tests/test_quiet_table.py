"""Note [Quiet table] (trident/runtime/tree_memo.cpp): the quiet pass of an unchanged module tree
(Python 3.12) reads one table of records in order; what it still checks there is each object's
exact type and instance dict, each empty set constant's type and size, and the rest through
the unchanged pass's checks. Each case reaches the quiet pass (asserted on 3.12), changes the
tree one way no dict watcher sees, and compares the next calls with eager."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import trident
from _trident_helpers import python_calls

WATCHERS = sys.version_info[:2] == (3, 12)  # runtime_internal.h's TRT_DICT_WATCHERS


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.flags = set()  # an empty set constant: the table's kEmptySet
        self.frozen = frozenset()

    def forward(self, x):
        x = self.lin(x)
        if "neg" in self.flags:
            x = -x
        if "half" in self.frozen:
            x = x / 2
        return x


class Gate2(Gate):
    def forward(self, x):
        return self.lin(x) + 1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.gates = nn.ModuleList([Gate() for _ in range(3)])

    def forward(self, x):
        for g in self.gates:
            x = g(x)
        return x


def f(m, x):
    return m(x)


def _flag_added(m):
    m.gates[1].flags.add("neg")


def _frozen_rebound(m):
    m.gates[2].frozen = frozenset({"half"})


def _class(m):
    m.gates[0].__class__ = Gate2


_KEEP: list = []


def _dict_replaced(m):
    g = m.gates[2]
    _KEEP.append(g.__dict__)  # the old dict kept alive: no event on it
    d = dict(g.__dict__)
    d["flags"] = {"neg"}
    g.__dict__ = d


def _non_persistent(m):
    m.gates[0].lin._non_persistent_buffers_set.add("weight")  # read by state_dict only


def _weight_metadata(m):
    with torch.no_grad():
        m.gates[1].lin.weight.data = torch.randn(4, 4, dtype=torch.float64)[:, :4].float().t()


CHANGES = [_flag_added, _frozen_rebound, _class, _dict_replaced, _non_persistent,
           _weight_metadata]
SEEN_BY_THE_GUARDS = {_weight_metadata}  # a leaf's metadata: the SCM's guards, not the tree


def _quiet(jf) -> int:
    return jf.tree_passes()["m"][0]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__.strip("_"))
def test_a_change_after_quiet_hits_is_seen(change):
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 4)
    jf = trident.jit(f)
    with torch.no_grad():
        for _ in range(4):
            assert torch.equal(jf(m, x), f(m, x))
        assert jf.stats.hits == 3, jf.stats
        if WATCHERS:
            assert _quiet(jf) >= 1, jf.tree_passes()  # the table was read
        walked, compiles = jf.tree_passes()["m"][2], jf.stats.compiles
        change(m)
        for _ in range(3):
            assert torch.equal(jf(m, x), f(m, x)), change.__name__
        if change in SEEN_BY_THE_GUARDS:
            assert jf.stats.compiles == compiles + 1, jf.stats
        else:  # the change failed a check of the table: the tree was walked again
            assert jf.tree_passes()["m"][2] > walked, jf.tree_passes()
        assert python_calls(jf, (m, x), 3) == []  # quiet again: native hits
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons


def test_the_quiet_table_follows_a_walk():
    """A walk (a submodule swapped) changes the memo's values; the root's table is filled
    again when it is quiet again, so it checks the new submodule, not the old one."""
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 4)
    jf = trident.jit(f)
    with torch.no_grad():
        for _ in range(4):
            jf(m, x)
        old = m.gates[1]
        m.gates[1] = Gate().eval()
        for _ in range(4):
            assert torch.equal(jf(m, x), f(m, x))
        assert jf.stats.compiles == 1, jf.stats  # the new gate: a walk, then hits
        if WATCHERS:
            assert _quiet(jf) >= 1, jf.tree_passes()
        m.gates[1].flags.add("neg")  # the new gate's set: a stale table would check old's
        for _ in range(3):
            assert torch.equal(jf(m, x), f(m, x))
    assert jf.stats.compiles == 2 and jf.stats.fallbacks == 0 and old.flags == set()
