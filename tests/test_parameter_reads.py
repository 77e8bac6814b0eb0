"""Note [Parameter reads] (trident/lower/uses.py): an argument tree holds what the function reads
of its arguments. A hit then costs what the function reads (a model's one weight, not its
layers), a change to what it does not read is no recompile, and every change to what it reads
(or to where Python finds it) is seen: each case compares the call after the change with eager.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trident
from trident.lower.uses import WHOLE, parameter_uses
from _trident_helpers import python_calls

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Tower(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(layers)])
        self.lm_head = nn.Linear(8, 4, bias=False)
        self.cfg = {"scale": 2.0, "other": 1.0}
        self.steps = [3, 4]


def head(m, x):
    return F.linear(x, m.lm_head.weight)


def tree_of(jf) -> list:
    (tree,) = [t for k, t in jf._trees.items() if any(s.tree == k for s in jf._specs)]
    return tree.nodes


def check(jf, fn, *args):
    """The jitted call gives eager's result, or raises eager's exception."""
    with torch.no_grad():
        try:
            got = jf(*args)
        except Exception as e:
            with pytest.raises(type(e)):
                fn(*args)
            return
        assert torch.equal(got, fn(*args))


@pytest.mark.parametrize("device", DEVICES)
def test_a_hit_holds_what_the_function_reads_not_the_whole_model(device):
    x = torch.randn(2, 8, device=device)
    sizes = []
    for layers in (2, 24):
        torch.manual_seed(0)
        m = Tower(layers).to(device).eval().requires_grad_(False)
        jf = trident.jit(head)
        check(jf, head, m, x)
        check(jf, head, m, x)
        sizes.append(len(tree_of(jf)))
        with torch.no_grad():
            assert python_calls(jf, (m, x), 50) == []  # hits, in C
    assert sizes[0] == sizes[1] < 12  # m, its three module dicts, lm_head and its weight, x...


@pytest.mark.parametrize("device", DEVICES)
def test_what_the_function_reads_is_seen_when_it_changes(device):
    torch.manual_seed(0)
    m = Tower(3).to(device).eval().requires_grad_(False)
    x = torch.randn(2, 8, device=device)
    jf = trident.jit(head)
    check(jf, head, m, x)
    changes = [
        lambda: m.lm_head.weight.mul_(2),  # in place: read by pointer
        lambda: setattr(m.lm_head, "weight", nn.Parameter(torch.randn(4, 8, device=device))),
        lambda: setattr(m, "lm_head", nn.Linear(8, 4, bias=False).to(device)),
        lambda: m.lm_head.load_state_dict({"weight": torch.ones(4, 8)}),
        lambda: setattr(m, "lm_head", nn.Linear(8, 6, bias=False).to(device)),  # a new shape
        # where Python finds m.lm_head: its __dict__ first, then _parameters, _buffers, _modules
        lambda: m._buffers.__setitem__("lm_head", torch.randn(4, 8, device=device)),
        lambda: m.__dict__.__setitem__("lm_head", nn.Linear(8, 4, bias=False).to(device)),
        lambda: m.__dict__.pop("lm_head"),
        lambda: m._buffers.pop("lm_head"),
    ]
    for change in changes:
        change()
        check(jf, head, m, x)  # a buffer named lm_head: head reads .weight of a tensor and raises
        check(jf, head, m, x)


def test_a_buffer_that_shadows_a_submodule_is_seen():
    torch.manual_seed(0)
    m = Tower(1).eval()
    x = torch.randn(2, 8)

    def size(m, x):
        return x * m.lm_head.shape[0] if isinstance(m.lm_head, torch.Tensor) else \
            F.linear(x, m.lm_head.weight)[:, :1]

    jf = trident.jit(size)
    check(jf, size, m, x)
    m._parameters["lm_head"] = nn.Parameter(torch.randn(4, 8), requires_grad=False)
    check(jf, size, m, x)
    del m._parameters["lm_head"]
    check(jf, size, m, x)


def test_what_the_function_does_not_read_changes_without_a_recompile():
    torch.manual_seed(0)
    m = Tower(3).eval()
    x = torch.randn(2, 8)
    jf = trident.jit(head)
    check(jf, head, m, x)
    m.layers[0] = nn.Linear(8, 8)
    m.layers.append(nn.Linear(8, 8))
    m.cfg["scale"] = 5.0
    m.layers[1].weight.data = torch.randn(3, 3)
    m.layers[2].bias = None
    check(jf, head, m, x)
    assert jf.stats.compiles == 1 and jf.stats.hits == 1
    m.new_attribute = 1  # m.__dict__'s keys decide where m.lm_head is found: a new tree
    check(jf, head, m, x)
    assert jf.stats.compiles == 2


def test_items_read_by_constant_keys_and_indices():
    def f(cfg, xs, t, x):
        return x * cfg["scale"] + xs[-1] * t[0]

    x = torch.randn(3)
    cfg, xs, t = {"scale": 2.0, "other": 1.0}, [1.0, 2.0, 3.0], (torch.ones(3), torch.zeros(3))
    jf = trident.jit(f)
    check(jf, f, cfg, xs, t, x)
    cfg["other"] = 7.0
    xs[0] = 9.0
    check(jf, f, cfg, xs, t, x)
    assert jf.stats.compiles == 1
    for change in (lambda: cfg.__setitem__("scale", 3.0), lambda: xs.__setitem__(2, 5.0),
                   lambda: xs.append(8.0), lambda: cfg.pop("other")):
        change()
        check(jf, f, cfg, xs, t, x)
    assert jf.stats.fallbacks == 0


class Getattr:
    def __init__(self):
        self.k = 2.0

    def __getattr__(self, name):
        return self.k * 3


class Prop:
    def __init__(self):
        self.k = 2.0

    @property
    def twice(self):
        return self.k * 2


def getattr_read(o, x):
    return x * o.missing


def property_read(o, x):
    return x * o.twice


@pytest.mark.parametrize("obj, fn", [(Getattr(), getattr_read), (Prop(), property_read)])
def test_attributes_that_python_code_serves_read_the_object_whole(obj, fn):
    x = torch.randn(3)
    jf = trident.jit(fn)
    check(jf, fn, obj, x)
    obj.k = 5.0
    check(jf, fn, obj, x)
    assert jf.stats.compiles == 2


def test_a_write_through_a_path_is_seen_and_replayed():
    """Note [Attribute writes] (trident/lower/writes.py): a float set on a plain object is set
    again by every hit; on an object whose class has its own ``__setattr__`` the call runs
    eagerly."""
    class Holder:
        def __init__(self):
            self.inner = Prop()

    class Guarded(Prop):
        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)

    def f(h, x):
        h.inner.k = 3.0
        return x * 2

    h, x = Holder(), torch.randn(3)
    jf = trident.jit(f)
    for _ in range(3):
        h.inner.k = 2.0
        assert torch.equal(jf(h, x), x * 2)
        assert type(h.inner.k) is float and h.inner.k == 3.0
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 2, 0), jf.stats
    h.inner = Guarded()
    with pytest.warns(UserWarning, match=r"assigns to h\.inner\.k .*Guarded"):
        check(jf, f, h, x)
    assert h.inner.k == 3.0


def test_the_scan_reads_paths_and_refuses_what_it_cannot_follow():
    def paths(m, cfg, x):
        y = m.a.b[0] + m.a.c
        return y * cfg["k"]

    assert parameter_uses(paths, False, ["m", "cfg", "x"]) == [
        {("attr", "a"): {("attr", "b"): {("item", 0): WHOLE}, ("attr", "c"): WHOLE}},
        {("item", "k"): WHOLE}, {}]  # x: not read, but its own node (a leaf)

    def passed_on(m, x):
        return helper(m.a, x)

    def rebound(m, x):
        m = m.a
        return m.b

    def closure(m, x):
        return (lambda: m.a)()

    def frame(m, x):
        return locals()["m"].a

    def starred(m, *args, **kwargs):
        return m.a

    def generator(m, x):
        yield m.a

    assert parameter_uses(passed_on, False, ["m", "x"]) == [{("attr", "a"): WHOLE}, WHOLE]
    assert parameter_uses(rebound, False, ["m", "x"]) == [WHOLE, {}]
    assert parameter_uses(closure, False, ["m", "x"]) == [WHOLE, {}]
    assert parameter_uses(frame, False, ["m", "x"]) == [WHOLE, WHOLE]
    assert parameter_uses(starred, False, ["m", "args", "kwargs"]) == [
        {("attr", "a"): WHOLE}, WHOLE, WHOLE]
    assert parameter_uses(generator, False, ["m", "x"]) == [WHOLE, WHOLE]
    assert parameter_uses(paths, False, ["m", "x"]) == [WHOLE, WHOLE]  # not its code's names
    assert parameter_uses(len, False, ["obj"]) == [WHOLE]


def helper(a, x):
    return a


def test_zero_argument_super_reads_self_whole():
    class Base(nn.Module):
        def forward(self, x):
            return x

    class Child(Base):
        def forward(self, x):
            return super().forward(x) * self.k

    assert parameter_uses(Child().forward, True, ["x"])[0] is WHOLE
    assert sys.version_info >= (3, 10)
