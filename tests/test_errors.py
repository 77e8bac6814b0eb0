"""Bad or unsupported input: eager fallbacks (counted, correct), TridentError with the user's
source line, and no crashes."""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings

import pytest
import torch

import trident
from _trident_helpers import assert_same, c_module

HERE = __file__.rsplit("/", 1)[-1]  # test_errors.py


def line_of(fn, text: str) -> int:
    """The file line number of the first line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def add(x, y):
    return x + y


# ---- argument count ------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(torch.ones(2),), (torch.ones(2), torch.ones(2), 3), ()])
def test_wrong_argument_count_raises_eagers_type_error(args):
    jf = trident.jit(add)
    with pytest.raises(TypeError) as want:
        add(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TypeError) as got:
            jf(*args)
        with pytest.raises(TypeError):  # again (a remembered signature or a new attempt)
            jf(*args)
    assert str(got.value) == str(want.value)
    assert jf.stats.compiles == 0
    # the function still compiles and serves correct calls
    x, y = torch.randn(3), torch.randn(3)
    assert torch.equal(jf(x, y), x + y)
    assert jf.stats.compiles == 1


def test_wrong_argument_count_after_compiling():
    jf = trident.jit(add)
    x = torch.randn(3)
    jf(x, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TypeError, match="missing 1 required positional argument"):
            jf(x)
    assert torch.equal(jf(x, x), x + x)
    assert jf.stats.hits == 1


@pytest.mark.gpu
def test_mixed_devices_raise_like_eager():
    jf = trident.jit(add)
    with pytest.raises(RuntimeError):
        add(torch.ones(2), torch.ones(2, device="cuda"))
    with pytest.raises(RuntimeError):
        jf(torch.ones(2), torch.ones(2, device="cuda"))


# ---- unsupported argument types ------------------------------------------------------------


class MyTensor(torch.Tensor):
    pass


def uses(x, obj):
    if isinstance(obj, str):
        return x * len(obj)
    if isinstance(obj, dict):
        return x + obj["a"]
    if isinstance(obj, list):
        return x + obj[0]
    if type(obj) is int:
        return x * 2 + float(obj)
    return x * 2 + obj


@pytest.mark.parametrize("obj", ["abc", {"a": 2.0}, [torch.ones(3)]], ids=["str", "dict", "list"])
def test_containers_and_constants_are_arguments_served_natively(obj):
    jf = trident.jit(uses)
    x = torch.arange(3.0)
    for _ in range(3):
        assert_same(jf(x, obj), uses(x, obj))
    st = jf.stats
    assert (st.fallbacks, st.misses, st.compiles, st.hits) == (0, 1, 1, 2)


@pytest.mark.parametrize("obj, kind", [(2**70, "an int"),
                                       (torch.ones(3).as_subclass(MyTensor), "a MyTensor")],
                         ids=["bigint", "subclass"])
def test_unsupported_argument_types_run_eagerly_with_one_warning(obj, kind):
    jf = trident.jit(uses)
    x = torch.arange(3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            got = jf(x, obj)
            assert_same(got, uses(x, obj))
            st = jf.stats
            assert (st.fallbacks, st.misses, st.compiles, st.traces, st.hits) == \
                (i + 1, i + 1, 0, 0, 0)
    assert [str(w.message) for w in caught] == [
        f"trident: uses runs eagerly: argument obj is {kind} that the native "
        "guards do not read (expected a strided CPU/CUDA tensor, int, float, bool or None)"]
    assert jf.stats.miss_reasons[-1].startswith(f"eager: argument obj is {kind} ")
    # the same function still compiles for supported arguments
    assert torch.equal(jf(x, 1.5), x * 2 + 1.5) and jf.stats.compiles == 1


def test_complex_constant_argument_matches_eager():
    jf = trident.jit(uses)
    x = torch.arange(3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            assert_same(jf(x, 1 + 2j), uses(x, 1 + 2j))


def test_unsupported_tensor_kinds_run_eagerly():
    def f(x):
        return x * 2

    jf = trident.jit(f)
    for x in (torch.ones(3, device="meta"), torch.ones(2, 2).to_sparse(),
              torch.ones(3, dtype=torch.complex64).conj(), torch.ones(3).as_subclass(MyTensor),
              torch._efficientzerotensor(3), torch.ones(3)._neg_view()):
        got = jf(x)
        want = f(x)
        assert type(got) is type(want) and got.layout == want.layout and got.device == want.device
        if x.device.type != "meta":
            assert torch.equal(got.to_dense() if got.is_sparse else got,
                               want.to_dense() if want.is_sparse else want)
    # (a ZeroTensor has no memory: its null data pointer would be what a CUDA graph replay
    # reads or copies in; it hit a plain tensor's specialization before)
    assert jf.stats.fallbacks == 6 and jf.stats.compiles == 0


def test_unsupported_argument_types_run_eagerly_even_without_fallback():
    jf = trident.jit(fallback=False)(uses)
    x = torch.arange(3.0)
    with pytest.warns(UserWarning, match="obj is an int that the native guards do not read"):
        assert torch.equal(jf(x, 2**70), uses(x, 2**70))
    assert jf.stats.fallbacks == 1


# ---- autograd ------------------------------------------------------------------------------


def loss(x, w, b):
    return torch.nn.functional.linear(torch.tanh(x), w, b).pow(2).sum()


def test_requires_grad_runs_eagerly_with_correct_gradients():
    jf = trident.jit(loss)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=gen)
    w = torch.randn(3, 5, generator=gen, requires_grad=True)
    b = torch.randn(3, generator=gen, requires_grad=True)
    for i in range(2):
        w.grad = b.grad = None
        out = jf(x, w, b)
        assert out.requires_grad and out.grad_fn is not None
        out.backward()
        gw, gb = w.grad.clone(), b.grad.clone()
        w.grad = b.grad = None
        want = loss(x, w, b)
        want.backward()
        assert_same(out.detach(), want.detach())
        assert_same(gw, w.grad)
        assert_same(gb, b.grad)
        assert jf.stats.fallbacks == i + 1 and jf.stats.compiles == 0


def test_same_inputs_under_no_grad_are_served_natively():
    jf = trident.jit(loss)
    x = torch.randn(4, 5)
    w = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        out1 = jf(x, w, b)
        out2 = jf(x, w, b)
        want = loss(x, w, b)
    assert not out1.requires_grad and out1.grad_fn is None
    assert_same(out1, want)
    assert_same(out2, want)
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 1, 0)
    # and under grad mode again: eager, differentiable
    out = jf(x, w, b)
    assert out.requires_grad
    out.backward()
    assert w.grad is not None and jf.stats.fallbacks == 1 and jf.stats.compiles == 1
    # inference mode is "no grad" too
    with torch.inference_mode():
        assert_same(jf(x, w, b), want)
    assert jf.stats.fallbacks == 1


def test_grad_mode_without_requires_grad_is_native_and_output_has_no_grad():
    jf = trident.jit(loss)
    x, w, b = torch.randn(4, 5), torch.randn(3, 5), torch.randn(3)
    out = jf(x, w, b)
    out = jf(x, w, b)
    assert not out.requires_grad
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 1, 0)


# ---- untraceable functions -----------------------------------------------------------------

GLOBAL_W = torch.randn(3)


def reads_global(x):
    return x + GLOBAL_W


def test_global_tensor_runs_eagerly_with_one_warning():
    jf = trident.jit(reads_global)
    x = torch.ones(3)
    with pytest.warns(UserWarning, match="not an argument") as record:
        assert_same(jf(x), reads_global(x))
    mine = [str(w.message) for w in record if "trident" in str(w.message)]
    assert len(mine) == 1
    assert f"{HERE}:{line_of(reads_global, 'x + GLOBAL_W')}" in mine[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second warning, no second trace
        assert_same(jf(x), reads_global(x))
    st = jf.stats
    assert (st.fallbacks, st.compiles, st.traces) == (2, 0, 1)
    # the eager fallback follows the global's current value
    GLOBAL_W.add_(1)
    try:
        assert_same(jf(x), reads_global(x))
    finally:
        GLOBAL_W.sub_(1)


def test_global_tensor_without_fallback_raises_naming_the_line():
    jf = trident.jit(fallback=False)(reads_global)
    with pytest.raises(trident.TridentError) as err:
        jf(torch.ones(3))
    line = line_of(reads_global, "x + GLOBAL_W")
    assert f"{HERE}:{line}" in str(err.value)
    assert "return x + GLOBAL_W" in str(err.value)
    assert isinstance(err.value, RuntimeError)


def test_closure_tensor_is_not_an_argument_either():
    w = torch.randn(3)

    def f(x):
        return x * w

    jf = trident.jit(fallback=False)(f)
    with pytest.raises(trident.TridentError, match=rf"{HERE}:{line_of(f, 'x * w')}"):
        jf(torch.ones(3))
    jf2 = trident.jit(f)
    with pytest.warns(UserWarning):
        assert_same(jf2(torch.ones(3)), f(torch.ones(3)))


def branchy(x):
    if float(x.sum()) > 0:  # a float taken from values: no value check (Note [Value reads])
        return x + 1
    return x - 1


def test_data_dependent_control_flow_falls_back_eagerly():
    jf = trident.jit(branchy)
    pos, neg = torch.ones(3), -torch.ones(3)
    with pytest.warns(UserWarning, match="runs eagerly"):
        assert_same(jf(pos), branchy(pos))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(jf(neg), branchy(neg))  # same signature: eager again, the other branch
    st = jf.stats
    assert (st.fallbacks, st.compiles, st.traces, st.hits) == (2, 0, 1, 0)


def test_data_dependent_control_flow_without_fallback_raises():
    jf = trident.jit(fallback=False)(branchy)
    with pytest.raises(trident.TridentError) as err:
        jf(torch.ones(3))
    assert f"{HERE}:{line_of(branchy, 'if float(x.sum()) > 0')}" in str(err.value)
    assert jf.stats.fallbacks == 0


def test_item_values_are_never_baked_in():
    """``.item()`` is data dependent: whether Trident runs it eagerly or reads it at run time,
    every call must see the current values, and never raise."""
    def f(x):
        return x * x.sum().item()

    jf = trident.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (3, 4):
            for k in range(2):
                x = torch.arange(float(n)) + k
                assert_same(jf(x), f(x))


class Slotted:
    __slots__ = ("y",)

    def __init__(self, y):
        self.y = y


def test_unsupported_output_type():
    def f(x):
        return Slotted(x + 1)

    jf = trident.jit(f)
    x = torch.ones(2)
    with pytest.warns(UserWarning, match="result is a test_errors.Slotted, which Trident cannot"):
        out = jf(x)
    assert_same(out.y, f(x).y)
    with pytest.raises(trident.TridentError, match="Slotted"):
        trident.jit(fallback=False)(f)(x)


# ---- errors inside the launch sequence -----------------------------------------------------


def mixed_mm(x, y):
    z = x + 1
    return torch.mm(z, y)


def test_op_error_in_launch_sequence_raises_eagers_error_naming_the_line():
    """A step that fails before the call changed anything (Note [Errors inside try] in
    capture.py): the call runs eagerly and raises eager's own exception; the warning names the
    failing step's line. The specialization stays."""
    jf = trident.jit(mixed_mm)
    x = torch.ones(2, 3)
    y = torch.ones(3, 2, dtype=torch.int64)
    with pytest.raises(RuntimeError) as eager:
        mixed_mm(x, y)
    with pytest.warns(UserWarning,  # once per reason
                      match=rf"{HERE}:{line_of(mixed_mm, 'torch.mm')} \(aten::mm\)"):
        for _ in range(2):  # the compiling call and a call of the installed specialization
            with pytest.raises(RuntimeError) as err:
                jf(x, y)
            assert type(err.value) is type(eager.value) and str(err.value) == str(eager.value)
    assert jf.stats.compiles == 1
    # the process is fine and the function still works for good inputs
    good = torch.ones(3, 2)
    assert torch.equal(jf(x, good), mixed_mm(x, good))


