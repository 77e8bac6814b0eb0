"""Note [Checked size steps] (trident/codegen/render.py): arithmetic on symbolic ints is done in
C on int64, checked; where Python's int would grow past int64 or Python raises, the call runs
eagerly. Every call is compared with eager (values and Python types), with exact counts."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import cffi
import pytest
import torch

import trident

BIG = 2**62
EDGES = [0, 1, -1, 2, -2, 3, 7, -7, 2**31, -2**31, 2**32 + 1, BIG, -BIG, 2**63 - 1, -2**63,
         2**63 - 2, -2**63 + 1, 3037000499, 3037000500, -3037000500]


@pytest.fixture(scope="module")
def checked():
    """trident_rt.h's checked operators, built with cffi as the SCMs include them."""
    ffi = cffi.FFI()
    names = ["add", "sub", "mul", "floordiv", "mod"]
    ffi.cdef("\n".join(f"int {n}(int64_t a, int64_t b, int64_t* r);" for n in names)
             + "\nint neg(int64_t a, int64_t* r);")
    body = "\n".join(f"int {n}(int64_t a, int64_t b, int64_t* r) {{ return trt_{n}_ck(a, b, r); }}"
                     for n in names)
    source = ('#include <stdint.h>\n#include "trident_rt.h"\n' + body
              + "\nint neg(int64_t a, int64_t* r) { return trt_neg_ck(a, r); }\n")
    header = Path(trident.__file__).parent / "runtime"
    ffi.set_source("checked_steps", source, include_dirs=[str(header)])
    import tempfile
    built = ffi.compile(tmpdir=tempfile.mkdtemp(prefix="checked-steps-"))
    spec = importlib.util.spec_from_file_location("checked_steps", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lib, ffi


def test_checked_operators_give_python_int_or_say_it_is_no_int64(checked):
    """Each checked operator either writes Python's exact answer or reports that Python's
    answer is no int64 (or that Python raises ZeroDivisionError): never a wrapped value."""
    lib, ffi = checked
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b}
    out = ffi.new("int64_t*")
    for name, py in ops.items():
        for a in EDGES:
            for b in EDGES:
                try:
                    want = py(a, b)
                except ZeroDivisionError:
                    want = None
                failed = getattr(lib, name)(a, b, out)
                if want is None or not -2**63 <= want < 2**63:
                    assert failed, (name, a, b)
                else:
                    assert not failed and out[0] == want, (name, a, b, out[0], want)
    for a in EDGES:
        failed = lib.neg(a, out)
        assert failed == (a == -2**63) and (failed or out[0] == -a), a


class Counter:
    def __init__(self, n):
        self.n = n


def _grow(x, c):
    n = c.n
    return x + 1, n * 4, n + n, n - (-n), -n


def _same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert type(a) is type(b) and a == b, (got, want)


def test_a_symbolic_int_past_int64_runs_eagerly_and_returns_python_ints():
    # c.n is traced as a symbol (Note [Symbolic ints]) from its second value on: n * 4 of
    # 2**62 is 2**64 in eager; the C step overflows and the call runs eagerly
    jf = trident.jit(_grow)
    x = torch.arange(3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 5, 2**60, BIG, -BIG, 2**61 - 1, -2**63, 7):
            _same(jf(x, Counter(n)), _grow(x, Counter(n)))
    s = jf.stats
    # 2**62, -2**62 (n * 4) and -2**63 (-n) are past int64: eager; the rest hit
    assert (s.compiles, s.fallbacks, s.hits) == (2, 3, 3), s
    said = [str(w.message) for w in caught if "past int64" in str(w.message)]
    assert len(said) == 1, said  # one warning per reason


