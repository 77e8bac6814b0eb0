"""Note [Quiet table] (trident/runtime/tree_memo.cpp): the quiet pass of an unchanged module tree
(Python 3.12) reads one table of records in order; what it still checks there is each object's
exact type and instance dict, each empty set constant's type and size, and the rest through
the unchanged pass's checks. On 3.11 (Note [Tag table]) the unchanged pass reads the same table,
with every dict's check and each record's tag. Each case reaches the table (asserted on 3.11 and
3.12), changes the tree one way no dict watcher sees, and compares the next calls with eager."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import trident
from _trident_helpers import python_calls

# runtime_internal.h's TRT_DICT_WATCHERS (3.12), or Note [Tag table] (3.11): the table is read
TABLE = sys.version_info[:2] in ((3, 11), (3, 12))


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
        if TABLE:
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
        if TABLE:
            assert _quiet(jf) >= 1, jf.tree_passes()
        m.gates[1].flags.add("neg")  # the new gate's set: a stale table would check old's
        for _ in range(3):
            assert torch.equal(jf(m, x), f(m, x))
    assert jf.stats.compiles == 2 and jf.stats.fallbacks == 0 and old.flags == set()


# Note [Instance dict slot] (trident/runtime/tree_eval.cpp): the unchanged and quiet passes read
# an object's dict slot where its type keeps it; each layout an argument tree checks (a variable-
# size object, a tuple subclass say, runs eagerly: Trident cannot guard its contents), each
# change no dict watcher sees.
class Managed:  # Py_TPFLAGS_MANAGED_DICT (3.11, 3.12): the slot three words before the object
    def __init__(self):
        self.scale = 2.0


class Spaced(types.SimpleNamespace):  # a positive tp_dictoffset: SimpleNamespace's own slot
    def __init__(self):
        super().__init__(scale=2.0)


class Managed2(Managed):
    pass


class Spaced2(Spaced):
    pass


def _scaled(cfg, x):
    return x * cfg.scale


def _dict_swapped(cfg):
    _KEEP.append(cfg.__dict__)  # the old dict kept alive: no event on it
    d = dict(cfg.__dict__)
    d["scale"] = 3.0
    cfg.__dict__ = d


def _class_swapped(cfg):
    cfg.__class__ = {Managed: Managed2, Spaced: Spaced2}[type(cfg)]


def _class_swapped_and_set(cfg):
    _class_swapped(cfg)
    cfg.scale = 5.0


@pytest.mark.parametrize("layout, change", [
    (Managed, _dict_swapped), (Managed, _class_swapped), (Managed, _class_swapped_and_set),
    (Spaced, _class_swapped), (Spaced, _class_swapped_and_set)],
    ids=lambda c: getattr(c, "__name__", "").strip("_"))
def test_every_dict_layout_is_checked_where_it_lives(layout, change):
    cfg = layout()
    x = torch.ones(3)
    jf = trident.jit(_scaled)
    for _ in range(4):
        assert torch.equal(jf(cfg, x), _scaled(cfg, x))
    assert jf.stats.hits == 3 and jf.stats.fallbacks == 0, jf.stats
    passes = jf.tree_passes()["cfg"]
    if TABLE:
        assert passes[0] >= 1, passes  # the quiet pass read the slot
    change(cfg)
    for _ in range(3):
        assert torch.equal(jf(cfg, x), _scaled(cfg, x)), (layout, change)
    assert jf.tree_passes()["cfg"][2] > passes[2], jf.tree_passes()  # walked again
    assert python_calls(jf, (cfg, x), 3) == []
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons


def test_a_hook_order_changed_after_table_passes_is_seen():
    """An OrderedDict of two or more keys (a module's forward hooks) is checked by its type, its
    tag and its key order: ``move_to_end`` changes no tag. Hits until the table is read (on 3.11
    the tag table's kOrderedDict record, Note [Tag table]), then the hooks reordered: the next
    calls run them in the new order, as eager."""
    torch.manual_seed(0)
    m, x = Net().eval(), torch.randn(2, 4)
    norm = m.gates[1].lin
    first = norm.register_forward_hook(lambda mod, args, out: out * 2)
    norm.register_forward_hook(lambda mod, args, out: out + 1)
    jf = trident.jit(f)
    with torch.no_grad():
        for _ in range(5):
            assert torch.equal(jf(m, x), f(m, x))
        assert jf.stats.hits == 4 and jf.stats.fallbacks == 0, jf.stats
        if sys.version_info[:2] == (3, 11):  # (3.12's quiet pass here: not run on 3.12 yet)
            assert _quiet(jf) >= 1, jf.tree_passes()
        walked = jf.tree_passes()["m"][2]
        norm._forward_hooks.move_to_end(first.id)
        for _ in range(3):
            assert torch.equal(jf(m, x), f(m, x))
        assert jf.tree_passes()["m"][2] > walked, jf.tree_passes()
        assert python_calls(jf, (m, x), 3) == []
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons
