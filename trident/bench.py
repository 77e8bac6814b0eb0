"""``python3 -m trident.bench cpu|gpu``: runs ``benchmarks/bench.py`` of Trident's source checkout
(the benchmarks live outside the package: ``benchmarks/__init__.py`` says why)."""

from __future__ import annotations

from trident.demo import run_from_checkout

if __name__ == "__main__":
    run_from_checkout("bench")
