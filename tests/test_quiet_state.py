"""Note [Quiet state] (runtime/state_memo.cpp): a state tree's proven reads are checked through
dict and type version tags once the memo is made. Each case hits the function until the memo is
made and used, makes a change the memo's proofs or its remaining checks must see, and holds the
next calls against eager's, with exact counts."""

from __future__ import annotations

import gc
import sys
import types
import weakref

import pytest
import torch

import trident

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 13), reason="no dict tags (Note)")

X = torch.arange(4.0)


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _quiet(jf, calls: int = 3):
    """Hit ``jf(X)`` ``calls`` times; the memo is made once and used (its checks held)."""
    for _ in range(calls):
        jf(X)
    made, proofs, checked, _, _ = jf._quiet_state()
    assert made == 1 and proofs > 0, jf._quiet_state()
    return checked


def _seen(jf, fn, change, *, compiles: int):
    """After ``change()``, two calls equal eager's; ``compiles`` in all, no fallback."""
    hits = jf.stats.hits
    change()
    for _ in range(2):
        assert torch.equal(jf(X), fn(X))
    st = jf.stats
    assert (st.compiles, st.fallbacks) == (compiles, 0), st
    assert st.hits == hits + 2 - (compiles - 1), st


class Base:
    w = 1.0


class Sub(Base):
    pass


class Meta(type):
    pass


class WithMeta(metaclass=Meta):
    w = 1.0


CFG = {"a": 1.0, "b": 2.0}
ITEMS = [1.0, 2.0]
OTHER = 0


def reads_sub(x):
    return x * Sub.w


def reads_meta(x):
    return x * WithMeta.w


def reads_cfg(x):
    return x * CFG["a"]


def reads_items(x):
    return x * sum(ITEMS)


@pytest.fixture(autouse=True)
def _restore():
    saved = (dict(CFG), list(ITEMS))
    yield
    CFG.clear()
    CFG.update(saved[0])
    ITEMS[:] = saved[1]
    for cls, name in ((Sub, "w"), (Meta, "w")):
        if name in vars(cls):
            delattr(cls, name)
    Base.w = WithMeta.w = 1.0


@pytest.mark.parametrize("change", ["subclass shadows", "base rebinds"])
def test_class_attribute_through_the_mro(change):
    jf = trident.jit(reads_sub)
    _quiet(jf)
    _seen(jf, reads_sub, (lambda: setattr(Sub, "w", 4.0)) if change == "subclass shadows"
          else (lambda: setattr(Base, "w", 3.0)), compiles=2)


def test_metaclass_data_descriptor_wins():
    jf = trident.jit(reads_meta)
    _quiet(jf)
    _seen(jf, reads_meta, lambda: setattr(Meta, "w", property(lambda cls: 5.0)), compiles=2)
    assert reads_meta(X)[1] == 5.0


def test_dict_item_rebound_and_other_key():
    jf = trident.jit(reads_cfg)
    _quiet(jf)
    _seen(jf, reads_cfg, lambda: CFG.__setitem__("a", 7.0), compiles=2)


def test_list_contents_checked_at_every_call():
    jf = trident.jit(reads_items)
    assert _quiet(jf) >= 1  # the list's contents: no tag covers them
    _seen(jf, reads_items, lambda: ITEMS.append(3.0), compiles=2)


def test_another_global_changes_at_every_call():
    """A module-level loop rebinds its variable in the module's dict at every call: the tag
    changes, the keys the memo read are read again, and the memo stays (no remake)."""
    global OTHER
    jf = trident.jit(reads_cfg)
    _quiet(jf)
    for i in range(1, 41):  # (the same object again is no change of the dict)
        OTHER = i
        assert torch.equal(jf(X), reads_cfg(X))
    made, proofs, _, reread, _ = jf._quiet_state()
    assert (made, jf.stats.compiles) == (1, 1) and proofs > 0 and reread >= 40


class Shadow(types.ModuleType):
    @property
    def k(self):
        return 9.0


MOD_CLASS = _module("quiet_mod_class", k=2.0)
MOD_GETATTR = _module("quiet_mod_getattr")
MOD_EQUAL = _module("quiet_mod_equal", k=2.0)


def reads_mod_class(x):
    return x * MOD_CLASS.k


def reads_absent(x):
    return x * getattr(MOD_GETATTR, "k", 2.0)


def reads_equal(x):
    return x * MOD_EQUAL.k


