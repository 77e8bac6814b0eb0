"""Note [Questions asked in the trace] (lower/state/asked.py): ``isinstance``, ``issubclass``,
``type(x) is C`` and ``type(x) in (...)`` of a trace's stand-in (a fake tensor, the SymInt that
``.item()`` made) with a class the bytecode does not name (a local import, ``getattr(module,
name)``, a closure's, an argument's), in user code and in library code. Where eager may answer
otherwise the call runs eagerly with one warning; where it answers alike the call is served.
Every call is compared with eager, with exact counts."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, installed_package, said

# (module, name) of a class eager answers otherwise for: the trace's fake tensor is one
_FAKE = ("torch._subclasses.fake_tensor", "FakeTensor")
_TENSOR = ("torch", "Tensor")  # type(x) is torch.Tensor: the fake's type is another
_NONE_IS = ("torch.nn.parameter", "UninitializedBuffer")  # a tensor class no tensor here is

_FORMS = {  # the question, of the tensor x and the class c
    "isinstance": "isinstance(x, c)",
    "a tuple of classes": "isinstance(x, (int, c))",
    "issubclass": "issubclass(type(x), c)",
    "type is": "type(x) is c",
    "type in": "type(x) in (int, c)",
    "of an attribute": "isinstance(h.w, c)",
}
_SOURCES = {  # where the class comes from
    "local import": "    from {module} import {name} as c\n",
    "getattr(module, name)": "    c = getattr(M{i}, N{i})\n",
    "closure": None,
    "argument": "",
}


def _case(i: int, form: str, source: str, cls: tuple) -> str:
    """The source of ``f{i}(x, c, h)``, which asks ``form`` with a class from ``source``."""
    module, name = cls
    head = f"import {module}\nM{i} = {module}\nN{i} = {name!r}\n"
    body = f"    return x * (3 if {_FORMS[form]} else 2)\n"
    if source == "closure":
        return head + (f"def make{i}():\n    c = getattr(M{i}, N{i})\n"
                       f"    def f{i}(x, _, h):\n    {body}    return f{i}\n"
                       f"f{i} = make{i}()\n")
    return head + f"def f{i}(x, c, h):\n" + _SOURCES[source].format(
        module=module, name=name, i=i) + body


_OTHERWISE = [(form, source, _TENSOR if form.startswith("type") else _FAKE)
              for form, source in itertools.product(_FORMS, _SOURCES)]
_ALIKE = [(form, source, cls) for form, source, cls in itertools.product(
    ["isinstance", "a tuple of classes", "of an attribute"], _SOURCES, [_TENSOR, _NONE_IS])]
_CASES = _OTHERWISE + _ALIKE
_SRC = "class Holder:\n    def __init__(self, w):\n        self.w = w\n\n\n" + "".join(
    _case(i, *case) for i, case in enumerate(_CASES))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The cases as user code (exec'd into a dict of their own) and as an installed
    library's."""
    user: dict = {}
    exec(compile(_SRC, "<questions47>", "exec"), user)
    with installed_package(tmp_path_factory.mktemp("asked47"), "trident_asked47",
                           {"__init__": _SRC}) as package:
        yield {"user": user, "library": vars(package)}


def _run(jf, f, calls) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for args in calls:
            got, want = jf(*args()), f(*args())
            assert torch.equal(got, want), (got, want, jf.stats.miss_reasons)
    return said(caught, "trident")


def _jitted(g: dict, i: int, cls: tuple):
    import importlib
    c = getattr(importlib.import_module(cls[0]), cls[1])
    h, fn = g["Holder"](torch.ones(2)), g[f"f{i}"]

    def call(x, c, h):
        return fn(x, c, h) + 1

    return trident.jit(call), call, lambda: (torch.ones(2), c, h)


@pytest.mark.parametrize("where", ["user", "library"])
@pytest.mark.parametrize("form,source,cls", _OTHERWISE,
                         ids=[f"{f}-{s}" for f, s, _ in _OTHERWISE])
def test_a_question_eager_answers_otherwise_runs_eagerly(sources, where, form, source, cls):
    jf, f, args = _jitted(sources[where], _CASES.index((form, source, cls)), cls)
    warned = _run(jf, f, [args, args])
    assert len(warned) == 1 and ("reads a tensor's Python type" in warned[0]), warned
    assert counts(jf) == (0, 0, 2), jf.stats.miss_reasons


@pytest.mark.parametrize("where", ["user", "library"])
@pytest.mark.parametrize("form,source,cls", _ALIKE,
                         ids=[f"{f}-{s}-{c[1]}" for f, s, c in _ALIKE])
def test_a_question_eager_answers_alike_is_served(sources, where, form, source, cls):
    jf, f, args = _jitted(sources[where], _CASES.index((form, source, cls)), cls)
    assert _run(jf, f, [args, args, args]) == []
    assert counts(jf) == (1, 2, 0), jf.stats.miss_reasons


# ---- of the SymInt that ``.item()`` made (Note [Questions about symbolic values]) --------------
# Library code given the number asked what it is with no check of the bytecode's: every call
# returned the branch eager never takes.

