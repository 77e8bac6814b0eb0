"""Exact hit / miss / compile / fallback accounting, miss reasons, explain(), the
specialization bound and keyword arguments."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import trident
from _trident_helpers import as_in_a_new_process


def counts(jf):
    s = jf.stats
    return {"hits": s.hits, "misses": s.misses, "compiles": s.compiles,
            "fallbacks": s.fallbacks, "traces": s.traces}


def scale(x, n):
    return x * n


def test_stats_start_at_zero_and_are_a_snapshot():
    jf = trident.jit(scale)
    assert isinstance(jf.stats, trident.Stats)
    assert counts(jf) == dict(hits=0, misses=0, compiles=0, fallbacks=0, traces=0)
    assert jf.stats.miss_reasons == []
    snap = jf.stats
    jf(torch.ones(2), 2)
    assert snap.misses == 0  # a snapshot, not a live view
    snap.miss_reasons.append("x")
    assert jf.stats.miss_reasons == ["first call"]


def test_first_call_is_a_miss_not_a_hit():
    """README: two identical calls give Stats(hits=1, misses=1, compiles=1, ...)."""
    jf = trident.jit(scale)
    x = torch.randn(4)
    jf(x, 2)
    assert counts(jf) == dict(hits=0, misses=1, compiles=1, fallbacks=0, traces=1)
    jf(x, 2)
    assert counts(jf) == dict(hits=1, misses=1, compiles=1, fallbacks=0, traces=1)


def test_same_call_hits_exactly():
    jf = trident.jit(scale)
    x = torch.randn(4)
    jf(x, 2)
    for i in range(1, 11):
        assert torch.equal(jf(x, 2), x * 2)
        assert counts(jf) == dict(hits=i, misses=1, compiles=1, fallbacks=0, traces=1)
    # a different tensor with the same metadata is a hit too
    y = torch.randn(4)
    assert torch.equal(jf(y, 2), y * 2)
    assert jf.stats.hits == 11 and jf.stats.misses == 1


def test_new_shape_misses_and_compiles():
    jf = trident.jit(scale)
    jf(torch.ones(4), 2)
    jf(torch.ones(5), 2)
    assert counts(jf) == dict(hits=0, misses=2, compiles=2, fallbacks=0, traces=2)
    assert jf.stats.miss_reasons[-1] == "x.size(0) == 4 expected, got 5 (specialization 0)"
    # both specializations now hit
    jf(torch.ones(4), 2)
    jf(torch.ones(5), 2)
    assert counts(jf) == dict(hits=2, misses=2, compiles=2, fallbacks=0, traces=2)
    # the second is automatic dynamic: x's size changed, so x.size(0) is symbolic (>= 2)
    assert jf.specializations == ["scale(x: float32[4] cpu, n=2)", "scale(x: float32[?] cpu, n=2)"]
    jf(torch.ones(9), 2)
    assert counts(jf) == dict(hits=3, misses=2, compiles=2, fallbacks=0, traces=2)


def test_different_int_value_misses():
    jf = trident.jit(scale)
    x = torch.arange(4.0)
    assert torch.equal(jf(x, 2), x * 2)
    assert torch.equal(jf(x, 3), x * 3)  # a value guard, not a stale result
    assert counts(jf) == dict(hits=0, misses=2, compiles=2, fallbacks=0, traces=2)
    assert "n == 2" in jf.stats.miss_reasons[-1]
    assert torch.equal(jf(x, 2), x * 2) and torch.equal(jf(x, 3), x * 3)
    assert jf.stats.hits == 2


@pytest.mark.parametrize("first,second,reason", [
    (2, 2.0, "n is int"),
    (2.0, 2, "n is float"),
    (True, 1, "n is bool"),
    (1, True, "n is int"),
    (0.0, -0.0, "n == 0.0"),
    (None, 0, "n is None"),
])
def test_scalar_kind_and_float_bits_are_guarded(first, second, reason):
    def f(x, n):
        return x + (0.5 if n is None else float(n))

    jf = trident.jit(f)
    x = torch.ones(3)
    jf(x, first)
    r = jf(x, second)
    assert torch.equal(r, f(x, second)) and r.dtype == f(x, second).dtype
    assert counts(jf)["misses"] == 2 and counts(jf)["compiles"] == 2
    assert reason in jf.stats.miss_reasons[-1]


def test_nan_float_argument_hits():
    jf = trident.jit(scale)
    x = torch.ones(2)
    jf(x, float("nan"))
    r = jf(x, float("nan"))
    assert torch.isnan(r).all()
    assert counts(jf) == dict(hits=1, misses=1, compiles=1, fallbacks=0, traces=1)


def test_strides_dtype_and_alignment_are_guarded():
    jf = trident.jit(lambda x: x + 1)
    base = torch.randn(4, 4)
    jf(base)
    jf(base.t())  # same sizes, other strides
    jf(base.double())  # other dtype
    jf(base.view(-1)[1:5].view(2, 2))  # same dtype, other shape & 4-byte misaligned
    assert counts(jf)["compiles"] == 4 and counts(jf)["hits"] == 0
    reasons = jf.stats.miss_reasons
    assert "x.stride(0) == 4" in reasons[1]
    assert "x.dtype == float32" in reasons[2]


def test_misalignment_alone_is_a_miss():
    jf = trident.jit(lambda x: x * 2)
    buf = torch.zeros(64)
    a = buf[0:8]
    b = buf[1:9]  # same size/stride/dtype, data_ptr % 16 == 4
    assert a.data_ptr() % 16 == 0 and b.data_ptr() % 16 != 0
    jf(a)
    jf(b)
    assert counts(jf)["compiles"] == 2
    assert "data_ptr() % 16 == 0" in jf.stats.miss_reasons[-1]
    c = buf[4:12]  # aligned again: hits specialization 0
    jf(c)
    assert counts(jf)["hits"] == 1


def test_explain_names_the_failing_guard():
    jf = trident.jit(scale)
    assert jf.explain(torch.ones(4), 2) == "no specializations yet"
    x = torch.ones(4)
    jf(x, 2)
    sig = "scale(x: float32[4] cpu, n=2)"
    assert jf.explain(x, 2) == f"specialization 0 ({sig}) accepts these arguments"
    assert jf.explain(x[:1], 2) == \
        f"specialization 0 ({sig}): x.size(0) == 4 expected, got 1"
    assert jf.explain(x, 3) == f"specialization 0 ({sig}): n == 2 expected, got 3"
    assert jf.explain(x.double(), 2) == \
        f"specialization 0 ({sig}): x.dtype == float32 expected, got 'float64'"
    with pytest.raises(TypeError):  # does not bind, as calling scale(x) would not
        jf.explain(x)
    assert jf.explain(x, "2") == \
        f"specialization 0 ({sig}): n: str '2' where a leaf was compiled"
    assert jf.explain(torch.ones(4, 1), 2) == \
        f"specialization 0 ({sig}): x.dim() == 1 expected, got 2"
    with torch.enable_grad():
        assert "x.requires_grad is False expected, got True" in jf.explain(
            torch.ones(4, requires_grad=True), 2)
    with torch.no_grad():  # grad mode is guarded: the specialization was made with it on
        assert "torch.is_grad_enabled() is True expected, got False" in jf.explain(x, 2)
    with torch.no_grad():  # every failing guard, the first of each argument's
        assert jf.explain(x.double()[:2], 3) == (
            f"specialization 0 ({sig}): torch.is_grad_enabled() is True expected, got False; "
            "x.dtype == float32 expected, got 'float64'; n == 2 expected, got 3")
    # explain() does not count anything
    assert counts(jf) == dict(hits=0, misses=1, compiles=1, fallbacks=0, traces=1)


def test_explain_lists_every_specialization():
    jf = trident.jit(scale)
    jf(torch.ones(4), 2)
    jf(torch.ones(4, 2), 2)
    text = jf.explain(torch.ones(3), 2)
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0] == ("specialization 0 (scale(x: float32[4] cpu, n=2)): "
                        "x.size(0) == 4 expected, got 3")
    assert lines[1] == ("specialization 1 (scale(x: float32[4, 2] cpu, n=2)): "
                        "x.dim() == 2 expected, got 1")
    assert jf.explain(torch.zeros(4, 2), 2) == \
        "specialization 1 (scale(x: float32[4, 2] cpu, n=2)) accepts these arguments"


def test_explain_names_a_long_signature_by_its_start():
    # a Hugging Face forward's signature is many hundred characters; explain() names each
    # specialization by its index and the first 120 (found by a new user: 14 such lines)
    def many(x, **kw):
        return x + len(kw)

    jf = trident.jit(many)
    kw = {f"option_{i}": i for i in range(40)}
    jf(torch.ones(4), **kw)
    (sig,) = jf.specializations
    assert len(sig) > 400
    assert jf.explain(torch.ones(3), **kw) == \
        f"specialization 0 ({sig[:117]}...): x.size(0) == 4 expected, got 3"


def test_miss_reasons_text_and_bound():
    jf = trident.jit(max_specializations=64)(scale)
    x = torch.ones(2)
    jf(x, 0)
    assert jf.stats.miss_reasons == ["first call"]
    jf(x, 1)
    assert jf.stats.miss_reasons == ["first call", "n == 0 expected, got 1 (specialization 0)"]
    jf(x, 2)
    assert jf.stats.miss_reasons[-1] == (
        "n == 0 expected, got 2 (specialization 0); n == 1 expected, got 2 (specialization 1)")


def gather_scaled(x, i, n):
    return x[i] * n


def test_every_call_is_a_hit_or_a_miss_with_one_reason():
    """Note [Miss counts]: each call is a hit or a miss, and each miss has one entry in
    ``miss_reasons`` (the last 32): one that compiled, ran eagerly (autograd, past the limit)
    or whose step failed on a specialization that accepted it (an index out of range)."""
    jf = trident.jit(max_specializations=1)(gather_scaled)
    x, good, bad = torch.randn(4, 3), torch.tensor([0, 3]), torch.tensor([0, 9])
    w = x.clone().requires_grad_()
    calls = [(x, good, 2), (x, good, 2), (w, good, 2), (w, good, 2), (x, good, 3), (x, bad, 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, args in enumerate(calls):
            try:
                assert torch.equal(jf(*args), gather_scaled(*args))
            except IndexError:  # eager's own error, raised by the eager run
                assert args[1] is bad
            s = jf.stats
            assert s.hits + s.misses == i + 1 and len(s.miss_reasons) == s.misses, s
        assert (s.hits, s.misses, s.compiles, s.fallbacks) == (1, 5, 1, 4), s
        assert s.miss_reasons[0] == "first call"
        assert [r.split(":")[0] for r in s.miss_reasons[1:]] == ["eager"] * 4
        assert "reached its limit of 1" in s.miss_reasons[3]
        assert "a step failed before the call changed anything" in s.miss_reasons[4]
        for n in range(40):  # past the limit: each call a miss, the last 32 kept
            jf(x, good, 10 + n)
    s = jf.stats
    assert s.misses == 45 and s.hits == 1 and len(s.miss_reasons) == 32


def test_max_specializations_bound_runs_eagerly_with_one_warning():
    jf = trident.jit(max_specializations=2)(scale)
    x = torch.arange(3.0)
    jf(x, 1)
    jf(x, 2)
    with pytest.warns(UserWarning, match="limit of 2 compiled specializations") as record:
        assert torch.equal(jf(x, 3), x * 3)
        assert torch.equal(jf(x, 4), x * 4)
        assert torch.equal(jf(x, 3), x * 3)
    limit_warnings = [w for w in record if "limit" in str(w.message)]
    assert len(limit_warnings) == 1
    assert limit_warnings[0].filename == __file__  # points at the caller's line
    assert counts(jf) == dict(hits=0, misses=5, compiles=2, fallbacks=3, traces=2)
    # the two kept specializations still hit, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(jf(x, 1), x) and torch.equal(jf(x, 2), x * 2)
    assert jf.stats.hits == 2 and len(jf.specializations) == 2


def test_the_limit_warning_says_which_wrappers_compiled(trident_cache):
    """Note [Specialization limit]: the limit counts the function's compiles in this process
    over every trident.jit object of it, not the stored specializations a new object installs
    from the cache; the warning says how many each made (a fresh user saw it at
    ``stats.compiles == 0``)."""
    first = trident.jit(max_specializations=2)(scale)
    x = torch.arange(3.0)
    first(x, 1)
    first(x, 2)
    second = trident.jit(max_specializations=2)(scale)
    assert torch.equal(second(x, 1), x)  # installed from the cache: not a compile
    with pytest.warns(UserWarning) as record:
        assert torch.equal(second(x, 3), x * 3)
    (warning,) = [str(w.message) for w in record if "limit" in str(w.message)]
    assert ("reached its limit of 2 compiled specializations in this process (0 by this "
            "trident.jit object, 2 by others over the same function; those installed from the "
            "cache do not count)") in warning, warning
    assert counts(second) == dict(hits=1, misses=1, compiles=0, fallbacks=1, traces=0)


def test_max_specializations_from_environment(monkeypatch):
    monkeypatch.setenv("TRIDENT_MAX_SPECIALIZATIONS", "1")
    jf = trident.jit(scale)
    jf(torch.ones(1), 1)
    with pytest.warns(UserWarning, match="limit of 1 compiled specializations"):
        jf(torch.ones(1), 2)
    assert counts(jf)["fallbacks"] == 1 and counts(jf)["compiles"] == 1


def test_a_miss_may_install_a_stored_specialization_without_compiling():
    """``Stats.misses`` (docs/torch-compile.md): a miss compiles, falls back, or installs a
    specialization stored for the same code by an earlier process, counted in neither
    ``compiles`` nor ``fallbacks``. In one process a second ``trident.jit`` object of the
    function shares the first's installed specializations: only hits."""
    first, second = trident.jit(scale), trident.jit(scale)
    x = torch.arange(3.0)
    assert torch.equal(first(x, 2), x * 2) and torch.equal(second(x, 2), x * 2)
    assert counts(first) == dict(hits=0, misses=1, compiles=1, fallbacks=0, traces=1)
    assert counts(second) == dict(hits=1, misses=0, compiles=0, fallbacks=0, traces=0)
    first(x, 3)  # the newest stored specialization, which a later process installs first
    as_in_a_new_process()  # (with a limit of one, that one alone: test_cache.py's limit test)
    later = trident.jit(scale, max_specializations=1)
    assert torch.equal(later(x, 2), x * 2) and torch.equal(later(x, 2), x * 2)
    assert counts(later) == dict(hits=1, misses=1, compiles=0, fallbacks=0, traces=0)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "a"])
