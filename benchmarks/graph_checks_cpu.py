"""A CUDA graph replay's overlap check (``trt_graph_hides_write``, runtime/trident_cuda.h) timed on
the CPU (issue 25).

``python3 -m benchmarks.graph_checks_cpu``. Before a replay copies its copied-in arguments into
the graph's buffers, it checks that none overlaps another argument where either may be written.
A decode step of a Hugging Face forward replays with the weights read by pointer and the static
cache's tensors (keys, values, cumulative length per layer) and the new token's ids copied in;
the token's tensor is at a new address at each step. Per call, ns, the median of 9 rounds of
2,000 calls, for the argument counts of a Llama-3.2-1B-like (147 weights by pointer, 48 cache
tensors and the ids copied in) and a Qwen2.5-0.5B-like decode step (290 and 72 + 1):

- ``whole``: the sort and sweep of every argument's range (``trt_copy_hides_write``), what each
  replay ran when the copied-in addresses differed from the last call's, or when there were more
  than 64 copied-in arguments (before commit d37143a);
- ``moved``: the slot's check when the ids moved since the last call;
- ``same``: the slot's check when nothing moved.

Built with the SCMs' flags (``build.CFLAGS``: -O0; Note [Optimized guards] in trident_rt.h).
"""

from __future__ import annotations

import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

SOURCE = """#include <stdint.h>
#include <time.h>
#include "trident_rt.h"
#include "trident_cuda.h"
static trt_graph slot;
static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
/* ns per call of `calls` checks; mode 0: whole, 1: the slot's with argument `moving` moving
 * between two addresses, 2: the slot's with nothing moving */
double time_check(const int64_t* in, int n, const uint64_t* pointers, int mode, int moving,
                  int calls) {
  static trt_arg a[4096];
  for (int i = 0; i < n; ++i) a[i].data_ptr = (void*)(uintptr_t)pointers[i];
  free(slot.checked);
  memset(&slot, 0, sizeof slot);
  int hidden = 0;
  hidden += trt_graph_hides_write(&slot, in, in, n, a);
  int64_t start = now_ns();
  for (int c = 0; c < calls; ++c) {
    if (mode == 1) a[moving].data_ptr = (void*)((uintptr_t)pointers[moving] + (c & 1) * 4096);
    hidden += mode == 0 ? trt_copy_hides_write(in, n, a) : trt_graph_hides_write(&slot, in, in, n, a);
  }
  double ns = (double)(now_ns() - start) / calls;
  return hidden ? -ns : ns;
}
"""


def _module():
    import cffi

    import trident
    from trident import build

    ffi = cffi.FFI()
    ffi.cdef("double time_check(const int64_t* in, int n, const uint64_t* pointers, int mode, "
             "int moving, int calls);")
    ffi.set_source("graph_checks", SOURCE, include_dirs=[
        str(Path(trident.__file__).parent / "runtime"), build._cuda_include()],
        extra_compile_args=list(build.CFLAGS))  # as an SCM is built
    built = ffi.compile(tmpdir=tempfile.mkdtemp(prefix="graph-checks-"))
    spec = importlib.util.spec_from_file_location("graph_checks", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return ffi, module.lib


def main() -> dict:
    from trident.frontend import graphs

    ffi, lib = _module()
    rows = {}
    for name, weights, copied in (("llama-3.2-1b-like", 147, 48), ("qwen2.5-0.5b-like", 290, 72)):
        words, pointers, address = [], [], 1 << 32
        for i in range(weights + copied + 1):  # weights, cache tensors (written), the ids
            by_pointer = i < weights
            size = 4096 if i < weights + copied else 8
            words += [i, graphs.BY_POINTER if by_pointer else graphs.COPY_IN, 0, size,
                      int(weights <= i < weights + copied)]
            pointers.append(address)
            address += size + 8192
        n = len(pointers)
        cw, cp = ffi.new("int64_t[]", words), ffi.new("uint64_t[]", pointers)
        row = {}
        for mode, label in ((0, "whole"), (1, "moved"), (2, "same")):
            times = [lib.time_check(cw, n, cp, mode, n - 1, 2000) for _ in range(9)]
            assert all(t > 0 for t in times)  # no overlap: the replay goes ahead
            row[label] = round(statistics.median(times), 1)
        rows[f"{name} ({n} arguments, {copied + 1} copied in)"] = row
    for k, v in rows.items():
        print(f"{k}: ns per check {v}")
    return rows


if __name__ == "__main__":
    start = time.perf_counter()
    main()
