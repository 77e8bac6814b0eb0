"""Faults the adversarial pass of session 39 found, each with a test of its whole kind; every
call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from torch import nn

import trident
from _trident_helpers import counts, run_python


# ---- Note [Fake CUDA guard] (lower/capture.py) ------------------------------------------------
# On a CUDA build of torch without a device (torch 2.11+cu130 on a CPU host), a compile in a
# thread after another thread's compile, once that thread had exited, crashed the process
# (c10's registry held the exited thread's no-op CUDA guard).

THREADS = """
import threading, torch, trident

def f(x, k):
    return torch.relu(x) * k + x.sum()

jf = trident.jit(f)
ok = []

def compile_in_a_thread(n):
    x = torch.randn(n, 3)
    ok.append(torch.equal(jf(x, 2.0), f(x, 2.0)) and torch.equal(jf(x, 2.0), f(x, 2.0)))

for n in (2, 3, 4):  # each thread exits before the next one compiles
    t = threading.Thread(target=compile_in_a_thread, args=(n,))
    t.start()
    t.join()
x = torch.randn(5, 3)
ok.append(torch.equal(jf(x, 2.0), f(x, 2.0)))  # and the main thread after them
s = jf.stats
print(ok, s.compiles, s.hits, s.fallbacks)
"""


def test_compiles_in_threads_that_exit_one_after_another(subprocess_env):
    """A child process (a crash fails the test, not the session): three threads, one at a
    time, each compiling a shape of its own and hitting it, then the main thread."""
    out = run_python(subprocess_env, "-c", THREADS).stdout.strip().splitlines()[-1]
    # 2 then 3 rows compile; 4 and 5 rows are the symbolic specialization's hits
    assert out == "[True, True, True, True] 2 5 0", out


class Gate(nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.k = k
        self.tags = set()

    def forward(self, x):
        y = self.lin(x) * self.k
        return -y if "neg" in self.tags else y


def call(m, x):
    return m(x)


def test_threads_calling_one_function_with_modules_they_change():
    """Threads share one jitted function; each owns a module and changes it between calls (a
    set edited in place, an attribute rebound), as a server's workers might. Every call equals
    eager's, none falls back, and each state compiles at most once."""
    torch.manual_seed(0)
    jf = trident.jit(call, max_specializations=64)
    failures: list = []

    def worker(i: int):
        m = Gate(float(i)).eval()
        x = torch.randn(2 + i % 2, 8)
        try:
            for n in range(60):
                if n % 20 == 10:
                    m.tags.symmetric_difference_update({"neg"})
                if n == 30:
                    m.k += 1
                with torch.no_grad():
                    if not torch.equal(jf(m, x), call(m, x)):
                        failures.append((i, n))
        except Exception as e:  # a crash of a thread fails the test, not silently
            failures.append((i, repr(e)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    compiles, hits, fallbacks = counts(jf)
    # 4 states (k, the set) per thread, threads of one row count share no k; every call a hit
    # or a miss (a miss may install what another thread compiled meanwhile: neither a compile
    # nor a hit, as the rows become symbolic and thread 0's k reaches thread 1's)
    assert (fallbacks, jf.stats.misses + hits) == (0, 240) and compiles <= 16, \
        jf.stats.miss_reasons


@pytest.mark.skipif(sys.version_info[:2] != (3, 12), reason="the dict watchers of Python 3.12")
def test_the_quiet_pass_of_a_thread_sees_another_threads_change():
    """One thread calls until its module's tree is quiet; another changes the module (a set
    edited in place, no dict event); the first thread's next calls equal eager's."""
    torch.manual_seed(0)
    m, x = Gate(2.0).eval(), torch.randn(2, 8)
    jf = trident.jit(call)
    with torch.no_grad():
        for _ in range(4):
            assert torch.equal(jf(m, x), call(m, x))
        assert jf.tree_passes()["m"][0] >= 1, jf.tree_passes()
        t = threading.Thread(target=m.tags.add, args=("neg",))
        t.start()
        t.join()
        for _ in range(3):
            assert torch.equal(jf(m, x), call(m, x))
    assert counts(jf) == (2, 5, 0), jf.stats.miss_reasons


# ---- Note [Partials in arguments] (lower/partials.py) ----------------------------------------
# A module holding a functools.partial (transformers' GELUTanh.act: every Gemma, every model of
# ``gelu_pytorch_tanh``) had its specializations kept in its process only: the partial was
# checked by identity, so each new process compiled the model again (issue 27). Its function
# is now named by its path, its arguments and keywords checked as values
# (tests/test_partials_in_trees.py).

PARTIAL = """
import functools, torch, trident
import torch.nn.functional as F
from torch import nn

class Act(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = functools.partial(F.gelu, approximate="tanh")

    def forward(self, x):
        return self.act(self.lin(x))

def f(m, x):
    return m(x)

torch.manual_seed(0)
m, x = Act().eval(), torch.randn(2, 4)
jf = trident.jit(f)
with torch.no_grad():
    ok = all(torch.equal(jf(m, x), f(m, x)) for _ in range(2))
print(ok, jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks)
"""


def test_a_partial_in_a_module_is_served_from_the_cache_in_a_new_process(subprocess_env):
    first = run_python(subprocess_env, "-c", PARTIAL).stdout.strip().splitlines()[-1]
    assert first == "True 1 1 0", first
    second = run_python(subprocess_env, "-c", PARTIAL).stdout.strip().splitlines()[-1]
    assert second == "True 0 2 0", second
