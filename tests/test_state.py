"""Never stale (issue 11, items 1-3): what a function reads outside its arguments is guarded
natively (Note [State guards] in trident/lower/state/__init__.py), or the call runs eagerly
with a warning.

Each kind of read is one case: the jitted function must equal eager before and after the state
changes in place (the change must change eager's result), the change must cost exactly one
recompile, and putting the state back must reinstall the first specialization without a compile
(its content digest matches again)."""

from __future__ import annotations

import datetime
import functools
import importlib
import json
import math
import os
import textwrap
import sys
import types
import warnings
from pathlib import Path
from unittest import mock
from warnings import warn

import numpy as np
import pytest
import torch

import _state_helpers as cfg
import trident
from _state_helpers import act
from _trident_helpers import check_change_is_seen, fresh_imports


class Knobs:
    factor = 1.0


class Scaled:
    factor = 2.0

    def __init__(self):
        self.scale = 2.0

    def forward(self, x):
        return x * self.scale

    def by_class(self, x):
        return x * self.factor


GAIN = [2.0]
CONFIG = {"scale": 2.0}
GLOBAL_K = 2.0
A, B, C = True, False, True
T = torch.tensor([1.0, 2.0, 3.0])
OBJ = Scaled()
BOUND = OBJ.forward
PARTIAL = functools.partial(torch.mul, other=2.0)


class K:
    s = 2.0


def _set(obj, name, value):
    """Set ``obj.name`` (or item) and return the undo."""
    if isinstance(obj, dict):
        old = obj[name]
        obj[name] = value
        return lambda: obj.__setitem__(name, old)
    old = getattr(obj, name)
    setattr(obj, name, value)
    return lambda: setattr(obj, name, old)


def _set_new(d, key, value):
    d[key] = value
    return lambda: d.pop(key)


def _env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value

    def undo():
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
    return undo


def _closure():
    lst = [2.0]

    def f(x):
        return x * lst[0]
    return f, lambda: _list_set(lst, 0, 3.0)


def _list_set(lst, i, value):
    old = lst[i]
    lst[i] = value
    return lambda: lst.__setitem__(i, old)


def _closure_helper():
    k = [2.0]

    def helper(x):
        return x * k[0]

    def f(x):
        return helper(x)
    return f, lambda: _list_set(k, 0, 3.0)


def _default():
    def f(x, k=[2.0]):
        return x * k[0]
    return f, lambda: _list_set(f.__defaults__[0], 0, 3.0)


def _code():
    def f(x):
        return x * 2.0

    def g(x):
        return x * 3.0
    return f, lambda: _set(f, "__code__", g.__code__)


def _builtin_shadow():
    def f(x):
        return abs(x)

    def change():
        globals()["abs"] = lambda t: t * 2

        def undo():
            del globals()["abs"]
        return undo
    return f, change


def _threads():
    def f(x):
        return x * torch.get_num_threads()
    n = torch.get_num_threads()

    def change():
        torch.set_num_threads(n + 1)
        return lambda: torch.set_num_threads(n)
    return f, change


def _deterministic():
    def f(x):
        return x * (2.0 if torch.are_deterministic_algorithms_enabled() else 3.0)

    def change():
        torch.use_deterministic_algorithms(True)
        return lambda: torch.use_deterministic_algorithms(False)
    return f, change


def _rebind(name, value):
    def change():
        old = globals()[name]
        globals()[name] = value
        return lambda: globals().__setitem__(name, old)
    return change


def _tensor_inplace():
    def change():
        old = T[1].item()
        T[1] = 5.0
        return lambda: T.__setitem__(1, old)
    return change


# A module made at run time (no __file__): user state, not a library's.
RUNTIME_MODULE = types.ModuleType("trident_test_runtime_module")
RUNTIME_MODULE.S = 0.5

class Typed:
    K = 2.0
    s = 2.0

    def by_type(self, x):
        return x * type(self).K

    def by_dunder_class(self, x):
        return x * self.__class__.K

    @classmethod
    def by_cls(cls, x):
        return x * cls.s

    @property
    def k(self):
        return 2.0

    def by_property(self, x):
        return x * self.k


class Base:
    K = 2.0

    def scaled(self, x):
        return x * self.K


class Sub(Base):
    pass


class Net(torch.nn.Module):
    def forward(self, x):
        return x * 2


class Net2(Net):
    pass


TYPED, SUB, NET2 = Typed(), Sub(), Net2()


def _shadow(cls, name, value):
    """Set ``cls.name`` where a base class holds it; the undo deletes it again."""
    def change():
        assert name not in vars(cls)
        setattr(cls, name, value)
        return lambda: delattr(cls, name)
    return change


class Plus(torch.nn.Module):
    def forward(self, x):
        return x + 1


PLUS = Plus()


def _global_hook(register, hook):
    def change():
        handle = register(hook)
        return handle.remove
    return change


def _flag(obj, name, value):
    return lambda: _set(obj, name, value)


def _mkldnn_flipped():
    """Flip torch.backends.mkldnn.enabled through its C setter (the property refuses once a
    test module called torch.backends.disable_global_flags(), as OpInfo's harness does)."""
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(not was)
    return lambda: torch._C._set_mkldnn_enabled(was)