def test_max_specializations_must_be_a_positive_int(bad):
    """0 read as unlimited, -3 made every call fall back, "a" failed at the first call."""
    with pytest.raises(trident.TridentError, match=r"max_specializations must be an int >= 1"):
        trident.jit(scale, max_specializations=bad)
    with pytest.raises(trident.TridentError, match="max_specializations"):
        trident.jit(max_specializations=bad)(scale)


def add(x, y=2, z=None):
    return x + y if z is None else x + y + z


def test_keyword_arguments_are_bound_and_correct():
    jf = trident.jit(add)
    x = torch.arange(3.0)
    assert torch.equal(jf(x, y=5), x + 5)
    assert torch.equal(jf(x=x, y=5), x + 5)
    assert torch.equal(jf(y=5, x=x), x + 5)
    assert torch.equal(jf(x, 5), x + 5)  # by position: the same bound values
    assert torch.equal(jf(x, z=x), add(x, z=x))  # defaults are filled in
    assert torch.equal(jf(x, y=7), x + 7)  # a new value: a new specialization
    st = jf.stats
    assert st.fallbacks == 0
    # (x, 5, None) bound as Python binds it, (x, 2, the tensor at x), (x, 7, None)
    assert st.compiles == 3 and st.misses == 3
    assert st.hits == 3  # by keyword in another order, and by position
    with pytest.raises(TypeError) as got:
        jf(x, w=1)
    with pytest.raises(TypeError) as want:
        add(x, w=1)
    assert str(got.value) == str(want.value)