def gather_rows(x, i):
    return x[i] * 2


def test_index_error_on_a_hit_raises_eagers_error_and_recovers():
    jf = trident.jit(gather_rows)
    x = torch.randn(4, 3)
    good, bad = torch.tensor([0, 3]), torch.tensor([0, 9])
    assert torch.equal(jf(x, good), gather_rows(x, good))
    with pytest.raises(IndexError) as eager:
        gather_rows(x, bad)
    with pytest.raises(IndexError) as err, pytest.warns(UserWarning, match="runs eagerly"):
        jf(x, bad)
    assert type(err.value) is IndexError and str(err.value) == str(eager.value)
    assert torch.equal(jf(x, good), gather_rows(x, good))
    # a call that raised is not a hit
    assert (jf.stats.hits, jf.stats.compiles, jf.stats.fallbacks) == (1, 1, 1), jf.stats


def count_then_gather(x, i, calls):
    calls.add_(1)  # visible to the caller: a failing step after it cannot run again eagerly
    return x[i] * 2


def test_op_error_after_a_write_names_the_step_with_pytorchs_message():
    """A step that fails after the call wrote to an argument cannot run again eagerly (it would
    write twice): a TridentError of eager's class, the step's line, then PyTorch's message
    without the C++ backtrace. The write happened once, as in eager."""
    jf = trident.jit(count_then_gather)
    x, calls = torch.randn(4, 3), torch.zeros(())
    jf(x, torch.tensor([1]), calls)
    bad = torch.tensor([9])
    with pytest.raises(IndexError) as eager:
        count_then_gather(x, bad, torch.zeros(()))
    with pytest.raises(trident.TridentError) as err:
        jf(x, bad, calls)
    assert isinstance(err.value, IndexError) and calls.item() == 2
    where = f"{HERE}:{line_of(count_then_gather, 'x[i]')}"
    assert re.fullmatch(rf"{re.escape(where)} \(aten::index\.Tensor(, out)?\): "
                        rf"{re.escape(str(eager.value))}", str(err.value)), str(err.value)


