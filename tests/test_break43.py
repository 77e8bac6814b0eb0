"""Faults the adversarial pass of session 43 found, each with a test of its whole kind; every
call is compared with eager (``torch.equal``), or, for Triton launches on CPU tensors (no
``TRITON_INTERPRET`` in this process: eager Triton has no driver), with the plain torch
expression the kernel computes, with exact compile, hit and fallback counts."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, run_python

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


# ---- Note [Launch frames] (frames.py): user code that Triton runs for a launch --------------
# A heuristic, a grid callable or an autotuner's hook runs at capture time, called by
# kernels.py from capture.py's _TritonLaunches; the recording stopped its walk at capture.py's
# frames, so what such code read (a global BLOCK, NUM_SMS) was no guard's: a hit after the
# global changed launched the old constexpr or grid (half the output left zero).


@triton.jit
def _add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


LAUNCH = {"block": 16, "grid": 1}


class Tuning:
    grid = 1


def _block_of(args):
    return LAUNCH["block"]


def _grid_of(meta):
    return (Tuning.grid,)


_heuristic_lambda = triton.heuristics({"BLOCK": lambda args: LAUNCH["block"]})(_add_one_kernel)
_heuristic_def = triton.heuristics({"BLOCK": _block_of})(_add_one_kernel)


def heuristic_lambda(x):
    out = torch.zeros_like(x)
    _heuristic_lambda[(1,)](x, out, x.numel())
    return out


def heuristic_def(x):
    out = torch.zeros_like(x)
    _heuristic_def[(1,)](x, out, x.numel())
    return out


def grid_lambda(x):
    out = torch.zeros_like(x)
    _add_one_kernel[lambda meta: (LAUNCH["grid"],)](x, out, x.numel(), BLOCK=16)
    return out


def grid_def(x):
    out = torch.zeros_like(x)
    _add_one_kernel[_grid_of](x, out, x.numel(), BLOCK=16)
    return out


def _set_block(v):
    LAUNCH["block"] = v


def _set_grid(v):
    LAUNCH["grid"] = v


def _set_class_grid(v):
    Tuning.grid = v


LAUNCH_READS = {  # fn, how to set the launch's extent (16 or 32 elements written)
    "heuristic lambda": (heuristic_lambda, _set_block, (16, 32)),
    "heuristic def": (heuristic_def, _set_block, (16, 32)),
    "grid lambda": (grid_lambda, _set_grid, (1, 2)),
    "grid def": (grid_def, _set_class_grid, (1, 2)),
}


@pytest.mark.parametrize("case", list(LAUNCH_READS))
def test_what_a_heuristic_or_grid_callable_reads_is_guarded(case):
    """Two calls per value of the global (a compile, then a hit), then the first value again
    (the first specialization's hit); each result is the extent the global says."""
    fn, set_extent, (small, big) = LAUNCH_READS[case]
    x = torch.arange(32, dtype=torch.float32)
    jf = trident.jit(fn)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no call runs eagerly)
            for value, written in ((small, 16), (small, 16), (big, 32), (big, 32), (small, 16)):
                set_extent(value)
                want = torch.cat([x[:written] + 1.0, torch.zeros(32 - written)])
                assert torch.equal(jf(x), want), (case, value)
    finally:
        set_extent(small)
    assert counts(jf) == (2, 3, 0)
    assert jf.stats.interpreted_launches == 5


NUM_SMS = 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_persistent_grid_of_a_global_sm_count_is_guarded_on_the_gpu():
    """A persistent kernel's grid, ``min(NUM_SMS, tiles)`` from a global, launched natively
    (replayed from a CUDA graph from its third call): a new ``NUM_SMS`` recompiles."""
    global NUM_SMS

    def f(x):
        out = torch.zeros_like(x)
        _add_one_kernel[lambda meta: (min(NUM_SMS, triton.cdiv(x.numel(), 16)),)](
            x, out, x.numel(), BLOCK=16)
        return out

    x = torch.arange(64, dtype=torch.float32, device="cuda")
    jf = trident.jit(f)
    try:
        for sms in (2, 2, 2, 4, 4, 4, 2):
            NUM_SMS = sms
            assert torch.equal(jf(x), f(x)), sms
    finally:
        NUM_SMS = 2
    assert counts(jf) == (2, 5, 0)


# ---- Note [Fork during a compile] (frontend/policy.py) -----------------------------------------
# A child forked from another thread while a compile ran inherited the compile lock held by a
# thread it does not have: its first call of any jitted function waited forever.

