"""Never stale, by construction (issue 28), the leftovers of the last pass: loggers reached
otherwise than through a global, iterators, the roots of objects no module path reaches, an
eager decision made for a moment's reason, the callable-argument scan's bound. Each case
compares with eager (``torch.equal``) and asserts exact counts."""

from __future__ import annotations

import functools
import gc
import inspect
import io
import logging
import pathlib
import sys
import textwrap
import warnings
import weakref

import pytest
import torch

import trident
from _trident_helpers import counting, run_python

# ---- Note [Logging calls]: a logger however reached ------------------------------------------

_STREAM = io.StringIO()
_LOG = logging.getLogger("trident.test.stale36")
_LOG.addHandler(logging.StreamHandler(_STREAM))
_LOG.setLevel(logging.INFO)
_LOG.propagate = False
getLogger = logging.getLogger  # (a name that is not the logging module)


def _closure_logger():
    log = _LOG

    def f(x):
        log.info("closure")
        return x * 2

    return f


class _HoldsLog:
    log = _LOG  # a class attribute, read through self

    def f(self, x):
        self.log.info("class attribute")
        return x * 2


def _get_logger_by_name(x):
    getLogger("trident.test.stale36").info("getLogger")
    return x * 2


def _adapter_in_closure():
    log = logging.LoggerAdapter(_LOG, {})

    def f(x):
        log.warning("adapter")
        return x * 2

    return f


def _passed_in(x, log):
    log.info("argument")
    return x * 2


def _local_alias(x):
    log = getLogger("trident.test.stale36")
    if log.isEnabledFor(logging.DEBUG):  # a level asked: what it says changes
        return x * 3
    return x * 2


LOGGERS = {
    "closure": (lambda: _closure_logger(), ()),
    "class attribute": (lambda: _HoldsLog().f, ()),
    "getLogger by another name": (lambda: _get_logger_by_name, ()),
    "adapter in a closure": (lambda: _adapter_in_closure(), ()),
    "argument": (lambda: _passed_in, (_LOG,)),
}


@pytest.mark.parametrize("case", sorted(LOGGERS))
def test_a_logging_call_however_the_logger_is_reached_runs_eagerly(case):
    # a logger that no global names (a closure's, a class attribute, getLogger under another
    # name) was not seen: the trace logged once, the hits never again
    make, extra = LOGGERS[case]
    fn, x = make(), torch.ones(3)
    jf = trident.jit(fn)
    _STREAM.seek(0)
    _STREAM.truncate()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(jf(x, *extra), fn(x, *extra))
    assert len(_STREAM.getvalue().splitlines()) == 6, _STREAM.getvalue()  # as eager: 3 + 3
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s
    assert len([w for w in caught if "runs eagerly" in str(w.message)]) == 1, \
        [str(w.message) for w in caught]


def test_a_level_asked_of_a_logger_runs_eagerly():
    # isEnabledFor's answer decided the branch: a level set later was not seen (stale)
    jf, x = trident.jit(_local_alias), torch.ones(3)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert torch.equal(jf(x), _local_alias(x))
        _LOG.setLevel(logging.DEBUG)
        try:
            after = _local_alias(x)
            assert torch.equal(after, x * 3)
            assert torch.equal(jf(x), after)
        finally:
            _LOG.setLevel(logging.INFO)
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (2, 0, 0), s


# ---- iterators: what the first call consumes -------------------------------------------------

class _Counter:
    def __init__(self):
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.i += 1
        return float(self.i)


_GLOBAL_IT = {"jit": counting(), "eager": counting()}


def _next_of(x, it):
    return x * next(it)


def _first_of(x, it):
    for v in it:
        return x * v


def _next_in_attr(x, holder):
    return x * next(holder.it)


def _next_of_global_jit(x):
    return x * next(_GLOBAL_IT["jit"])


def _next_of_global_eager(x):
    return x * next(_GLOBAL_IT["eager"])


class _Holder:
    def __init__(self, it):
        self.it = it


