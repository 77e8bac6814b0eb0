"""Eager fallbacks are cheap, honest and quiet (Note [Eager decisions] in
trident/frontend/policy.py): a call that runs eagerly for a reason its argument tree keeps is
decided from the leaves the native tree read, without flattening in Python or tracing again; it
says its real reason (once in the warnings, in ``miss_reasons`` and ``explain``); the decision
is read again at every call, so a call whose reason stopped holding is compiled and served
natively; a trace that fails prints nothing of torch's on stderr; two ``trident.jit`` objects
over one function share its cache entry and its specialization limit."""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import trident
from trident.ir.facts import MAX_ARGS

install_module = importlib.import_module("trident.frontend.install")  # where calls are flattened


def add(x, y):
    return x + y


def matmul(x, y):
    return x @ y


def shift(x, n):
    return x * 2 + n % 7


def total(xs):
    return torch.stack(xs).sum(0)


GLOBAL_W = torch.randn(3)


def reads_global(x, y):
    return x + y + GLOBAL_W


def _requires_grad():
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    return (add, lambda: (x, w), contextlib.nullcontext, lambda: w.requires_grad_(False),
            "y requires grad: Trident serves inference; autograd runs eagerly")


def _autocast():
    x, y, on = torch.randn(2, 3), torch.randn(3, 2), [True]
    return (matmul, lambda: (x, y), lambda: torch.autocast("cpu", enabled=on[0]),
            lambda: on.__setitem__(0, False), "autocast, a torch.func transform or a "
            "TorchFunctionMode (torch.set_default_device, ...) is on")


def _bigint():
    x, n = torch.randn(3), [2**70]
    return (shift, lambda: (x, n[0]), contextlib.nullcontext, lambda: n.__setitem__(0, 3),
            "argument n is an int that the native guards do not read")


def _dual():
    x, y, t, dual = torch.randn(3), torch.randn(3), torch.randn(3), [True]

    @contextlib.contextmanager
    def level():
        with fwAD.dual_level() if dual[0] else contextlib.nullcontext():
            yield

    return (add, lambda: (fwAD.make_dual(x, t) if dual[0] else x, y), level,
            lambda: dual.__setitem__(0, False),
            "x is a forward-mode AD dual tensor: its tangent is computed eagerly")


def _too_many_leaves():
    xs = [torch.full((2,), float(i)) for i in range(MAX_ARGS + 1)]
    return (total, lambda: (xs,), contextlib.nullcontext, None,
            f"{MAX_ARGS + 1} argument leaves; the native path reads at most {MAX_ARGS - 1}")


def _compile_failure():
    x, y = torch.randn(3), torch.randn(3)
    return (reads_global, lambda: (x, y), contextlib.nullcontext, None,
            "reads_global reads a tensor that is not an argument")


def _run(fn, args, context):
    """``fn(*args)`` under ``context``: the output's values and, for a dual output, tangent."""
    with context():
        out = fn(*args())
        primal, tangent = fwAD.unpack_dual(out)
        return primal.detach(), tangent, out.requires_grad, out.dtype


def _same(got, want) -> bool:
    return all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
               for a, b in zip(got, want))


@pytest.mark.parametrize("case", [_requires_grad, _autocast, _bigint, _dual, _too_many_leaves,
                                  _compile_failure],
                         ids=["requires-grad", "autocast", "bigint", "dual", "too-many-leaves",
                              "compile-failure"])