FORK = """
import faulthandler, os, threading, torch, trident

entered, go = threading.Event(), threading.Event()

def slow(x):  # traced in a thread, which waits inside the trace until the fork starts
    entered.set()
    go.wait(60)
    return x * 2

def g(x):
    return torch.relu(x) + 1

js, jg = trident.jit(slow), trident.jit(g)
os.register_at_fork(before=go.set)  # after trident's (trident.jit imported it): runs first
t = threading.Thread(target=js, args=(torch.ones(3),))
t.start()
entered.wait(60)
pid = os.fork()
if pid == 0:
    faulthandler.dump_traceback_later(30, exit=True)  # a hang fails, not waits
    x = torch.arange(-2.0, 3.0)
    ok = [torch.equal(jg(x), g(x)), torch.equal(jg(x), g(x)), torch.equal(js(x), x * 2)]
    print(ok, jg.stats.compiles, jg.stats.hits, jg.stats.fallbacks, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
t.join()
print("child exit", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_fork_while_another_thread_compiles(subprocess_env):
    """The fork waits for the compile in progress; the child compiles and hits a function of
    its own and calls the one the parent was compiling (which waits on a threading.Event in
    its trace: an eager call), each equal to eager."""
    out = run_python(subprocess_env, "-c", FORK).stdout.strip().splitlines()
    assert out == ["[True, True, True] 1 1 0", "child exit 0"], out


# ---- Note [Nested jitted calls] (frames.py) ----------------------------------------------------
# A jitted function that the traced function calls runs eagerly in the trace, from policy.py's
# MissPolicy._eager: the recording's walk stopped at that Trident frame, so what the nested
# function read was no guard of the outer one, and a hit after it changed returned the old value.

_NESTED = {"scale": 2.0}
_NESTED_FLOAT = 1.0


class _Nested:
    offset = 0.5


@trident.jit
def _nested_global(x):
    return x * _NESTED_FLOAT


@trident.jit
def _nested_dict(x):
    return x * _NESTED["scale"]


@trident.jit
def _nested_class(x):
    return x + _Nested.offset


def _set_nested_float(v):
    global _NESTED_FLOAT
    _NESTED_FLOAT = v


NESTED_READS = {  # the nested jitted function, how to set what it reads, two values
    "a global": (_nested_global, _set_nested_float, (1.0, 3.0)),
    "a global dict's item": (_nested_dict, lambda v: _NESTED.__setitem__("scale", v), (2.0, 5.0)),
    "a class attribute": (_nested_class, lambda v: setattr(_Nested, "offset", v), (0.5, 4.0)),
}


@pytest.mark.parametrize("case", list(NESTED_READS))
def test_what_a_nested_jitted_function_reads_is_guarded(case):
    """Two calls per value (a compile, then a hit), then the first value again (a hit)."""
    inner, set_value, (first, second) = NESTED_READS[case]

    def outer(x):
        return inner(x) * 2 + 1

    x = torch.arange(4.0)
    jf = trident.jit(outer)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the nested function warns that it runs eagerly)
            for value in (first, first, second, second, first):
                set_value(value)
                assert torch.equal(jf(x), inner.__wrapped__(x) * 2 + 1), (case, value)
    finally:
        set_value(first)
    assert counts(jf) == (2, 3, 0)
    # the nested function's own fallbacks (one per trace) say why, not "a TorchFunctionMode"
    assert inner.stats.miss_reasons[-1] == (
        "eager: called while another jitted function is traced: its code is traced into that "
        "function's specialization (Note [Nested jitted calls] in trident/frames.py)")


def test_a_nested_jitted_closure_runs_eagerly_and_sees_its_cell():
    """A nested jitted closure's cell is not reachable from the outer function's state (the
    JitFunction hides it): every call runs eagerly, with the new value after a change."""
    cell = [1.0]

    @trident.jit
    def inner(x):
        return x * cell[0]

    def outer(x):
        return inner(x) + 1

    x = torch.arange(4.0)
    jf = trident.jit(outer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for value in (1.0, 1.0, 3.0, 3.0):
            cell[0] = value
            assert torch.equal(jf(x), x * value + 1), value
    assert counts(jf) == (0, 0, 4)


# ---- Note [Binding] (frontend/jit.py) ----------------------------------------------------------
# A JitFunction bound the instance whatever it wrapped: one over a bound method or a module,
# set on a class, got the instance as an extra argument (TypeError where eager returns); and
# the stand-in without a runtime bound nothing (a jitted method in a class body lost self).


class _Scaled(torch.nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


class _Owner:
    k = 3.0

    @classmethod
    def by_class(cls, x):
        return x * cls.k

    def by_instance(self, x):
        return x - self.k


def _owners() -> dict:
    """Each case: (class holding the eager callable, class holding its jitted one)."""
    module, owner = _Scaled(2.0), _Owner()
    return {name: (type("Eager", (), {"f": value}), type("Jitted", (), {"f": trident.jit(value)}))
            for name, value in (("a classmethod bound to its class", _Owner.by_class),
                                ("a method bound to an instance", owner.by_instance),
                                ("a module", module))}


@pytest.mark.parametrize("case", ["a classmethod bound to its class",
                                  "a method bound to an instance", "a module"])
def test_a_jitted_bound_method_or_module_on_a_class_binds_nothing(case):
    eager_cls, jitted_cls = _owners()[case]
    x = torch.arange(4.0)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(jitted_cls().f(x), eager_cls().f(x))
            assert torch.equal(jitted_cls.f(x), eager_cls.f(x))
    assert counts(jitted_cls.__dict__["f"]) == (1, 3, 0)


class _Method:
    k = 5.0

    @trident.jit
    def f(self, x):
        return x * self.k


def test_a_jitted_function_in_a_class_body_binds_self():
    x = torch.arange(4.0)
    for _ in range(2):
        assert torch.equal(_Method().f(x), x * 5.0)
    assert counts(_Method.__dict__["f"]) == (1, 1, 0)


STAND_IN = """
import warnings, torch, trident
warnings.simplefilter("ignore")