ITERATORS = {
    "generator": (_next_of, lambda: (counting(),)),
    "list iterator": (_next_of, lambda: (iter([1.0, 2.0, 3.0, 4.0]),)),
    "map": (_next_of, lambda: (map(float, range(1, 9)),)),
    "for over a generator": (_first_of, lambda: (counting(),)),
    "an attribute's": (_next_in_attr, lambda: (_Holder(counting()),)),
    "an iterator class": (_next_of, lambda: (_Counter(),)),
}


@pytest.mark.parametrize("case", sorted(ITERATORS))
def test_an_iterator_passed_in_is_advanced_as_eager_advances_it(case):
    # the first call consumes what eager consumes (the trace did not advance it first), and
    # later calls see the values eager sees
    fn, make = ITERATORS[case]
    x, mine, theirs = torch.ones(3), make(), make()
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(jf(x, *mine), fn(x, *theirs))
    s = jf.stats
    # a generator has no contents a guard reads: eager; the class's counter is an int the
    # call writes: each value is a new specialization
    want = (0, 3, 0) if case == "an iterator class" else (3, 0, 0)
    assert (s.fallbacks, s.compiles, s.hits) == want, s


_GENS = {"jit": [counting()], "eager": [counting()]}


def _next_of_item_jit(x, i):
    return x * next(_GENS["jit"][i])  # (an item the code does not name: advanced all the same)


def _next_of_item_eager(x, i):
    return x * next(_GENS["eager"][i])


@pytest.mark.parametrize("how", ["global", "item of a global"])
def test_a_global_iterator_is_advanced_as_eager_advances_it(how):
    # next(GENS[i]): the trace advanced it once, then the state tree refused it: the first
    # call consumed two values where eager consumes one
    jitted, eager, extra = (_next_of_global_jit, _next_of_global_eager, ()) if how == "global" \
        else (_next_of_item_jit, _next_of_item_eager, (0,))
    jf, x = trident.jit(jitted), torch.ones(3)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(jf(x, *extra), eager(x, *extra))
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s


# ---- Note [Object roots]: the roots of objects no module path reaches ------------------------

def _reads_k(x, o):
    return x * o.k


def test_an_object_root_does_not_keep_its_object_alive():
    # chain.py's table of ("object", token) roots held every object for good (a leak across
    # jitted functions and objects that die)
    def run():
        class Local:  # (no module path reaches it: an object root)
            k = 2.0

        jf, x = trident.jit(_reads_k), torch.ones(3)
        o = Local()
        assert torch.equal(jf(x, o), x * 2) and torch.equal(jf(x, o), x * 2)
        Local.k = 3.0  # the class attribute is read through the root: guarded
        assert torch.equal(jf(x, o), x * 3)
        s = jf.stats
        assert (s.fallbacks, s.compiles, s.hits) == (0, 2, 1), s
        return weakref.ref(Local)

    gone = run()
    gc.collect()
    assert gone() is None


def test_an_object_roots_token_is_never_reused():
    from trident import serials
    from trident.lower.state import chain

    class A:
        pass

    tokens = set()
    addresses = set()
    for _ in range(50):  # objects made and dropped: addresses come back, tokens do not
        a = A()
        root, _ = chain._root_of(a)
        assert chain._resolve_root(root, None) is a
        tokens.add(root[1])
        addresses.add(id(a))
        del a  # (no cycle: freed here, without a collection)
        assert chain._resolve_root(root, None) is chain._MISSING
    assert len(tokens) == 50 and len(addresses) < 50
    dicts = [{} for _ in range(serials._STRONG_BOUND + 5)]  # no weak reference: bounded
    roots = [chain._root_of_dict(d) for d in dicts]
    assert chain._resolve_root(roots[0], None) is chain._MISSING
    assert chain._resolve_root(roots[-1], None) is dicts[-1]
    assert len(serials._STRONG) <= serials._STRONG_BOUND


# ---- Note [Stored eager decisions]: a moment's reason is not stored --------------------------

