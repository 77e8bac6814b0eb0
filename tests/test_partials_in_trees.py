"""Note [Partials in arguments] (lower/partials.py): a ``functools.partial`` that a call's
argument tree holds (transformers' ``GELUTanh.act``: ``functools.partial(F.gelu,
approximate="tanh")`` in every Gemma) is checked by what decides the code, named the same in
every process: a new process loads its specializations (issue 27). Its ``func``, ``args`` and
``keywords`` are read at every call, through the memo of unchanged subtrees too (Note
[Unchanged subtrees] in runtime/tree_eval.cpp): a ``__setstate__`` or a keywords dict written
in place is seen. Every call is compared with eager (``torch.equal``), with exact counts."""

from __future__ import annotations

import functools
import json
import operator
import sys
import textwrap
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trident
from trident.frontend import entries
from _trident_helpers import run_python

WATCHERS = sys.version_info[:2] == (3, 12)  # tree_eval.cpp's TRT_DICT_WATCHERS


class Act(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = act

    def forward(self, x):
        return self.act(self.lin(x))


def _model(act) -> Act:
    torch.manual_seed(0)
    return Act(act).eval()


def counts(jf) -> tuple[int, int, int, int]:
    s = jf.stats
    return s.compiles, s.hits, s.misses, s.fallbacks


def _trident_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "trident" in str(w.message)]


def _stored(cache) -> list:
    return sorted((cache / "functions").rglob("specs/*.json"))


# (the partial, its change in place, what undoes it); each change changes eager's result
def _keywords(p):
    p.keywords["approximate"] = "none"
    return lambda: p.keywords.__setitem__("approximate", "tanh")


def _setstate(state):
    def change(p):
        before = p.__reduce__()[2]
        p.__setstate__(state)
        return lambda: p.__setstate__(before)
    return change