def _recursion_limit():
    n = sys.getrecursionlimit()
    sys.setrecursionlimit(n + 1000)
    return lambda: sys.setrecursionlimit(n)


def _patch(target, new):
    def change():
        p = mock.patch(target, new)
        p.start()
        return p.stop
    return change


KNOB_NAME = "factor"
ENV_NAME = "TRIDENT_T_MODE"
CONFIG_KEY = "scale"


def _pick_knobs():
    return Knobs


def _picked_class(x):
    chosen = _pick_knobs()
    return x * chosen.factor


def _chosen_class(x):
    chosen = Knobs if x.dim() == 1 else Scaled
    return x * chosen.factor


class Override(Base):
    def scaled(self, x):
        return super().scaled(x) + 1


OVERRIDE = Override()
T0 = torch.tensor(2.0)  # 0-dim


class Strict:
    """Raises KeyError for names it lacks (hasattr probes do not get an AttributeError)."""

    def __getattr__(self, name):
        raise KeyError(name)


STRICT = Strict()
STRICT.k = 2.0


def _fill(t, value):
    def change():
        old = t.clone()
        t.fill_(value)
        return lambda: t.copy_(old)
    return change


def _environ_alias(x):
    env = os.environ
    return x * (2.0 if env.get("TRIDENT_T_MODE") == "a" else 3.0)


def _imports_inside(x):
    import _state_helpers
    return x * _state_helpers.SCALE


def _imports_from_inside(x):
    from _state_helpers import SCALE as scale
    return x * scale


def _imports_a_package_inside(x):
    import email.mime  # noqa: F401  (binds the top package; not a library of user state)
    import _state_helpers as h
    return x * h.CFG.model.attn.scale


LAZY_MODULE = types.ModuleType("trident_test_lazy_module")  # PEP 562: a module __getattr__
LAZY_MODULE._VALUES = {"LAZY": 2.0}
LAZY_MODULE.__getattr__ = lambda name: LAZY_MODULE._VALUES[name]


def _bind_in_module(module, name, value):
    def change():
        setattr(module, name, value)
        return lambda: delattr(module, name)
    return change


