"""Never stale (issue 28): a write outside the call's arguments, found by the walk-back over the
bytecode (Note [Write targets], trident/lower/state/flow.py), makes the call run eagerly before
its trace, so each call writes once, as eager does; a Triton kernel's global rebound between
launches raises as Triton does."""

from __future__ import annotations

import warnings

import pytest
import torch
import triton
import triton.language as tl

import trident
from trident.lower import kernels

L = [1.0]
D = {"k": 1.0}
M = [[1.0]]


class Obj:
    n = 0


OBJ = Obj()


class Box:
    def __init__(self):
        self.items = []

    def add(self, v):
        self.items.append(v)


BOX = Box()


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


NET = Counter()


class Holder:
    def helper(self, lst):
        lst.append(1.0)


def _push(lst, v):
    lst.append(v)


def _set_k(d):
    d["k"] = d["k"] + 1


def _bump(o):
    o.n += 1


def _remember(x, seen=[]):  # noqa: B006 (the default is the state)
    seen.append(1.0)
    return x * len(seen)


def chained(x):
    a = b = L  # noqa: F841
    b.append(1.0)
    return x * len(L)


def element(x):
    inner = M[0]
    inner.append(1.0)
    return x * len(M[0])


def unpacked(x):
    a, _ = L, D
    a.append(1.0)
    return x * len(L)


def looped(x):
    for lst in (L,):
        lst.append(1.0)
    return x * len(L)


def walrus(x):
    (lst := L).append(1.0)
    return x * len(L)


def inplace_add(x):
    lst = L
    lst += [1.0]
    return x * len(L)


def slice_store(x):
    L[:] = L + [1.0]
    return x * len(L)


def through_dict(x):
    OBJ.__dict__["n"] = OBJ.n + 1
    return x * OBJ.n


def with_setattr(x):
    setattr(OBJ, "n", OBJ.n + 1)
    return x * OBJ.n


def unbound_method(x):
    append = list.append
    append(L, 1.0)
    return x * len(L)


def globals_alias(x):
    g = globals()
    g["WRITTEN"] = g.get("WRITTEN", 0) + 1
    return x * g["WRITTEN"]


def helper_appends(x):
    _push(L, 1.0)
    return x * len(L)


def helper_sets_item(x):
    _set_k(D)
    return x * D["k"]


def helper_bumps(x):
    _bump(OBJ)
    return x * OBJ.n


def method_of_a_global(x):
    BOX.add(1.0)
    return x * len(BOX.items)


def global_module(x):
    return NET(x)


def helper_default(x):
    return _remember(x) + 1


def parameter_method(x, holder):
    holder.helper(L)
    return x * len(L)


def in_a_comprehension(x):
    [L.append(v) for v in (1.0,)]
    return x * len(L)


def in_a_lambda(x):
    target = L
    add = lambda v: target.append(v)  # noqa: E731
    add(1.0)
    return x * len(L)


WRITERS = [in_a_comprehension, in_a_lambda, chained, element, unpacked, looped, walrus,
           inplace_add, slice_store, through_dict,
           with_setattr, unbound_method, globals_alias, helper_appends, helper_sets_item,
           helper_bumps, method_of_a_global, global_module, helper_default, parameter_method]


def _reset():
    L[:] = [1.0]
    D.clear()
    D["k"] = 1.0
    M[:] = [[1.0]]
    OBJ.__dict__.pop("n", None)
    BOX.items.clear()
    NET.calls = 0
    globals().pop("WRITTEN", None)
    _remember.__defaults__[0].clear()


def _state():
    return (list(L), dict(D), [list(m) for m in M], OBJ.n, list(BOX.items), NET.calls,
            globals().get("WRITTEN"), list(_remember.__defaults__[0]))


@pytest.mark.parametrize("fn", WRITERS, ids=[f.__name__ for f in WRITERS])
def test_writes_found_by_the_walk_back_run_eagerly_before_the_trace(fn):
    """Each kind of write outside the arguments whose target the walk-back finds (an alias, an
    element, a helper's parameter, a global module's ``forward``, a method's ``self``...) makes
    every call run eagerly with one warning, decided before the trace: results and the state
    written equal eager's, call by call (a write the trace had made would show twice)."""
    args = (Holder(),) if fn is parameter_method else ()
    _reset()
    want = [fn(torch.ones(2), *args) for _ in range(3)]
    want_state = _state()
    _reset()
    jf = trident.jit(fn)
    try:
        with pytest.warns(UserWarning, match="writes to") as caught:
            got = [jf(torch.ones(2), *args) for _ in range(3)]
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
        assert _state() == want_state
        assert (jf.stats.fallbacks, jf.stats.compiles) == (3, 0), jf.stats
        assert sum("runs eagerly" in str(w.message) for w in caught) == 1
    finally:
        _reset()