def _size_division(x, y):
    return torch.ones(x.shape[0] // (y.shape[0] - 4)), x.shape[0] % (y.shape[0] - 4)


def test_division_by_zero_in_a_size_expression_raises_zero_division_error():
    """With dynamic dims, a size expression whose divisor becomes 0 raises eager's
    ZeroDivisionError (the specialization's guards exclude that size; its trace raises and the
    call runs eagerly), and the sizes around it are served as before."""
    jf = trident.jit(_size_division, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (5, 6, 4, 7, 4):
            x, y = torch.randn(n + 3), torch.randn(n)
            if n == 4:
                with pytest.raises(ZeroDivisionError):
                    jf(x, y)
            else:
                assert_same(jf(x, y), _size_division(x, y))
    assert jf.stats.fallbacks == 2, jf.stats


def _pow_or_double(x):
    try:
        return x.pow(-2)
    except RuntimeError:
        return x.double().pow(-2)


def _gather_or_zeros(x, i):
    try:
        return x.clone().gather(0, i) * 2
    except (IndexError, RuntimeError):
        return torch.zeros(3)


def _helper_catches(x, i):
    y = x + 1
    return _gather_or_zeros(y, i), y


def _bare_except(x):
    try:
        return x.pow(-2)
    except:  # noqa: E722 - the kind under test
        return x * 0


@pytest.mark.parametrize("fn, args, bad", [
    (_pow_or_double, (torch.arange(1, 5),), None),
    (_bare_except, (torch.arange(1, 5),), None),
    (_gather_or_zeros, (torch.randn(3), torch.tensor([0, 2, 1])), torch.tensor([0, 9, 1])),
    (_helper_catches, (torch.randn(3), torch.tensor([2, 2, 0])), torch.tensor([5, 0, 0])),
], ids=["pow", "bare", "gather", "helper"])
def test_errors_only_real_kernels_raise_take_eagers_except_branch(fn, args, bad):
    """A ``try`` around ops whose error only the real kernel raises (the trace runs on fake
    tensors): a call whose step fails before anything it did is visible runs eagerly and takes
    eager's ``except`` branch; calls that do not fail stay native."""
    jf = trident.jit(fn)
    calls = [args, args] if bad is None else [args, (args[0], bad), args, (args[0], bad)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in calls:
            assert_same(jf(*call), fn(*call))
    # every call fails (None), or the calls with ``bad`` do, the second good call hits
    fallbacks, hits = (len(calls), 0) if bad is None else (2, 1)
    assert (jf.stats.compiles, jf.stats.fallbacks, jf.stats.hits) == (1, fallbacks, hits), \
        jf.stats


def _pow_in_finally_and_with(x):
    with torch.no_grad():
        try:
            return x.pow(-2)
        finally:
            x.add_(0)


def _write_then_catch(x, y):
    y.add_(1)
    try:
        return x.pow(-2)
    except RuntimeError:
        return x.double().pow(-2)


def test_errors_outside_catching_try_are_raised():
    """``finally`` and ``with`` catch nothing: the kernel's error is raised, as eager raises it
    (the call runs eagerly, its ``finally`` included). A step that fails after the call wrote to
    its arguments cannot run again eagerly: it raises (a TridentError naming the step) rather
    than write twice."""
    x = torch.arange(1, 5)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        _pow_in_finally_and_with(x)
    version = x._version
    jf = trident.jit(_pow_in_finally_and_with)
    with pytest.raises(RuntimeError, match="negative integer powers"), \
            pytest.warns(UserWarning, match="runs eagerly"):
        jf(x)
    assert jf.stats.fallbacks == 1 and x._version == version + 1, jf.stats
    y = torch.zeros(2)
    jg = trident.jit(_write_then_catch)
    with pytest.raises(trident.TridentError, match="pow"):
        jg(x, y)
    assert torch.equal(y, torch.ones(2)) and jg.stats.fallbacks == 0


def test_runtime_abi_reports_cpp_exceptions_as_error_codes(tmp_path):
    """Note [No exception crosses the ABI]: a trt_api entry point whose C++ throws (the data
    pointer of a tensor without storage) returns an error code to the C caller and leaves
    PyTorch's message pending; nothing unwinds through C."""
    from trident import runtime

    _, lib = c_module(tmp_path, "abi_probe", "int probe(uintptr_t api);", r"""
#include "trident_rt.h"
int probe(uintptr_t api) {
  const trt_api* rt = (const trt_api*)api;
  trt_op* empty = rt->op("aten::empty", "memory_format");
  int64_t size = 2;
  trt_value args[] = {TRT_IL(&size, 1), TRT_NONE_V, TRT_I(1) /* torch.sparse_coo */,
                      TRT_NONE_V, TRT_NONE_V, TRT_NONE_V};
  trt_value r[1];
  if (!empty || rt->call(empty, args, 6, r, 1)) return -1;
  void* data = 0;
  int rc = rt->data_ptr(r[0].u.t, &data);
  rt->release(r[0].u.t);
  return rc;
}
""")
    rt = runtime.load()
    assert lib.probe(rt.api_address()) == 1
    assert "doesn't have storage" in rt.last_error()


def test_error_kinds_come_from_the_runtime_header(monkeypatch):
    """The runtime raises a failed step's error as the class of its kind (TRT_ERR_* in
    trident_rt.h, an index into the classes handed over at load): Python orders errors.py's
    classes by the header's values, and refuses a header and a table that disagree."""
    from trident import errors, runtime

    kinds = {name: value for name, value in runtime.ABI.items()
             if name.startswith("TRT_ERR_") and name != "TRT_ERR_KINDS"}
    assert set(kinds) == set(errors.ERROR_TYPES) and len(kinds) == runtime.ABI["TRT_ERR_KINDS"]
    types = runtime.error_types()
    assert all(types[value] is errors.ERROR_TYPES[name] for name, value in kinds.items())
    assert types[runtime.ABI["TRT_ERR_INDEX"]] is errors.TridentIndexError
    monkeypatch.delitem(errors.ERROR_TYPES, "TRT_ERR_EAGER")
    with pytest.raises(trident.TridentError, match="disagree"):
        runtime.error_types()
    monkeypatch.setitem(errors.ERROR_TYPES, "TRT_ERR_EAGER", errors.EagerCall)
    monkeypatch.setitem(runtime.ABI, "TRT_ERR_EAGER", 7)  # not 0..TRT_ERR_KINDS - 1
    with pytest.raises(trident.TridentError, match="disagree"):
        runtime.error_types()


def test_tree_codes_come_from_the_runtime_header():
    """The codes of tree nodes and output recipes are defined once, in trident_trees.h, which
    flatten.py and state.py read through ``runtime.ABI``: every enumerator there is written
    ``TRT_X = N``, the form ``runtime.ABI`` reads (one without its value would be missing from it,
    or numbered by the compiler alone), and the codes of each enum are distinct."""
    from trident import runtime

    text = (runtime.HERE / "trident_trees.h").read_text()
    enums = re.findall(r"^enum (\w+) \{\n(.*?)^\};", text, re.MULTILINE | re.DOTALL)
    assert [name for name, _ in enums] == ["trt_tree_access", "trt_tree_check", "trt_recipe_op",
                                           "trt_recipe_base"]
    for _, body in enums:
        entries = re.findall(r"^\s*(\w+)(?: = (-?\d+))?,", body, re.MULTILINE)
        assert entries and all(value != "" for _, value in entries), body
        assert all(runtime.ABI[name] == int(value) for name, value in entries)
        assert len({value for _, value in entries}) == len(entries)


def test_the_runtime_build_key_covers_every_part():
    """Every part of the runtime (runtime.cpp includes them) and every header of this folder they
    include are hashed into the runtime's build key, so an edit to any of them rebuilds it."""
    from trident import runtime

    hashed = {path.name for path in runtime.sources()}
    parts = {path.name for path in runtime.HERE.glob("*.cpp")}
    assert parts <= hashed
    assert {"runtime_internal.h", "trident_rt.h", "trident_trees.h"} <= hashed


def yields(x):
    yield x + 1


def count_kwargs(x, **kw):
    return x + len(kw)


class Holder:
    def __init__(self, n):
        self.n = n


def reads_n(x, c):
    return x * (c.n % 7)


@pytest.mark.parametrize("fn, args, kwargs, message", [
    (yields, (), {}, "the result is a builtins.generator, which Trident cannot rebuild"),
    (count_kwargs, (), {(): 1},
     "argument **kwargs is a dict with a tuple key; Trident flattens dicts with str and int keys"),
    (reads_n, (Holder(2**70),), {}, "argument c.n is an int that the native guards do not read"),
], ids=["generator", "kwargs", "int"])
def test_an_eager_calls_warning_reads_as_english(fn, args, kwargs, message):
    """No doubled words ("the result result"), no empty names ("argument  is"), "an int"."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jf = trident.jit(fn)
        if fn is reads_n:  # c.n becomes an int leaf once it changes (Note [Int leaves])
            for n in (2, 3):
                jf(torch.arange(3.0), Holder(n))
        with contextlib.suppress(TypeError):  # Python's own binding refuses a tuple keyword
            jf(torch.arange(3.0), *args, **kwargs)
    said = [str(w.message) for w in caught]
    assert [m for m in said if m.startswith(f"trident: {fn.__name__} runs eagerly: {message}")], said


def test_a_module_attribute_asked_of_its_jit_function_names_what_to_jit():
    """``trident.jit(model)`` is the model's forward: a name the module has and the JitFunction
    lacks (a new user's ``trident.jit(model).generate``) raises AttributeError saying to jit
    the forward instead; another name raises Python's plain AttributeError."""
    linear = torch.nn.Linear(2, 2)
    jm = trident.jit(linear)
    with pytest.raises(AttributeError, match=r"jit its forward: model.forward = trident.jit"):
        jm.extra_repr
    with pytest.raises(AttributeError, match=r"^'JitFunction' object has no attribute 'nope'$"):
        jm.nope
    assert not hasattr(jm, "__deepcopy__") and callable(jm.__call__)
    x = torch.randn(3, 2)
    assert torch.equal(jm(x), linear(x))
