"""Note [Unchanged subtrees] (trident/runtime/tree_eval.cpp): a hit skips the containers whose dict
version tags say they are unchanged, and still sees every change the whole walk saw.

Each case jits ``f(m, x) = m(x)`` over a module tree, hits it, changes the tree one way, and
compares the next calls with eager (``torch.equal``): the change is seen (a recompile, or a
hit of what the new state needs), and the call after it is a hit again (the memo is valid
again). Cases run on the CPU, and on CUDA where there is a device.
"""

from __future__ import annotations

import collections
import copy
import gc
import sys

import pytest
import torch
from torch import nn

import trident
from _trident_helpers import python_calls, tiny_causal_lm

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TAG_TABLE = sys.version_info[:2] == (3, 11)  # Note [Tag table]: no dict watchers


class Cfg:
    def __init__(self):
        self.k, self.flag = 2.0, False


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.register_buffer("shift", torch.zeros(4))
        self.scale = 1.5

    def forward(self, x):
        x = self.norm(self.lin(x)) * self.scale + self.shift
        if self.training:
            x = x * 2
        return x + getattr(self, "bias_add", 0.0)


class Block2(Block):
    def forward(self, x):
        return self.norm(self.lin(x)) - 1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.cfg = Cfg()
        self.scales = [1.0, 70000]
        self.tags = {"a"}

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        if self.cfg.flag:
            x = x + 1
        if "b" in self.tags:
            x = x - 3
        return x * self.cfg.k * self.scales[0] + self.scales[1]


class Cache:
    def __init__(self, device):
        self.layers = [torch.ones(4, device=device)]


def f(m, x):
    return m(x)


def g(m, cache, x):
    return m(x) * cache.layers[0]


def _hook_mul3(module, args, out):
    return out * 3


def _pre_hook_neg(module, args):
    return (-args[0],)


def _param(m):
    m.blocks[1].lin.weight = nn.Parameter(torch.randn(4, 4, device=m.blocks[1].lin.weight.device))


def _buffer(m):
    m.blocks[0].shift = torch.ones(4, device=m.blocks[0].shift.device)


def _load_state_dict(m):
    state = {k: torch.randn_like(v) for k, v in m.state_dict().items()}
    m.load_state_dict(state)


def _in_place(m):
    m.blocks[2].lin.weight.mul_(2)


def _requires_grad(m):
    m.blocks[0].lin.weight.requires_grad_(False)


def _hook(m):
    m.blocks[1].norm.register_forward_hook(_hook_mul3)


def _pre_hook(m):
    m.blocks[2].lin.register_forward_pre_hook(_pre_hook_neg)


def _hook_removed(m):
    handle = m.blocks[1].norm.register_forward_hook(_hook_mul3)
    f(m, torch.ones(2, 4, device=m.blocks[1].norm.weight.device))
    handle.remove()


def _swap(m):
    m.blocks[1].lin = nn.Linear(4, 4, device=m.blocks[1].lin.weight.device)


def _delete(m):
    del m.blocks[2]


def _attribute(m):
    m.blocks[0].bias_add = 5.0


def _config(m):
    m.cfg.k = 3.0


def _config_flag(m):
    m.cfg.flag = True


def _config_replaced(m):
    cfg = Cfg()
    cfg.k = -1.0
    m.cfg = cfg


def _class(m):
    m.blocks[1].__class__ = Block2


def _train(m):
    m.blocks[1].train()


def _dict_replaced(m):
    b = m.blocks[0]
    d = dict(vars(b))
    d["scale"] = 7.0
    b.__dict__ = d


def _list_item(m):
    m.scales[1] = 70000 + int("1")  # a new int object, perhaps where the old one lived


def _list_float(m):
    m.scales[0] = float("2.5")


def _set(m):
    m.tags.add("b")


def _hook_order(m):
    norm = m.blocks[0].norm
    first = norm.register_forward_hook(lambda mod, args, out: out * 2)
    norm.register_forward_hook(lambda mod, args, out: out + 1)
    f(m, torch.ones(2, 4, device=norm.weight.device))
    norm._forward_hooks.move_to_end(first.id)  # no dict tag changes: the key order does


