"""An adversarial pass over the tenth session's changes and Python state that changes between
calls (CPU machine): each fault found is a test of its whole kind, against eager."""

from __future__ import annotations

import decimal
import random
import types
import warnings

import numpy as np
import pytest
import torch

import trident
from _trident_helpers import assert_same, counts, run_python, said


def fresh(fn):
    """``fn`` with a code object of its own (``backend_stats`` counts per frame code)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


# ---- Note [Size choices in graphs]: torch.sym_max / sym_min promote to float ------------------

def sym_max_const(x):
    return torch.full((2,), torch.sym_max(x.shape[0], 1.0))


def sym_min_const(x):
    return torch.full((2,), torch.sym_min(x.shape[0], 100.5))


def sym_max_arg(x, a):
    return torch.full((2,), torch.sym_max(x.shape[0], a))


def sym_min_arg(x, a):
    return x[:2] * torch.sym_min(a, x.shape[0])


def max_of_sizes(x):  # all ints: max answers an int, as eager's
    return x[:max(x.shape[0] - 4, 1)] * 2


_CHOICES = {
    "sym_max(n, 1.0)": (sym_max_const, [(torch.ones(n),) for n in (3, 4, 5, 6)]),
    "sym_min(n, 100.5)": (sym_min_const, [(torch.ones(n),) for n in (3, 4, 5, 6)]),
    # (one size: a new size traces again, Note [Size choices in graphs] aside)
    "sym_max(n, a)": (sym_max_arg, [(torch.ones(4), a) for a in (1.0, 2.0, 9.0, 0.5)]),
    "sym_min(a, n)": (sym_min_arg, [(torch.ones(4), a) for a in (1.0, 2.0, 9.0, 7.5)]),
    "max(n - 4, 1)": (max_of_sizes, [(torch.ones(n),) for n in (3, 4, 5, 6, 9)]),
}
_EAGER_CHOICES = {"sym_max(n, a)", "sym_min(a, n)"}


@pytest.mark.parametrize("case", list(_CHOICES))
def test_size_choices_answer_as_torch_does(case):
    """Note [Size choices in graphs]: ``torch.sym_max`` / ``torch.sym_min`` with a float
    operand answer a float (``torch.sym_max(3, 1.0)`` is ``3.0``); the backend's graph called
    Python's ``max``, which answered the int ``3``: ``torch.full`` made an int64 tensor where
    eager made a float32 one. Each call equals eager (dtype included), none falls back."""
    fn, calls = _CHOICES[case]
    torch._dynamo.reset()
    f = torch.compile(fresh(fn), backend="trident", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for args in calls:
            assert_same(f(*args), fn(*args))
    s = trident.backend_stats(f)
    if case in _EAGER_CHOICES:  # a float argument: Dynamo passes it as a tensor, whose item
        # the choice compares (data-dependent: the graph runs eagerly, one warning)
        assert (s.compiles, s.hits, s.fallbacks) == (0, 0, len(calls)), s
        assert len(said(caught, "trident")) == 1, said(caught, "trident")
        return
    assert not said(caught, "trident"), said(caught, "trident")
    assert s.fallbacks == 0 and s.hits + s.compiles == len(calls), s


# ---- Note [The decimal context]: its reads ---------------------------------------------------

D = decimal.Decimal


def third(x):
    return x * float(D(1) / D(3))


def context_precision(x):
    return x * decimal.getcontext().prec


def quantized(x):
    return x * float(D("1.23456789").quantize(D("0.01")))


def local_context(x):  # the local context copies the thread's rounding
    with decimal.localcontext() as c:
        c.prec = 2
        return x * float(D(2) / D(3))


@pytest.mark.parametrize("fn", [third, context_precision, quantized, local_context],
                         ids=lambda f: f.__name__)
def test_decimal_context_reads_run_eagerly(fn):
    """Decimal arithmetic reads the thread's context (precision, rounding), which no guard
    checks and no recording sees (C slots, a type's call): a hit kept the trace's answer after
    ``getcontext().prec = 3`` or a new rounding. Such a function runs eagerly, with one warning;
    each call equals eager."""
    x = torch.ones(3)
    jf = trident.jit(fn)
    with decimal.localcontext() as ctx, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for change in (None, ("prec", 3), ("rounding", decimal.ROUND_UP), ("prec", 30)):
            if change is not None:
                setattr(ctx, *change)
            for _ in range(2):
                assert_same(jf(x), fn(x))
    assert counts(jf) == (0, 0, 8), jf.stats
    assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")
    assert said(caught, "decimal"), said(caught, "trident")


# ---- Note [Draws of a trace] -----------------------------------------------------------------

RNG = random.Random(0)
NP_GEN = np.random.default_rng(0)


def _py_states():
    return random.getstate(), RNG.getstate()


def _np_states():
    return np.random.get_state(legacy=False)["state"]["key"].tobytes(), \
        repr(NP_GEN.bit_generator.state)


_DRAWS = {
    "random.random": lambda x: x * random.random(),
    "random.randint": lambda x: x * random.randint(1, 1000),
    "a global random.Random": lambda x: x * RNG.random(),
    "np.random.rand": lambda x: x * float(np.random.rand()),
    "np.random.randn through a helper": lambda x: x * _helper_draw(),
    "a global numpy Generator": lambda x: x * float(NP_GEN.random()),
}


def _helper_draw():
    return float(np.random.randn())


@pytest.mark.parametrize("case", list(_DRAWS))
def test_a_draw_is_made_once_per_call(case):
    """A draw from a Python-level generator is a result no guard keeps: the call runs eagerly
    (numpy's were served from the trace's draw at every hit: Cython methods, which no profile
    hook reports), and the trace's own draw is put back (eager's first call drew the trace's
    second number). Each call's answer and the generators' states after it equal eager's."""
    fn = _DRAWS[case]
    x = torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(3):
            random.seed(seed), RNG.seed(seed), np.random.seed(seed)
            NP_GEN.bit_generator.state = np.random.default_rng(seed).bit_generator.state
            want = fn(x)
            after = _py_states(), _np_states()
            random.seed(seed), RNG.seed(seed), np.random.seed(seed)
            NP_GEN.bit_generator.state = np.random.default_rng(seed).bit_generator.state
            assert_same(jf(x), want)
            assert (_py_states(), _np_states()) == after, seed
    assert counts(jf) == (0, 0, 3), jf.stats
    assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")