def test_a_constant_past_int64_is_not_compiled():
    # a static trace's n * 4 of 2**62 is the constant 2**64, which no C int holds
    jf = trident.jit(lambda x, n: (x + 1, n * 4))
    x = torch.arange(3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (3, BIG, BIG):
            _same(jf(x, n), (x + 1, n * 4))
    s = jf.stats
    assert (s.compiles, s.fallbacks, s.hits) == (2, 2, 0), s  # the second: decided eager


def _divide(x, c):
    n = c.n
    return x * 2, n // -1, n % -1, n // 3, n % -5


def test_int64_min_floordiv_minus_one_runs_eagerly():
    # INT64_MIN // -1 traps in C (SIGFPE) and is 2**63 in Python
    jf = trident.jit(_divide)
    x = torch.arange(4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (9, 11, -2**63, -2**63 + 1, 2**63 - 1, -13):
            _same(jf(x, Counter(n)), _divide(x, Counter(n)))
    s = jf.stats
    assert (s.compiles, s.fallbacks, s.hits) == (2, 1, 3), s


def _modulo(x, c):
    return x * 2, c.n % (x.shape[0] - 4), c.n // (x.shape[0] - 4)


def test_a_zero_divisor_raises_zero_division_error_as_eager():
    # Python's % on ints is a size step again (aten::fmod.int); a size that makes its divisor 0
    # raises eager's ZeroDivisionError, never C's SIGFPE
    jf = trident.jit(_modulo, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, length in ((9, 6), (11, 7), (13, 4), (15, 9), (17, 4)):
            x = torch.arange(float(length))
            if length == 4:
                with pytest.raises(ZeroDivisionError):
                    _modulo(x, Counter(n))
                with pytest.raises(ZeroDivisionError):
                    jf(x, Counter(n))
            else:
                _same(jf(x, Counter(n)), _modulo(x, Counter(n)))
    assert jf.stats.fallbacks == 2, jf.stats


def _count(x, c):
    c.n = c.n * 1000003 + 1
    return x + 1


def test_an_attribute_counter_grows_past_int64_as_in_eager():
    # Note [Attribute writes]: the new value is a size step of the old: checked, the first
    # call whose product passes 2**63 runs eagerly, and from then on the Python int (no int64)
    # is an argument the native guards do not read
    jf = trident.jit(_count)
    mine, theirs = Counter(7), Counter(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(6):
            x = torch.ones(2)
            assert torch.equal(jf(x, mine), _count(x, theirs))
            assert type(mine.n) is int and mine.n == theirs.n, (mine.n, theirs.n)
    assert mine.n > 2**63
    s = jf.stats
    assert s.hits + s.fallbacks + s.compiles >= 6 and s.fallbacks >= 2, s


def _branch(x, y):
    if x.shape[0] * y.shape[0] > 100:
        return y * 2
    return y * 3


def test_a_size_guard_past_int64_runs_eagerly():
    # the ShapeEnv's guard s0 * s1 > 100 over an expanded tensor of 2**62 elements: its product
    # passes int64, where the wrapped value (0) would take the other branch
    jf = trident.jit(_branch, dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length, m in ((30, 6), (40, 7), (BIG, 4), (50, 9)):
            x, y = torch.ones(1).expand(length), torch.ones(m)
            assert torch.equal(jf(x, y), _branch(x, y)), (length, m)
    s = jf.stats
    assert (s.compiles, s.fallbacks, s.hits) == (1, 1, 2), s
    said = [str(w.message) for w in caught if "int64 cannot decide" in str(w.message)]
    assert len(said) == 1, said


def test_a_first_call_whose_size_guard_is_past_int64_runs_eagerly():
    # the specialization traced from the call cannot decide its own guard in C: the call runs
    # eagerly (it was an internal error), the next such call too, and a small one hits
    jf = trident.jit(_branch, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for length, m in ((BIG, 4), (BIG, 5), (30, 6)):
            x, y = torch.ones(1).expand(length), torch.ones(m)
            assert torch.equal(jf(x, y), _branch(x, y)), (length, m)
    s = jf.stats
    assert (s.compiles, s.fallbacks, s.hits) == (1, 2, 1), s