_NUMBER_FORMS = {k: v.replace("x", "v").replace("int, c", "str, c")
                 for k, v in _FORMS.items() if k != "of an attribute"}
_INT = ("builtins", "int")


def _number_case(i: int, form: str, source: str, cls: tuple) -> str:
    """The source of ``g{i}(v, c)``, which asks ``form`` of ``v`` with a class from
    ``source``."""
    return _case(i, form, source, cls).replace(f"f{i}(x, _, h)", f"g{i}(v, _)").replace(
        f"f{i}(x, c, h)", f"g{i}(v, c)").replace(f"f{i}", f"g{i}").replace(
        "return x * (3 if " + _FORMS[form], "return (3 if " + _NUMBER_FORMS[form])


_NUMBER_CASES = [(form, source, _INT) for form, source in itertools.product(
    _NUMBER_FORMS, _SOURCES)] + [("isinstance", "local import", ("numbers", "Integral"))]
_NUMBER_ALIKE = ("import torch\nNUMBERS = (int, float, torch.SymInt, torch.SymFloat, "
                 "torch.SymBool)\ndef alike(v, _):\n    return 3 if isinstance(v, NUMBERS) else 2\n")
_NUMBER_SRC = _NUMBER_ALIKE + "".join(_number_case(i, *case)
                                      for i, case in enumerate(_NUMBER_CASES))


@pytest.fixture(scope="module")
def number_sources(tmp_path_factory):
    user: dict = {}
    exec(compile(_NUMBER_SRC, "<numbers47>", "exec"), user)
    with installed_package(tmp_path_factory.mktemp("numbers47"), "trident_numbers47",
                           {"__init__": _NUMBER_SRC}) as package:
        yield {"user": user, "library": vars(package)}


def _number_jitted(g: dict, name: str, cls: tuple):
    import importlib
    c, fn = getattr(importlib.import_module(cls[0]), cls[1]), g[name]

    def call(x, m, c):
        return x * fn(m.sum().item(), c)

    return trident.jit(call), call, lambda: (torch.ones(2), torch.tensor([1, 3]), c)


@pytest.mark.parametrize("where", ["user", "library"])
@pytest.mark.parametrize("form,source,cls", _NUMBER_CASES,
                         ids=[f"{f}-{s}-{c[1]}" for f, s, c in _NUMBER_CASES])
def test_a_question_about_a_read_number_runs_eagerly(number_sources, where, form, source, cls):
    i = _NUMBER_CASES.index((form, source, cls))
    jf, f, args = _number_jitted(number_sources[where], f"g{i}", cls)
    warned = _run(jf, f, [args, args, args])
    assert len(warned) == 1 and "asks Python what a symbolic value is" in warned[0], warned
    assert counts(jf) == (0, 0, 3), jf.stats.miss_reasons


@pytest.mark.parametrize("where", ["user", "library"])
def test_a_question_about_a_read_number_eager_answers_alike_is_served(number_sources, where):
    jf, f, args = _number_jitted(number_sources[where], "alike", _INT)
    assert _run(jf, f, [args, args, args]) == []
    assert counts(jf) == (1, 2, 0), jf.stats.miss_reasons


# ---- isinstance bound before the trace; type() of an attribute ---------------------------------
# A name bound to the builtin before the trace (``_isinstance = isinstance`` at a module's top)
# calls it past the trace's wrapper: the bytecode scan keeps it where the class is not named.
_BOUND = '''
_isinstance = isinstance  # bound before any trace


def bound_before(x, c, h):
    return x * (3 if _isinstance(x, c) else 2)


def type_of_an_attribute(x, c, h):
    return h.w * (3 if type(h.w) is c else 2)
'''


def _bound_case(tmp_path, where: str, which: str, cls: tuple):
    import importlib
    c = getattr(importlib.import_module(cls[0]), cls[1])
    if where == "user":
        g: dict = {}
        exec(compile(_BOUND, "<bound47>", "exec"), g)
        return _bound_run(g[which], c)
    with installed_package(tmp_path, "trident_bound47", {"__init__": _BOUND}) as lib:
        return _bound_run(getattr(lib, which), c)


def _bound_run(read, c):
    def f(x, c, h):
        return read(x, c, h) + 1

    jf = trident.jit(f)
    h = type("Holder", (), {})()
    h.w = torch.ones(2)
    warned = _run(jf, f, [lambda: (torch.ones(2), c, h)] * 2)
    assert len(warned) == 1 and "reads a tensor's Python type" in warned[0], warned
    assert counts(jf) == (0, 0, 2), jf.stats.miss_reasons


@pytest.mark.parametrize("where", ["user", "library"])
def test_isinstance_bound_before_the_trace_runs_eagerly(tmp_path, where):
    _bound_case(tmp_path, where, "bound_before", _FAKE)


@pytest.mark.xfail(strict=True, reason="type() of a tensor reached otherwise than as a "
                   "parameter (type(h.w)) calls no function the trace sees, and the scan "
                   "follows tensor parameters only (docs/design.md, Limits today)")
@pytest.mark.parametrize("where", ["user", "library"])
def test_type_of_an_attribute_runs_eagerly(tmp_path, where):
    _bound_case(tmp_path, where, "type_of_an_attribute", _TENSOR)
