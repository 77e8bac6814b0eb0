"""``python3 -m trident.demo``: runs the demo, ``benchmarks/demo.py`` of Trident's source checkout
(the benchmarks live outside the package: ``benchmarks/__init__.py`` says why)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def run_from_checkout(module: str) -> None:
    """Run ``benchmarks.<module>`` as ``__main__`` from the checkout this package lives in.

    Raises:
        SystemExit: Trident is installed without its source checkout (not ``pip install -e``).
    """
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / f"{module}.py").is_file():
        raise SystemExit(f"trident.{module}: benchmarks/{module}.py is part of Trident's source "
                         f"checkout, not of the installed package (found none beside {root})")
    sys.path.insert(0, str(root))
    runpy.run_module(f"benchmarks.{module}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_from_checkout("demo")
