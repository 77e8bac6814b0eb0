"""Faults of issue 28 left by session 43, each with a test of its whole kind: every call is
compared with eager (``torch.equal``), with exact compile, hit and fallback counts and the one
warning where calls run eagerly."""

from __future__ import annotations

import functools
import operator
import sys
import types
import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, installed_package, said


# ---- Note [Tensor types and attributes] (ir/guards.py): a tensor argument's attributes -------
# A library function that reads a Python attribute of a tensor argument with a default (a
# probe, hasattr, a try, nn.Buffer's isinstance, which asks ``_is_buffer``) got the trace's fake
# tensor's answer (absent) at every hit, also after the attribute was set, and even at the first
# call where the tensor had it. Each tensor argument is now guarded on whether it has Python
# attributes: without, the lookup is served; with, the call runs eagerly, with one warning.

_ATTRLIB = '''
import torch


def with_default(t):
    return t * getattr(t, "scale", 1.0)


def probed(t):
    return t * 2.0 if hasattr(t, "scale") else t


def caught(t):
    try:
        return t * t.scale
    except AttributeError:
        return t


def buffer(t):
    return t * (2.0 if isinstance(t, torch.nn.Buffer) else 3.0)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2), requires_grad=False)

    def forward(self, x):
        return x * self.weight * getattr(self.weight, "scale", 1.0)
'''

ATTRIBUTE = {"with_default": ("scale", 3.0, 5.0), "probed": ("scale", 3.0, 5.0),
             "caught": ("scale", 3.0, 5.0), "buffer": ("_is_buffer", True, False),
             "a module's parameter": ("scale", 3.0, 5.0)}
# when -> (what happens before each of the four calls, the counts)
WHEN = {
    "never": ((), (1, 3, 0)),
    "set after the first call": ({2: "set"}, (1, 1, 2)),
    "set before the first call": ({0: "set"}, (0, 0, 4)),
    "changed": ({0: "set", 2: "change"}, (0, 0, 4)),
    "deleted": ({0: "set", 2: "delete"}, (1, 1, 2)),
}


@pytest.fixture(scope="module")
def attrlib(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("attrlib"), "trident_attrlib44",
                           {"__init__": _ATTRLIB}) as lib:
        yield lib


@pytest.mark.parametrize("when", list(WHEN), ids=list(WHEN))
@pytest.mark.parametrize("reader", list(ATTRIBUTE), ids=list(ATTRIBUTE))
def test_library_code_reading_a_tensor_arguments_python_attribute(attrlib, reader, when):
    name, first, second = ATTRIBUTE[reader]
    steps, expected = WHEN[when]
    if reader == "a module's parameter":
        module = attrlib.Scaled()
        target = module.weight

        def f(x, m):
            return m(x)
        args = (torch.full((2,), 2.0), module)
    else:
        fn = getattr(attrlib, reader)
        target = torch.full((2,), 2.0)

        def f(x):
            return fn(x)
        args = (target,)
    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for k in range(4):
            step = dict(steps).get(k)
            if step in ("set", "change"):
                setattr(target, name, first if step == "set" else second)
            elif step == "delete":
                delattr(target, name)
            assert torch.equal(jf(*args), f(*args)), k
    assert counts(jf) == expected, jf.stats
    warned = said(caught, "trident")
    assert len(warned) == (1 if expected[2] else 0), warned
    assert all(f"Python attribute {name!r} of a tensor argument" in w for w in warned), warned


@pytest.mark.parametrize("looks", [False, True])
def test_a_tensor_gains_attributes(attrlib, looks):
    """A tensor argument that gains attributes after the first call (a static cache's tensors
    gain ``_dynamo_static_input_type``): where no code looked its attributes up, the same
    specialization serves it; where code did, the call misses, then runs eagerly."""
    def f(x):
        return attrlib.with_default(x) if looks else x + 1

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for k in range(4):
            if k == 2:
                x._dynamo_static_input_type = "unguarded"
            assert torch.equal(jf(x), f(x)), k
    assert counts(jf) == ((1, 1, 2) if looks else (1, 3, 0)), jf.stats


# ---- Note [Tensor types and attributes]: a tensor argument's type -------------------------------
# The native guards read an nn.Parameter as a tensor and no guard told them apart: a library's
# ``isinstance(t, nn.Parameter)`` answered at every hit as for the tensor it was traced with. A
# ``type(t)`` or ``t.__class__`` that library code reads is the fake tensor's (FakeTensor): wrong
# at the first call already. The first is now guarded (and served, in user code too); the second
# runs eagerly, with one warning.