CASES = {
    "what a module's __getattr__ serves": (
        lambda x: x * LAZY_MODULE.LAZY, lambda: _set(LAZY_MODULE._VALUES, "LAZY", 3.0)),
    "a name bound where a module's __getattr__ served it": (
        lambda x: x * LAZY_MODULE.LAZY, _bind_in_module(LAZY_MODULE, "LAZY", 5.0)),
    "a global forward hook registered later": (
        lambda x: PLUS(x), _global_hook(torch.nn.modules.module.register_module_forward_hook,
                                        lambda m, i, o: o * 10)),
    "a global forward pre-hook registered later": (
        lambda x: PLUS(x), _global_hook(
            torch.nn.modules.module.register_module_forward_pre_hook, lambda m, i: (i[0] * 3,))),
    "a torch function patched (F.gelu = torch.tanh)": (
        lambda x: torch.nn.functional.gelu(x), _flag(torch.nn.functional, "gelu", torch.tanh)),
    "mock.patch of torch.relu": (lambda x: torch.relu(x), _patch("torch.relu", torch.neg)),
    "a tensor method patched (torch.Tensor.relu = ...)": (
        lambda x: x.relu().mul(2), _patch("torch.Tensor.relu", lambda self: self * 10)),
    "a method of an intermediate tensor patched": (
        lambda x: x.relu().mul(2),
        _patch("torch.Tensor.mul", lambda self, k: torch.add(self, k))),
    "an item of a library's list (sys.argv[1])": (
        lambda x: x * (2.0 if sys.argv[-1] != "trident-test-arg" else 3.0),
        lambda: _list_set(sys.argv, -1, "trident-test-arg")),
    "math.pi patched": (lambda x: x * math.pi, _flag(math, "pi", 3.0)),
    "a torch.backends flag read in Python": (
        lambda x: x * (1.0 if torch.backends.mkldnn.enabled else 2.0),
        _mkldnn_flipped),
    "sys.getrecursionlimit() in a branch": (
        lambda x: x * (2.0 if sys.getrecursionlimit() % 2000 < 1000 else 3.0),
        _recursion_limit),
    "a 0-dim global tensor read with .item()": (lambda x: x * T0.item(), _fill(T0, 3.0)),
    "an object whose __getattr__ raises KeyError": (lambda x: x * STRICT.k,
                                                    lambda: _set(STRICT, "k", 3.0)),
    "a class returned by a helper": (_picked_class, lambda: _set(Knobs, "factor", 10.0)),
    "importlib.import_module(name)": (
        lambda x: x * importlib.import_module("_state_helpers").SCALE,
        lambda: _set(cfg, "SCALE", 3.0)),
    "sys.modules[name]": (lambda x: x * sys.modules["_state_helpers"].SCALE,
                          lambda: _set(cfg, "SCALE", 3.0)),
    "__import__(name)": (lambda x: x * __import__("_state_helpers").SCALE,
                         lambda: _set(cfg, "SCALE", 3.0)),
    "a class chosen in a conditional expression": (_chosen_class,
                                                   lambda: _set(Knobs, "factor", 10.0)),
    "a base method called through super()": (
        lambda x: OVERRIDE.scaled(x), lambda: _set(Base, "scaled", lambda self, x: x * 5)),
    "os.environ.get(NAME), NAME a global": (
        lambda x: x * (2.0 if os.environ.get(ENV_NAME) == "a" else 3.0),
        lambda: _env("TRIDENT_T_MODE", "a")),
    "os.getenv(NAME, default)": (
        lambda x: x * (2.0 if os.getenv(ENV_NAME, "b") == "a" else 3.0),
        lambda: _env("TRIDENT_T_MODE", "a")),
    "CONFIG[KEY], KEY a global": (lambda x: x * CONFIG[CONFIG_KEY],
                                  lambda: _set(CONFIG, "scale", 3.0)),
    "os.environ through a local": (_environ_alias, lambda: _env("TRIDENT_T_MODE", "a")),
    "a name in os.environ": (lambda x: x * (2.0 if "TRIDENT_T_MODE" in os.environ else 3.0),
                             lambda: _env("TRIDENT_T_MODE", "a")),
    "a key in a global dict": (lambda x: x * (2.0 if "other" in CONFIG else 3.0),
                               lambda: _set_new(CONFIG, "other", 1)),
    "os.getenv with a default, the variable unset": (
        lambda x: x * float(os.getenv("TRIDENT_T_K", "2")), lambda: _env("TRIDENT_T_K", "5")),
    "os.environ.get with a default": (
        lambda x: x * float(os.environ.get("TRIDENT_T_K", "2")),
        lambda: _env("TRIDENT_T_K", "5")),
    "getattr(Knobs, NAME), the attribute changed": (
        lambda x: x * getattr(Knobs, KNOB_NAME), lambda: _set(Knobs, "factor", 10.0)),
    "getattr(Knobs, NAME), NAME rebound": (
        lambda x: x * getattr(Knobs, KNOB_NAME, 7.0), _rebind("KNOB_NAME", "unset")),
    "type(self).K": (lambda x: TYPED.by_type(x), lambda: _set(Typed, "K", 3.0)),
    "self.__class__.K": (lambda x: TYPED.by_dunder_class(x), lambda: _set(Typed, "K", 3.0)),
    "a classmethod's cls.s": (lambda x: Typed.by_cls(x), lambda: _set(Typed, "s", 3.0)),
    "a classmethod called on an instance": (lambda x: TYPED.by_cls(x),
                                            lambda: _set(Typed, "s", 3.0)),
    "a property replaced on the class": (
        lambda x: TYPED.by_property(x), lambda: _set(Typed, "k", property(lambda self: 3.0))),
    "a subclass shadows its base's attribute": (lambda x: SUB.scaled(x),
                                                _shadow(Sub, "K", 4.0)),
    "forward replaced on an nn.Module subclass": (
        lambda x: NET2(x), _shadow(Net2, "forward", lambda self, x: x * 3)),
    "import inside the function": (_imports_inside, lambda: _set(cfg, "SCALE", 3.0)),
    "from-import inside the function": (_imports_from_inside, lambda: _set(cfg, "SCALE", 3.0)),
    "import as inside the function": (
        _imports_a_package_inside, lambda: _set(cfg.CFG.model.attn, "scale", 0.25)),
    "class attribute": (lambda x: x * Knobs.factor, lambda: _set(Knobs, "factor", 10.0)),
    "list item through a global": (lambda x: x * GAIN[0], lambda: _list_set(GAIN, 0, -1.0)),
    "module attribute (cfg.SCALE)": (lambda x: x * cfg.SCALE, lambda: _set(cfg, "SCALE", 3.0)),
    "helper in another module": (lambda x: x + act(x), lambda: _set(cfg, "SCALE", 3.0)),
    "dict entry": (lambda x: x * CONFIG["scale"], lambda: _set(CONFIG, "scale", 3.0)),
    "dict.get": (lambda x: x * CONFIG.get("scale"), lambda: _set(CONFIG, "scale", 3.0)),
    "closure's list": _closure,
    "a helper held by a closure reads its own closure": _closure_helper,
    "mutable default": _default,
    "__code__ reassigned": _code,
    "global that shadows a builtin": _builtin_shadow,
    "globals()[...]": (lambda x: x * globals()["GLOBAL_K"], _rebind("GLOBAL_K", 3.0)),
    "os.environ.get": (lambda x: x * (2.0 if os.environ.get("TRIDENT_T_MODE") == "a" else 3.0),
                       lambda: _env("TRIDENT_T_MODE", "a")),
    "os.getenv": (lambda x: x * (2.0 if os.getenv("TRIDENT_T_MODE") == "a" else 3.0),
                  lambda: _env("TRIDENT_T_MODE", "a")),
    "attribute of a module without a file": (lambda x: x * RUNTIME_MODULE.S,
                                             lambda: _set(RUNTIME_MODULE, "S", 7.0)),
    "deep config": (lambda x: x * cfg.CFG.model.attn.scale,
                    lambda: _set(cfg.CFG.model.attn, "scale", 0.25)),
    "bool rebound among seen values": (
        lambda x: x * (2.0 if C else 3.0) * (1.0 if A and not B else 0.5), _rebind("C", False)),
    "partial's argument": (lambda x: PARTIAL(x),
                           _rebind("PARTIAL", functools.partial(torch.mul, other=3.0))),
    "bound method's self": (lambda x: BOUND(x), lambda: _set(OBJ, "scale", 3.0)),
    "class defined again under the same name": (
        lambda x: x * K.s, _rebind("K", type("K", (), {"s": 3.0}))),
    "global tensor read with .tolist()": (lambda x: x * T.tolist()[1], _tensor_inplace()),
    "torch.get_num_threads()": _threads,
    "are_deterministic_algorithms_enabled()": _deterministic,
    "a method's class attribute through self": (
        lambda x: OBJ.by_class(x), lambda: _set(Scaled, "factor", 3.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_state_changed_in_place_is_seen(case):
    made = CASES[case]
    fn, change = made() if not isinstance(made, tuple) else made
    check_change_is_seen(fn, change)


S_ITEM = torch.tensor([2.0])


def test_global_tensor_is_named_and_what_changed_said():
    """A global tensor read as a Python value is guarded by identity and version counter: a
    write that leaves its values equal reinstalls the same specialization (a hit, no miss); a
    write that changes them misses with the global's own name and what happened to it (not
    ``S_ITEM.item.__self__ changed``); another tensor bound to the name is "changed"."""
    def fn(x):
        return x * S_ITEM.item()

    global S_ITEM
    jf, x, saved = trident.jit(fn), torch.ones(2), S_ITEM
    try:
        for _ in range(2):
            assert torch.equal(jf(x), fn(x))
        S_ITEM.mul_(1)
        assert torch.equal(jf(x), fn(x)) and (jf.stats.misses, jf.stats.hits) == (1, 2)
        version = S_ITEM._version
        S_ITEM.add_(1)
        assert torch.equal(jf(x), fn(x)) and jf.stats.misses == 2
        assert jf.stats.miss_reasons[-1] == (
            f"S_ITEM was written in place (its version counter is {version + 1}, was "
            f"{version}) since the last call")
        S_ITEM = torch.tensor([5.0])
        assert torch.equal(jf(x), fn(x)) and jf.stats.misses == 3
        assert jf.stats.miss_reasons[-1] == "S_ITEM changed since the last call"
    finally:
        S_ITEM = saved
        S_ITEM.fill_(2.0)
    assert (jf.stats.compiles, jf.stats.fallbacks) == (3, 0), jf.stats


def test_a_module_or_class_passed_as_an_argument_is_read_through():
    """``f(cfg, x)`` with a module (or a class) as the argument: its tree checks its identity,
    what the function reads from it is a chain of it (a module's was baked in)."""
    def f(m, x):
        return x * m.SCALE

    def g(k, x):  # a class passed in
        return x * k.factor

    x = torch.ones(3)
    for fn, owner, name in ((f, cfg, "SCALE"), (g, Knobs, "factor")):
        jf = trident.jit(fn)
        assert torch.equal(jf(owner, x), fn(owner, x)) and torch.equal(jf(owner, x), fn(owner, x))
        undo = _set(owner, name, 3.0)
        try:
            assert torch.equal(jf(owner, x), x * 3.0)
        finally:
            undo()
        st = jf.stats
        assert (st.compiles, st.hits, st.fallbacks) == (2, 1, 0), (fn.__name__, st)


class _Holder:
    def __init__(self):
        self.cfg = Knobs  # a class held by an instance attribute

    def run(self, x):
        return x * self.cfg.factor


class _Attn(torch.nn.Module):
    scale = 2.0  # a class attribute of a submodule's class


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attn()

    def forward(self, x):
        return x * self.attn.scale


@pytest.mark.parametrize("case", ["instance attribute holding a class", "submodule's class"])
def test_class_attributes_read_through_an_arguments_attributes(case):
    """``self.cfg.factor`` (``cfg`` a class) and ``self.attn.scale`` (a class attribute of a
    submodule's class): the argument tree checks the class by identity and the submodule's
    own state, not the class's attributes; the chain goes on through the instance's attribute
    (they were baked in)."""
    if case == "instance attribute holding a class":
        fn, arg, owner, name = (lambda h, x: h.run(x)), _Holder(), Knobs, "factor"
    else:
        fn, arg, owner, name = (lambda b, x: b(x)), _Block(), _Attn, "scale"
    jf, x = trident.jit(fn), torch.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(jf(arg, x), fn(arg, x)) and torch.equal(jf(arg, x), fn(arg, x))
        undo = _set(owner, name, 7.0)
        try:
            assert torch.equal(jf(arg, x), x * 7.0) and torch.equal(jf(arg, x), x * 7.0)
        finally:
            undo()
        assert torch.equal(jf(arg, x), fn(arg, x))
    st = jf.stats
    assert (st.compiles, st.hits, st.fallbacks) == (2, 3, 0), st


def test_method_of_a_jitted_object_sees_its_attribute():
    """``self.scale`` of a jitted bound method (the argument tree)."""
    obj = Scaled()
    jf = trident.jit(obj.forward)
    x = torch.ones(3)
    assert torch.equal(jf(x), x * 2)
    obj.scale = 5.0
    assert torch.equal(jf(x), x * 5) and jf.stats.compiles == 2


_TARGET_PACKAGE = """
import functools
import torch

def contiguous_args(fn):  # a decorator that keeps the function in a closure cell
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        return fn(ctx, *(a.contiguous() for a in args))
    return wrapper

class Double(torch.autograd.Function):
    @staticmethod
    @contiguous_args
    def forward(ctx, x):
        return x * 2
"""


@pytest.mark.parametrize("installed", [True, False], ids=["dist-info", "plain-folder"])
def test_package_on_sys_path_with_closures(tmp_path, monkeypatch, installed):
    """A package in a folder on ``sys.path`` that holds ``*.dist-info`` (``pip install --target``,
    how liger-kernel reaches the GPU machine) is a library: its decorators' closure cells are not
    user state, and the call is served natively. The same code in a plain folder is user code:
    the cells are found through the class that holds the decorated method, and guarded."""
    name = f"tgt_pkg_{'lib' if installed else 'user'}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(_TARGET_PACKAGE)
    if installed:
        (tmp_path / f"{name}-1.0.dist-info").mkdir()
        (tmp_path / f"{name}-1.0.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    package = __import__(name)

    def f(x):
        return package.Double.apply(x.t()) + 1

    jf = trident.jit(f)
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert torch.equal(jf(x), f(x))
        assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 2, 0), jf.stats
        if not installed:  # user code: the method it reached through the class is guarded
            package.Double.forward = staticmethod(package.contiguous_args(lambda ctx, x: x * 3))
            assert torch.equal(jf(x), f(x)) and jf.stats.compiles == 2, jf.stats


def test_sdpa_after_disabling_a_backend():
    """The SDPA backend a trace picked depends on torch's flags: they are call-wide guards."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=gen) for _ in range(3))

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    jf = trident.jit(f)
    assert torch.equal(jf(q, k, v), f(q, k, v))
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        assert torch.equal(jf(q, k, v), f(q, k, v))
        st = jf.stats
        assert st.compiles == 2 and "flash_sdp_enabled" in st.miss_reasons[-1], st
    finally:
        torch.backends.cuda.enable_flash_sdp(True)


def test_triton_constexpr_global_edited_in_place():
    """A kernel's ``tl.constexpr`` global (read by the kernel's code, which never runs in the
    trace) is a chain of the kernel's function."""
    def f(x):
        out = torch.empty_like(x)
        cfg.scale_kernel[(1,)](x, out, x.numel(), BLOCK=16)
        return out

    jf = trident.jit(f)
    x = torch.randn(16, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton's interpreter on CPU tensors
        assert torch.equal(jf(x), x * 2.0)
        old = cfg.KERNEL_SCALE.value
        cfg.KERNEL_SCALE.value = 3.0
        try:
            assert torch.equal(jf(x), x * 3.0)
        finally:
            cfg.KERNEL_SCALE.value = old
    assert jf.stats.compiles == 2 and "KERNEL_SCALE" in jf.stats.miss_reasons[-1], jf.stats


ARRAY = np.arange(4.0)
with torch.inference_mode():
    INFERENCE_T = torch.tensor([1.0, 2.0])  # no version counter


def _computed_name(x):
    name = "fac" + "tor"
    return x * getattr(Knobs, name)


def _computed_global(x):
    name = "GLOBAL" + "_K"
    return x * globals()[name]


@pytest.mark.parametrize("case", ["random.random", "random.randint", "time.time", "numpy array",
                                  "inference tensor", "getattr with a computed name",
                                  "globals() with a computed key",
                                  "a library config module's value", "datetime.now",
                                  "os.path.exists", "pathlib.Path.exists",
                                  "a torch.backends flag that Python serves"])
def test_unguardable_reads_run_eagerly(case):
    import random
    import time

    import torch._dynamo.config  # noqa: F401  (a ConfigModule: its values are served by Python)

    fns = {"random.random": lambda x: x * random.random(),
           "random.randint": lambda x: x * random.randint(1, 10),
           "time.time": lambda x: x * (time.time() > 0),
           "numpy array": lambda x: x * float(ARRAY[1]),
           "inference tensor": lambda x: x * INFERENCE_T.tolist()[1],
           "getattr with a computed name": _computed_name,
           "globals() with a computed key": _computed_global,
           "datetime.now": lambda x: x * datetime.datetime.now().microsecond,
           "os.path.exists": lambda x: x * os.path.exists("/tmp/trident-test-no-such-file"),
           "pathlib.Path.exists": lambda x: x * Path("/tmp/trident-test-no-such").exists(),
           "a library config module's value": lambda x: x * (
               2.0 if torch._dynamo.config.cache_size_limit > 4 else 3.0),
           "a torch.backends flag that Python serves": lambda x: x * (
               2.0 if torch.backends.mkldnn.fp32_precision == "none" else 3.0)}
    fn = fns[case]
    jf = trident.jit(fn)
    x = torch.ones(4)
    with pytest.warns(UserWarning, match="runs eagerly"):
        jf(x)
    if case == "numpy array":
        ARRAY[1] = 7.0
        try:
            assert torch.equal(jf(x), x * 7.0)
        finally:
            ARRAY[1] = 1.0
    else:
        jf(x)
    st = jf.stats
    assert (st.compiles, st.fallbacks, st.hits) == (0, 2, 0), st


def test_edited_spec_file_is_dropped(trident_cache):
    def f(x):
        return x * 2

    jf = trident.jit(f)
    x = torch.ones(2)
    jf(x)
    (path,) = trident_cache.glob("functions/*/specs/*.json")
    data = json.loads(path.read_text())
    data["signature"] = data["signature"] + " "  # still parses, no longer hashes to its name
    path.write_text(json.dumps(data))
    jg = trident.jit(f)
    with pytest.warns(UserWarning, match="not to the hash in its name"):
        assert torch.equal(jg(x), x * 2)
    assert jg.stats.compiles == 1


# ---- item 3: state changed between processes ----------------------------------------------

HELPERS = textwrap.dedent('''
    import functools
    import numpy as np
    import torch

    SCALE = 2.0
    ARRAY = np.arange(100000.0)
    T = torch.tensor([1.0, 2.0, 3.0])

    def act(x):
        return x * 2

    class Knobs:
        factor = 2.0

    class Obj:
        def method(self, x):
            return x * 2

    OBJ = Obj()

    def mul(x, k):
        return x * k

    PARTIAL = functools.partial(mul, k=2.0)

    def d1(x): return d2(x)
    def d2(x): return d3(x)
    def d3(x): return d4(x)
    def d4(x): return d5(x)
    def d5(x): return d6(x)
    def d6(x): return x * 2
''')

USER = textwrap.dedent('''
    import torch
    import trident
    import helpers
    from helpers import act

    def imported(x):
        import helpers as h
        return x * h.SCALE

    def imported_from(x):
        from helpers import Knobs
        return x * Knobs.factor

    CASES = {
        "import inside the function": imported,
        "from-import inside the function": imported_from,
        "helper in another module": lambda x: act(x),
        "config constant": lambda x: x * helpers.SCALE,
        "class attribute": lambda x: x * helpers.Knobs.factor,
        "method of a global object": lambda x: helpers.OBJ.method(x),
        "partial's argument": lambda x: helpers.PARTIAL(x),
        "helper chain 6 calls deep": lambda x: helpers.d1(x),
        "large numpy array element": lambda x: x * float(helpers.ARRAY[99999]),
        "tensor read with .tolist()": lambda x: x * helpers.T.tolist()[1],
    }
''')

EDITS = [("def act(x):\n    return x * 2", "def act(x):\n    return x * 3"),
         ("SCALE = 2.0", "SCALE = 3.0"),
         ("factor = 2.0", "factor = 3.0"),
         ("def method(self, x):\n        return x * 2",
          "def method(self, x):\n        return x * 3"),
         ("functools.partial(mul, k=2.0)", "functools.partial(mul, k=3.0)"),
         ("def d6(x): return x * 2", "def d6(x): return x * 3"),
         ("ARRAY = np.arange(100000.0)", "ARRAY = np.arange(100000.0); ARRAY[99999] = 7.0"),
         ("torch.tensor([1.0, 2.0, 3.0])", "torch.tensor([1.0, 5.0, 3.0])")]


def _run(d: Path) -> dict:
    """Each case of a fresh import of ``user.py`` (and of ``helpers.py``, as a new process
    imports them) through ``trident.jit``, twice."""
    out = {}
    x = torch.ones(3)
    with fresh_imports(d):
        for name, fn in importlib.import_module("user").CASES.items():
            jf = trident.jit(fn)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = [jf(x).tolist() for _ in range(2)]
            st = jf.stats
            out[name] = {"got": got, "want": fn(x).tolist(), "compiles": st.compiles,
                         "fallbacks": st.fallbacks}
    return out


def test_state_edited_between_processes(tmp_path, trident_cache):
    """A new process sharing the cache never loads a specialization compiled for other state:
    one process compiles every case, the sources are edited, a second process must compile
    again (or run eagerly, as the first did) and equal eager. Each process is a fresh import of
    the modules in this one (``fresh_imports``): the stored specializations are found by the
    function's key and their state's digest, as in another process."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "helpers.py").write_text(HELPERS)
    (d / "user.py").write_text(USER)
    first = _run(d)
    text = HELPERS
    for old, new in EDITS:
        assert old in text, old
        text = text.replace(old, new)
    (d / "helpers.py").write_text(text)
    second = _run(d)
    unchanged = _run(d)
    for name, r in second.items():
        assert r["got"] == [r["want"]] * 2, name
        assert r["want"] != first[name]["want"], f"{name}: the edit must change eager's result"
        eager = first[name]["fallbacks"] > 0
        assert (r["compiles"], r["fallbacks"]) == ((0, 2) if eager else (1, 0)), (name, r)
        assert (unchanged[name]["compiles"], unchanged[name]["got"]) == (0, r["got"]), name
    assert first["large numpy array element"]["fallbacks"] == 2  # numpy contents: eager


# ---- writes to state outside the arguments (found by a fresh user's pass) -------------------

WRITES = {"n": 0}
WRITE_LOG: list = []
WRITE_COUNT = 0


class _Counter:
    n = 0


WRITE_OBJ = _Counter()


def _writes_item(x):
    WRITES["n"] += 1
    return x * WRITES["n"]


def _assigns_item(x):
    WRITES["n"] = WRITES["n"] + 1
    return x * WRITES["n"]


def _writes_global(x):
    global WRITE_COUNT
    WRITE_COUNT += 1
    return x * WRITE_COUNT


def _writes_attribute(x):
    WRITE_OBJ.n += 1
    return x * WRITE_OBJ.n


def _appends(x):
    WRITE_LOG.append(1)
    return x * len(WRITE_LOG)


def _appends_through_an_alias(x):
    log = WRITE_LOG
    log.append(1)
    return x * len(WRITE_LOG)


def _writes_a_module_attribute(x):
    import _state_helpers as h
    h.WRITTEN = getattr(h, "WRITTEN", 0) + 1
    return x * 2


def _writes_in_a_helper(x):
    return _writes_item(x) + 1


def _writes_nonlocal():
    k = 0

    def step(x):
        nonlocal k
        k += 1
        return x * k

    return step


def _state_now():
    return (dict(WRITES), list(WRITE_LOG), WRITE_COUNT, WRITE_OBJ.n,
            getattr(cfg, "WRITTEN", 0))


def _reset_writes():
    global WRITE_COUNT
    WRITES["n"], WRITE_COUNT, WRITE_OBJ.n = 0, 0, 0
    WRITE_LOG.clear()
    cfg.__dict__.pop("WRITTEN", None)


@pytest.mark.parametrize("make", [
    lambda: _writes_item, lambda: _assigns_item, lambda: _writes_global,
    lambda: _writes_attribute, lambda: _appends, lambda: _writes_in_a_helper, _writes_nonlocal,
    lambda: _appends_through_an_alias, lambda: _writes_a_module_attribute,
], ids=["item", "item-assign", "global", "attribute", "append", "helper", "nonlocal",
        "append-through-a-local-alias", "imported-module-attribute"])
def test_writes_outside_the_arguments_run_eagerly(make):
    """Only a trace runs the function's Python code: a hit would skip a write to a global, a
    closure variable, a global container's item or attribute, a mutating method's. Such a
    function runs eagerly (checked before the trace, so the write happens once per call, as in
    eager), with a warning naming the write."""
    x = torch.ones(2)
    _reset_writes()
    fn = make()
    want = [fn(x) for _ in range(3)]
    want_state = _state_now()
    _reset_writes()
    jf = trident.jit(make())
    with pytest.warns(UserWarning, match="writes to"):
        got = [jf(x) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and _state_now() == want_state
    assert (jf.stats.fallbacks, jf.stats.compiles) == (3, 0), jf.stats


def _after_the_compile():
    return None


def test_compiles_under_a_c_profiler():
    """``sys.getprofile()`` returns cProfile's ``Profile`` object, which cannot be called: the
    state recording of a compile suspends it, and it records again afterwards (a TypeError
    from inside the trace before)."""
    import cProfile
    import pstats

    @trident.jit
    def f(x):
        return x * 2 + 1

    x = torch.randn(5)
    profile = cProfile.Profile()
    profile.enable()
    try:
        first, second = f(x), f(x)
        _after_the_compile()
    finally:
        profile.disable()
    assert torch.equal(first, x * 2 + 1) and torch.equal(second, x * 2 + 1)
    assert (f.stats.compiles, f.stats.hits, f.stats.fallbacks) == (1, 1, 0)
    assert sys.getprofile() is None
    assert "_after_the_compile" in {name for _, _, name in pstats.Stats(profile).stats}
def _prints(x):
    print("x is", x.shape)
    return x + 1


def _warns(x):
    warnings.warn("careful")
    return x + 1


def _warns_through_an_import(x):
    warn("careful")
    return x + 1


def _writes_stdout(x):
    sys.stdout.write("out\n")
    return x + 1


def _writes_stderr(x):
    sys.stderr.write("err\n")
    return x + 1


def _prints_in_a_helper(x):
    return _prints(x) * 2


def _prints_in_a_branch_not_taken(x):
    if x.dim() > 3:
        print("big")
    return x + 1


@pytest.mark.parametrize("fn", [_prints, _warns, _warns_through_an_import, _writes_stdout,
                                _writes_stderr, _prints_in_a_helper, _prints_in_a_branch_not_taken],
                         ids=["print", "warnings.warn", "warn", "stdout", "stderr", "helper",
                              "branch-not-taken"])
def test_printing_or_warning_functions_run_eagerly(fn, capsys):
    """Only a trace runs the function's Python code: a hit would not print or warn, eager does
    at every call (as Python's warning filters allow). Such a function runs eagerly (checked
    in its bytecode and its helpers' before the trace: the output comes once per call), with
    one warning naming the call; every instruction counts, a branch not taken too."""
    x = torch.ones(2)

    def run(f):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [f(x) for _ in range(3)]
        printed = capsys.readouterr()
        return outs, printed.out, printed.err, [str(w.message) for w in caught]

    want, want_out, want_err, want_warnings = run(fn)
    jf = trident.jit(fn)
    got, out, err, caught = run(jf)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert (out, err) == (want_out, want_err)
    ours = [w for w in caught if w.startswith("trident:")]
    assert [w for w in caught if not w.startswith("trident:")] == want_warnings
    assert len(ours) == 1 and "the function prints or warns (" in ours[0], ours
    assert (jf.stats.fallbacks, jf.stats.compiles, jf.stats.traces) == (3, 0, 1), jf.stats


def test_two_unregistered_imports_of_one_source_keep_their_own_globals(tmp_path):
    """Two imports of one file that ``sys.modules`` does not hold (``exec_module`` without
    registering) have one function key but their own globals: the second must not be served
    the first's specialization, whose state was read through the first's helper function (it
    returned ``x * 2.0`` for ``x * 3.0``)."""
    import importlib.util

    path = tmp_path / "unregistered_scale.py"
    path.write_text(textwrap.dedent('''
        import trident
        SCALE = 1.0

        def scaled(x):
            return x * SCALE

        @trident.jit
        def f(x):
            return scaled(x)
    '''))

    def load():
        spec = importlib.util.spec_from_file_location("unregistered_scale", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    first, second = load(), load()
    first.SCALE, second.SCALE = 2.0, 3.0
    x = torch.randn(8)
    for _ in range(2):
        assert torch.equal(first.f(x), x * 2.0)
        assert torch.equal(second.f(x), x * 3.0)
    assert (first.f.stats.compiles, second.f.stats.compiles) == (1, 1)
    assert (first.f.stats.hits, second.f.stats.hits) == (1, 1)


OP_FACTOR = 2.0


@torch.library.custom_op("trident_test_state::scale", mutates_args=())
def _custom_scale(x: torch.Tensor) -> torch.Tensor:
    return x * OP_FACTOR


@_custom_scale.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.triton_op("trident_test_state::plus", mutates_args={})
def _triton_plus(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_custom_and_triton_ops_are_served_natively():
    """A ``torch.library.custom_op`` and a ``triton_op`` named by globals are operators, checked
    by identity (they ran eagerly: ``_backend_fns`` is a dict with a None key): a hit calls
    them through the dispatcher, so what the custom op's body reads is read at every call."""
    global OP_FACTOR

    def f(x):
        return _custom_scale(x) + _triton_plus(x)

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            assert torch.equal(jf(x), f(x))
        OP_FACTOR = 5.0
        try:
            assert torch.equal(jf(x), f(x)) and torch.equal(f(x), x * 5 + x + 1)
        finally:
            OP_FACTOR = 2.0
    st = jf.stats
    assert (st.compiles, st.hits, st.fallbacks) == (1, 2, 0), st


_HOOKS = {
    "forward": (torch.nn.modules.module.register_module_forward_hook, lambda m, i, o: o * 10),
    "forward pre": (torch.nn.modules.module.register_module_forward_pre_hook,
                    lambda m, i: (i[0] * 3,)),
    "forward, always called": (
        lambda h: torch.nn.modules.module.register_module_forward_hook(h, always_call=True),
        lambda m, i, o: o - 5),
    "forward, with kwargs": (
        lambda h: torch.nn.modules.module.register_module_forward_hook(h, with_kwargs=True),
        lambda m, i, kw, o: o * 7),
}


@pytest.mark.parametrize("kind", list(_HOOKS))
def test_a_global_module_hook_registered_after_the_first_call(kind):
    """``def f(m, x): return m(x)`` with the module an argument: torch's global hooks, which
    Module.__call__ reads, are guarded whole (Note [Library state]); a hook registered later
    recompiles, removing it reinstalls the first specialization."""
    register, hook = _HOOKS[kind]

    def f(m, x):
        return m(x)

    jf, m, x = trident.jit(f), Plus(), torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = f(m, x)
        assert all(torch.equal(jf(m, x), before) for _ in range(2))
        handle = register(hook)
        try:
            after = f(m, x)
            assert not torch.equal(after, before)
            assert all(torch.equal(jf(m, x), after) for _ in range(2))
        finally:
            handle.remove()
        assert torch.equal(jf(m, x), before)
    st = jf.stats
    # torch 2.13 leaves the hook's id in _global_forward_hooks_with_kwargs after remove():
    # that is another state, compiled again (seen, not stale)
    leftover = kind == "forward, with kwargs"
    assert (st.compiles, st.fallbacks, st.hits) == ((3, 0, 2) if leftover else (2, 0, 3)), st
