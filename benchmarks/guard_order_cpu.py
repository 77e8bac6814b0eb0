"""Note [Guard order]: a hit whose tree is not the first installed module's, on the CPU.

``python3 -m benchmarks.guard_order_cpu [--tensors N] [--rounds R]``: a function of a dict of N
tensors, called with the dict in two key orders (two argument trees of as many leaves, so two
modules), then a hit of the second tree: ``Dispatcher._hit_profile``'s parts (thread CPU time,
µs per call, the fastest of R rounds of 200). The dispatcher tries its modules in order, so the
first module's guards run before the second's: they fail at the tree key, which Note [Guard
order] checks right after the argument count (before, last: after every other check).
"""

from __future__ import annotations

import argparse

import torch


def main(argv=None) -> dict:
    import trident

    p = argparse.ArgumentParser()
    p.add_argument("--tensors", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def f(d):
            return torch.stack(list(d.values())).sum(0)

        names = [f"k{i}" for i in range(a.tensors)]
        first = {k: torch.ones(4, 4) for k in names}
        second = {k: first[k] for k in reversed(names)}
        jf = trident.jit(f)
        for _ in range(2):
            jf(first)
            jf(second)
        best: dict = {}
        for _ in range(a.rounds):
            for k, v in jf._hit_profile((second,), None, 200, True).items():
                best[k] = min(best.get(k, v), v)
    finally:
        torch.set_num_threads(threads)
    print(f"  {jf.stats}".split(", miss_reasons")[0])
    for k in ("argument tree", "environment and leaves", "guards"):
        print(f"  {k:24s} {best[k]:8.2f}")
    return best


if __name__ == "__main__":
    main()
