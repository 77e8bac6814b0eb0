"""An adversarial pass over torch's settings that the function reads in Python and settings
that torch itself refuses to answer (CPU machine, session 49): each fault found is a test of its
whole kind, against eager (``torch.equal``), with exact compile, hit and fallback counts and the
one warning where calls run eagerly."""

from __future__ import annotations

import json
import logging
import textwrap
import warnings

import pytest
import torch

import trident
from _trident_helpers import assert_same, counts, installed_package, run_python, said


# ---- torch's settings read in Python ----------------------------------------------------------
# Each was read by a getter that no guard followed: the trace's answer was baked in and every
# hit after the change returned it (stale, hits up, no warning). ``is_autocast_cache_enabled``
# was wrong from the first call: make_fx turns the cache off to trace.

def _warn_always(x):
    return x * (2 if torch.is_warn_always_enabled() else 3)


def _mha_fastpath(x):
    return x * (2 if torch.backends.mha.get_fastpath_enabled() else 3)


def _fill_uninitialized(x):
    return x * (2 if torch._C._get_deterministic_fill_uninitialized_memory() else 3)


def _qengine(x):
    return x * torch._C._get_qengine()


def _autocast_dtype(x):
    return x * (2 if torch.get_autocast_dtype("cpu") == torch.bfloat16 else 3)


def _autocast_cpu_dtype(x):
    return x * (2 if torch.get_autocast_cpu_dtype() == torch.bfloat16 else 3)


def _autocast_cache(x):
    return x * (2 if torch.is_autocast_cache_enabled() else 3)


_QENGINE = torch.backends.quantized.engine
_SETTINGS = {  # the function; the change; the setting put back; served natively
    # (trt_env.flags' TRT_FLAG_WARN_ALWAYS, which ops obey when they run: a recompile)
    "warn always": (_warn_always, lambda: torch.set_warn_always(True),
                    lambda: torch.set_warn_always(False), True),
    # (torch.backends is scanned library code: its module global is a library value)
    "mha fastpath": (_mha_fastpath, lambda: torch.backends.mha.set_fastpath_enabled(False),
                     lambda: torch.backends.mha.set_fastpath_enabled(True), True),
    # (chain.py's _TORCH_GETTERS: called in C at every hit, checked by value)
    "fill uninitialized memory": (
        _fill_uninitialized,
        lambda: torch._C._set_deterministic_fill_uninitialized_memory(False),
        lambda: torch._C._set_deterministic_fill_uninitialized_memory(True), True),
    "quantized engine": (
        _qengine, lambda: setattr(torch.backends.quantized, "engine", "qnnpack"),
        lambda: setattr(torch.backends.quantized, "engine", _QENGINE), True),
    # Note [Autocast settings] (lower/state/impure.py): eager
    "autocast dtype": (_autocast_dtype, lambda: torch.set_autocast_dtype("cpu", torch.float16),
                       lambda: torch.set_autocast_dtype("cpu", torch.bfloat16), False),
    "deprecated autocast dtype": (
        _autocast_cpu_dtype, lambda: torch.set_autocast_cpu_dtype(torch.float16),
        lambda: torch.set_autocast_cpu_dtype(torch.bfloat16), False),
    # Note [Trace state] (lower/state/recording.py): eager
    "autocast cache": (_autocast_cache, lambda: torch.set_autocast_cache_enabled(False),
                       lambda: torch.set_autocast_cache_enabled(True), False),
}


def _change_is_seen(fn, change, reset, served: bool) -> None:
    """Five calls of ``fn`` jitted, ``change()`` before the third, each against eager: served,
    two compiles and three hits without a warning; else five eager calls with one warning."""
    x = torch.ones(3)
    reset()
    jf = trident.jit(fn)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(5):
                if i == 2:
                    change()
                assert_same(jf(x), fn(x))
        if served:
            assert counts(jf) == (2, 3, 0), jf.stats
            assert not said(caught, "trident"), said(caught, "trident")
        else:
            assert counts(jf) == (0, 0, 5), jf.stats
            assert len(said(caught, "runs eagerly")) == 1, said(caught, "trident")
    finally:
        reset()


@pytest.mark.parametrize("case", list(_SETTINGS))
def test_a_torch_setting_read_in_python_is_seen(case):
    _change_is_seen(*_SETTINGS[case])


def _print_options(x):
    return x * (2 if torch._tensor_str.get_printoptions()["precision"] == 4 else 3)


def _print_options_in_library(x):
    return x * (2 if torch.nn.Identity().extra_repr() == "" and
                torch._tensor_str.get_printoptions()["sci_mode"] is None else 3)


