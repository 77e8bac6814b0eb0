"""Note [Argument trees] (trident/lower/flatten.py): calls bound and flattened natively, results rebuilt.

Each test is one kind of fault found by an adversarial pass: the call must return what eager
returns (values, types, identity, the arguments' state afterwards) or run eagerly with a warning.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import warnings

import numpy as np
import pytest
import torch

import trident
from _trident_helpers import assert_same


def run_both(f, *args, **kwargs):
    """(Trident's result, eager's result, the warnings Trident raised)."""
    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = jf(*args, **kwargs)
    return jf, got, f(*args, **kwargs), [str(w.message) for w in caught]


def test_native_and_python_flattening_agree():
    class Obj:
        def __init__(self):
            self.t, self.n, self.name, self.items = torch.ones(2), 3, "a", [torch.zeros(1), None]

    x = torch.randn(3)
    obj = Obj()
    calls = [((x,), {}), ((x, (x, 2.0)), {}), ((x,), {"d": {"b": x, "a": [1, True]}}),
             ((x, obj), {}), ((x, obj, obj), {}),
             ((x,), {"e": collections.namedtuple("P", "a b")(x, 1)})]
    for args, kwargs in calls:
        def f(*a, **k):
            return a[0] + 1

        jf = trident.jit(f)
        jf(*args, **kwargs)
        tree, leaves = jf._flatten_native(args, kwargs)
        assert tree == 0
        python = jf._flatten(args, kwargs).leaves
        assert leaves[0] == python[0]  # the tree's key
        assert len(leaves) == len(python) and all(a is b for a, b in zip(leaves[1:], python[1:]))


def test_dict_and_keyword_order_is_guarded():
    def f(x, **kw):
        return [x * v for v in kw.values()]

    jf = trident.jit(f)
    x = torch.ones(2)
    for kw in ({"a": 1.0, "b": 2.0}, {"b": 2.0, "a": 1.0}, {"a": 1.0, "b": 2.0}):
        got, want = jf(x, **kw), f(x, **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert (jf.stats.compiles, jf.stats.hits) == (2, 1)

    def g(x, d):
        return {k: x * v for k, v in d.items()}

    jg = trident.jit(g)
    for d in ({"a": 1.0, "b": 2.0}, {"b": 2.0, "a": 1.0}):
        assert list(jg(x, d)) == list(g(x, d))


@pytest.mark.parametrize("make", [lambda: np.ones(3), lambda: collections.deque([1.0]),
                                  lambda: bytearray(b"ab")], ids=["numpy", "deque", "bytearray"])
def test_objects_whose_contents_no_check_sees_run_eagerly(make):
    def f(x, a):
        return x * float(a[0])

    jf = trident.jit(f)
    x, a = torch.ones(2), make()
    with pytest.warns(UserWarning, match="whose contents Trident cannot guard"):
        jf(x, a)
    a[0] = 5
    assert torch.equal(jf(x, a), f(x, a))
    assert jf.stats.compiles == 0 and jf.stats.fallbacks == 2


def test_slots_objects_run_eagerly():
    class S:
        __slots__ = ("k",)

    s = S()
    s.k = 2.0
    jf, got, want, caught = run_both(lambda x, s: x * s.k, torch.ones(2), s)
    assert torch.equal(got, want) and any("cannot guard" in w for w in caught)


def test_sets_of_numbers_run_eagerly_and_sets_of_str_are_compared():
    x = torch.ones(2)

    class O:
        pass

    o = O()
    o.v = frozenset({0.0})
    jf, got, want, caught = run_both(lambda x, o: x / next(iter(o.v)), x, o)
    assert torch.equal(got, want) and jf.stats.compiles == 0

    def adds(x, s):
        s.add("c")
        return x + len(s)

    s1, s2 = {"a"}, {"a"}
    jf = trident.jit(adds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            assert torch.equal(jf(x, s1), adds(x, s2)) and s1 == s2


def _to_format(x, memory_format, layout=torch.strided, dtype=torch.float64, device="cpu"):
    return (x.to(dtype).clone(memory_format=memory_format),
            torch.zeros(2, layout=layout, dtype=dtype, device=torch.device(device)))


def test_torch_constants_as_arguments_are_guarded_by_value():
    """dtypes, devices, memory formats and layouts passed as arguments (OpInfo passes
    ``memory_format=``) are constants of a specialization: a call with another one misses."""
    x = torch.randn(2, 3, 4, 5)
    jf = trident.jit(_to_format)
    calls = [dict(memory_format=torch.channels_last), dict(memory_format=torch.contiguous_format),
             dict(memory_format=torch.channels_last, dtype=torch.float16),
             dict(memory_format=torch.channels_last)]
    for kwargs in calls:
        assert_same(jf(x, **kwargs), _to_format(x, **kwargs))
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (3, 0, 1), jf.stats


def _sliced(x, index):
    return x[index], x.__getitem__(index).sum()


def test_slices_are_guarded_by_their_bounds_types_and_values():
    """A slice of ints (OpInfo's ``__getitem__``) is a constant of a specialization, its bounds
    compared by exact type: ``slice(True, 3)`` equals ``slice(1, 3)`` in Python and ``x[1.0:3]``
    raises where ``x[1:3]`` does not, so each compiles or runs on its own."""
    x = torch.randn(5, 4)
    jf = trident.jit(_sliced)
    for index in (slice(1, 3), slice(1, 3), (slice(None, None, 2), 1), slice(True, 3),
                  slice(1, 3), (slice(None, None, 2), 1), slice(1.0, 3)):
        try:
            want = _sliced(x, index)
        except TypeError as e:
            with pytest.warns(UserWarning, match="cannot guard"), pytest.raises(type(e)):
                jf(x, index)
            continue
        assert_same(jf(x, index), want)
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (3, 3, 1), jf.stats


def _calls_an_operator(op):
    def call(*args):
        return op(*args)
    return call


def test_torch_operators_are_checked_by_identity():
    """A torch operator (``torch.ops.aten.mul.Tensor``, a packet such as ``torch.ops.aten.add``)
    passed as an argument or read from a closure (OpInfo's ``op.op``) is checked by identity
    (its ``__dict__`` holds the dispatcher's caches, keyed by DispatchKey: it ran eagerly);
    another operator compiles again."""
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    jf = trident.jit(lambda op, x, y: op(x, y))
    for op in (torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.add,
               torch.ops.aten.add, torch.ops.aten.mul.Tensor):
        assert_same(jf(op, x, y), op(x, y))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 3, 0), jf.stats
    for op in (torch.ops.aten._safe_softmax.default, torch.ops.aten._softmax):
        f = _calls_an_operator(op)
        jf = trident.jit(f)
        args = (x, 1) if op is torch.ops.aten._safe_softmax.default else (x, 1, False)
        for _ in range(2):
            assert_same(jf(*args), f(*args))
        assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 1, 0), jf.stats


def test_complex_constants_compare_bit_patterns():
    class O:
        pass

    o, x = O(), torch.ones(2)
    o.v = complex(0.0, 1.0)
    f = lambda x, o: x / o.v.real  # noqa: E731
    jf = trident.jit(f)
    jf(x, o)
    o.v = complex(-0.0, 1.0)
    assert torch.equal(jf(x, o), f(x, o))  # -inf, not +inf
    assert jf.stats.compiles == 2


def test_deep_arguments_run_eagerly():
    deep: list = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    jf, got, want, caught = run_both(lambda x, d: x + len(d), torch.ones(2), deep)
    assert torch.equal(got, want) and any("too deeply" in w for w in caught)


@dataclasses.dataclass
class D:
    y: torch.Tensor


def test_repeated_results_and_returned_arguments_keep_identity():
    x = torch.ones(2)
    for f, check in [(lambda x: (lambda d: [d, d])(D(x + 1)), lambda r: r[0] is r[1]),
                     (lambda x: (lambda l: (l, l))([x + 1]), lambda r: r[0] is r[1]),
                     (lambda t: t, None)]:
        jf = trident.jit(f)
        arg = (x, x + 1) if check is None else x
        for _ in range(2):
            r = jf(arg)
            assert (r is arg) if check is None else check(r)
        assert jf.stats.fallbacks == 0, jf.stats


def test_function_that_mutates_its_arguments_runs_eagerly_with_eager_state():
    def f(x, log, obj):
        log.append(1)
        obj.count = getattr(obj, "count", 0) + 1
        return x * 2

    class O:
        pass

    jf = trident.jit(f)
    mine, theirs = ([], O()), ([], O())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            assert torch.equal(jf(torch.ones(2), *mine), f(torch.ones(2), *theirs))
    assert mine[0] == theirs[0] and mine[1].count == theirs[1].count == 3
    assert jf.stats.compiles == 0


def test_reassigned_defaults_are_seen():
    def f(x, scale=[1.0], *, shift=0.0):
        return x * len(scale) + shift

    jf = trident.jit(f)
    x = torch.ones(2)
    assert torch.equal(jf(x), f(x))
    f.__defaults__ = ([1.0, 2.0, 3.0],)
    assert torch.equal(jf(x), f(x))
    f.__kwdefaults__ = {"shift": 5.0}
    assert torch.equal(jf(x), f(x))
    assert jf.stats.compiles == 3 and "f.__kwdefaults__['shift'] changed" in jf.stats.miss_reasons[-1]


_SEEN_CALLS: list = []


def _counting_hook(x):  # its content key reads a global list that grows with every call
    _SEEN_CALLS.append(1)
    return x


def test_identity_checked_function_keeps_its_words_while_its_globals_change():
    # Found on the GPU: a wrapper put in place of model.forward read changing globals (the
    # JitFunction's counters, a list it appended to); the model reached it as an attribute the
    # trace never calls, and every slow-path call got a new argument tree: the decode step
    # recompiled on every call until the specialization limit.
    class Holder:
        pass

    holder = Holder()
    holder.hook = _counting_hook  # reached through the argument, never called by f

    def f(h, x):
        return x * 2

    jf = trident.jit(f)
    x, y = torch.randn(3), torch.randn(5)
    assert torch.equal(jf(holder, x), x * 2)
    holder.hook(x)
    assert torch.equal(jf(holder, y), y * 2)  # a miss, through the Python flatten
    assert "hook" not in jf.stats.miss_reasons[-1]
    assert len(jf._trees) == 1
    assert torch.equal(jf(holder, x), x * 2)
    assert jf.stats.misses == 2 and jf.stats.fallbacks == 0


def test_content_key_of_a_function_reading_a_jit_function_ignores_its_counters():
    from trident.identity import function_key

    jf = trident.jit(lambda x: x + 1)
    globals()["_JF"] = jf

    def wrapper(x):
        return _JF(x)  # noqa: F821 (the global set above)

    before = function_key(wrapper)
    for n in range(3):
        wrapper(torch.randn(n + 1))
    assert jf.stats.misses >= 1 and function_key(wrapper) == before