_TYPELIB = '''
import torch


def is_parameter(t):
    return t * (2.0 if isinstance(t, torch.nn.Parameter) else 3.0)


def is_parameter_or_int(t):
    return t * (2.0 if isinstance(t, (int, torch.nn.Parameter)) else 3.0)


def exact(t):
    return t * (2.0 if type(t) is torch.Tensor else 3.0)


def class_name(t):
    return t * (2.0 if t.__class__.__name__ == "Parameter" else 3.0)


def type_name(t):
    return t * (2.0 if type(t).__name__ == "Tensor" else 3.0)
'''


def _user_is_parameter(t):
    return t * (2.0 if isinstance(t, torch.nn.Parameter) else 3.0)


SERVED = ["is_parameter", "is_parameter_or_int", "user code"]
EAGER = ["exact", "class_name", "type_name"]


@pytest.fixture(scope="module")
def typelib(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("typelib"), "trident_typelib44",
                           {"__init__": _TYPELIB}) as lib:
        yield lib


@pytest.mark.parametrize("reader", SERVED + EAGER)
def test_a_parameter_and_a_plain_tensor_passed_to_the_same_function(typelib, reader):
    fn = _user_is_parameter if reader == "user code" else getattr(typelib, reader)

    def f(x):
        return fn(x)

    jf = trident.jit(f)
    p = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    t = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in (p, t, p, t, t):
            assert torch.equal(jf(x), f(x))
    warned = said(caught, "trident")
    if reader in SERVED:
        assert counts(jf) == (2, 3, 0) and not warned, (jf.stats, warned)
        assert "isinstance(x, nn.Parameter) is True expected, got False" in \
            jf.stats.miss_reasons[1]
    else:
        assert counts(jf) == (0, 0, 5), jf.stats
        assert len(warned) == 1 and "reads a tensor's Python type" in warned[0], warned


def test_a_modules_parameter_replaced_by_a_plain_tensor():
    """``m.weight`` a Parameter, then a plain tensor assigned through ``__dict__``'s
    ``_parameters`` (as ``torch.nn.utils.parametrize`` and weight-swapping code do): the
    function asks which it has."""
    m = torch.nn.Linear(2, 2, bias=False).requires_grad_(False)

    def f(m, x):
        w = m.weight
        return x @ w.t() * (2.0 if isinstance(w, torch.nn.Parameter) else 3.0)

    jf = trident.jit(f)
    x = torch.ones(1, 2)
    weight = m.weight
    for k in range(4):
        m._parameters["weight"] = weight if k % 2 == 0 else weight.detach().clone()
        assert torch.equal(jf(m, x), f(m, x)), k
    assert counts(jf) == (2, 2, 0), jf.stats


@pytest.mark.parametrize("dims", [(3,), (4,), (5,), (6,)])
def test_a_parameter_of_symbolic_sizes_keeps_its_type(typelib, dims):
    """After a recompile with symbolic sizes the fake of a Parameter still answers as one."""
    jf = trident.jit(lambda x: typelib.is_parameter(x))
    for n in (3, 4, 5, 6, dims[0]):
        for x in (torch.nn.Parameter(torch.ones(n), requires_grad=False), torch.ones(n)):
            assert torch.equal(jf(x), typelib.is_parameter(x)), (n, type(x))
    assert jf.stats.fallbacks == 0, jf.stats


def test_a_library_type_read_known_alike_is_served():
    """Note [Type reads alike] (lower/state/type_strings.py): transformers'
    ``infer_framework_from_repr`` reads ``type(x)`` of each ``ModelOutput``'s first field where
    the others are None (a forward with ``use_cache=False``); it answers on a fake as on a
    tensor and a Parameter, so the forward is served (it ran eagerly: 10 of 10 calls)."""
    transformers = pytest.importorskip("transformers")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from transformers.utils.generic import infer_framework_from_repr

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2))
    assert infer_framework_from_repr(fake) == infer_framework_from_repr(torch.ones(2)) == \
        infer_framework_from_repr(torch.nn.Parameter(torch.ones(2))) == "pt"
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()

    def logits(model, ids):
        return model(input_ids=ids, use_cache=False).logits

    jf = trident.jit(logits)
    with torch.no_grad():
        for n in (5, 5, 5):
            ids = torch.randint(0, 64, (1, n))
            assert torch.equal(jf(model, ids), logits(model, ids))
    assert counts(jf) == (1, 2, 0), jf.stats


# ---- Note [Modules used whole] (lower/state/wholes.py), at any depth --------------------------
# A user module used whole had its globals guarded, but a user module among them by identity
# alone: ``attrgetter("helpers.K")(mod)`` returned the old ``helpers.K`` after it was rebound.
# So was a user class that a user class held (``Cfg.Inner.K``), and a module a class held.

