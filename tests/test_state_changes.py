"""Never stale (issue 28): Python state changed between calls in the ways users change it (a
closure's cell, a function's defaults and code, a partial's arguments, a module reloaded or
replaced in ``sys.modules``, descriptors, properties, metaclasses, dataclasses, enums, a
patched builtin, torch's default dtype, grad and inference mode, threads), each compared with
eager. The adversarial pass of issue 28's second round; the kinds it found stale (a module
replaced in ``sys.modules`` under an import inside the function, a descriptor's own state, a
patched builtin) are cases here, as are those it found served correctly."""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import importlib
import math
import sys
import types

import pytest
import torch

import trident
from _trident_helpers import check_change_is_seen


def _set(obj, name, value):
    """Set ``obj.name`` (past a frozen dataclass's ``__setattr__``) and return the undo."""
    own = getattr(obj, "__dict__", {})
    old = own[name] if name in own else getattr(obj, name, _GONE)
    put = setattr if isinstance(obj, (type, types.ModuleType)) else object.__setattr__
    put(obj, name, value)
    if name in own or (old is not _GONE and not isinstance(obj, type)):
        return lambda: put(obj, name, old)
    return lambda: delattr(obj, name)


def _item(container, key, value):
    old = container[key]
    container[key] = value
    return lambda: container.__setitem__(key, old)


_GONE = object()


# ---- closures, defaults, code, partials --------------------------------------------------

def _closure(k):
    def scaled(x):
        return x * k
    return scaled


CLOSED = _closure(2.0)
HELPER = _closure(2.0)


def _with_default(x, k=2.0):
    return x * k


def _default_helper(x, k=2.0):
    return x * k


def _kw_helper(x, *, k=2.0):
    return x * k


def _times_two(x):
    return x * 2.0


def _times_three(x):
    return x * 3.0


def _own_code(x):
    return x * 2.0


def _scale(x, k):
    return x * k


PARTIAL = functools.partial(_scale, k=2.0)


# ---- descriptors, properties, metaclasses, dataclasses, enums ------------------------------

class Held:
    """A descriptor whose ``__get__`` reads its own state."""

    def __init__(self):
        self.v = 2.0

    def __get__(self, obj, owner):
        return self.v


class WithHeld:
    k = Held()


HELD = WithHeld()
PROPERTY_K = [2.0]


class WithProperty:
    @property
    def k(self):
        return PROPERTY_K[0]


PROP = WithProperty()
META_TABLE = {"k": 2.0}


class Meta(type):
    def __getattr__(cls, name):
        try:
            return META_TABLE[name]
        except KeyError:
            raise AttributeError(name) from None


class ByMeta(metaclass=Meta):
    pass


class MetaAttr(type):
    k = 2.0


class ByMetaAttr(metaclass=MetaAttr):
    pass


@dataclasses.dataclass
class Data:
    scale: float = 2.0


@dataclasses.dataclass(frozen=True)
class Frozen:
    scale: float = 2.0


DATA, FROZEN = Data(), Frozen()


class Mode(enum.Enum):
    A = 2.0
    B = 3.0


MODE = [Mode.A]


class Plain:
    k = 2.0


class Other:
    k = 3.0


OBJ = Plain()


class Holder:
    items = [2.0]


def _pick():
    return Holder


def _picked(x):
    c = _pick()
    return x * c.items[0]


class ByName(torch.nn.Module):
    k = 2.0

    def forward(self, x, name):
        return x * getattr(self, name)


BY_NAME = ByName()


def _anomaly():
    torch.autograd.set_detect_anomaly(True)
    return lambda: torch.autograd.set_detect_anomaly(False)


def _module_file(tmp):
    """A user module on sys.path, to reload and to replace in sys.modules."""
    (tmp / "_changed_mod.py").write_text("SCALE = 2.0\n")
    sys.path.insert(0, str(tmp))
    importlib.invalidate_caches()
    return importlib.import_module("_changed_mod")


def _reload(mod):
    path = mod.__file__
    with open(path, "w") as fh:
        fh.write("SCALE = 3.0\n")
    importlib.invalidate_caches()
    sys.modules.pop("_changed_mod", None)  # (a new file of the same size and time)
    sys.modules["_changed_mod"] = mod
    importlib.reload(mod)

    def undo():
        with open(path, "w") as fh:
            fh.write("SCALE = 2.0\n")
        mod.SCALE = 2.0
    return undo


def _replace_module(mod):
    new = types.ModuleType("_changed_mod")
    new.SCALE = 5.0
    sys.modules["_changed_mod"] = new
    return lambda: sys.modules.__setitem__("_changed_mod", mod)


def _imports(x):
    import _changed_mod

    return x * _changed_mod.SCALE