CHANGES = {
    "keywords written in place": (lambda: functools.partial(F.gelu, approximate="tanh"),
                                  _keywords),
    "__setstate__, other keywords": (lambda: functools.partial(F.gelu, approximate="tanh"),
                                     _setstate((F.gelu, (), {"approximate": "none"}, None))),
    "__setstate__, a library Python function": (
        lambda: functools.partial(F.gelu, approximate="tanh"),
        _setstate((F.silu, (), {}, None))),
    "__setstate__, other args": (lambda: functools.partial(operator.mul, 2.0),
                                 _setstate((operator.mul, (3.0,), {}, None))),
    # an int argument: an int leaf of the tree where trees differ in it (Note [Int leaves])
    "__setstate__, other int args": (lambda: functools.partial(operator.mul, 2),
                                     _setstate((operator.mul, (3,), {}, None))),
    "__setstate__, other int keywords": (
        lambda: functools.partial(torch.clamp, min=-1),
        _setstate((torch.clamp, (), {"min": 0}, None))),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_partial_changed_in_place_recompiles_and_changed_back_hits(change):
    """Four hits first (the unchanged pass of the memo, and on Python 3.12 its quiet pass),
    then the change: a miss and a compile, equal to eager; undone, the first specialization
    serves again."""
    make, changer = CHANGES[change]
    m, x = _model(make()), torch.randn(2, 4)
    jf = trident.jit(_call)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for _ in range(5):
            assert torch.equal(jf(m, x), m(x))
        if WATCHERS:  # the quiet pass read the partial's attributes
            assert jf.tree_passes()["m"][0] >= 1, jf.tree_passes()
        undo = changer(m.act)
        try:
            for _ in range(3):
                assert torch.equal(jf(m, x), m(x))
        finally:
            undo()
        for _ in range(2):
            assert torch.equal(jf(m, x), m(x))
    assert counts(jf) == (2, 8, 2, 0), jf.stats.miss_reasons


def _call(m, x):
    return m(x)


def test_a_partial_in_a_module_is_stored_with_its_words(trident_cache):
    """The tree names the partial by its function's path: the specialization is stored (not
    kept in this process only), and a miss names what changed."""
    m, x = _model(functools.partial(F.gelu, approximate="tanh")), torch.randn(2, 4)
    jf = trident.jit(m)
    with torch.no_grad():
        assert torch.equal(jf(x), m(x))
        assert len(_stored(trident_cache)) == 1
        m.act.keywords["approximate"] = "none"
        assert torch.equal(jf(x), m(x))
    assert len(_stored(trident_cache)) == 2
    assert jf.stats.miss_reasons[-1].startswith(
        "self.act.keywords['approximate']: str 'none' where str 'tanh' was compiled"), \
        jf.stats.miss_reasons


def _places():
    def local(x, k):  # no path names it
        return x * k + 1

    return {
        "of a local function, in a namespace": (
            lambda x, c: c.act(x), lambda p: types.SimpleNamespace(act=p),
            functools.partial(local, k=2.0), (local, (), {"k": 3.0}, None), (1, 0)),
        "of a lambda, in a module": (
            lambda m, x: m(x), None, functools.partial(lambda x, k: x * k, k=2.0),
            (lambda x, k: x - k, (), {"k": 3.0}, None), (0, 1)),
        "holding a tensor, in a module": (
            lambda m, x: m(x), None, functools.partial(torch.add, other=torch.ones(4)),
            (torch.add, (), {"other": torch.full((4,), 2.0)}, None), (0, 1)),
    }


@pytest.mark.parametrize("place", ["of a local function, in a namespace",
                                   "of a lambda, in a module", "holding a tensor, in a module"])
def test_a_partial_no_path_names_is_checked_by_identity_and_never_stale(place, trident_cache):
    """A partial whose function no path names, or that holds a tensor, is checked by identity
    and its contents are a state read (process-only: not stored); one of a user function in a
    module runs eagerly with one warning (Note [Callable arguments]), as does one holding a
    tensor (a tensor no argument holds). Either way, equal to eager after ``__setstate__``."""
    fn, holder, part, state, (compiled, eager) = _places()[place]
    x = torch.randn(2, 4)
    arg = holder(part) if holder else _model(part)
    args = (x, arg) if holder else (arg, x)
    jf = trident.jit(fn)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            if i == 2:
                part.__setstate__(state)
            assert torch.equal(jf(*args), fn(*args)), i
    s = jf.stats
    assert (s.compiles, s.fallbacks) == (2 * compiled, 4 * eager), s
    assert len(_trident_warnings(caught)) == eager, _trident_warnings(caught)
    assert _stored(trident_cache) == []  # Note [Process-only state]


def test_a_process_only_entry_is_listed_with_its_origin(trident_cache):
    """``python -m trident list`` names the function of a folder whose specializations served
    their process only (it said "made by an older Trident")."""
    def by_a_partial(x, c):
        return c.act(x)

    def local(x, k):
        return x * k

    jf = trident.jit(by_a_partial)
    c = types.SimpleNamespace(act=functools.partial(local, k=2.0))
    x = torch.randn(2, 4)
    assert torch.equal(jf(x, c), by_a_partial(x, c))
    assert jf.stats.compiles == 1 and _stored(trident_cache) == []
    (row,) = entries.list_entries()
    assert row["about"]["qualname"].endswith("by_a_partial"), row


# ---- a new process ------------------------------------------------------------------------

PARTIAL = textwrap.dedent("""
    import functools, json, sys, torch, trident
    import torch.nn.functional as F
    from torch import nn

    class Act(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.act = functools.partial(F.gelu, approximate="tanh")

        def forward(self, x):
            return self.act(self.lin(x))

    torch.manual_seed(0)
    m, x = Act().eval(), torch.randn(2, 4)
    jf = trident.jit(m)
    ok = []
    with torch.no_grad():
        ok += [torch.equal(jf(x), m(x)) for _ in range(2)]
        m.act.__setstate__((F.silu, (), {}, None))
        ok += [torch.equal(jf(x), m(x)) for _ in range(2)]
    s = jf.stats
    print(json.dumps([all(ok), s.compiles, s.hits, s.fallbacks, s.traces]))
""")


def test_each_partial_state_loads_from_the_cache_in_a_new_process(subprocess_env):
    """Both specializations (``F.gelu`` tanh, then ``F.silu`` set by ``__setstate__``) are
    stored; a new process traces and builds nothing."""
    first = json.loads(run_python(subprocess_env, "-c", PARTIAL).stdout.splitlines()[-1])
    assert first == [True, 2, 2, 0, 2], first
    env = dict(subprocess_env, TRIDENT_FORBID_COMPILE="1")
    second = json.loads(run_python(env, "-c", PARTIAL).stdout.splitlines()[-1])
    assert second == [True, 0, 4, 0, 0], second


GEMMA2 = textwrap.dedent("""
    import dataclasses, json, warnings
    import torch, transformers, trident

    config = transformers.Gemma2Config(hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, vocab_size=96)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    ids = torch.randint(0, 96, (1, 6))
    assert type(model.model.layers[0].mlp.act_fn.act) is __import__("functools").partial

    def generate():
        return model.generate(ids, max_new_tokens=4, do_sample=False,
                              cache_implementation="static", disable_compile=True)

    eager = generate()
    warnings.simplefilter("ignore")  # (this test counts compiles, not warnings)
    model.forward = trident.jit(model.forward)
    same = torch.equal(generate(), eager)
    print("STATS " + json.dumps([same, dataclasses.asdict(model.forward.stats)]))
""")


# A dict in the order of a set of str, as transformers' create_masks_for_generate makes the
# masks of a hybrid model: Python's hash seed decides the order, and a function that iterates
# the dict returns its values in that order
ITERATED = textwrap.dedent("""
    import dataclasses, json
    import torch, trident

    def scaled(x, masks):
        return [x * m for m in masks.values()]

    masks = {k: torch.full((2,), float(len(k))) for k in {"sliding_attention", "full_attention"}}
    x = torch.ones(2)
    f = trident.jit(scaled)
    same = all(all(torch.equal(a, b) for a, b in zip(f(x, masks), scaled(x, masks)))
               for _ in range(2))
    print("STATS " + json.dumps([list(masks), same, dataclasses.asdict(f.stats)]))
""")


def test_a_function_that_iterates_a_dict_of_another_key_order_compiles_again(subprocess_env):
    """Issue 27: a dict whose keys come in another order (another hash seed) is another object
    to code that iterates it: the second process's call of ``scaled`` returns its values in
    its own order, as eager does, from a specialization of its own (its trace read the order:
    Note [Dict orders] in lower/orders.py). The next test's dict, read by key only, loads."""
    def run(seed):
        lines = run_python(dict(subprocess_env, PYTHONHASHSEED=seed), "-c",
                           ITERATED).stdout.splitlines()
        (line,) = [l for l in lines if l.startswith("STATS ")]
        return json.loads(line[6:])

    keys0, same0, first = run("0")
    keys1, same1, second = run("1")
    assert keys0 != keys1 and same0 and same1  # (seeds 0 and 1 order the set apart)
    assert (first["compiles"], first["hits"]) == (1, 1), first
    assert (second["compiles"], second["hits"], second["fallbacks"]) == (1, 1, 0), second


def _gemma2_restart(env: dict, seeds: tuple[str, str]) -> dict:
    """The second process's stats, after a first that compiled (each under its
    ``PYTHONHASHSEED``); both processes' tokens equal to eager's."""
    def run(seed, **more):
        lines = run_python(dict(env, PYTHONHASHSEED=seed, **more), "-c",
                           GEMMA2).stdout.splitlines()
        (line,) = [l for l in lines if l.startswith("STATS ")]
        return json.loads(line[6:])

    same, first = run(seeds[0])
    assert same and (first["compiles"], first["fallbacks"]) == (2, 0), first
    same, second = run(seeds[1], TRIDENT_FORBID_COMPILE="1")
    assert same, second
    return second


def test_a_tiny_gemma2_restarts_warm(subprocess_env):
    """Gemma2's MLP holds ``GELUTanh`` (a partial of ``F.gelu``): a second process's
    ``generate`` traces and builds nothing (``TRIDENT_FORBID_COMPILE``), its tokens equal to
    eager's. (Both under one hash seed: see the next test.)"""
    second = _gemma2_restart(subprocess_env, ("0", "0"))
    assert (second["traces"], second["compiles"], second["misses"], second["fallbacks"],
            second["hits"]) == (0, 0, 0, 0, 4), second


def test_a_tiny_gemma2_restarts_warm_under_another_hash_seed(subprocess_env):
    """Seeds 0 and 1 order ``{"sliding_attention", "full_attention"}`` differently (the
    attention_mask dict transformers' create_masks_for_generate makes): Gemma2 reads it by
    key only, so its tree checks the dict in any order (Note [Dict orders] in
    lower/orders.py) and the second process loads both specializations."""
    second = _gemma2_restart(subprocess_env, ("0", "1"))
    assert (second["traces"], second["compiles"], second["misses"], second["fallbacks"],
            second["hits"]) == (0, 0, 0, 0, 4), second