def test_numpy_random_first_imported_by_the_trace(subprocess_env):
    """numpy imports ``numpy.random`` at its first use: a function whose ``np.random.rand()``
    is the process's first was traced with the module unwatched."""
    code = (
        "import warnings, numpy as np, torch, trident, sys\n"
        "assert 'numpy.random' not in sys.modules\n"
        "def f(x):\n"
        "    return x * float(np.random.rand())\n"
        "jf = trident.jit(f)\n"
        "x = torch.ones(2)\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    jf(x)\n"  # (the trace imports numpy.random)
        "    assert (jf.stats.compiles, jf.stats.fallbacks) == (0, 1), jf.stats\n"
        "    for seed in range(3):\n"
        "        np.random.seed(seed)\n"
        "        want = f(x)\n"
        "        np.random.seed(seed)\n"
        "        assert torch.equal(jf(x), want), seed\n"
        "assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (0, 0, 4), jf.stats\n"
        "print('ok')\n")
    assert run_python(subprocess_env, "-c", code).stdout.strip().endswith("ok")


# ---- library warnings ------------------------------------------------------------------------

def implicit_softmax(x):
    return torch.nn.functional.softmax(x)  # torch warns (Python's warnings.warn) at each call


def test_library_warning_under_a_changed_filter():
    # Note [Warnings a trace gives] (lower/state/warned.py): a function whose trace gives a
    # library's warning runs eagerly (tests/test_never_stale48.py: every filter)
    x = torch.ones(3)
    jf = trident.jit(implicit_softmax)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jf(x)
        jf(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="Implicit dimension"):
            implicit_softmax(x)
        with pytest.raises(UserWarning, match="Implicit dimension"):
            jf(x)
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (0, 0, 3), jf.stats