_TRANSIENT = textwrap.dedent('''
    import os, sys, warnings
    import torch, trident
    FAIL = os.environ.get("STALE36_FAIL") == "1"

    def helper():
        if FAIL:  # (a file not there yet, a device busy: this moment's)
            raise OSError("not ready")
        return 2.0

    @trident.jit
    def f(x):
        return x * helper()

    x = torch.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            try:
                assert torch.equal(f(x), x * 2)
            except OSError:
                assert FAIL
    s = f.stats
    print(s.fallbacks, s.compiles, s.hits, sum("earlier process" in str(w.message) for w in caught))
''')


def test_an_eager_decision_for_a_moments_reason_is_not_stored(tmp_path, subprocess_env):
    # a trace that failed for a reason of the moment (here an exception user code raised)
    # was stored as the signature's eager decision: every later process ran it eagerly
    script = tmp_path / "transient.py"
    script.write_text(_TRANSIENT)
    first = run_python({**subprocess_env, "STALE36_FAIL": "1"}, str(script))
    assert first.stdout.split() == ["2", "0", "0", "0"], first.stdout
    second = run_python(subprocess_env, str(script))
    assert second.stdout.split() == ["0", "1", "1", "0"], second.stdout


# ---- Note [Callable arguments]: past the scan's bound ----------------------------------------

def _act(x, b=0.0):
    return x * 2 + b


def _calls_first(x, fns):
    return fns[0](x)


def test_a_function_passed_past_the_scans_bound_runs_eagerly():
    # the scan of the arguments for functions passed in stopped at 4096 objects: a function
    # found later was checked by identity only, its __defaults__ not at all (stale)
    from trident.lower.state import callables

    fns = [_act] + [[] for _ in range(callables._SCAN_BOUND + 10)]  # (scanned from the end)
    jf, x = trident.jit(_calls_first), torch.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(jf(x, fns), _calls_first(x, fns))
        _act.__defaults__ = (1.0,)
        try:
            after = _calls_first(x, fns)
            assert torch.equal(jf(x, fns), after) and torch.equal(jf(x, fns), after)
        finally:
            _act.__defaults__ = (0.0,)
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s
    said = [str(w.message) for w in caught if "first 4096 objects" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]


# ---- a user function's lru_cache -------------------------------------------------------------

class _Knob:
    k = 2.0


@functools.lru_cache(maxsize=None)
def _cached_scale():
    return _Knob.k


def _reads_cached(x):
    return x * _cached_scale()


def _closure_cached():
    cached = functools.cache(lambda: _Knob.k)

    def f(x):
        return x * cached()

    return f, cached


def _calls_passed(x, fn):
    return x * fn()


CACHED = {
    "global": lambda: (_reads_cached, _cached_scale, ()),
    "closure": lambda: (*_closure_cached(), ()),
    "argument": lambda: (_calls_passed, _cached_scale, (_cached_scale,)),
}


@pytest.mark.parametrize("case", sorted(CACHED))
def test_a_user_functions_lru_cache_runs_eagerly(case):
    # the cached function's code ran in the first trace only: a retrace after _Knob.k changed
    # read the cache (no chain to _Knob.k), and cache_clear() later was not seen (stale)
    fn, cached, extra = CACHED[case]()
    cached.cache_clear()
    x = torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for step in range(3):
                assert torch.equal(jf(x, *extra), fn(x, *extra))
                if step == 0:
                    _Knob.k = 5.0  # (the cache still answers 2.0, in eager too)
                elif step == 1:
                    cached.cache_clear()
        finally:
            _Knob.k = 2.0
            cached.cache_clear()
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s
    assert len([w for w in caught if "cache Trident cannot guard" in str(w.message)]) == 1


# ---- state that no bytecode of a file names: files, frames, eval'd code ----------------------

_K = 2.0
_FILE = {"path": None}


def _eval_reads(x):
    return x * eval("_K")


def _frame_reads(x):
    return x * sys._getframe().f_globals["_K"]


def _inspect_reads(x):
    return x * inspect.currentframe().f_globals["_K"]


