"""Trident's demo and benchmarks, outside the ``trident`` package: not installed with it, and not
part of the key of cached functions (``cache.keyed_sources``), so editing a benchmark keeps every
cache entry. Run from the repository root (``python3 -m benchmarks.bench_hf``), or through the
package's thin entries ``python3 -m trident.demo`` and ``python3 -m trident.bench cpu|gpu``
(docs/benchmarks.md)."""
