"""Note [Own writes] (trident/runtime/tree_memo.cpp): an attribute a hit sets on an object its
tree holds (a DynamicCache layer's ``keys``: a new tensor at every decode step) is followed by
the tree's memo, so the next call does not walk that object again; every change made between
calls by anything else is still seen, each call compared with eager."""

from __future__ import annotations

import torch

import trident


class Layer:  # as transformers' DynamicLayer: its keys a new tensor at every step
    def __init__(self):
        self.keys = torch.arange(6.0).reshape(3, 2)
        self.scale = 2.0


def step(x, layer):
    layer.keys = layer.keys + x
    return layer.keys.sum(0) * layer.scale


def twins():
    return Layer(), Layer()


def same(mine, theirs) -> bool:
    return vars(mine).keys() == vars(theirs).keys() and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        for a, b in zip(vars(mine).values(), vars(theirs).values()))


def call_both(jf, x, mine, theirs):
    """One call through Trident and eagerly on twin objects: results and states equal, or the
    same exception."""
    try:
        ref = step(x, theirs)
    except Exception as e:  # noqa: BLE001 (the exception eager raises, raised by both)
        try:
            jf(x, mine)
        except type(e):
            return None
        raise AssertionError(f"eager raised {e!r}, Trident did not")
    out = jf(x, mine)
    assert torch.equal(out, ref) and same(mine, theirs)
    return out


def passes(jf) -> tuple:
    return jf.tree_passes()["layer"]


def test_a_written_leaf_is_followed_so_its_object_is_not_walked_again():
    jf = trident.jit(step)
    mine, theirs = twins()
    x = torch.ones(3, 2)
    for _ in range(8):
        call_both(jf, x, mine, theirs)
    assert (jf.stats.hits, jf.stats.misses, jf.stats.fallbacks) == (7, 1, 0), jf.stats
    quiet, unchanged, walked = passes(jf)
    # the first hit walks (the trace's tree was not yet held), then never again: each later
    # hit takes the unchanged pass (the memo followed the last hit's write; on Python 3.12 the
    # write is a watched dict's event, so not the quiet one)
    assert walked == 1 and quiet + unchanged == 6, passes(jf)


def test_changes_between_calls_after_own_writes_are_seen():
    def change_keys(layer):
        layer.keys = torch.full((3, 2), 5.0)

    def change_scale(layer):
        layer.scale = 3.0

    def add(layer):
        layer.extra = 1

    def delete_scale(layer):
        del layer.scale

    def replace_dict(layer):
        layer.__dict__ = {"keys": layer.keys * 2, "scale": layer.scale}

    def set_class(layer):
        class Other(Layer):
            scale = 7.0  # (the instance's own still wins: eager reads it)

        layer.__class__ = Other

    def same_value(layer):  # the same objects bound again: no change at all
        layer.keys = layer.keys

    def keys_in_place(layer):
        layer.keys.add_(1)

    x = torch.ones(3, 2)
    for change in (change_keys, change_scale, add, delete_scale, replace_dict, set_class,
                   same_value, keys_in_place):
        jf = trident.jit(step)
        mine, theirs = twins()
        for _ in range(4):  # hits whose writes the memo followed
            call_both(jf, x, mine, theirs)
        change(mine)
        change(theirs)
        for _ in range(3):
            call_both(jf, x, mine, theirs)
        assert jf.stats.fallbacks == 0 or change is delete_scale, (change.__name__, jf.stats)


def test_a_write_through_a_custom_setattr_is_not_followed():
    """A __setattr__ of its own may change other attributes with the write: such a function
    runs eagerly (Note [Attribute writes]), and the memo would not follow the write either
    (own_write_leaf wants the generic setattr); every call equals eager."""

    class Counting(Layer):
        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)
            if name == "keys":
                object.__setattr__(self, "scale", getattr(self, "scale", 1.0) + 1.0)

    jf = trident.jit(step)
    mine, theirs = Counting(), Counting()
    for _ in range(5):
        call_both(jf, torch.ones(3, 2), mine, theirs)