@pytest.fixture
def package():
    mod = types.ModuleType("trident_user44")
    helpers = types.ModuleType("trident_user44_helpers")
    helpers.K = 2.0

    class Cfg:
        K = 2.0

        class Inner:
            K = 2.0
    Cfg.__module__ = Cfg.Inner.__module__ = "trident_user44_helpers"
    Cfg.helpers = helpers
    helpers.Cfg, helpers.back, mod.helpers = Cfg, mod, helpers  # (modules import each other)
    sys.modules.update({"trident_user44": mod, "trident_user44_helpers": helpers})
    yield mod
    for name in ("trident_user44", "trident_user44_helpers"):
        del sys.modules[name]


def _first(t):
    return t[0]


DEEP = {  # name: (read, the path to what changes, from the module)
    "attrgetter": (lambda x, m: x * operator.attrgetter("helpers.K")(m), "helpers"),
    "functools.reduce(getattr)": (
        lambda x, m: x * functools.reduce(getattr, ["helpers", "K"], m), "helpers"),
    "[mod][0].helpers.K": (lambda x, m: x * [m][0].helpers.K, "helpers"),
    "a helper's result": (lambda x, m: x * _first((m,)).helpers.K, "helpers"),
    "a class of the module it imports": (
        lambda x, m: x * operator.attrgetter("helpers.Cfg.K")(m), "helpers.Cfg"),
    "a class a class holds": (
        lambda x, m: x * operator.attrgetter("helpers.Cfg.Inner.K")(m), "helpers.Cfg.Inner"),
    "a module a class holds": (
        lambda x, m: x * operator.attrgetter("helpers.Cfg.helpers.K")(m), "helpers"),
    "through an import cycle": (
        lambda x, m: x * operator.attrgetter("helpers.back.helpers.K")(m), "helpers"),
}


@pytest.mark.parametrize("use", list(DEEP), ids=list(DEEP))
def test_a_user_module_used_whole_guards_what_it_holds_at_any_depth(package, use):
    read, where = DEEP[use]
    owner = operator.attrgetter(where)(package)
    M = package

    def f(x):
        return read(x, M)

    jf = trident.jit(f)
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no call runs eagerly)
        for k, value in enumerate((2.0, 5.0, 5.0, 2.0)):
            owner.K = value
            assert torch.equal(jf(x), f(x)), (k, value)
    assert counts(jf) == (2, 2, 0), jf.stats


# ---- Note [Nested jitted calls] (frames.py): a Triton launch inside the nested function -------
# A jitted function called by another one's traced code runs eagerly inside the trace, its ops
# the trace's; but its eager run set a launch hook of its own over the trace's (the CPU
# interpreter's), so its Triton launch went to Triton's launcher with the trace's fake tensors
# ("0 active drivers" on the CPU): the outer function could not be traced and ran eagerly at
# every call. The launch is now the trace's, and what the nested function reads to make it
# (the kernel's global, a scale) is guarded.

triton = pytest.importorskip("triton")
tl = triton.language

from _triton_kernels import add_kernel, scale_inplace_kernel  # noqa: E402


@triton.jit
def _negated_scale_kernel(x_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, -tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


KERNEL = scale_inplace_kernel
SCALE = 2.0


@trident.jit
def _nested_add(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
    return out


@trident.jit
def _nested_scale(x):
    out = x.clone()
    KERNEL[(triton.cdiv(x.numel(), 64),)](out, x.numel(), SCALE, BLOCK=64)
    return out


def test_a_nested_jitted_functions_launch_is_part_of_the_outer_trace():
    def outer(x, y):
        return _nested_add(x, y) * 2

    jf = trident.jit(outer)
    x, y = torch.randn(100), torch.randn(100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(jf(x, y), (x + y) * 2)
    assert counts(jf) == (1, 2, 0), jf.stats
    assert jf.stats.interpreted_launches == 3  # (on the CPU; the SCM launches it on a GPU)
    assert not said(caught, "outer runs eagerly"), caught
    assert said(caught, "_nested_add runs eagerly: called while another jitted function is "
                "traced"), caught


@pytest.mark.parametrize("change", ["the kernel", "a scale it passes"])
def test_what_a_nested_launch_reads_is_guarded(change):
    global KERNEL, SCALE

    def outer(x):
        return _nested_scale(x) + 1

    def eager(x):
        out = x.clone()
        return out * (-SCALE if KERNEL is _negated_scale_kernel else SCALE) + 1

    jf = trident.jit(outer)
    x = torch.arange(8.0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the nested function runs eagerly in the trace)
            for k in range(4):
                if k == 2 and change == "the kernel":
                    KERNEL = _negated_scale_kernel
                elif k == 2:
                    SCALE = 3.0
                assert torch.equal(jf(x), eager(x)), k
    finally:
        KERNEL, SCALE = scale_inplace_kernel, 2.0
    assert counts(jf) == (2, 2, 0), jf.stats