class M:
    k = 5.0

    @trident.jit
    def f(self, x):
        return x * self.k

model = torch.nn.Linear(2, 2)
W = type("W", (), {"g": trident.jit(model)})
x = torch.ones(3, 2)
with torch.no_grad():
    print(torch.equal(M().f(torch.arange(4.0)), torch.arange(4.0) * 5.0),
          torch.equal(W().g(x), model(x)), M.__dict__["f"].stats.fallbacks)
"""


def test_the_stand_in_without_a_runtime_binds_as_the_native_one(tmp_path, subprocess_env):
    """``TRIDENT_CACHE_DIR`` naming a file: no runtime, every call eager (test_faults.py)."""
    (tmp_path / "a-file").write_text("")
    env = dict(subprocess_env, TRIDENT_CACHE_DIR=str(tmp_path / "a-file"))
    assert run_python(env, "-c", STAND_IN).stdout.strip() == "True True 1"


# ---- Note [Kernels of one name] (ir/launch.py) -------------------------------------------------
# A factory's @triton.jit kernels share a module and qualified name (make.<locals>.kernel): the
# install found the first of them for every launch of the others, and two specializations of
# one C source (two closures of one def over each kernel) shared one loaded module, whose
# interpreted-launch callback the last one set. Each ran the other kernel: x + 1 for x * 3.


def _make_kernel(op: str):
    if op == "add":
        @triton.jit
        def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)
    else:
        @triton.jit
        def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3, mask=mask)
    return kernel


_ADD, _TIMES = _make_kernel("add"), _make_kernel("times")


def _launch_add(x):
    out = torch.empty_like(x)
    _ADD[(1,)](x, out, x.numel(), BLOCK=16)
    return out


def _launch_times(x):
    out = torch.empty_like(x)
    _TIMES[(1,)](x, out, x.numel(), BLOCK=16)
    return out


def _launch_both(x):
    return _launch_add(x), _launch_times(x)


def _closure_over(kernel):
    def launch(x):
        out = torch.empty_like(x)
        kernel[(1,)](x, out, x.numel(), BLOCK=16)
        return out
    return launch


def test_factory_kernels_of_one_name_each_run_their_own():
    x = torch.arange(8.0)
    add, times = x + 1, x * 3
    jitted = {"add": trident.jit(_launch_add), "times": trident.jit(_launch_times),
              "both": trident.jit(_launch_both), "closure add": trident.jit(_closure_over(_ADD)),
              "closure times": trident.jit(_closure_over(_TIMES))}
    want = {"add": add, "times": times, "both": (add, times), "closure add": add,
            "closure times": times}
    for _ in range(2):
        for name, jf in jitted.items():
            got = jf(x)
            assert all(map(torch.equal, got, want[name])) if name == "both" else \
                torch.equal(got, want[name]), name
    assert [counts(jf) for jf in jitted.values()] == [(1, 1, 0)] * 5
    assert [jf.stats.interpreted_launches for jf in jitted.values()] == [2, 2, 4, 2, 2]
