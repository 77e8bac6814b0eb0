"""Issue 28, session 48: ``isinstance``/``issubclass`` judged as the trace calls them (Note
[Questions asked in the trace] in lower/state/asked.py), and Python warnings that code the
function runs gives in the trace (Note [Warnings a trace gives] in lower/state/warned.py). Each
call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import trident
from _trident_helpers import counts, installed_package, said

_LIB = '''
import torch
from torch._subclasses import fake_tensor

_isinstance = isinstance  # bound before any trace


class Gathered(torch.Tensor):  # a subclass no traced tensor is
    pass


def computed(x):  # a class from a local import
    from torch._subclasses.fake_tensor import FakeTensor as cls
    return x * (3 if isinstance(x, cls) else 2)


def attribute(x):  # a module's attribute through a local
    m = fake_tensor
    return x * (3 if isinstance(x, m.FakeTensor) else 2)


def aliased(x):  # the builtin under another name
    return x * (3 if _isinstance(x, fake_tensor.FakeTensor) else 2)


def given(x, cls):  # a class the caller passes
    return x * (3 if isinstance(x, cls) else 2)


def subclass(x):  # issubclass of the stand-in's class
    from torch._subclasses.fake_tensor import FakeTensor as cls
    t = type(x)
    return x * (3 if issubclass(t, (int, cls)) else 2)


def local_gathered(x):  # a class from a local, answered alike: served
    c = (Gathered, int)
    return x * (3 if isinstance(x, c) else 2)


def local_uninitialized(x):  # a subclass of Parameter (its metaclass answers by the class)
    c = torch.nn.parameter.UninitializedParameter
    return x * (3 if isinstance(x, c) else 2)


def is_int(v):  # a question about .item()'s SymInt
    return isinstance(v, int)


def is_number(v):  # answered alike for a SymInt and an int: served
    k = (int, torch.SymInt)
    return isinstance(v, k)


def softmax_no_dim(x):  # torch warns at each call (warnings.warn in Python)
    return torch.nn.functional.softmax(x)


def warns(x):
    import warnings
    warnings.warn("lib48 says so", UserWarning, stacklevel=2)
    return x + 1
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("lib48"), "trident_lib48",
                           {"__init__": _LIB}) as package:
        yield package


def _calls(jf, f, make, n=3):
    """``n`` calls of ``jf`` and ``f`` (eager) on ``make()``'s arguments, compared; the
    warnings Trident gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            args = make()
            got, want = jf(*args), f(*args)
            assert torch.equal(got, want) and type(got) is type(want), (got, want)
    return said(caught, "trident")


_EAGER_QUESTIONS = {  # the trace's answer for its FakeTensor is True, eager's False
    "local import": lambda lib: lambda x: lib.computed(x) + 1,
    "module attribute through a local": lambda lib: lambda x: lib.attribute(x) + 1,
    "builtin bound before the trace": lambda lib: lambda x: lib.aliased(x) + 1,
    "class passed by the caller": lambda lib: lambda x: lib.given(x, FakeTensor) + 1,
    "issubclass of type(x)": lambda lib: lambda x: lib.subclass(x) + 1,
    "in the function itself": lambda lib: _user_local_import,
}


def _user_local_import(x):
    from torch._subclasses.fake_tensor import FakeTensor as cls
    return x * (3 if isinstance(x, cls) else 2)


@pytest.mark.parametrize("kind", list(_EAGER_QUESTIONS))
def test_a_question_whose_class_the_bytecode_does_not_name_runs_eagerly(lib, kind):
    f = _EAGER_QUESTIONS[kind](lib)
    jf = trident.jit(f)
    warned = _calls(jf, f, lambda: (torch.ones(2),))
    assert len(warned) == 1 and "reads a tensor's Python type" in warned[0], warned
    assert counts(jf) == (0, 0, 3), jf.stats


def test_a_question_answered_alike_stays_served(lib):
    f = lambda x, m: lib.local_gathered(x) + lib.local_uninitialized(x) + int(  # noqa: E731
        lib.is_number(m.sum().item()))
    jf = trident.jit(f)
    assert _calls(jf, f, lambda: (torch.ones(2), torch.tensor([1, 3]))) == []
    assert counts(jf) == (1, 2, 0), jf.stats


def test_a_library_question_about_a_symbolic_size_traces_at_exact_sizes(lib):
    def f(x):
        return x * 2 if lib.is_int(x.shape[0]) else x * 3

    jf = trident.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 3):
            x = torch.ones(n)
            assert torch.equal(jf(x), f(x))
    assert said(caught, "trident") == []
    assert counts(jf) == (3, 1, 0), jf.stats.miss_reasons  # the third size's symbolic
    # trace asked: traced again at its size, static from then on


def _given(jf, f, x, action):
    """One call of ``jf`` and of ``f`` under ``simplefilter(action)``: what each returned or
    raised, and the warnings each gave that are not Trident's."""
    out = []
    for fn in (jf, f):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter(action)
            try:
                result = fn(x)
            except UserWarning as e:
                result = f"raised {e}"
        out.append((result, [str(w.message) for w in caught if "trident" not in
                             str(w.message)]))
    return out


@pytest.mark.parametrize("who", ["torch", "library"])
def test_a_warning_given_in_the_trace_is_eagers_under_every_filter(lib, who):
    f = lib.softmax_no_dim if who == "torch" else lib.warns
    jf = trident.jit(f)
    x = torch.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        jf(x)
        jf(x)
    assert caught == [] and counts(jf) == (0, 0, 2), jf.stats
    for action in ("error", "always", "default", "ignore", "always"):
        (got, got_said), (want, want_said) = _given(jf, f, x, action)
        if isinstance(want, str):
            assert got == want, (action, got, want)
        else:
            assert torch.equal(got, want), action
        assert got_said == want_said and (action in ("ignore", "error") or want_said), (
            action, got_said)
        assert isinstance(want, str) == (action == "error"), (action, want)
    assert counts(jf) == (0, 0, 7), jf.stats


def test_warnings_the_trace_machinery_gives_leave_the_call_served():
    def f(x):
        return torch.nn.functional.softmax(x, dim=0) * 2

    jf = trident.jit(f)
    assert _calls(jf, f, lambda: (torch.ones(3),)) == []
    assert counts(jf) == (1, 2, 0), jf.stats
