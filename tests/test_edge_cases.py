"""Inputs and programs that once gave wrong answers, leaks or raw errors (each found by trying
to break Trident), compared with eager PyTorch."""

import math
import threading
import warnings

import numpy as np
import pytest
import torch

import trident
from _trident_helpers import assert_same


def test_autocast_is_guarded():
    def f(x, w):
        return (x @ w).relu() @ w + 1

    jf = trident.jit(f)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    assert_same(jf(x, w), f(x, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = jf(x, w), f(x, w)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)
    assert_same(jf(x, w), f(x, w))
    assert jf.stats.fallbacks == 1 and jf.stats.compiles == 1


def test_grad_mode_read_by_the_function_is_guarded():
    def f(x):
        return x + 1 if torch.is_grad_enabled() else x - 1

    jf = trident.jit(f)
    x = torch.randn(3)
    for mode in (True, False, True, False):
        with torch.set_grad_enabled(mode):
            assert_same(jf(x), f(x))
    assert jf.stats.compiles == 2


def test_requires_grad_and_inference_tensors_are_guarded():
    def f(x):
        if x.requires_grad:
            return x * 2
        return x + 1 if x.is_inference() else x - 1

    jf = trident.jit(f)
    plain, needs_grad = torch.randn(3), torch.randn(3, requires_grad=True)
    with torch.inference_mode():
        inference = torch.randn(3)
    with torch.no_grad():
        for x in (plain, needs_grad, inference, plain, needs_grad, inference):
            assert_same(jf(x), f(x))
    assert jf.stats.compiles == 3


def test_negative_nan_argument_keeps_its_sign():
    def f(x, s: float):
        return torch.copysign(x, s), torch.full_like(x, s).signbit()

    jf = trident.jit(f)
    x = torch.ones(3)
    for s in (-math.nan, math.nan, -0.0):
        got, want = jf(x, s), f(x, s)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_one_tensor_twice_after_distinct_tensors():
    def f(x, y):
        return x * 0 if x is y else x + y

    jf = trident.jit(f)
    a, b = torch.ones(3), torch.ones(3)
    assert_same(jf(a, b), f(a, b))
    assert_same(jf(a, a), f(a, a))
    assert_same(jf(a, b), f(a, b))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_returned_list_items_do_not_leak():
    def f(x):
        return (x + 1).chunk(2)

    jf = trident.jit(f)
    x = torch.randn(512, 512)  # 1 MiB per intermediate
    for _ in range(20):
        jf(x)
    before = rss_bytes()
    for _ in range(300):
        out = jf(x)
    del out
    assert rss_bytes() - before < 64 * 2**20  # a leak here would be about 300 MiB


def test_first_calls_from_several_threads():
    def f(x):
        return torch.relu(x * 3 - 1).sum(0)

    jf = trident.jit(f)
    x = torch.randn(8, 8)
    errors, results = [], []

    def call():
        try:
            results.append(jf(x))
        except BaseException as e:  # noqa: BLE001 - the test reports whatever escaped
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for r in results:
        assert_same(r, f(x))


def test_tensor_made_with_requires_grad_inside_runs_eagerly():
    def f(x):
        return torch.zeros(3, requires_grad=True) + x

    jf = trident.jit(f)
    with pytest.warns(UserWarning, match="requires grad"):
        got = jf(torch.ones(3))
    assert got.requires_grad and torch.equal(got.detach(), torch.ones(3))


def test_unimportable_constant_falls_back_with_a_warning():
    def f(x):
        return x + 1j

    jf = trident.jit(f)
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = jf(x)
    assert torch.equal(got, f(x))
    assert jf.stats.fallbacks == 1 and any("trident" in str(w.message) for w in caught)
    with pytest.raises(trident.TridentError):
        trident.jit(f, fallback=False)(x)


G = torch.tensor([2.0])


def test_one_element_global_tensor_is_live_state_not_a_constant():
    def f(x):
        return x * G

    jf = trident.jit(f)
    x = torch.ones(3)
    with pytest.warns(UserWarning, match="not an argument"):
        assert_same(jf(x), f(x))
    G[0] = 5.0
    assert_same(jf(x), f(x))
    G[0] = 2.0


def _literals(x, i, k: int):
    return (x[[1, 2]], x[[k, 0]], torch.unravel_index(i, (4, 5)),
            x[:2, 0] + torch.tensor([0.5, 1e-3]), torch.tensor([[True, False]]) & (x[:1, :2] > 0),
            torch.tensor([[1, 2], [3, 4]], dtype=torch.int16), torch.tensor([3.0, 4.0]),
            x.new_tensor([[k, 2 * k]]), torch.tensor([255, 1], dtype=torch.uint8) + 1,
            torch.tensor([0.1, 1e-30], dtype=torch.float64),
            torch.tensor([0.1, 0.2], dtype=torch.bfloat16) * x[0, :2])


def test_tensors_made_from_python_data_are_baked():
    """Tensors the function makes from Python values (index lists, ``torch.tensor([...])``, a
    shape inside ``unravel_index``; up to 64 elements; a sweep of the kind over dtypes) are
    made by the plan on every call: fresh, contiguous, no ``_base``, equal to eager's; a value
    from an int argument is guarded (another value compiles again); complex ones run eagerly."""
    x, i = torch.randn(5, 5), torch.arange(13).view(1, 13)
    jf = trident.jit(_literals)
    for k in (3, 3, 4, 4):
        got, want = jf(x, i, k), _literals(x, i, k)
        assert_same(got, want)
        assert [t._is_view() for t in got[:2] + got[3:]] == [t._is_view() for t in
                                                             want[:2] + want[3:]]
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (2, 2, 0), jf.stats
    jf = trident.jit(lambda x: x + torch.tensor([1j, 2.0]))
    with pytest.warns(UserWarning, match="complex64 tensor from Python data"):
        assert_same(jf(x[0, :2]), x[0, :2] + torch.tensor([1j, 2.0]))


def test_default_dtype_is_guarded():
    def f(x):
        return (x * 1.5).sum(0) + torch.tensor(0.1)

    jf = trident.jit(f)
    x = torch.arange(6).reshape(2, 3)
    assert_same(jf(x), f(x))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert_same(jf(x), f(x))
        assert_same(jf(x), f(x))
    finally:
        torch.set_default_dtype(old)
    assert_same(jf(x), f(x))
    assert jf.stats.compiles == 2


def test_torch_func_transforms_run_eagerly():
    def f(x):
        return torch.sin(x) * 2

    jf = trident.jit(f)
    x = torch.randn(4, 3)
    assert_same(jf(x), f(x))
    assert torch.equal(torch.vmap(jf)(x), torch.vmap(f)(x))
    assert torch.equal(torch.func.grad(lambda t: jf(t).sum())(x),
                       torch.func.grad(lambda t: f(t).sum())(x))
    with torch.no_grad():
        assert torch.equal(torch.func.functionalize(jf)(x), f(x))
    assert_same(jf(x), f(x))
    assert type(jf(x)) is torch.Tensor


def test_complex_setitem_falls_back():
    def f(x):
        x = x.clone()
        x[1] = 0.1
        return x

    jf = trident.jit(f)
    x = torch.randn(3, dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(jf(x), f(x))


def test_rebinding_a_closure_variable_recompiles():
    def make():
        k = 2.0
        f = trident.jit(lambda x: x * k)

        def set_k(value):
            nonlocal k
            k = value
        return f, set_k

    f, set_k = make()
    x = torch.arange(3.0)
    assert torch.equal(f(x), x * 2) and torch.equal(f(x), x * 2)
    set_k(5.0)
    assert torch.equal(f(x), x * 5)
    assert (f.stats.compiles, f.stats.hits) == (2, 1)


_storage_offset = torch.Tensor.storage_offset  # an alias taken before any trace


@pytest.mark.parametrize("read", [lambda x: x + x.storage_offset(),
                                  lambda x: x + _storage_offset(x),
                                  lambda x: x + x.storage().size(),
                                  lambda x: x + 1 if x._base is None else x - 1,
                                  lambda x: x * (2 if x._is_view() else 3),
                                  lambda x: x + x._version],
                         ids=["storage_offset", "alias", "storage", "_base", "_is_view",
                              "_version"])
@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")  # x.storage(), torch 2.13
def test_reading_unguarded_tensor_facts_runs_eagerly(read):
    f = trident.jit(read)
    base = torch.arange(32.0)
    with pytest.warns(UserWarning, match="does not guard"):
        f(base[0:8])
    for x in (base[4:12], torch.ones(8), base[0:8]):
        assert torch.equal(f(x), read(x))
    assert f.stats.compiles == 0 and f.stats.fallbacks == 4


_ARRAY = np.arange(8, dtype=np.float32)


def _adds_numpy(x):
    return x + torch.from_numpy(_ARRAY)


def test_a_tensor_over_numpy_memory_says_what_the_function_did():
    """A tensor the function makes from a NumPy array is read by torch's tracer (its
    ``storage_offset()``), not by the user: the warning says the function made a tensor over
    memory it does not own, at its line, and what to do, and the call equals eager's."""
    f = trident.jit(_adds_numpy)
    x = torch.ones(8)
    line = _adds_numpy.__code__.co_firstlineno + 1
    with pytest.warns(UserWarning) as caught:
        assert torch.equal(f(x), _adds_numpy(x))
    (message,) = [str(w.message) for w in caught if "trident" in str(w.message)]
    assert message == (
        f"trident: _adds_numpy runs eagerly: the function makes a tensor over memory it does "
        f"not own (test_edge_cases.py:{line}): return x + torch.from_numpy(_ARRAY) (as "
        "torch.from_numpy or torch.frombuffer do: the tensor shares a NumPy array's or a "
        "buffer's memory, which no guard watches); pass the tensor as an argument for the call "
        "to compile")
    assert "storage_offset" not in message
    _ARRAY[0] = 5.0  # eager reads the array's memory at every call
    assert torch.equal(f(x), _adds_numpy(x)) and f.stats.fallbacks == 2


def _assigns_data(x):
    x.data = torch.zeros(3)
    return x + 1


def _assigns_grad(x):
    x.grad = torch.ones_like(x)
    return x * 2


@pytest.mark.parametrize("fn", [_assigns_data, _assigns_grad], ids=["data", "grad"])
def test_rebinding_a_tensor_inside_the_function_runs_eagerly(fn):
    """``x.data = y`` (another shape) rebinds ``x`` and eager returns the new shape; a hit would
    neither rebind it nor see the shape: the call runs eagerly, with one warning."""
    f = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            a, b = torch.ones(2), torch.ones(2)
            want, got = fn(a), f(b)
            assert torch.equal(got, want) and torch.equal(a, b)
            assert (a.grad is None) == (b.grad is None)
    ours = [w for w in caught if "trident" in str(w.message)]
    assert len(ours) == 1 and "assigns a tensor's" in str(ours[0].message), ours
    assert (f.stats.compiles, f.stats.fallbacks, f.stats.hits) == (0, 3, 0), f.stats


def test_inference_mode_is_guarded():
    f = trident.jit(lambda x: x + 1 if torch.is_inference_mode_enabled() else x - 1)
    x = torch.ones(2)
    with torch.no_grad():
        assert torch.equal(f(x), x - 1)
    with torch.inference_mode():
        assert torch.equal(f(x), x + 1)
    with torch.no_grad():
        assert torch.equal(f(x), x - 1)
    assert (f.stats.compiles, f.stats.hits) == (2, 1)


def test_default_device_mode_runs_eagerly():
    f = trident.jit(lambda n: torch.zeros(n) + 1)
    assert f(3).device.type == "cpu"
    torch.set_default_device("meta")
    try:
        assert f(3).device.type == "meta"
    finally:
        torch.set_default_device(None)
    assert f(3).device.type == "cpu"
    assert (f.stats.compiles, f.stats.fallbacks, f.stats.hits) == (1, 1, 1)


def test_another_threads_draws_during_a_trace_are_not_the_functions():
    """8 threads, each calling its own function, while another thread draws from the default
    generator: the generator's state moves during the traces, but not by the functions (their
    own thread set nothing), so every call is served natively (480 of 480 ran eagerly: 'changes
    global torch state (rng)'). A function that sets the generator itself still runs eagerly."""
    stop = threading.Event()

    def draw():
        while not stop.is_set():
            torch.randn(64)

    fns = [trident.jit(lambda x, k=k: x * k + 1) for k in range(8)]
    failures = []

    def work(i):
        x = torch.ones(3)
        for _ in range(60):
            if not torch.equal(fns[i](x), x * i + 1):
                failures.append(i)

    drawer = threading.Thread(target=draw)
    drawer.start()
    try:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        stop.set()
        drawer.join()
    assert not failures
    assert [(f.stats.compiles, f.stats.hits, f.stats.fallbacks) for f in fns] == [(1, 59, 0)] * 8

    def seeds(x):
        g = torch.default_generator
        saved = g.get_state()
        g.manual_seed(0)
        y = x + torch.rand(3)
        g.set_state(saved)
        return y

    js = trident.jit(seeds)
    with pytest.warns(UserWarning, match="random generator in another state"):
        assert torch.equal(js(torch.ones(3)), seeds(torch.ones(3)))
    assert js.stats.fallbacks == 1
