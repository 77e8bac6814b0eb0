"""``python3 -m benchmarks.bench_guards``: what each kind of state guard costs per call, in C.

Note [State guards] (trident/lower/state/) checks what a function read outside its arguments
before every call. This micro-benchmark installs state trees of ``--reads`` reads of one kind
each on a dispatcher and times ``_state_failure()``, which runs the same C (``state_holds``)
as the hit path; a kind's cost is (time with its tree - time with no tree) / reads, the fastest
of ``--repeats`` loops (timeit's advice: the others measure the machine's other work). The
call-wide flags (``trt_env.flags``) are timed as ``global_flags()`` against another C function
of no work. Numbers are ns per read per call.
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit
import types

import torch

from trident import runtime
from trident.lower import state
from trident.frontend.jit import jit


def _trees(n: int) -> dict[str, tuple[str, list[state.Read]]]:
    """Per kind: (what it guards, its reads) over a synthetic user module ``mod``."""
    mod = types.ModuleType("trident_bench_guards_state")
    mod.__file__ = os.path.join(os.getcwd(), "trident_bench_guards_state.py")  # user code
    sys.modules[mod.__name__] = mod
    root = ("module", mod.__name__)
    knobs = type("Knobs", (), {})
    mod.Knobs = knobs
    mod.ITEMS = [float(i) for i in range(n)]
    mod.TABLE = {f"k{i}": float(i) for i in range(n)}
    held_base = type("HeldBase", (), {"K": 1.0, "__module__": mod.__name__})
    mod.HeldBase = held_base
    for i in range(n):
        setattr(mod, f"H{i}", type(f"H{i}", (held_base,), {"J": float(i),
                                                            "__module__": mod.__name__}))
        setattr(mod, f"f{i}", types.FunctionType((lambda: None).__code__, {}))
        setattr(mod, f"c{i}", float(i))
        setattr(mod, f"t{i}", torch.zeros(1))
        setattr(knobs, f"a{i}", float(i))
        os.environ.setdefault(f"TRIDENT_BENCH_{i}", "1")

    def reads(steps):
        return [state.Read(root, s) for s in steps]

    return {
        "ID": ("a global function, by identity (ID_MATCH)",
               reads([(("attr", f"f{i}"),) for i in range(n)])),
        "CONST": ("a global float, by value (EQUALS_MATCH, bit pattern)",
                  reads([(("attr", f"c{i}"),) for i in range(n)])),
        "class attribute": ("Knobs.a: getattr on a class, by value",
                            reads([(("attr", "Knobs"), ("attr", f"a{i}")) for i in range(n)])),
        "list item": ("ITEMS[i]: a list item through a global, by value",
                      reads([(("attr", "ITEMS"), ("item", i)) for i in range(n)])),
        "dict item": ("TABLE['k']: a dict item through a global, by value",
                      reads([(("attr", "TABLE"), ("item", f"k{i}")) for i in range(n)])),
        "TENSOR": ("a global tensor: identity and version counter",
                   reads([(("attr", f"t{i}"),) for i in range(n)])),
        "ABSENT": ("an unbound name (a global that would shadow a builtin)",
                   reads([(("attr", f"missing{i}"),) for i in range(n)])),
        "held class": ("a user class whose instance an argument tree holds, used whole: its "
                       "two numbers (one its base's) and its and its base's names (Note "
                       "[Classes of held objects]); per class",
                       [state.Read(root, (("attr", f"H{i}"),), True) for i in range(n)]),
        "environ": ("os.environ.get('X'): an item of os.environ",
                    [state.Read(("module", "os"),
                                (("attr", "environ"), ("get", f"TRIDENT_BENCH_{i}")))
                     for i in range(n)]),
    }


def _time(fn, number: int, repeats: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args(argv)
    d = jit(lambda x: x)
    rt = runtime.load()
    base = _time(d._state_failure, opts.number, opts.repeats)
    print(f"state guards, ns per read per call (fastest of {opts.repeats} x {opts.number} calls, "
          f"{opts.reads} reads per tree; empty tree: {base:.1f} ns per call)")
    for kind, (what, reads) in _trees(opts.reads).items():
        tree = state.build(reads, None)
        d._set_state(tree.program())
        assert d._state_failure() == -1, kind
        t = _time(d._state_failure, opts.number, opts.repeats)
        print(f"  {kind:16s} {(t - base) / opts.reads:6.1f}  {len(tree.nodes) - 1:5d} nodes  "
              f"{what}")
    d._set_state(None)
    flags = _time(rt.global_flags, opts.number * 10, opts.repeats)
    noop = _time(rt.api_address, opts.number * 10, opts.repeats)
    threads = _time(torch.get_num_threads, opts.number * 10, opts.repeats)
    print(f"  {'flags':16s} {flags - noop:6.1f}  torch's global flags, read once per call "
          f"(global_flags() {flags:.1f} ns against a no-op C call {noop:.1f} ns; "
          f"torch.get_num_threads() from Python {threads:.1f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