def test_eager_decisions_are_made_once_per_tree_and_never_stale(case, monkeypatch):
    """Each kind of reason a call runs eagerly for: after the first call, no call of the tree
    is flattened in Python or traced again, every call equals eager (values, tangent, grad),
    the reason is warned once and recorded per call (never "first call"), and explain() says
    it. When the reason stops holding, the next call compiles and the one after is a hit."""
    fn, args, context, stop, reason = case()
    flattened = []
    real = install_module.flatten_call
    monkeypatch.setattr(install_module, "flatten_call",
                        lambda *a: flattened.append(1) or real(*a))  # counts, then runs it
    jf = trident.jit(fn)
    traced = 1 if case is _compile_failure else 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            assert _same(_run(jf, args, context), _run(fn, args, context))
            st = jf.stats
            assert (st.misses, st.fallbacks, st.hits, st.compiles, st.traces) == \
                (i + 1, i + 1, 0, 0, traced), st
    assert len(flattened) == 1
    ours = [str(w.message) for w in caught if str(w.message).startswith("trident")]
    assert len(ours) == 1 and ours[0].startswith(f"trident: {fn.__name__} runs eagerly: {reason}")
    # one entry per miss (Note [Miss counts]): a miss whose trace failed says why it ran eagerly
    eager = jf.stats.miss_reasons
    assert len(eager) == 4 and all(r.startswith(f"eager: {reason}") for r in eager)
    with context():
        assert f"runs eagerly: {reason}" in jf.explain(*args())
    if stop is None:
        return
    stop()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # compiled: no warning
        for _ in range(2):
            assert _same(_run(jf, args, context), _run(fn, args, context))
    st = jf.stats
    assert (st.misses, st.fallbacks, st.hits, st.compiles) == (5, 4, 1, 1), st
    assert "accepts these arguments" in jf.explain(*args())


def test_reasons_that_return_are_decided_again():
    """A tensor that requires grad again after a compile: its calls miss natively and run
    eagerly without a new trace; calls without grad stay hits."""
    x, w = torch.randn(3), torch.randn(3)
    jf = trident.jit(add)
    with pytest.warns(UserWarning, match="y requires grad"):
        for grad in (False, False, True, True, False, True):
            w.requires_grad_(grad)
            assert torch.equal(jf(x, w), x + w) and jf(x, w).requires_grad == grad
    st = jf.stats  # each loop step called twice
    assert (st.compiles, st.traces, st.hits, st.fallbacks) == (1, 1, 5, 6), st


def pick(x, y):
    return x + (y[0] if isinstance(y, list) else y % 7 if type(y) is int else y)


def test_a_call_the_eager_tree_holds_but_python_flattens_otherwise_is_compiled():
    """The native tree of an eager call also holds for calls whose own tree differs (a LEAF
    takes any value; a tensor passed twice is one leaf and a SAME node in Python's tree): those
    take the whole miss path, flattened in Python, and compile."""
    x, t = torch.randn(3), torch.randn(3)
    jf = trident.jit(pick)
    with pytest.warns(UserWarning, match="argument y is an int"):
        assert torch.equal(jf(x, 2**70), pick(x, 2**70))
    assert torch.equal(jf(x, [t]), x + t) and torch.equal(jf(x, [t]), x + t)
    assert (jf.stats.fallbacks, jf.stats.compiles, jf.stats.hits) == (1, 1, 1), jf.stats
    w = torch.randn(3, requires_grad=True)
    with pytest.warns(UserWarning, match="y requires grad"):
        assert torch.equal(jf(x, w), x + w)
    w.requires_grad_(False)
    assert torch.equal(jf(w, w), w + w) and torch.equal(jf(w, w), w + w)
    assert (jf.stats.fallbacks, jf.stats.compiles, jf.stats.hits) == (2, 2, 2), jf.stats
    assert len(jf.specializations) == 2 and jf._select(w, w) == 1


# ---- a failed trace prints nothing of torch's ----------------------------------------------


def _mismatched_matmul(x, w):
    return x @ w


def _mismatched_cat(x, w):
    return torch.cat([x, w], dim=1)


def _bad_view(x, w):
    return (x + 1).view(7, -1) + w.sum()


@pytest.mark.parametrize("fn", [_mismatched_matmul, _mismatched_cat, _bad_view],
                         ids=["matmul", "cat", "view"])
def test_a_failed_trace_warns_once_and_raises_eagers_exception_only(fn, capfd, caplog):
    """A shape error inside the function: the user sees Trident's one warning and eager's own
    exception, nothing on stderr; fake tensor mode's traceback goes to Trident's recompiles
    log (TRIDENT_LOGS=recompiles)."""
    x, w = torch.randn(3, 4), torch.randn(5, 6)
    with pytest.raises(RuntimeError) as want:
        fn(x, w)
    capfd.readouterr()
    jf = trident.jit(fn)
    caplog.set_level(logging.INFO, logger="trident.recompiles")
    with pytest.warns(UserWarning, match=f"trident: {fn.__name__} runs eagerly: cannot trace"):
        with pytest.raises(RuntimeError) as got:
            jf(x, w)
    assert str(got.value) == str(want.value)
    assert capfd.readouterr().err == ""
    assert jf.stats.fallbacks == 1 and jf.stats.traces == 1
    logged = [r for r in caplog.records if r.name == "trident.recompiles"]
    if fn is not _bad_view:  # (view's error is raised by torch's Python, not the meta kernel)
        assert any("torch._subclasses.fake_tensor (ERROR)" in r.getMessage() and r.exc_info
                   for r in logged)


