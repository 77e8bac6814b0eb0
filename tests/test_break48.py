"""An adversarial pass over odd inputs, Python state that changes between calls and the
callables a user jits (CPU machine, session 48): each fault found is a test of its whole kind,
against eager."""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch

import trident
from _trident_helpers import assert_same, counts, run_python, said


# ---- Note [Identity questions] (lower/state/identity.py) -------------------------------------

SEEN: dict = {}  # id -> factor: a memo keyed by address, as user code keeps one


class Holder:
    def __init__(self, w):
        self.w = w


def _by_id(x, o):
    return x * (2 if id(x) in SEEN else 3)


def _get_by_id(x, o):
    return x * SEEN.get(id(o.w), 3)


def _by_object_id(x, o):
    return x * SEEN.get(id(o), 3)


def _sorted_by_id(x, o):
    return torch.cat(sorted([x, o.w], key=id))


def _by_hash(x, o):
    return x * (hash(x) % 5)


def _by_dunder_hash(x, o):
    return x * (x.__hash__() % 5)


def _ids_compared(x, o):
    return x * (2 if id(x) < id(o.w) else 3)


_IDENTITY = {  # each: the function; what changes between calls (an argument, a global)
    "id(x) in a memo": (_by_id, "memo"),  # (stale before: the fake's id is in no memo)
    "memo.get(id(o.w))": (_get_by_id, "object"),  # (stale before)
    "memo.get(id(o)) of an equal object": (_by_object_id, "object"),  # (stale before)
    "sorted(key=id)": (_sorted_by_id, None),  # (stale before: the fakes' order)
    "hash(x)": (_by_hash, None),  # (stale before)
    "x.__hash__()": (_by_dunder_hash, None),  # (stale before)
    "id(x) < id(o.w)": (_ids_compared, None),  # (stale before)
}


@pytest.mark.parametrize("case", list(_IDENTITY))
def test_identity_questions_run_eagerly(case):
    """Note [Identity questions]: what a function computes from ``id()`` or ``hash()`` of a
    tensor or an object of the call was the trace's answer (a fake tensor's address, the
    trace's object's), baked into the plan: every hit returned it, also after the memo or the
    object changed. Such a call runs eagerly, with one warning; each call equals eager."""
    fn, change = _IDENTITY[case]
    x = torch.arange(1., 7.)
    objs = [Holder(torch.arange(6.)), Holder(torch.arange(6.))]
    SEEN.clear()
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            o = objs[0]
            if step == 2 and change == "memo":
                SEEN[id(x)] = 1
            elif change == "object":
                SEEN[id(objs[0].w)] = SEEN[id(objs[0])] = 5
                o = objs[step // 2]  # an object of equal contents from the third call on
            assert_same(jf(x, o), fn(x, o))
    SEEN.clear()
    assert counts(jf) == (0, 0, 4), jf.stats
    assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")
    assert said(caught, "identity or hash"), said(caught, "trident")


def test_hash_of_a_number_is_served():
    """The hash of a number or None is the same in every process and for every object of equal
    value: still served."""
    def fn(x):
        return x * (hash(7) % 5) + hash(None) % 2

    x = torch.arange(6.)
    jf = trident.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            assert_same(jf(x), fn(x))
    assert counts(jf) == (1, 1, 0), jf.stats


_HASH_OF_A_NAME = textwrap.dedent("""
    import sys, warnings, torch, trident

    @trident.jit
    def scaled(x, name):
        return x * (hash(name) % 1000)

    x = torch.ones(2)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = scaled(x, "query")
    assert torch.equal(got, x * (hash("query") % 1000)), (got, hash("query") % 1000)
    print(scaled.stats.compiles, scaled.stats.hits, scaled.stats.fallbacks)
""")


def test_hash_of_a_str_in_another_process(subprocess_env):
    """Note [Identity questions]: ``hash`` of a str depends on the process's hash seed; a
    specialization stored by one process returned its hash in the next, whose seed differs
    (stale before: a hit with the first process's value). Both run eagerly."""
    for seed in ("1", "2"):
        env = dict(subprocess_env, PYTHONHASHSEED=seed)
        assert run_python(env, "-c", _HASH_OF_A_NAME).stdout.split() == ["0", "0", "1"]
