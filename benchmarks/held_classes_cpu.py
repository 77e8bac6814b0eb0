"""A hit over user classes, on the CPU (issue 28, Note [Classes of held objects]).

``python3 -m benchmarks.held_classes_cpu head:24 gains:24 forward:24``: a user ``nn.Module``
of N blocks of two user classes (``Block``, and ``Wide``, its subclass, each with a class
attribute ``SCALE``), one thread; per case, µs per call in the thread's CPU time (the machine
is shared: the wall clock counts other processes), the fastest of 7 rounds of 2000 calls, for
``trident.jit`` and eager:

- ``head``: ``F.linear(x, m.blocks[0].lin.weight) * m.blocks[0].SCALE`` (the tree holds one
  block);
- ``gains``: ``x * sum(map(operator.attrgetter("SCALE"), m.blocks))`` (the tree holds every
  block; their classes' ``SCALE`` is read in C, by no chain);
- ``forward``: ``m(x)``.
"""

from __future__ import annotations

import operator
import sys
import time

import torch


class Block(torch.nn.Module):
    SCALE = 0.5

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) * self.SCALE


class Wide(Block):
    SCALE = 0.25


class Net(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() if i % 2 else Wide() for i in range(n)])
        self.requires_grad_(False)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def head(m, x):
    return torch.nn.functional.linear(x, m.blocks[0].lin.weight) * m.blocks[0].SCALE


def gains(m, x):
    return x * sum(map(operator.attrgetter("SCALE"), m.blocks))


def forward(m, x):
    return m(x)


def _time(f, *args, n: int = 2000, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for _ in range(n):
            f(*args)
        best = min(best, (time.thread_time() - t) / n)
    return best * 1e6


def main(argv: list[str]) -> None:
    import trident

    torch.set_num_threads(1)
    for case in argv or ["head:24", "gains:24", "forward:24"]:
        kind, layers = case.split(":")
        m, x = Net(int(layers)), torch.randn(2, 8)
        fn = {"head": head, "gains": gains, "forward": forward}[kind]
        jf = trident.jit(fn)
        for _ in range(3):
            assert torch.equal(jf(m, x), fn(m, x))
        s = jf.stats
        print(f"{case:12s} trident {_time(jf, m, x):8.2f} µs  eager {_time(fn, m, x):8.2f} µs  "
              f"(compiles, hits, fallbacks) {s.compiles, s.hits, s.fallbacks}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
