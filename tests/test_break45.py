"""Faults the adversarial pass of session 45 found, each with a test of its whole kind: every
call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, installed_package


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
            a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _served(jf, fn, calls) -> list[str]:
    """Each of ``calls`` (argument makers) through ``jf`` and ``fn`` (eager), compared with
    ``_same``, arguments after the call too; the warnings ``jf`` gave."""
    caught_all = []
    for make in calls:
        mine, theirs = make(), make()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = jf(*mine)
        caught_all += [str(w.message) for w in caught]
        want = fn(*theirs)
        assert _same(got, want), (got, want, jf.stats.miss_reasons)
        assert all(_same(a, b) for a, b in zip(mine, theirs) if isinstance(a, torch.Tensor))
    return caught_all


# ---- Note [Questions about read values] (lower/values.py) --------------------------------------
# A number taken from a tensor with ``.item()`` or ``.tolist()`` is a SymInt (SymFloat,
# SymBool) in the trace, an int in eager; ``int(t)`` guards and returns an int. A question
# about its Python type or identity answered for the SymInt, with no guard: every call,
# the first included, returned the other branch, and hits went up.

_READ_QUESTIONS = {
    "isinstance of an int item": "v = m.sum().item()\n    c = isinstance(v, int)",
    "isinstance of a float item": "v = m.float().sum().item()\n    c = isinstance(v, float)",
    "isinstance of a bool item": "v = m.any().item()\n    c = isinstance(v, bool)",
    "type of a tolist item": "v = m.tolist()[0]\n    c = type(v) is int",
    "__class__ of an item": "v = m.max().item()\n    c = v.__class__ == int",
    "is of a small int": "v = m.max().item()\n    c = v is THREE",
    "match class": "match m.max().item():\n        case int():\n            c = True\n"
                   "        case _:\n            c = False",
    "a read that a value check fixes": "v = m.sum().item()\n    if v > 0:\n"
                                       "        c = isinstance(v, int)\n    else:\n"
                                       "        c = False",
}


@pytest.mark.parametrize("kind", list(_READ_QUESTIONS), ids=list(_READ_QUESTIONS))
def test_a_question_about_a_read_number_runs_eagerly(kind):
    g = {"torch": torch, "THREE": 3}
    exec(f"def f(x, m):\n    {_READ_QUESTIONS[kind]}\n    return x * 2 if c else x * 3\n", g)
    fn = g["f"]
    jf = trident.jit(fn)
    caught = _served(jf, fn, [lambda: (torch.ones(2), torch.tensor([1, 3]))] * 3)
    assert counts(jf) == (0, 0, 3), jf.stats.miss_reasons
    assert sum("asks Python what a symbolic value is" in w for w in caught) == 1, caught


def test_read_numbers_without_questions_stay_served():
    """What the scan lets through: a read number's text (a guard on its value) and its
    arithmetic, a question about another value, a read returned."""
    def f(x, m):
        v = m.max().item()
        k = len(str(v)) + (2 if isinstance(x, torch.Tensor) else 5)
        return x * k, v

    jf = trident.jit(f)
    calls = [lambda: (torch.ones(2), torch.tensor([1, 3]))] * 2 + \
        [lambda: (torch.ones(2), torch.tensor([1, 30]))]
    assert not _served(jf, f, calls)
    assert counts(jf) == (2, 1, 0), jf.stats.miss_reasons


_LIB = '''
def is_int(v):
    return isinstance(v, int)
'''


def test_a_library_question_about_a_read_number(tmp_path):
    # Note [Questions asked in the trace] (lower/state/asked.py): the library's isinstance of
    # the SymInt that .item() made is seen as the trace calls it
    with installed_package(tmp_path, "trident_readlib45", {"__init__": _LIB}) as lib:
        def f(x, m):
            return x * 2 if lib.is_int(m.sum().item()) else x * 3

        jf = trident.jit(f)
        caught = _served(jf, f, [lambda: (torch.ones(2), torch.tensor([1, 3]))] * 3)
        assert counts(jf) == (0, 0, 3), jf.stats.miss_reasons
        assert sum("asks Python what a symbolic value is" in w for w in caught) == 1, caught


# ---- Note [Instance lookups] (lower/state/instances.py) ----------------------------------------
# ``cfg.a`` of an argument's object is found in its ``__dict__`` only while no class of its MRO
# holds ``a`` as a data descriptor: each such step reads the class's ``a``. A step through an
# item of a plain list, dict or tuple (``cache.layers[0].keys``, an alias of it) ended the
# walk: a property given to the layer's class (or its base) later was never seen, and every hit
# returned the instance dict's tensor (and a hit that writes it wrote the dict, past the
# setter).

_ITEM_READS = {
    "list item": "return cache.layers[0].keys + x",
    "negative index": "return cache.layers[-1].keys + x",
    "an alias of the item": "l = cache.layers[0]\n    return l.keys + x",
    "dict item": "return cache.by_name['a'].keys + x",
    "tuple item": "return cache.pair[0].keys + x",
    "written through the item": "cache.layers[0].keys = cache.layers[0].keys + x\n"
                                "    return cache.layers[0].keys * 1",
    "a loop over the items": "for l in cache.layers:\n        x = x + l.keys\n    return x",
}
_ACCESSES = list(_ITEM_READS)


class _Base45:
    pass


class _Layer45(_Base45):
    def __init__(self):
        self.keys = torch.ones(3)


class _Cache45:
    def __init__(self):
        self.layers = [_Layer45()]
        self.by_name = {"a": self.layers[0]}
        self.pair = (self.layers[0], 1)


def _zeros_property():
    return property(lambda self: torch.zeros(3), lambda self, v: None)


_CLASS_CHANGES = {
    "a property on the class": (_Layer45, "keys", _zeros_property),
    "a property on its base": (_Base45, "keys", _zeros_property),
    "__getattribute__ assigned": (_Layer45, "__getattribute__", lambda: (
        lambda self, n: torch.zeros(3) if n == "keys" else object.__getattribute__(self, n))),
}


@pytest.mark.parametrize("change", list(_CLASS_CHANGES), ids=list(_CLASS_CHANGES))
@pytest.mark.parametrize("access", _ACCESSES, ids=list(_ITEM_READS))
def test_a_class_that_gains_a_descriptor_behind_an_item_is_seen(access, change):
    g = {"torch": torch}
    exec(f"def f(cache, x):\n    {_ITEM_READS[access]}\n", g)
    fn = g["f"]
    jf = trident.jit(fn)
    mine, theirs = _Cache45(), _Cache45()
    x = torch.ones(3)
    for _ in range(2):
        assert torch.equal(jf(mine, x), fn(theirs, x))
    assert counts(jf) == (1, 1, 0), jf.stats.miss_reasons
    cls, name, value = _CLASS_CHANGES[change]
    setattr(cls, name, value())
    try:
        for _ in range(2):
            assert torch.equal(jf(mine, x), fn(theirs, x)), jf.stats.miss_reasons
        assert torch.equal(vars(mine.layers[0])["keys"], vars(theirs.layers[0])["keys"])
    finally:
        delattr(cls, name)
    assert jf.stats.misses == 2 and "changed" in jf.stats.miss_reasons[1], jf.stats.miss_reasons


# ---- Note [Fake tensors' own attributes] (lower/state/tensor_reads.py), Note [Trace state] -------
# A trace's tensors are fake tensors: an attribute only they have (``fake_mode``) was found
# with no failed lookup, and torch's own answers about the trace's fake mode
# (``torch._guards.detect_fake_mode``, ``torch._C._get_dispatch_mode``) answered for the trace:
# every call, the first included, took the branch eager never takes, and hits went up.

_FAKE_PROBES = {
    "hasattr": "hasattr(x, 'fake_mode')",
    "getattr with a default": "getattr(x, 'fake_device', None) is not None",
    "getattr of the string constant": "getattr(x, 'constant', 0) is None",
    "an attribute in a try": "_attr(x)",
    "of an argument's attribute": "hasattr(box.t, 'fake_mode')",
    "detect_fake_mode": "torch._guards.detect_fake_mode(x) is not None",
    "the dispatch mode": "torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) "
                         "is not None",
}


@pytest.mark.parametrize("kind", list(_FAKE_PROBES), ids=list(_FAKE_PROBES))
def test_a_question_about_the_trace_fake_mode_runs_eagerly(kind):
    g = {"torch": torch}
    exec("def _attr(x):\n    try:\n        return x.fake_mode is not None\n"
         "    except AttributeError:\n        return False\n\n\n"
         f"def f(x, box):\n    return x * 2 if {_FAKE_PROBES[kind]} else x * 3\n", g)
    fn = g["f"]

    class Box:
        def __init__(self):
            self.t = torch.zeros(2)

    jf = trident.jit(fn)
    box = Box()
    caught = _served(jf, fn, [lambda: (torch.ones(2), box)] * 3)
    assert counts(jf) == (0, 0, 3), jf.stats.miss_reasons
    assert len(caught) == 1 and "runs eagerly" in caught[0], caught


def test_the_same_names_on_other_objects_stay_served():
    """``cfg.constant`` (an attribute) and ``hasattr`` of a fake-only name on a known non-tensor
    (a parameter, not a tensor) are not questions about a tensor."""
    class Cfg:
        constant = 2.0

    def f(x, cfg):
        return x * cfg.constant * (3 if hasattr(cfg, "fake_mode") else 1)

    jf = trident.jit(f)
    assert not _served(jf, f, [lambda: (torch.ones(2), Cfg())] * 2)
    assert counts(jf) == (1, 1, 0), jf.stats.miss_reasons


# ---- Note [Tensors written outside] (lower/trace_writes.py) ------------------------------------
# An operator called as torch.ops names it (``torch.ops.aten.add_.Tensor(BUF, 1)``, a custom
# op that mutates its argument) has a name that says nothing of its writes: the trace wrote the
# global buffer for real, then the call ran eagerly and wrote it again (eager's plus one). Its
# schema says which arguments it writes.

BUF45 = torch.zeros(2)


@torch.library.custom_op("trident_break45::bump", mutates_args=("t",))
def _bump(t: torch.Tensor) -> None:
    t.add_(1)


@_bump.register_fake
def _(t):
    return None


_OP_WRITES = {
    "an aten overload": "torch.ops.aten.add_.Tensor(BUF45, 1)",
    "an aten out overload": "torch.ops.aten.add.out(BUF45, 1, out=BUF45)",
    "a foreach overload": "torch.ops.aten._foreach_add_.Scalar([BUF45], 1)",
    "a custom op's packet": "torch.ops.trident_break45.bump(BUF45)",
    "a custom op's overload": "torch.ops.trident_break45.bump.default(BUF45)",
    "a custom op object": "_bump(BUF45)",
}


@pytest.mark.parametrize("kind", list(_OP_WRITES), ids=list(_OP_WRITES))
def test_an_operator_that_writes_a_global_runs_eagerly_and_writes_once(kind):
    g = {"torch": torch, "BUF45": BUF45, "_bump": _bump}
    exec(f"def f(x):\n    {_OP_WRITES[kind]}\n    return x * BUF45\n", g)
    fn = g["f"]
    jf = trident.jit(fn)
    runs = []
    for run in (jf, fn):
        BUF45.zero_()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs.append(([run(torch.ones(2)).clone() for _ in range(3)], BUF45.clone(),
                         [str(w.message) for w in caught]))
    (got, got_buf, caught), (want, want_buf, _) = runs
    assert all(map(_same, got, want)) and torch.equal(got_buf, want_buf), (got_buf, want_buf)
    assert counts(jf) == (0, 0, 3), jf.stats.miss_reasons
    assert sum("writes a tensor that is not an argument" in w for w in caught) == 1, caught


def test_a_custom_op_that_writes_the_calls_own_tensor_stays_served():
    def f(x):
        y = x.clone()
        _bump(y)
        return y * 2

    jf = trident.jit(f)
    assert not _served(jf, f, [lambda: (torch.ones(2),)] * 3)
    assert counts(jf) == (1, 2, 0), jf.stats.miss_reasons


# ---- Note [Writes through wrappers] (lower/state/wrappers.py) ----------------------------------
# A mutating function passed to another call (``map(operator.setitem, [D], ...)``,
# ``itertools.starmap``, ``functools.reduce(operator.iadd, ..., LOG)``) is called from C, as a
# partial's function is: no bytecode named the write, and each hit returned the trace's value
# and wrote nothing (user and library code).

_PASSED_SRC = '''
import functools
import itertools
import operator

LOG = []
MEMO = {}


class Box:
    n = 0


BOX = Box()


def starmap_setitem(x):
    list(itertools.starmap(operator.setitem, [(MEMO, "n", MEMO.get("n", 0) + 1)]))
    return x * MEMO["n"]


def map_setitem(x):
    list(map(operator.setitem, [MEMO], ["n"], [MEMO.get("n", 0) + 1]))
    return x * MEMO["n"]


def map_setattr(x):
    list(map(setattr, [BOX], ["n"], [BOX.n + 1]))
    return x * BOX.n


def map_list_append(x):
    list(map(list.append, [LOG], [1]))
    return x * len(LOG)


def map_dict_update(x):
    list(map(dict.update, [MEMO], [{"n": MEMO.get("n", 0) + 1}]))
    return x * MEMO["n"]


def reduce_iadd(x):
    functools.reduce(operator.iadd, [[1]], LOG)
    return x * len(LOG)


def passed_for_a_fresh_dict(x):
    fresh = {}
    list(map(operator.setitem, [fresh], ["n"], [2]))
    return x * fresh["n"]
'''
PASSED = ["starmap_setitem", "map_setitem", "map_setattr", "map_list_append", "map_dict_update",
          "reduce_iadd"]


@pytest.fixture(params=["user code", "library code"])
def passed_module(request, tmp_path):
    if request.param == "user code":
        g: dict = {"__name__": "trident_user_passed45"}
        exec(compile(_PASSED_SRC, "<trident_user_passed45>", "exec"), g)
        yield g
    else:
        with installed_package(tmp_path, "trident_passedlib45", {"__init__": _PASSED_SRC}) as lib:
            yield vars(lib)


def _counted_calls(g, jf, fn):
    def reset():
        g["MEMO"].clear()
        g["LOG"].clear()
        g["BOX"].n = 0

    runs = []
    for run in (jf, fn):
        reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = [run(torch.ones(2)).clone() for _ in range(3)]
        runs.append((out, (len(g["LOG"]), dict(g["MEMO"]), g["BOX"].n),
                     [str(w.message) for w in caught]))
    return runs


@pytest.mark.parametrize("use", PASSED)
def test_a_mutating_function_passed_to_a_call_runs_eagerly(passed_module, use):
    fn = passed_module[use]
    jf = trident.jit(fn)
    (got, got_state, caught), (want, want_state, _) = _counted_calls(passed_module, jf, fn)
    assert all(map(_same, got, want)) and got_state == want_state, (got, want, got_state)
    assert [float(t[0]) for t in got] == [1.0, 2.0, 3.0]
    assert counts(jf) == (0, 0, 3), jf.stats.miss_reasons
    assert len(caught) == 1 and "passed to a call" in caught[0], caught


def test_a_mutating_function_passed_for_a_fresh_object_is_served(passed_module):
    fn = passed_module["passed_for_a_fresh_dict"]
    jf = trident.jit(fn)
    (got, _, caught), (want, _, _) = _counted_calls(passed_module, jf, fn)
    assert all(map(_same, got, want)) and not caught, caught
    assert counts(jf) == (1, 2, 0), jf.stats.miss_reasons


# ---- Note [Attribute writes] (lower/writes.py), Note [Own writes] (runtime/tree_memo.cpp) -------
# A finalizer that the function's own attribute write runs (the old value's last reference
# dropped, ``weakref.finalize``) and that writes what the call reads next: eager runs it in the
# middle of the call, the trace (which holds the old value) did not, so every compiled call
# used the value from before the finalizer.

class _Finalized45:
    def __init__(self):
        self.keys = torch.zeros(2)
        self.scale = 1.0


def _finalized_write(layer, x):
    layer.keys = layer.keys + x
    return layer.keys * layer.scale


class _Deleted45:
    def __del__(self):
        pass


_REFS45: list = []


def _finalize(layer, i):
    import weakref
    weakref.finalize(layer.keys, setattr, layer, "scale", float(i + 2))


def _weak_callback(layer, i):
    import weakref
    _REFS45.append(weakref.ref(layer.keys, lambda _: setattr(layer, "scale", float(i + 2))))


def _deleted(layer, i):
    layer.state = _Deleted45()


def _state_write(layer, x):
    layer.keys = layer.keys + x
    layer.state = x + 1
    return layer.keys * layer.scale


@pytest.mark.parametrize("finalizer", [_finalize, _weak_callback, _deleted])
def test_a_finalizer_run_by_an_attribute_write_is_warned(finalizer):
    """Note [Finalizers of written values] (lower/writes.py): a replayed write whose old value
    a finalizer watches (``weakref.finalize``, a weak reference's callback, ``__del__``) makes
    the call run eagerly, with one warning (silently stale before)."""
    fn = _state_write if finalizer is _deleted else _finalized_write
    jf = trident.jit(fn)
    layer = _Finalized45()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            finalizer(layer, i)
            jf(layer, torch.ones(2))
    assert counts(jf) == (0, 0, 3), jf.stats
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "finalizes" in said[0], said


def _finalized_in_place(layer, x):
    layer.keys = layer.keys + x
    return layer.keys * layer.gain


@pytest.mark.parametrize("fn", [_finalized_write, _finalized_in_place])
def test_a_finalizer_run_by_an_attribute_write_is_seen(fn):
    """The call runs eagerly, and as eager: its fallback holds no reference to the call's
    values (the native dispatcher's leaves list is emptied, the failed trace's traceback
    dropped), so the finalizer runs at the write (after the read before, every call). The
    finalizer rebinds a float (a new argument tree each call: the miss path) or writes a
    tensor in place (the same tree: the native dispatcher's ``_tree_miss``)."""
    import weakref

    def calls(run):
        layer, out = _Finalized45(), []
        layer.gain = torch.ones(2)
        for i in range(3):
            weakref.finalize(layer.keys, setattr, layer, "scale", float(i + 2))
            weakref.finalize(layer.keys, layer.gain.add_, 1.0)
            out.append(run(layer, torch.ones(2)).clone())
        return out

    jf = trident.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, want = calls(jf), calls(fn)
    assert all(map(_same, got, want)), (got, want)
    assert counts(jf) == (0, 0, 3), jf.stats


COUNTS45 = {"scale": ((1, 1, 3), 2), "gain": ((1, 1, 3), 1)}  # (compiles, hits, fallbacks),
# warnings: the hit's, and where the finalizer rebinds a float, the next trace's


def _effect45(layer, what, i):
    if what == "scale":  # a float the tree holds: the next call is another tree's
        layer.scale = float(i + 2)
    else:  # a tensor written in place: the same tree, served by the native memo
        layer.gain.add_(1.0)


def _attach_finalize(layer, what, i):
    import weakref
    weakref.finalize(layer.keys, _effect45, layer, what, i)


def _attach_callback(layer, what, i):
    import weakref
    _REFS45.append(weakref.ref(layer.keys, lambda _: _effect45(layer, what, i)))


@pytest.mark.parametrize("attach", [_attach_finalize, _attach_callback])
@pytest.mark.parametrize("fn, what", [(_finalized_write, "scale"),
                                      (_finalized_in_place, "gain")])
def test_a_finalizer_attached_after_the_compile_is_seen(attach, fn, what):
    """Note [Finalizers of written values] (lower/writes.py): a finalizer attached after the
    specialization compiled, to the value its replayed write drops, is seen before the launch
    sequence (the native hit reads the value the write would drop: ``finalized_write`` in
    runtime/dispatcher.cpp), and the call runs eagerly, as eager: the finalizer runs at the
    write (stale before: every hit read the value from before it)."""
    def calls(run):
        layer, out = _Finalized45(), []
        layer.gain = torch.ones(2)
        for i in range(5):
            if i >= 2:
                attach(layer, what, i)
            out.append(run(layer, torch.ones(2)).clone())
        return out

    _REFS45.clear()
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = calls(jf)
    _REFS45.clear()
    want = calls(fn)
    _REFS45.clear()
    assert all(map(_same, got, want)), (got, want)
    assert counts(jf) == COUNTS45[what][0], jf.stats.miss_reasons
    said = [str(w.message) for w in caught]
    assert len(said) == COUNTS45[what][1] and all("finalizes" in w for w in said), said