def _imports_module(x):
    return x * importlib.import_module("_changed_mod").SCALE


def _abs_patched():
    old = builtins.abs
    builtins.abs = lambda v: 3.0
    return lambda: setattr(builtins, "abs", old)


def _default_dtype():
    torch.set_default_dtype(torch.float64)
    return lambda: torch.set_default_dtype(torch.float32)


def _context(ctx):
    ctx.__enter__()
    return lambda: ctx.__exit__(None, None, None)


def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1 if old != 1 else 2)
    return lambda: torch.set_num_threads(old)


CASES = {
    "a closure's cell set": (CLOSED, lambda: _set(CLOSED.__closure__[0], "cell_contents", 3.0)),
    "a helper's closure cell set": (
        lambda x: HELPER(x) + 1, lambda: _set(HELPER.__closure__[0], "cell_contents", 3.0)),
    "the function's own __defaults__": (
        _with_default, lambda: _set(_with_default, "__defaults__", (3.0,))),
    "a helper's __defaults__": (
        lambda x: _default_helper(x), lambda: _set(_default_helper, "__defaults__", (3.0,))),
    "a helper's __kwdefaults__": (
        lambda x: _kw_helper(x), lambda: _set(_kw_helper, "__kwdefaults__", {"k": 3.0})),
    "a helper's __code__ replaced": (
        lambda x: _times_two(x), lambda: _set(_times_two, "__code__", _times_three.__code__)),
    "the function's own __code__ replaced": (
        _own_code, lambda: _set(_own_code, "__code__", _times_three.__code__)),
    "a partial's keywords mutated": (
        lambda x: PARTIAL(x), lambda: _item(PARTIAL.keywords, "k", 3.0)),
    "a module reloaded": ("reload", None),
    "a module replaced in sys.modules, imported inside": ("replace", _imports),
    "a module replaced in sys.modules, import_module": ("replace", _imports_module),
    "a descriptor's own state": (lambda x: x * WithHeld.k,
                                 lambda: _set(WithHeld.__dict__["k"], "v", 3.0)),
    "a descriptor's own state, through an instance": (
        lambda x: x * HELD.k, lambda: _set(WithHeld.__dict__["k"], "v", 3.0)),
    "a property reading a global": (lambda x: x * PROP.k, lambda: _item(PROPERTY_K, 0, 3.0)),
    "a property replaced on the class": (
        lambda x: x * PROP.k, lambda: _set(WithProperty, "k", property(lambda s: 3.0))),
    "a metaclass __getattr__": (lambda x: x * ByMeta.k, lambda: _item(META_TABLE, "k", 3.0)),
    "a metaclass attribute": (lambda x: x * ByMetaAttr.k, lambda: _set(MetaAttr, "k", 3.0)),
    "a dataclass field": (lambda x: x * DATA.scale, lambda: _set(DATA, "scale", 3.0)),
    "a frozen dataclass's field through object.__setattr__": (
        lambda x: x * FROZEN.scale, lambda: _set(FROZEN, "scale", 3.0)),
    "a dataclass's default (its __init__'s)": (
        lambda x: x * Data().scale, lambda: _set(Data.__init__, "__defaults__", (3.0,))),
    "an enum member chosen by a global": (lambda x: x * MODE[0].value,
                                          lambda: _item(MODE, 0, Mode.B)),
    "an enum compared by identity": (lambda x: x * (2.0 if MODE[0] is Mode.A else 3.0),
                                     lambda: _item(MODE, 0, Mode.B)),
    "__class__ assigned": (lambda x: x * OBJ.k, lambda: _set(OBJ, "__class__", Other)),
    "a builtin patched": (lambda x: x * abs(-2.0), _abs_patched),
    "math.sqrt patched": (lambda x: x * math.sqrt(4.0), lambda: _set(math, "sqrt",
                                                                     lambda v: 3.0)),
    "a function's attribute": ("attribute", None),
    "torch.set_default_dtype": (lambda x: x + torch.ones(4), _default_dtype),
    "torch.get_default_dtype() in a branch": (
        lambda x: x * (2.0 if torch.get_default_dtype() == torch.float32 else 3.0),
        _default_dtype),
    "torch.is_grad_enabled() in a branch": (
        lambda x: x * (2.0 if torch.is_grad_enabled() else 3.0),
        lambda: _context(torch.no_grad())),
    "torch.is_inference_mode_enabled() in a branch": (
        lambda x: x * (2.0 if torch.is_inference_mode_enabled() else 3.0),
        lambda: _context(torch.inference_mode())),
    "torch.get_num_threads() as a value": (lambda x: x * torch.get_num_threads(), _threads),
    "a list of a class returned by a call": (_picked, lambda: _item(Holder.items, 0, 3.0)),
    "getattr(self, name) of a class attribute": (
        lambda x: BY_NAME(x, "k"), lambda: _set(ByName, "k", 3.0)),
    "torch.is_anomaly_enabled() in a branch": (
        lambda x: x * (2.0 if torch.is_anomaly_enabled() else 3.0), _anomaly),
}