def _open_reads(x):
    with open(_FILE["path"]) as fh:
        return x * float(fh.read())


def _pathlib_reads(x):
    return x * float(pathlib.Path(_FILE["path"]).read_text())


def _set_k():
    global _K
    _K = 5.0


HIDDEN = {
    "eval": (_eval_reads, _set_k),
    "sys._getframe": (_frame_reads, _set_k),
    "inspect.currentframe": (_inspect_reads, _set_k),
    "open": (_open_reads, lambda: pathlib.Path(_FILE["path"]).write_text("5.0")),
    "pathlib": (_pathlib_reads, lambda: pathlib.Path(_FILE["path"]).write_text("5.0")),
}


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_state_read_through_files_frames_or_eval_runs_eagerly(case, tmp_path):
    # eval("_K"), a frame's f_globals, a file's contents: no chain names what they read, and
    # a change was not seen (stale)
    global _K
    fn, change = HIDDEN[case]
    _FILE["path"] = str(tmp_path / "value.txt")
    pathlib.Path(_FILE["path"]).write_text("2.0")
    x = torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            before = fn(x)
            assert torch.equal(jf(x), before)
            change()
            after = fn(x)
            assert not torch.equal(after, before), "the change must change eager's result"
            assert torch.equal(jf(x), after) and torch.equal(jf(x), after)
        finally:
            _K = 2.0
    s = jf.stats
    assert (s.fallbacks, s.compiles, s.hits) == (3, 0, 0), s
    assert len([w for w in caught if "runs eagerly" in str(w.message)]) == 1


# ---- a write through ``.data`` (Note [Global tensor values] in lower/state/tree.py) ---------

_W = torch.tensor(2.0)


def _reads_w(x):
    return x * _W.item()


def _reads_w_list(x):
    return x * sum(_W.tolist())


@pytest.mark.parametrize("write", ["fill", "assign", "assign_bits", "item", "unchanged"])
def test_a_write_through_data_to_a_global_tensor_read_as_a_value(write):
    """``.data`` is a tensor of its own version counter, and ``.data =`` keeps the old one: the
    global's contents are what shows the write."""
    global _W
    _W = torch.tensor([2.0, 3.0]) if write == "item" else torch.tensor(2.0)
    fn = _reads_w_list if write == "item" else _reads_w
    x = torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(jf(x), fn(x)) and torch.equal(jf(x), fn(x))
        if write == "fill":
            _W.data.fill_(5.0)
        elif write == "assign":
            _W.data = torch.tensor(5.0)
        elif write == "assign_bits":  # the same bytes as another dtype: .item() is an int
            _W.data = torch.tensor(2.0).view(torch.int32)
        elif write == "item":
            _W.data[1] = 7.0
        else:
            _W.data = torch.tensor(2.0)
        for _ in range(2):
            assert torch.equal(jf(x), fn(x))
    s = jf.stats
    assert (s.compiles, s.hits, s.fallbacks) == ((1, 3, 0) if write == "unchanged" else
                                                 (2, 2, 0)), s
    if write != "unchanged":
        # (a stored specialization of the old contents may be named after it: Note [Process-only
        # state] in frontend/install.py)
        assert s.miss_reasons[-1].startswith("_W changed since the last call"), s.miss_reasons


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_global_cuda_tensor_read_as_a_value_runs_eagerly_with_one_warning():
    """A CUDA tensor's contents cannot be compared on the hit path without a copy to the host:
    the call runs eagerly, and a write through ``.data`` is eager's."""
    global _W
    _W = torch.tensor(2.0, device="cuda")
    x = torch.ones(3, device="cuda")
    jf = trident.jit(_reads_w)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(jf(x), _reads_w(x))
        _W.data.fill_(5.0)
        assert torch.equal(jf(x), _reads_w(x))
    said = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert len(said) == 1 and "read as Python values" in said[0], said
    assert jf.stats.fallbacks == 2 and jf.stats.hits == 0, jf.stats