def _specialized_store(m):
    b = m.blocks[2]
    for i in range(200):  # STORE_ATTR specializes: its fast paths must bump the dict's tag
        b.scale = 1.0 + i / 1000


CHANGES = [_param, _buffer, _load_state_dict, _in_place, _requires_grad, _hook, _pre_hook,
           _hook_removed, _swap, _delete, _attribute, _config, _config_flag, _config_replaced,
           _class, _train, _dict_replaced, _list_item, _list_float, _set, _hook_order,
           _specialized_store]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__.strip("_"))
def test_a_change_to_the_module_tree_is_seen(change, device):
    torch.manual_seed(0)
    m = Net().to(device).eval()
    x = torch.randn(2, 4, device=device)
    jf = trident.jit(f)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(jf(m, x), f(m, x))
        assert jf.stats.hits == 2 and jf.stats.fallbacks == 0, jf.stats
        change(m)
        for _ in range(3):
            assert torch.equal(jf(m, x), f(m, x)), change.__name__
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons
    with torch.no_grad():
        assert python_calls(jf, (m, x), 3) == []  # unchanged again: a native hit


def through_shells(*args, **kwargs):
    """f, its module in **kwargs and its input in *args: containers binding makes afresh."""
    return f(kwargs["m"], args[0])


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__.strip("_"))
def test_a_change_below_a_new_kwargs_dict_is_seen(change):
    """The **kwargs dict and *args tuple are new at every call: what they hold are roots of
    their own (Note [Unchanged subtrees]), checked by the unchanged pass, never walked while
    unchanged, and every change below them is still seen."""
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 4)
    jf = trident.jit(through_shells)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(jf(x, m=m), through_shells(x, m=m))
        walked = jf.tree_passes()["m"][2]
        for _ in range(5):
            assert torch.equal(jf(x, m=m), through_shells(x, m=m))
        assert jf.tree_passes()["m"][2] == walked, jf.tree_passes()
        if TAG_TABLE:  # the unchanged pass read its checks and tags from the table
            assert jf.tree_passes()["m"][0] >= 4, jf.tree_passes()
        change(m)
        for _ in range(3):
            assert torch.equal(jf(x, m=m), through_shells(x, m=m)), change.__name__
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons
    with torch.no_grad():
        assert python_calls(jf, (x,), 3, m=m) == []


def count_kwargs(x, **kw):
    return x + len(kw)


@pytest.mark.parametrize("kwargs", [{1: 2}, {"a": 1, 2: 3}, {(): 1}],
                         ids=["int", "str and int", "tuple"])
def test_a_keyword_that_is_not_a_str_raises_as_eager_after_hits(kwargs):
    """Python's binding raises TypeError for a keyword that is not a str; the native binding
    left an error set on its way to the slow path (an adversarial pass's finding)."""
    x = torch.ones(3)
    jf = trident.jit(count_kwargs)
    for _ in range(3):
        assert torch.equal(jf(x, a=1), count_kwargs(x, a=1))
    with pytest.raises(TypeError) as eager:
        count_kwargs(x, **kwargs)
    with pytest.raises(TypeError) as mine:
        jf(x, **kwargs)
    assert str(mine.value) == str(eager.value)
    assert torch.equal(jf(x, a=1), count_kwargs(x, a=1))


@pytest.mark.parametrize("device", DEVICES)
def test_a_cache_object_replaced_or_edited_is_seen(device):
    torch.manual_seed(0)
    m = Net().to(device).eval()
    x = torch.randn(2, 4, device=device)
    cache = Cache(device)
    jf = trident.jit(g)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(jf(m, cache, x), g(m, cache, x))
        cache = Cache(device)
        cache.layers[0] = torch.full((4,), 2.0, device=device)  # a new object, a new list
        assert torch.equal(jf(m, cache, x), g(m, cache, x))
        cache.layers[0] = torch.full((4,), 3.0, device=device)  # the same list, a new item
        assert torch.equal(jf(m, cache, x), g(m, cache, x))
        cache.layers.append(torch.ones(4, device=device))
        assert torch.equal(jf(m, cache, x), g(m, cache, x))
        assert torch.equal(jf(m, cache, x), g(m, cache, x))
        assert python_calls(jf, (m, cache, x), 3) == []
    assert jf.stats.fallbacks == 0, jf.stats