# ---- Note [Global side effects] (lower/global_state.py): torch's settings ---------------------

def _flushes():
    return torch.tensor([1e-40], dtype=torch.float32).mul_(1.0).item() == 0.0


_SETTINGS = {  # a function that sets it; the setting's reader; its value to start from
    "print options": (lambda x: (torch.set_printoptions(precision=2), x + 1)[1],
                      lambda: str(torch.tensor([1.23456])),
                      lambda: torch.set_printoptions(precision=4)),
    "flush denormal": (lambda x: (torch.set_flush_denormal(True), x + 1)[1], _flushes,
                       lambda: torch.set_flush_denormal(False)),
    "warn always": (lambda x: (torch.set_warn_always(True), x + 1)[1],
                    torch.is_warn_always_enabled, lambda: torch.set_warn_always(False)),
    "float32 matmul precision": (
        lambda x: (torch.set_float32_matmul_precision("medium"), x + 1)[1],
        torch.get_float32_matmul_precision,
        lambda: torch.set_float32_matmul_precision("highest")),
    "mkldnn enabled": (lambda x: (torch._C._set_mkldnn_enabled(False), x + 1)[1],
                       torch._C._get_mkldnn_enabled,  # (as torch.backends.mkldnn.flags sets it:
                       lambda: torch._C._set_mkldnn_enabled(True)),  # another test may have
    # disabled the global flags' setters)
    "anomaly mode": (lambda x: (torch.autograd.set_detect_anomaly(True), x + 1)[1],
                     torch.is_anomaly_enabled,
                     lambda: torch.autograd.set_detect_anomaly(False)),
}


@pytest.mark.parametrize("case", list(_SETTINGS))
def test_a_torch_setting_set_by_the_function_runs_eagerly(case):
    """A torch setting that the function sets and leaves set: the trace set it once, no hit
    did (print options, flush-denormal, warn-always: stale state after every hit), or it made
    every call miss and compile again (matmul precision, guarded). The call runs eagerly with
    one warning, the setting put back before it, so that eager sets it once; after each call
    the setting is eager's."""
    fn, read, reset = _SETTINGS[case]
    x = torch.ones(3)
    jf = trident.jit(fn)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                reset()
                want = fn(x)
                after = read()
                reset()
                assert_same(jf(x), want)
                assert read() == after
        assert counts(jf) == (0, 0, 3), jf.stats
        assert len(said(caught, "changes global torch state")) == 1, said(caught, "trident")
    finally:
        reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ["cudnn benchmark", "matmul precision"])
def test_a_cuda_setting_set_by_the_function_runs_eagerly_on_cuda(case):
    """Note [Global side effects] on CUDA tensors (the lead's GPU run): the setting is eager's
    after each call, one warning, no replay that skips it; reading the settings warns
    nothing at the other calls' traces (the tf32 flags' legacy getters are not read)."""
    get, put, value, start = {
        "cudnn benchmark": (torch._C._get_cudnn_benchmark, torch._C._set_cudnn_benchmark,
                            True, False),
        "matmul precision": (torch.get_float32_matmul_precision,
                             torch.set_float32_matmul_precision, "high", "highest")}[case]

    def fn(x):
        put(value)
        return x @ x

    x = torch.randn(8, 8, device="cuda")
    jf = trident.jit(fn)
    plain = trident.jit(lambda x: x @ x + 1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                put(start)
                want = fn(x)
                put(start)
                assert_same(jf(x), want)
                assert get() == value
                put(start)
                assert_same(plain(x), x @ x + 1)
        assert counts(jf) == (0, 0, 3), jf.stats
        assert counts(plain) == (1, 2, 0), plain.stats
        assert [str(w.message) for w in caught if "trident" in str(w.message)] == \
            said(caught, "changes global torch state"), [str(w.message) for w in caught]
        assert len(said(caught, "changes global torch state")) == 1
    finally:
        put(start)
