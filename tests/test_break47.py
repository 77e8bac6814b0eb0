"""An adversarial pass over Python state that changes between calls and odd inputs (CPU
machine, session 47): each fault found is a test of its whole kind, against eager."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import trident
from _trident_helpers import assert_same, counts, run_python, said


# ---- Note [Conversions inside ops] (lower/conversions.py) -------------------------------------

class Index:
    """An index whose value is a class attribute, read by its ``__index__``."""
    v = 1

    def __index__(self):
        return Index.v


class Pair:
    """A sequence whose items are a class attribute, read by ``__len__`` and ``__getitem__``."""
    v = (3, 2)

    def __len__(self):
        return len(Pair.v)

    def __getitem__(self, i):
        return Pair.v[i]


_CONVERTED = {  # a function of (x, o); o; the change of o's class attribute
    "x[o]": (lambda x, o: x[o], Index, 0),  # stale before: Tensor.__getitem__ converts
    "x[o, 0]": (lambda x, o: x[o, 0], Index, 0),  # (stale before)
    "F.pad(x, (o, o))": (lambda x, o: F.pad(x, (o, o)), Index, 0),  # (stale before)
    "x[:o]": (lambda x, o: x[:o], Index, 0),
    "x.flip(o)": (lambda x, o: x.flip(o), Index, 0),  # (converted as torch parses: guarded)
    "torch.zeros(o)": (lambda x, o: torch.zeros(o) + x.sum(), Index, 3),
    "x.repeat(o, 1)": (lambda x, o: x.repeat(o, 1), Index, 2),
    "x[s]": (lambda x, o: x.flatten()[o], Pair, (1, 0)),
    "torch.tensor(s)": (lambda x, o: torch.tensor(o) + x.sum(), Pair, (5, 6)),
}


@pytest.mark.parametrize("case", list(_CONVERTED))
def test_user_conversions_inside_ops_run_eagerly(case):
    """Note [Conversions inside ops]: torch converts an op's argument with its class's
    ``__index__`` (a sequence's ``__len__`` and ``__getitem__``) from C inside the op, where the recording
    does not watch: a hit returned the trace's ``x[1]`` after ``Index.v = 0``. A call that
    passes an object whose protocol method is user code to a torch op runs eagerly, with one
    warning; each call equals eager, before and after the change."""
    fn, cls, changed = _CONVERTED[case]
    first = cls.v
    x = torch.arange(6.).reshape(2, 3)
    jf = trident.jit(fn)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for value in (first, changed):
                cls.v = value
                for _ in range(2):
                    assert_same(jf(x, cls()), fn(x, cls()))
    finally:
        cls.v = first
    assert counts(jf) == (0, 0, 4), jf.stats
    assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")
    assert said(caught, f"{cls.__name__}.__"), said(caught, "trident")


def test_library_conversions_are_served():
    """An ``IntEnum`` member, a numpy-free int subclass of the standard library, converts with
    int's own C slots: no user code, still served."""
    import enum

    class Axis(enum.IntEnum):
        ROWS = 0

    def f(x, o):
        return x[o] * 2

    x = torch.arange(6.).reshape(2, 3)
    jf = trident.jit(f)
    for _ in range(3):
        assert_same(jf(x, Axis.ROWS), f(x, Axis.ROWS))
    assert counts(jf) == (1, 2, 0), jf.stats


# ---- Note [Inference mode inside] (lower/source_lines.py) -------------------------------------

def inference_block(x):
    with torch.inference_mode():
        y = x * 2
    return y


def normal_block(x):  # called under inference mode
    with torch.inference_mode(False):
        y = x * 2
    return y


@torch.inference_mode()
def _decorated(x):
    return x + 1


def decorated_helper(x):
    return _decorated(x)


def both_kinds(x):
    with torch.inference_mode():
        y = x * 2
    return y, x + 1


@pytest.mark.parametrize("fn, outer", [(inference_block, False), (normal_block, True),
                                       (decorated_helper, False), (both_kinds, False)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_inference_mode_switched_inside_runs_eagerly(fn, outer):
    """Note [Inference mode inside]: eager's tensors made inside ``torch.inference_mode()``
    are inference tensors (an in-place update outside the mode raises); a hit ran under the
    call's mode and returned plain tensors (and inference tensors for ``inference_mode(False)``
    inside a call under the mode). Each result equals eager's, its kind included, and an
    in-place update of it behaves as eager's; one warning."""
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with torch.inference_mode(outer):
                x = torch.ones(3)
                want, got = fn(x), jf(x)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            for a, b in zip(got, want):
                assert_same(a, b)
                assert a.is_inference() == b.is_inference()
                failed = []
                for t in (a, b):
                    try:
                        t.add_(1)
                    except RuntimeError as e:
                        failed.append(str(e))
                assert len(failed) in (0, 2), failed
    assert counts(jf) == (0, 0, 3), jf.stats
    assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")
    assert said(caught, "inference mode"), said(caught, "trident")


def test_inference_mode_outside_is_served():
    """The call's own inference mode is guarded, not refused: a function called under
    ``torch.inference_mode()`` that does not switch it is served, its results inference
    tensors as eager's."""
    def f(x):
        return x * 2

    jf = trident.jit(f)
    with torch.inference_mode():
        for _ in range(3):
            x = torch.ones(3)
            got, want = jf(x), f(x)
            assert_same(got, want)
            assert got.is_inference() and want.is_inference()
    assert counts(jf) == (1, 2, 0), jf.stats


# ---- a coroutine function (capture.py) --------------------------------------------------------

async def doubled(x):
    return x * 2


def test_coroutine_function_runs_eagerly_without_a_stray_warning():
    """An ``async def`` returns a coroutine; the trace's own coroutine was dropped unawaited,
    and its collection warned "coroutine 'doubled' was never awaited" (a RuntimeWarning eager
    does not give). Each call returns eager's coroutine, which awaits to eager's result; one
    warning, Trident's."""
    import asyncio
    import gc

    x = torch.ones(3)
    jf = trident.jit(doubled)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert_same(asyncio.run(jf(x)), asyncio.run(doubled(x)))
        gc.collect()
    assert counts(jf) == (0, 0, 3), jf.stats
    assert not said(caught, "never awaited"), said(caught, "never awaited")
    assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")


# ---- Note [Reads through super] (lower/state/supers.py) ---------------------------------------

class Base:
    k = 1.0

    def scale(self, x):
        return x * 2


class Middle(Base):
    pass


class Derived(Middle):
    k = 3.0

    def zero_argument(self, x):
        return x * super().k

    def two_arguments(self, x):
        return x * super(Derived, self).k

    def kept(self, x):
        s = super()
        return x * s.k

    def method(self, x):  # served: the method's code is recorded
        return super().scale(x)


def _rebind(cls, name, value):
    return lambda: setattr(cls, name, value)


_SUPER_READS = {  # a method of Derived; the changes made between calls (each undone after)
    "super().k, the base's changed": ("zero_argument", [(Base, "k", 7.0)]),
    "super().k, a class between gains k": ("zero_argument", [(Middle, "k", 5.0)]),
    "super(Derived, self).k": ("two_arguments", [(Base, "k", 11.0)]),
    "s = super(); s.k": ("kept", [(Base, "k", 13.0)]),
}


@pytest.mark.parametrize("case", list(_SUPER_READS))
def test_reads_through_super_run_eagerly(case):
    """Note [Reads through super]: ``super().k`` is looked up on an object a call made, which
    no chain names: a hit kept the trace's ``Base.k`` after ``Base.k = 7.0``, or after
    ``Middle`` (between them in the MRO) gained its own ``k``. Such a function runs eagerly,
    with one warning; each call equals eager."""
    name, changes = _SUPER_READS[case]
    obj = Derived()
    fn = getattr(obj, name)
    x = torch.ones(3)
    jf = trident.jit(fn)
    saved = [(cls, attr, cls.__dict__.get(attr)) for cls, attr, _ in changes]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                assert_same(jf(x), fn(x))
            for cls, attr, value in changes:
                setattr(cls, attr, value)
                for _ in range(2):
                    assert_same(jf(x), fn(x))
    finally:
        for cls, attr, value in saved:
            if value is None:
                delattr(cls, attr)
            else:
                setattr(cls, attr, value)
    assert counts(jf) == (0, 0, 2 + 2 * len(changes)), jf.stats
    assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")
    assert said(caught, "super()"), said(caught, "trident")


def test_methods_called_through_super_are_served():
    """``super().scale(x)`` calls a method, whose code the trace records: served, and a new
    ``Base.scale`` compiles again."""
    obj = Derived()
    x = torch.ones(3)
    jf = trident.jit(obj.method)
    saved = Base.scale
    try:
        for _ in range(2):
            assert_same(jf(x), obj.method(x))
        Base.scale = lambda self, x: x * 9
        for _ in range(2):
            assert_same(jf(x), obj.method(x))
    finally:
        Base.scale = saved
    assert counts(jf) == (2, 2, 0), jf.stats


# ---- Process state that Dynamo caches ---------------------------------------------------------
# A design judged type questions by wrapping the builtins ``isinstance`` and ``issubclass`` while
# a trace ran (taken out): Dynamo caches the builtins' identities the first time it needs them,
# so a Trident trace that came first in a process left Dynamo unable to trace the real
# ``isinstance`` for the rest of it (a graph break in every transformers model's forward).

_DYNAMO_AFTER_A_TRACE = '''
import torch, trident

def typed(x):
    return x * 2 if isinstance(x, torch.Tensor) and issubclass(torch.Tensor, object) else x

jf = trident.jit(lambda x: typed(x) + 1)
assert torch.equal(jf(torch.ones(2)), torch.ones(2) * 3) and jf.stats.compiles == 1
f = torch.compile(typed, backend="eager", fullgraph=True)  # a graph break raises
assert torch.equal(f(torch.ones(2)), torch.ones(2) * 2)
print("ok")
'''


def test_a_trace_first_leaves_dynamo_able_to_trace_the_builtins(subprocess_env):
    assert run_python(subprocess_env, "-c", _DYNAMO_AFTER_A_TRACE).stdout.strip() == "ok"