def test_an_object_held_in_two_arguments_is_checked_as_one():
    """A SAME node below an unchanged container refers to a node of another argument: the
    memo of the container holds, the identity across arguments must still be checked."""

    class Holder:
        def __init__(self, block):
            self.block = block

    def h(block, holder, x):
        return block(x) + holder.block(x)

    torch.manual_seed(0)
    a, b = Block().eval(), Block().eval()
    holder = Holder(a)
    x = torch.randn(2, 4)
    jf = trident.jit(h)
    with torch.no_grad():
        for block in (a, a, b, b, a):
            assert torch.equal(jf(block, holder, x), h(block, holder, x))
    assert jf.stats.fallbacks == 0


def test_a_copied_module_is_a_new_tree_of_the_same_structure():
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 4)
    jf = trident.jit(f)
    with torch.no_grad():
        jf(m, x)
        m2 = copy.deepcopy(m)
        m2.blocks[0].lin.weight.add_(1)
        for model in (m2, m, m2):
            assert torch.equal(jf(model, x), f(model, x))
    assert jf.stats.compiles == 1 and jf.stats.fallbacks == 0, jf.stats


def test_a_hugging_face_model_change_is_seen():
    pytest.importorskip("transformers")
    model = tiny_causal_lm("Llama", hidden_size=32, intermediate_size=64, vocab_size=64)
    ids = torch.randint(0, 64, (1, 5))

    def logits(model, ids):
        return model(input_ids=ids, use_cache=False).logits

    jf = trident.jit(logits)
    changes = [
        lambda: model.model.layers[1].mlp.register_forward_hook(_hook_mul3),
        lambda: model.model.layers[0].self_attn.q_proj.weight.mul_(0.5),
        lambda: setattr(model.model.layers[0], "mlp", copy.deepcopy(model.model.layers[1].mlp)),
        lambda: setattr(model.model.norm, "variance_epsilon", 0.5),
    ]
    with torch.no_grad():
        for change in [lambda: None] + changes:
            change()
            for _ in range(2):
                assert torch.equal(jf(model, ids), logits(model, ids))
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons


# ---- faults an adversarial pass found (each failed before its fix) ---------------------------

def test_an_ordered_dicts_new_order_is_seen():
    """move_to_end reorders an OrderedDict's linked list, not the dict under it (nor its tag)."""
    def f(d, x):
        out = x
        for k, v in d.items():
            out = out * v if k == "a" else out + v
        return out

    jf = trident.jit(f)
    x = torch.ones(3)
    d = collections.OrderedDict(a=torch.full((3,), 2.0), b=torch.ones(3))
    for _ in range(3):
        assert torch.equal(jf(d, x), f(d, x))
    d.move_to_end("a")
    assert torch.equal(jf(d, x), f(d, x))

    lin = nn.Linear(3, 3).eval()  # the same through a module's forward hooks
    first = lin.register_forward_hook(lambda m, a, o: o * 2)
    lin.register_forward_hook(lambda m, a, o: o + 1)
    jg = trident.jit(f_module)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(jg(lin, x), f_module(lin, x))
        lin._forward_hooks.move_to_end(first.id)
        assert torch.equal(jg(lin, x), f_module(lin, x))
        assert python_calls(jg, (lin, x), 3) == []


def f_module(m, x):
    return m(x)


def test_a_subclass_of_a_number_runs_eagerly():
    """Its value is not in its __dict__, which is all an object's check reads."""
    class Scale(float):
        pass

    def f(s, x):
        return x * s

    jf = trident.jit(f)
    x = torch.ones(3)
    with pytest.warns(UserWarning, match="subclass of float"):
        jf(Scale(2.0), x)
    assert torch.equal(jf(Scale(5.0), x), f(Scale(5.0), x))
    assert jf.stats.hits == 0 and jf.stats.fallbacks == 2