def test_keyword_only_parameters_and_kwargs_are_served_natively():
    def f(x, *, s=1.0, **extra):
        return x * s + sum(extra.values())

    jf = trident.jit(f)
    x = torch.arange(3.0)
    for _ in range(2):
        assert torch.equal(jf(x, s=3.0), x * 3)
        assert torch.equal(jf(x), x)  # the default
        assert torch.equal(jf(x, b=2.0, a=x), f(x, a=x, b=2.0))
    assert counts(jf) == dict(hits=3, misses=3, compiles=3, fallbacks=0, traces=3)


def test_varargs():
    def f(*xs):
        return sum(xs[1:], xs[0])

    jf = trident.jit(f)
    a, b, c = torch.ones(2), torch.full((2,), 2.0), torch.full((2,), 3.0)
    assert torch.equal(jf(a, b, c), a + b + c)
    assert torch.equal(jf(a, b, c), a + b + c)
    assert torch.equal(jf(a, b), a + b)
    assert counts(jf) == dict(hits=1, misses=2, compiles=2, fallbacks=0, traces=2)
    assert jf.specializations[0].endswith(
        "f(xs[0]: float32[2] cpu, xs[1]: float32[2] cpu, xs[2]: float32[2] cpu)")
    assert "xs: builtins.tuple of 2 where builtins.tuple of 3 was compiled" in \
        jf.stats.miss_reasons[-1]


def test_stats_dataclass_fields():
    names = {f.name for f in dataclasses.fields(trident.Stats)}
    assert {"hits", "misses", "compiles", "fallbacks", "traces", "miss_reasons"} <= names


def test_decorator_forms_and_bad_targets():
    @trident.jit
    def a(x):
        return x + 1

    @trident.jit(max_specializations=3)
    def b(x):
        return x + 2

    assert a.__name__ == "a" and b.__name__ == "b" and a.__wrapped__(torch.ones(1)).item() == 2
    assert torch.equal(a(torch.ones(1)), torch.full((1,), 2.0))
    assert torch.equal(b(torch.ones(1)), torch.full((1,), 3.0))
    with pytest.raises(trident.TridentError):
        trident.jit(42)
    with pytest.raises(trident.TridentError):
        trident.jit(torch.relu)  # a builtin: no Python code to trace