# ---- two trident.jit objects over one function ---------------------------------------------


def scaled(x, n):
    return x * n


def test_two_jits_of_one_function_share_its_cache_entry():
    """The second jit loads what the first compiled; both are one function in `list`."""
    x = torch.randn(3)
    a, b = trident.jit(scaled), trident.jit(scaled)
    assert torch.equal(a(x, 2), x * 2) and torch.equal(b(x, 2), x * 2)
    assert (a.stats.compiles, b.stats.compiles, b.stats.misses) == (1, 0, 0)
    assert b(x, 2) is not None and b.stats.hits == 2
    (row,) = trident.list_cache()
    assert row["specializations"] == 1


def test_two_jits_called_at_once_compile_once():
    x = torch.randn(3)
    jfs = [trident.jit(scaled) for _ in range(2)]
    start = threading.Barrier(2)
    outs = [None, None]

    def call(i):
        start.wait()
        outs[i] = jfs[i](x, 3)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(o, x * 3) for o in outs)
    assert sum(j.stats.compiles for j in jfs) == 1 and sum(j.stats.fallbacks for j in jfs) == 0
    assert [r["specializations"] for r in trident.list_cache()] == [1]


def test_two_jits_of_one_function_share_its_specialization_limit():
    """Note [Specialization limit]: compiles are counted per function, as torch.compile's
    recompile limit counts per code object."""
    x = torch.randn(3)
    a, b = (trident.jit(scaled, max_specializations=2) for _ in range(2))
    assert torch.equal(a(x, 2), x * 2) and torch.equal(b(x, 3), x * 3)
    with pytest.warns(UserWarning, match="reached its limit of 2 compiled specializations"):
        assert torch.equal(a(x, 4), x * 4)
    assert (a.stats.compiles, b.stats.compiles, a.stats.fallbacks) == (1, 1, 1)
    assert torch.equal(a(x, 3), x * 3) and a.stats.fallbacks == 1  # b's, from the cache


def _Cache(t):
    return {"t": t}


def _append(cache, x):
    cache["t"] = torch.cat([cache["t"], x])  # an assignment to its argument's item: eager
    return cache["t"] * 2


def test_a_signature_that_fails_the_same_way_at_two_sizes_is_eager_at_every_size():
    # a growing cache that assigns a dict item (no specialization replays it: Note [Attribute
    # writes] in trident/lower/writes.py) traced once per generated token before
    f = trident.jit(_append)
    mine, theirs = _Cache(torch.zeros(1)), _Cache(torch.zeros(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(6):
            x = torch.randn(1 + i % 2)
            assert torch.equal(f(mine, x), _append(theirs, x))
            assert torch.equal(mine["t"], theirs["t"])
    assert (f.stats.traces, f.stats.fallbacks, f.stats.compiles) == (2, 6, 0)
    # a signature that differs in more than sizes (a dtype) is traced again
    x, c = torch.randn(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(f(_Cache(c), x), _append(_Cache(c), x))
    assert f.stats.traces == 3


def _branch_on_value(x):
    if float(x.sum()) > 0:  # a branch on a tensor's value, a float (Note [Value reads])
        return x * 2
    return x - 1


def test_a_branch_on_a_tensor_value_says_so_and_runs_eagerly():
    """Data-dependent control flow: the warning names the line and says that a trace sees shapes,
    not values (torch's own message, GuardOnDataDependentSymNode, follows); both branches equal
    eager's."""
    jf = trident.jit(_branch_on_value)
    with pytest.warns(UserWarning, match=r"if float\(x\.sum\(\)\) > 0:.*\) \(Python control flow "
                                         r".* a trace sees shapes, not values; no value check: "
                                         r"a float"):
        assert torch.equal(jf(torch.ones(3)), _branch_on_value(torch.ones(3)))
    assert torch.equal(jf(-torch.ones(3)), _branch_on_value(-torch.ones(3)))
    assert (jf.stats.fallbacks, jf.stats.hits) == (2, 0), jf.stats