def _attribute_case():
    def scaled(x):
        return x * scaled.k
    scaled.k = 2.0
    return scaled, lambda: _set(scaled, "k", 3.0)


@pytest.mark.parametrize("case", list(CASES))
def test_state_changed_between_calls_is_seen(case, tmp_path):
    """Each change makes eager's result differ; the next calls equal eager's (one compile
    more, no fallback, no warning), and the state put back is served by the first
    specialization again without a compile."""
    fn, change = CASES[case]
    mod = None
    if fn in ("reload", "replace"):
        mod = _module_file(tmp_path)
        fn, change = (_imports, lambda: _reload(mod)) if fn == "reload" else (
            change, lambda: _replace_module(mod))
    elif fn == "attribute":
        fn, change = _attribute_case()
    try:
        check_change_is_seen(fn, change)
    finally:
        if mod is not None:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("_changed_mod", None)


# ---- docs/design.md's list of what makes a call eager: the lines no other file tests -------

LOCK = __import__("threading").Lock()


def _hook(k):
    def hook(module, inputs, output):
        return output * k
    return hook


HOOKED = torch.nn.Identity()
HOOKED.register_forward_hook(_hook(2.0))


def _hook_cell():
    cell = next(iter(HOOKED._forward_hooks.values())).__closure__[0]
    return _set(cell, "cell_contents", 3.0)


@pytest.mark.parametrize("case", ["a lock", "a closure that library code calls"])
def test_state_no_guard_reads_runs_eagerly(case):
    """A lock read by the function (no check sees its state), and a closure variable of a
    hook that ``Module.__call__`` calls (no chain finds its cell again): every call runs
    eagerly, with one warning, and equals eager after the state changes."""
    fn, change = {"a lock": (lambda x: x * (2.0 if LOCK.locked() else 3.0),
                             lambda: (LOCK.acquire(), LOCK.release)[1]),
                  "a closure that library code calls": (lambda x: HOOKED(x), _hook_cell)}[case]
    jf = trident.jit(fn)
    x = torch.ones(2)
    with pytest.warns(UserWarning, match="runs eagerly") as caught:
        assert torch.equal(jf(x), fn(x))
        undo = change()
        try:
            after = fn(x)
            assert torch.equal(jf(x), after)
        finally:
            undo()
    assert sum("runs eagerly" in str(w.message) for w in caught) == 1
    assert (jf.stats.compiles, jf.stats.fallbacks) == (0, 2), jf.stats


def _numbers():
    n = 0
    while True:
        n += 1
        yield float(n)


GEN = [_numbers()]
TLOCAL = __import__("threading").local()
TLOCAL.k = 2.0


def _next(x):
    return x * next(GEN[0])


def _looped(x):
    for v in GEN[0]:
        return x * v


EAGER = {
    "next() of a global generator": _next,
    "a loop over a global generator": _looped,
    "sys.getrefcount": lambda x: x * sys.getrefcount(Holder),
    "threading.get_ident()": lambda x: x * (__import__("threading").get_ident() % 7 + 1),
    "a threading.local's attribute": lambda x: x * getattr(TLOCAL, "k", 3.0),
    "type(x) of a tensor": lambda x: x * (2.0 if type(x) is torch.Tensor else 3.0),
    "x.__class__ of a tensor": lambda x: x * (2.0 if x.__class__.__name__ == "Tensor" else 3.0),
    # (isinstance(x, nn.Parameter) is served: tests/test_never_stale44.py; of a tensor
    # subclass: tests/test_type_reads46.py)
}


@pytest.mark.parametrize("case", list(EAGER))
def test_reads_no_guard_keeps_run_eagerly_once_per_call(case):
    """A global iterator advanced (a write the bytecode shows: before the trace), the
    collector's or the thread's state, a threading.local, and a tensor's Python type (fake in
    the trace): each call runs eagerly with one warning, and equals eager call by call (a
    generator advanced by a trace would be one ahead)."""
    fn = EAGER[case]
    GEN[0] = _numbers()
    x = torch.ones(2)
    want = [fn(x) for _ in range(3)]
    GEN[0] = _numbers()
    jf = trident.jit(fn)
    with pytest.warns(UserWarning, match="runs eagerly") as caught:
        got = [jf(x) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
    assert sum("runs eagerly" in str(w.message) for w in caught) == 1
    assert (jf.stats.compiles, jf.stats.fallbacks) == (0, 3), jf.stats