@torch.library.custom_op("trident_tests::reenter", mutates_args=())
def _reenter(x: torch.Tensor) -> torch.Tensor:
    if _REENTER["on"]:
        _REENTER["n"] += 1
        _REENTER["jf"](x, [1] * _REENTER["n"])  # a new structure: a compile, a new table
    return x + 1


@_reenter.register_fake
def _(x):
    return torch.empty_like(x)


_REENTER = {"on": False, "n": 0, "jf": None}


def test_a_hit_that_installs_a_new_table_from_its_launch_sequence():
    """A custom op's body calls the same function with a new argument structure: that call
    installs new trees while the outer hit still reads its own."""
    def f(x, a):
        return torch.ops.trident_tests.reenter(x) if len(a) == 0 else x * 2

    jf = trident.jit(f)
    _REENTER.update(on=False, n=0, jf=jf)
    x = torch.ones(3)
    for _ in range(2):
        jf(x, [])
    _REENTER["on"] = True
    try:
        for _ in range(3):
            assert torch.equal(jf(x, []), x + 1)
    finally:
        _REENTER["on"] = False
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons


class _Holder:
    def __init__(self, t):
        self.t = t  # no __dict__ until it is first read: the walk makes it


def test_a_collection_during_a_walk_does_not_run_the_function_again():
    """A finalizer that calls the function, run by a collection that starts inside a walk (an
    instance dict made on its first read allocates), must not write the walk's memo."""
    def f(lst, x):
        return x + lst[0].t + lst[1]

    jf = trident.jit(f)
    x = torch.ones(3)
    for _ in range(3):
        jf([_Holder(torch.ones(3)), torch.ones(3)], x)
    armed, keep, inner = [False], [], []

    class Bomb:
        def __del__(self):
            if armed[0]:
                armed[0] = False
                other = [_Holder(torch.zeros(3)), torch.full((3,), 100.0)]
                keep.append(other)
                inner.append(jf(other, x))

    for k in range(12):  # a collection threshold that falls on the walk's allocation
        lst = [_Holder(torch.ones(3)), torch.full((3,), 5.0)]
        keep.append(lst)
        gc.collect()
        gc.disable()
        bomb = Bomb()
        bomb.me = bomb
        del bomb
        gc.enable()
        armed[0] = True
        gc.set_threshold(gc.get_count()[0] + k)
        try:
            assert torch.equal(jf(lst, x), f(lst, x)), k
        finally:
            gc.set_threshold(700)
            armed[0] = False
        gc.collect()
    assert all(torch.equal(r, torch.full((3,), 101.0)) for r in inner)


@pytest.mark.parametrize("device", DEVICES)
def test_a_new_object_at_a_freed_ones_address_is_checked_afresh(device):
    """A root or a list's item is only known to be at the address the memo holds: a new tuple
    of new tensors (the ``*args`` tuple of every call), a new string, a new tuple in a list, is
    read afresh, whatever address the allocator gives it."""
    def f(x, mode, pair, *rest):
        y = x.relu() if mode == "relu" else x.neg()
        return y + pair[0][1] + rest[0] * rest[1]

    jf = trident.jit(f)
    g = torch.Generator().manual_seed(0)
    for i in range(40):
        x, a, b, c = (torch.randn(3, generator=g).to(device) for _ in range(4))
        mode = "".join(["re", "lu"] if i % 3 else ["ne", "gx"])  # a new str each call
        pair = [(1, a)]  # a new list holding a new tuple
        want = f(x, mode, pair, b, c)
        assert torch.equal(jf(x, mode, pair, b, c), want), i
        del x, a, b, c, pair  # freed: the next call's objects may take their addresses
        gc.collect()
    assert jf.stats.fallbacks == 0
    assert jf.stats.compiles == 2  # one per mode