def test_module_class_assigned():
    jf = trident.jit(reads_mod_class)
    _quiet(jf)
    try:
        _seen(jf, reads_mod_class, lambda: setattr(MOD_CLASS, "__class__", Shadow), compiles=2)
        assert reads_mod_class(X)[1] == 9.0
    finally:
        MOD_CLASS.__class__ = types.ModuleType


def test_module_getattr_added_for_an_absent_name():
    jf = trident.jit(reads_absent)
    _quiet(jf)
    try:
        _seen(jf, reads_absent, lambda: setattr(MOD_GETATTR, "__getattr__", lambda name: 6.0),
              compiles=2)
    finally:
        del MOD_GETATTR.__getattr__


def test_an_equal_value_rebound_at_every_call():
    """A proven value rebound to an equal new object at every call: the proof fails, every node
    holds, the memo is made again; after its limit of remakes, every node at every call. One
    compile, every call a hit."""
    jf = trident.jit(reads_equal)
    _quiet(jf)
    for i in range(40):
        MOD_EQUAL.k = float(str(2.0))  # a new float object, equal
        assert torch.equal(jf(X), reads_equal(X))
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (1, 0, 42), jf.stats
    made, proofs, _, _, _ = jf._quiet_state()
    assert made == 16 and proofs == -1


def test_function_execd_into_its_own_globals():
    """``exec`` into a dict no module holds: the function is the user's, its reads guarded
    (they were taken as a library's: stale after the class attribute changed, and after the
    global was rebound where eager raises)."""

    class Scale:
        k = 2.0

    g = {"obj": Scale()}
    exec("def f(x):\n    return x * obj.k", g)
    jf = trident.jit(g["f"])
    _quiet(jf)
    _seen(jf, g["f"], lambda: setattr(Scale, "k", 5.0), compiles=2)
    g["obj"] = 7
    with pytest.warns(UserWarning, match="runs eagerly"), \
            pytest.raises(AttributeError, match="'int' object has no attribute 'k'"):
        jf(X)


def test_memo_holds_no_object_past_the_function():
    """The memo owns what it proved (the Dispatcher's tp_traverse visits it): a module whose
    function is jitted and held in its own dict, and the global object the function read, are
    collected together once the module is gone."""

    class Scale:
        k = 2.0

    mod = _module("quiet_mod_gc", obj=Scale())
    sys.modules[mod.__name__] = mod
    try:
        exec("def f(x):\n    return x * obj.k", vars(mod))
        jf = trident.jit(mod.f)
        _quiet(jf)
        gone = weakref.ref(mod.obj)
        mod.jitted = jf  # a cycle: module dict -> jf -> memo -> module dict
    finally:
        del sys.modules[mod.__name__]
    del jf, mod
    gc.collect()
    assert gone() is None


@pytest.mark.skipif(sys.version_info[:2] != (3, 12), reason="dict and type watchers (3.12)")
def test_watched_proofs_skip_their_tags_until_an_event():
    """Note [Watched state]: while no watched dict or type had an event, the proofs hold
    through their watchers; an event makes the next call read every tag, which sees the change
    (or re-reads the entries of a dict whose other key changed), then the watchers serve again."""
    jf = trident.jit(reads_cfg)
    _quiet(jf)

    def calls(n):
        before = jf._quiet_state()
        for _ in range(n):
            assert torch.equal(jf(X), reads_cfg(X))
        after = jf._quiet_state()
        return after[0] - before[0], after[3] - before[3], after[4] - before[4]  # made, reread, watched

    assert calls(3) == (0, 0, 3)
    CFG["b"] = 5.0  # another key: its event, the tag read, the entry read again
    assert calls(1) == (0, 1, 0) and calls(2) == (0, 0, 2)
    CFG["a"] = 7.0  # the key read: its proof fails, a new specialization (and state memo)
    for _ in range(2):
        assert torch.equal(jf(X), reads_cfg(X))
    assert calls(2)[2] == 2 and jf.stats.compiles == 2

    jt = trident.jit(reads_sub)
    for _ in range(3):
        jt(X)
    made = jt._quiet_state()[0]
    Base.w = 1.0  # an equal value: the type's event, its tag gone, every node holds: remade
    assert torch.equal(jt(X), reads_sub(X))
    assert jt._quiet_state()[0] == made + 1 and jt.stats.compiles == 1
    Sub.w = 4.0  # through the subclass's own watcher
    assert torch.equal(jt(X), reads_sub(X)) and jt.stats.compiles == 2
