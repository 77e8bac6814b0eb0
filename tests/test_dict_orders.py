"""Note [Dict orders] (trident/lower/orders.py): a dict argument whose key order the trace did
not read is checked in any order, so that a process whose hash seed orders it otherwise loads
the stored specialization; one whose order it read (iterated, listed, passed on to code that
iterates it) is checked in order and compiles again for another order, equal to eager. Each
call is compared with eager (``torch.equal``), with exact counts and no fallback."""

from __future__ import annotations

import json
import textwrap
import types
import warnings

import pytest
import torch

import trident
from _trident_helpers import run_python


def _masks(order) -> dict:
    return {k: torch.full((2,), float(len(k) + ord(k[0]))) for k in order}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


AB, BA = ("ab", "cd"), ("cd", "ab")
ABC, CBA = ("ab", "cd", "ef"), ("ef", "cd", "ab")
# three keys: a reversal keeps the middle key, a rotation moves every key; the order probe
# watches the dict rather than trying orders (Note [Dict orders]), so neither is missed
ABC4 = (("ab", "cd", "ef"), ("ef", "cd", "ab"), ("cd", "ef", "ab"), ("ab", "cd", "ef"))
ABC2 = (ABC, ABC[1:] + ABC[:1], ABC, ABC[1:] + ABC[:1])
ABCD = ("ab", "cd", "ef", "gh")
FOUR = (ABCD, ABCD[::-1], ABCD[1:] + ABCD[:1], ("gh", "ab", "ef", "cd"))


def _first_is(x, d):  # one of the three orders puts "ef" first
    return x * 2 if next(iter(d)) == "ef" else x * 3


