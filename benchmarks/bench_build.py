"""``python3 -m benchmarks.bench_build [N]``: what the Nth compile of one function costs.

One small function (matmul, add, relu, mul, sub, softmax, sum: 7 ATen steps) is called with N
shapes in turn (``dynamic=False``, ``max_specializations=N``), so each call compiles one more
specialization. For each compile it prints the time of installing the new set of
specializations (``_install_module``: render the C, build it with cffi, load and install it)
and the whole miss (trace, Torch-MLIR, plan, install). Before Note [Incremental modules] (in
trident/build.py), a miss rebuilt one module of all the function's specializations, so the
install grew with their number; now it builds the new specialization's module only.

The function cache is a fresh temporary folder (the native runtime is taken from
``TRIDENT_CACHE_DIR``'s, or built there once). The script imports only ``trident``, so it also
times an older checkout: ``PYTHONPATH=/old/checkout python3 benchmarks/bench_build.py 50``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch


def step(x, w):
    h = torch.relu(x @ w + 1)
    return torch.softmax(h * 2 - x, -1).sum(0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 50
    import trident
    from trident import config

    jit = importlib.import_module("trident.frontend.jit")

    runtime = config.cache_dir() / "runtime"
    trident.jit(step)  # the native runtime, built once into TRIDENT_CACHE_DIR
    root = Path(tempfile.mkdtemp(prefix="trident-bench-build-"))
    (root / "runtime").symlink_to(runtime)
    os.environ["TRIDENT_CACHE_DIR"] = str(root)

    installs: list[float] = []
    install = jit.JitFunctionMixin._install_module

    def timed_install(self, specs):  # instrumentation: the install's wall time
        start = time.perf_counter()
        try:
            return install(self, specs)
        finally:
            installs.append(time.perf_counter() - start)

    jit.JitFunctionMixin._install_module = timed_install
    f = trident.jit(step, dynamic=False, max_specializations=n)
    w = torch.randn(16, 16)
    rows = []
    for k in range(n):
        x = torch.randn(k + 1, 16)
        start = time.perf_counter()
        out = f(x, w)
        miss = time.perf_counter() - start
        assert torch.equal(out, step(x, w)), "not equal to eager"
        rows.append({"compile": k + 1, "install_s": installs[-1], "miss_s": miss})
        print(f"compile {k + 1:3d}: install {installs[-1]:6.2f} s, whole miss {miss:6.2f} s",
              flush=True)
    assert f.stats.compiles == n and f.stats.fallbacks == 0, f.stats
    files = sorted(p.name for p in next((root / "functions").iterdir()).iterdir())
    print(f"\n{len(files)} entries in the function's cache folder")
    print(json.dumps({"trident": trident.__file__, "torch": torch.__version__, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