# a function of a torch.distributed module (by its globals' name, as library_kind tells
# torch's own Python) that reads a dict global: judged by what the global holds, not by the
# module's name (a name test let every torch.distributed function through)
_DISTRIBUTED = {"__name__": "torch.distributed._trident_test49", "TABLE": {"k": 2}}
exec("def factor():\n    return TABLE['k']\n", _DISTRIBUTED)
_FACTOR = _DISTRIBUTED.pop("factor")


_GETTERS = {  # Note [torch's Python state] (lower/state/library.py): eager, one warning
    "get_printoptions": (_print_options, lambda: torch.set_printoptions(precision=6),
                         lambda: torch.set_printoptions(precision=4), False),
    "get_printoptions twice": (_print_options_in_library,
                               lambda: torch.set_printoptions(sci_mode=True),
                               lambda: torch.set_printoptions(sci_mode=None), False),
}


@pytest.mark.parametrize("case", list(_GETTERS))
def test_a_getter_of_torchs_python_state_is_seen(case):
    _change_is_seen(*_GETTERS[case])


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_the_process_group_registry_is_no_python_state():
    """Note [torch's Python state]: torch.distributed's registry of process groups
    (``distributed_c10d._world``, which ``dist.group.WORLD`` reads) is guarded by the process
    group guard, so a function that reads it is let through by what the global holds
    (tests/test_collectives.py serves the collectives natively); another torch.distributed
    function's dict is torch's Python state. (An end-to-end case needs a real torch.distributed
    function that reads a dict global itself, which torch 2.13 does not have: exec'd code of
    that module name is read as user code, its reads guarded.)"""
    import torch.distributed.distributed_c10d as c10d
    from trident.lower.state.library import torch_state_read

    assert torch_state_read(c10d._WorldMeta.WORLD.fget.__code__, vars(c10d)) is None
    assert torch_state_read(_FACTOR.__code__, _FACTOR.__globals__) == "TABLE"


def _attention(m, x):
    return m(x, x, x, need_weights=False)[0]


def _encoder_layer(m, x):
    return m(x)


_FAST_PATHS = {  # the module, made under manual_seed(0); its call
    "nn.MultiheadAttention": (lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True),
                              _attention),
    "nn.TransformerEncoderLayer": (
        lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), _encoder_layer),
    "nn.TransformerEncoder": (lambda: torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2,
        enable_nested_tensor=False), _encoder_layer),
}


@pytest.mark.parametrize("case", list(_FAST_PATHS))
def test_a_fast_path_the_trace_mode_turns_off_runs_eagerly(case):
    """Note [Trace state] (lower/state/recording.py): in eval mode without grad, eager runs
    the fused ``_native_multi_head_attention`` / ``_transformer_encoder_layer_fwd``; the
    forward asks ``torch.overrides.has_torch_function(args)``, which the trace's own
    TorchFunctionMode answered True, and every hit returned the composite path's result (other
    values, other strides). Such calls run eagerly; with the fast path turned off
    (``torch.backends.mha.set_fastpath_enabled(False)``, a library value) the forward asks no
    more and is served."""
    make, call = _FAST_PATHS[case]
    torch.manual_seed(0)
    m = make().eval()
    x = torch.randn(2, 4, 8)
    jf = trident.jit(call)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert_same(jf(m, x), call(m, x))
    assert counts(jf) == (0, 0, 3), jf.stats
    assert len(said(caught, "has_torch_function")) == 1, said(caught, "trident")

    def composite(m, x):
        return call(m, x)

    served = trident.jit(composite)
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                assert_same(served(m, x), call(m, x))
        assert counts(served) == (1, 2, 0), served.stats
        assert not said(caught, "trident"), said(caught, "trident")
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def _einsum(a, b, c):
    return torch.einsum("ij,jk,kl->il", a, b, c)


def _einsum_flag(x):
    return x * (2 if torch.backends.opt_einsum.enabled else 3)


@pytest.mark.parametrize("fn", [_einsum, _einsum_flag])
def test_the_einsum_flags_library_code_reads_are_guarded(fn):
    """Note [Flags behind a PropModule] (lower/state/library.py): torch.einsum of three
    operands reads ``torch.backends.opt_einsum.enabled`` (and, with opt_einsum installed,
    ``strategy``), which pick the contraction order, so the values in the last bits; a change
    must recompile (here, without opt_einsum, the order is the same). So must the flag read by
    user code."""
    a, b, c = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3, 9)
    args = (a, b, c) if fn is _einsum else (a,)
    start = torch.backends.opt_einsum.enabled
    jf = trident.jit(fn)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (opt_einsum is not available: a UserWarning)
            for i in range(4):
                if i == 2:
                    torch.backends.opt_einsum.enabled = not start
                assert_same(jf(*args), fn(*args))
        assert counts(jf) == (2, 2, 0), jf.stats
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.opt_einsum.enabled = start