# name: (function of (x, arg), the argument made from an order, orders of the 4 calls,
#        compiles); one compile: the order serves any order; more: each order its own (the
#        orders of ABC2, ABC4 and FOUR are 2, 3 and 4)
KINDS = {
    "read by key": (lambda x, d: x * d["ab"] + d["cd"], _masks, (AB, BA, AB, BA), 1),
    "read by .get and in": (lambda x, d: x * d.get("ab") + ("cd" in d), _masks,
                            (AB, BA, AB, BA), 1),
    "read by key, in a list": (lambda x, l: x * l[0]["ab"] - l[0]["cd"],
                               lambda o: [_masks(o)], (AB, BA, AB, BA), 1),
    "values iterated": (lambda x, d: [x * m for m in d.values()], _masks, (AB, BA, AB, BA), 2),
    "keys returned": (lambda x, d: (x + d["ab"], list(d)), _masks, (AB, BA, AB, BA), 2),
    "first value": (lambda x, d: x * next(iter(d.values())), _masks, (AB, BA, AB, BA), 2),
    "values summed": (lambda x, d: sum(d.values()) * x, _masks, (AB, BA, AB, BA), 2),
    "passed to torch.stack": (lambda x, d: torch.stack(list(d.values())) * x, _masks,
                              (AB, BA, AB, BA), 2),
    "items formatted": (lambda x, d: (x * d["ab"], ",".join(k for k, _ in d.items())),
                        _masks, (AB, BA, AB, BA), 2),
    # three and four keys
    "three keys, read by key": (lambda x, d: x * d["ab"] + d["ef"], _masks, ABC4, 1),
    "four keys, read by key": (lambda x, d: x * d["gh"] - d["cd"] * d["ab"], _masks, FOUR, 1),
    "three keys, middle value": (lambda x, d: x * list(d.values())[1], _masks, ABC4, 3),
    "three keys, first key compared": (_first_is, _masks, ABC4, 3),
    "four keys, sorted": (lambda x, d: x * d[sorted(d)[0]], _masks, FOUR, 4),
    # every way C code reads a dict's order, through the dict's own methods
    "copied with dict()": (lambda x, d: x * dict(d)["ab"], _masks, ABC2, 2),
    "unpacked into a dict": (lambda x, d: x * {**d}["ab"], _masks, ABC2, 2),
    "passed as **kwargs": (lambda x, d: (lambda **kw: x * kw["ab"])(**d), _masks, ABC2, 2),
    "made a set of": (lambda x, d: x * len(set(d)), _masks, ABC2, 2),
    "written": (lambda x, d: x * d.setdefault("ab", None), _masks, ABC2, 2),
    # read through its class's methods, which the watch's own do not see: a C method of
    # dict's is a C call that the recording reports (a 3-key dict's middle item, which a
    # reversal leaves where it is, was missed: served another order's specialization)
    "keys through dict.keys": (lambda x, d: x * d[list(dict.keys(d))[0]], _masks,
                               (AB, BA, AB, BA), 2),
    "values through dict.values": (lambda x, d: x * list(dict.values(d))[0], _masks,
                                   ABC4, 3),
    "middle key through dict.keys": (lambda x, d: x * d[list(dict.keys(d))[1]], _masks,
                                     ABC4, 3),
    "middle value through dict.values": (lambda x, d: x * list(dict.values(d))[1], _masks,
                                         ABC4, 3),
    "middle item through dict.items": (lambda x, d: x * list(dict.items(d))[1][1], _masks,
                                       ABC4, 3),
    "middle value through dict.copy": (lambda x, d: x * list(dict.copy(d).values())[1],
                                       _masks, ABC4, 3),
    # a slot wrapper through the class (no C call event): the watch holds the items reversed,
    # so the second trace differs and the order is checked
    "first key through dict.__iter__": (lambda x, d: x * d[next(dict.__iter__(d))], _masks,
                                        ABC4, 3),
    # several dicts in one call: one probe watches each
    "two dicts, read by key": (lambda x, p: x * p[0]["ab"] + p[1]["cd"],
                               lambda o: (_masks(o), _masks(o)), (AB, BA, AB, BA), 1),
    "two dicts, one iterated": (lambda x, p: [x * p[0]["ab"]] + list(p[1].values()),
                                lambda o: (_masks(o), _masks(o[::-1])), ABC4, 3),
    "a dict of dicts, read by key": (lambda x, d: x * d["cd"]["ab"],
                                     lambda o: {k: _masks(o) for k in o}, ABC4, 1),
    # not watched: checked in order
    "one dict passed twice": (lambda x, p: x * p[0]["ab"] + p[1]["cd"],
                              lambda o: (lambda d: (d, d))(_masks(o)), ABC4, 3),
    "in an object, read by key": (lambda x, c: x * c.masks["ab"],
                                  lambda o: types.SimpleNamespace(masks=_masks(o)),
                                  (AB, BA, AB, BA), 2),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_dict_in_another_order(kind):
    """Calls in the orders given, each equal to eager: one compile where the trace did not
    read the order (the other calls hit), one per order where it did."""
    fn, make, orders, compiles = KINDS[kind]
    f, x = trident.jit(fn), torch.arange(2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for order in orders:
            arg = make(order)
            assert _same(f(x, arg), fn(x, arg)), order
    s = f.stats
    assert (s.compiles, s.misses, s.hits, s.fallbacks) == (compiles, compiles,
                                                           4 - compiles, 0), s


def _either(x, d, iterate):
    if iterate:
        return [x * m for m in d.values()]
    return x * d["ab"] + d["cd"]


def test_a_dict_read_by_key_then_iterated():
    """One function reads the dict by key (``iterate`` False: one specialization for any
    order) and iterates it (True: one per order, though the first one's tree accepts the
    dict in any order and the second's in its order); calls of each kind after each other
    are served by the specialization of their kind and order."""
    f, x = trident.jit(_either), torch.arange(2.0)
    calls = [(AB, False), (BA, False), (AB, True), (BA, True), (AB, False), (AB, True),
             (BA, True), (BA, False)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for order, iterate in calls:
            d = _masks(order)
            assert _same(f(x, d, iterate), _either(x, d, iterate)), (order, iterate)
    s = f.stats
    assert (s.compiles, s.misses, s.hits, s.fallbacks) == (3, 3, 5, 0), s


# ---- a new process under another hash seed ---------------------------------------------------

# a dict in the order of a set of str, as transformers' create_masks_for_generate makes a
# hybrid model's masks: the hash seed orders it
SEEDED = textwrap.dedent("""
    import dataclasses, json, sys
    import torch, trident

    def either(x, masks, iterate):
        if iterate:
            return [x * m for m in masks.values()]
        return x * masks["sliding_attention"] + masks["full_attention"]

    names = {"sliding_attention", "full_attention"} | set(sys.argv[2:])
    masks = {k: torch.full((2,), float(len(k))) for k in names}
    x = torch.arange(2.0)
    f = trident.jit(either)
    same, stats = [], []
    for iterate in json.loads(sys.argv[1]):
        r, e = f(x, masks, iterate), either(x, masks, iterate)
        same.append(torch.equal(r, e) if iterate is False else
                    all(torch.equal(a, b) for a, b in zip(r, e)))
        stats.append(dataclasses.asdict(f.stats))
    print("STATS " + json.dumps([list(masks), all(same), stats]))
""")


def _seeded(env: dict, seed: str, calls: list, *keys: str, **more) -> tuple:
    lines = run_python(dict(env, PYTHONHASHSEED=seed, **more), "-c", SEEDED,
                       json.dumps(calls), *keys).stdout.splitlines()
    (line,) = [l for l in lines if l.startswith("STATS ")]
    keys, same, stats = json.loads(line[6:])
    assert same, stats
    return keys, [(s["traces"], s["compiles"], s["hits"], s["fallbacks"]) for s in stats]


@pytest.mark.parametrize("keys, seed", [((), "1"), (("chunked_attention",), "2")],
                         ids=["two keys", "three keys"])
def test_a_dict_read_by_key_loads_under_another_hash_seed(subprocess_env, keys, seed):
    """Seeds 0 and 1 order the dict of two keys apart, seeds 0 and 2 that of three (a
    rotation: neither the same order nor its reversal); the second process reads the first
    one's specialization (``TRIDENT_FORBID_COMPILE``: no trace, no build)."""
    keys0, first = _seeded(subprocess_env, "0", [False, False], *keys)
    assert first[-1] == (1, 1, 1, 0), first
    keys1, second = _seeded(subprocess_env, seed, [False, False], *keys,
                            TRIDENT_FORBID_COMPILE="1")
    assert keys0 != keys1 and (len(keys0) == 2 or keys0 != keys1[::-1])
    assert second[-1] == (0, 0, 2, 0), second


def test_a_dict_iterated_compiles_again_under_another_hash_seed(subprocess_env):
    """The first process stored a specialization that reads the dict by key and one that
    iterates it; the second, of another order, loads the first and compiles the second
    again (its trace reads the order), each call equal to eager."""
    _, first = _seeded(subprocess_env, "0", [False, True])
    assert first == [(1, 1, 0, 0), (2, 2, 0, 0)], first
    _, second = _seeded(subprocess_env, "1", [False, True, False, True])
    assert second == [(0, 0, 1, 0), (1, 1, 1, 0), (1, 1, 2, 0), (1, 1, 3, 0)], second


def test_the_order_probe_is_timed_as_a_stage_inside_the_trace():
    """Note [Compile stages]: the probe's trace counts as ``order probe`` (and in ``trace``),
    only for a call that holds a candidate dict."""
    def seconds():
        times = trident.config.compile_times()
        return times["trace"], times["order probe"]

    x = torch.arange(2.0)
    trace0, probe0 = seconds()
    f = trident.jit(lambda x, d: x * d["ab"] + d["ef"])
    assert torch.equal(f(x, _masks(ABC)), x * _masks(ABC)["ab"] + _masks(ABC)["ef"])
    trace1, probe1 = seconds()
    assert 0 < probe1 - probe0 < trace1 - trace0
    g = trident.jit(lambda x, d: x * d["ab"])
    assert torch.equal(g(x, {"ab": x}), x * x)  # one key: one order, no probe
    assert seconds()[1] == probe1 and seconds()[0] > trace1