def local_work(x, cfg):
    out = []
    out.append(x * 2)
    table = {"a": 1}
    table["b"] = 2
    buf = torch.zeros(2)
    buf[0] = 1.0
    cfg["seen"] = True
    acc = []
    add = lambda v: acc.append(v)  # noqa: E731
    add(1)
    [acc.append(v) for v in range(2)]
    return out[0] + buf * table["b"] * len(acc)


def test_writes_to_the_frame_and_the_arguments_are_not_outside():
    """A list or dict made in the frame, a tensor made there, an argument's item, a frame's
    list written by a lambda or a comprehension: the walk-back finds them fresh or the
    arguments' (the argument tree sees those), so the function compiles and then hits."""
    from trident.lower.state import flow, writes

    code = local_work.__code__
    assert writes.outside_write(code, local_work.__globals__, local_work) is None
    assert flow.Flow(code, local_work.__globals__, local_work).written_parameters() == {"cfg"}
    jf = trident.jit(local_work)
    x = torch.ones(2)
    for _ in range(2):
        cfg = {}
        assert torch.equal(jf(x, cfg), local_work(x, {})) and cfg == {"seen": True}


@triton.jit
def _shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + SHIFT, mask=mask)


SHIFT = tl.constexpr(1.0)


def test_a_kernels_global_is_checked_as_triton_checks_it():
    """triton 3.6 copies the globals a kernel reads at its first launch and raises at a later
    launch where one changed; ``check_used_globals`` does the same for Trident's GPU launches."""
    global SHIFT
    kernels.check_used_globals(_shift_kernel)
    old = SHIFT
    SHIFT = tl.constexpr(5.0)
    try:
        with pytest.raises(RuntimeError, match="Global variable SHIFT has changed"):
            kernels.check_used_globals(_shift_kernel)
    finally:
        SHIFT = old
    kernels.check_used_globals(_shift_kernel)  # changed back: launches again


def _shifted(x):
    out = torch.empty_like(x)
    _shift_kernel[(1,)](x, out, x.numel(), BLOCK=16)
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_kernels_global_rebound_on_the_gpu_raises_as_triton_does():
    """Issue 25's item: a kernel's ``tl.constexpr`` global rebound between calls. Triton raises
    ``RuntimeError`` at the next launch; so does the jitted function (its trace fails, eager's
    launch raises), and once the global is back both run again."""
    global SHIFT
    x = torch.arange(16.0, device="cuda")
    jf = trident.jit(_shifted)
    assert torch.equal(jf(x), _shifted(x)) and torch.equal(jf(x), x + 1)
    old = SHIFT
    SHIFT = tl.constexpr(5.0)
    try:
        with pytest.raises(RuntimeError, match="Global variable SHIFT has changed"):
            _shifted(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the trace's failure is warned)
            with pytest.raises(RuntimeError, match="Global variable SHIFT has changed"):
                jf(x)
    finally:
        SHIFT = old
    assert torch.equal(jf(x), x + 1) and torch.equal(_shifted(x), x + 1)


APPEND = L.append


def bound_builtin(x):
    APPEND(1.0)
    return x * len(L)


def test_a_bound_builtin_method_held_by_a_global_is_a_write():
    """``APPEND = L.append`` at module level, ``APPEND(v)`` in the function: the callee is a
    mutating method of ``L``, whose origin is the global: the function runs eagerly, writing
    once per call as eager does."""
    _reset()
    want = [bound_builtin(torch.ones(2)) for _ in range(3)]
    want_l = list(L)
    _reset()
    jf = trident.jit(bound_builtin)
    try:
        with pytest.warns(UserWarning, match="writes to"):
            got = [jf(torch.ones(2)) for _ in range(3)]
        assert all(torch.equal(a, b) for a, b in zip(got, want)) and L == want_l
        assert (jf.stats.fallbacks, jf.stats.compiles) == (3, 0), jf.stats
    finally:
        _reset()