# ---- Note [Library objects read into] (lower/state/chain.py) -----------------------------------

_LIB = """
class Settings:
    def __init__(self):
        self.scale = 2.0
        self.mode = "fast"

    @property
    def double(self):
        return self.scale * 2


SETTINGS = Settings()
"""
_LIB_NAME = "break49lib"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("site"), _LIB_NAME,
                           {"__init__": _LIB}) as module:
        yield module


def _lib_scale(x):
    import break49lib
    return x * break49lib.SETTINGS.scale


def _lib_mode(x):
    import break49lib
    return x * (2 if break49lib.SETTINGS.mode == "fast" else 3)


def _lib_property(x):
    import break49lib
    return x * break49lib.SETTINGS.double


def _print_precision(x):
    return x * (2 if torch._tensor_str.PRINT_OPTS.precision == 4 else 3)


def _json_indent(x):
    return x * (2 if json._default_encoder.indent is None else 3)


def _root_level(x):
    return x * (2 if logging.root.level == logging.WARNING else 3)


def _set_attribute(owner, name, value):
    def change():
        setattr(owner(), name, value)
    return change


_OBJECTS = {  # the function; its change; its undoing; served natively
    "a library object's number": (
        _lib_scale, lambda: _set_attribute(lambda: __import__(_LIB_NAME).SETTINGS, "scale", 5.0),
        lambda: _set_attribute(lambda: __import__(_LIB_NAME).SETTINGS, "scale", 2.0), True),
    "a library object's string": (
        _lib_mode, lambda: _set_attribute(lambda: __import__(_LIB_NAME).SETTINGS, "mode", "slow"),
        lambda: _set_attribute(lambda: __import__(_LIB_NAME).SETTINGS, "mode", "fast"), True),
    "a library object's property": (
        _lib_property,
        lambda: _set_attribute(lambda: __import__(_LIB_NAME).SETTINGS, "scale", 5.0),
        lambda: _set_attribute(lambda: __import__(_LIB_NAME).SETTINGS, "scale", 2.0), False),
    "torch's print options": (_print_precision, lambda: lambda: torch.set_printoptions(
        precision=6), lambda: lambda: torch.set_printoptions(precision=4), True),
    "json's default encoder": (
        _json_indent, lambda: _set_attribute(lambda: json._default_encoder, "indent", 2),
        lambda: _set_attribute(lambda: json._default_encoder, "indent", None), True),
    "the root logger": (_root_level, lambda: lambda: logging.root.setLevel(logging.ERROR),
                        lambda: lambda: logging.root.setLevel(logging.WARNING), False),
}


@pytest.mark.parametrize("case", list(_OBJECTS))
def test_an_attribute_of_a_library_object_read_through_its_module(lib, case):
    """The chain ended at the object, checked by identity: after the attribute changed, hits
    returned the trace's answer (stale). Now read into as a user's object, or eager where
    Python code serves the attribute (a property) or the object is a logger."""
    fn, change, reset, served = _OBJECTS[case]
    _change_is_seen(fn, change(), reset(), served)


# ---- Note [Flags that raise] (runtime/args.cpp) -----------------------------------------------

_RAISING = textwrap.dedent('''
    import warnings
    import torch, trident

    def fn(x):
        return x * 2 + 1

    x = torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning either)
        assert torch.equal(jf(x), fn(x))
        {change}
        try:
            {getter}
        except RuntimeError:
            pass
        else:
            print("answers")  # (another torch version: nothing to test)
            raise SystemExit(0)
        for _ in range(3):
            assert torch.equal(jf(x), fn(x))
    s = jf.stats
    assert (s.compiles, s.hits, s.fallbacks) == (2, 2, 0), s
    print("ok")
''')


@pytest.mark.parametrize("change, getter", [
    ("torch.backends.cudnn.allow_tf32 = False; torch.backends.fp32_precision = 'tf32'",
     "torch.backends.cudnn.allow_tf32"),
    ("torch.backends.mkldnn.matmul.fp32_precision = 'bf16'",
     "torch.get_float32_matmul_precision()"),
], ids=["cudnn tf32", "matmul precision"])
def test_a_setting_torch_refuses_to_answer_is_a_state_of_its_own(subprocess_env, change, getter):
    """Where the legacy and the fp32_precision settings disagree, torch's C++ getters throw;
    the dispatcher read them at every call, and the process ended (``terminate called``)
    where eager runs the function. A child process: before the fix it aborts."""
    out = run_python(subprocess_env, "-c", _RAISING.format(change=change, getter=getter))
    if out.stdout.strip() == "answers":
        pytest.skip(f"torch {torch.__version__} answers {getter} in this state")
    assert out.stdout.strip().endswith("ok"), out.stdout
