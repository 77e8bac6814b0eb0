"""A CUDA graph replay's copies (runtime/trident_cuda.h), checked on the CPU.

``trt_copy_hides_write`` decides whether a replay may copy its copied-in arguments (one that
overlaps another argument where either may be written would hide the write, and the call then
runs step by step). It sorts and sweeps the arguments' byte ranges; its Python twin here is the
definition, every pair of arguments. The copy kernel itself runs on the GPU machine
(tests/test_cuda_graphs.py, tests/test_unchanged_subtrees.py on CUDA).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trident
from trident import build
from trident.frontend import graphs


@pytest.fixture(scope="module")
def hides(tmp_path_factory):
    cffi = pytest.importorskip("cffi")
    source = """#include <stdint.h>
#include "trident_rt.h"
#include "trident_cuda.h"
int hides(const int64_t* in, int n, const uint64_t* pointers) {
  trt_arg a[600] = {{0}};
  for (int i = 0; i < n; ++i) a[i].data_ptr = (void*)(uintptr_t)pointers[i];
  return trt_copy_hides_write(in, n, a);
}
"""
    ffi = cffi.FFI()
    ffi.cdef("int hides(const int64_t* in, int n, const uint64_t* pointers);")
    ffi.set_source("graph_copies", source, include_dirs=[
        str(Path(trident.__file__).parent / "runtime"), build._cuda_include()])
    built = ffi.compile(tmpdir=str(tmp_path_factory.mktemp("graph-copies")))
    spec = importlib.util.spec_from_file_location("graph_copies", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda *args: module.lib.hides(*args), ffi


def _twin(arguments) -> bool:
    """Some copied-in argument overlaps another, and one of the two may be written."""
    for i, (p, span, copied, written) in enumerate(arguments):
        for j, (q, span2, _, written2) in enumerate(arguments):
            if copied and i != j and (written or written2) and span > 0 and span2 > 0 and \
                    p < q + span2 and q < p + span:
                return True
    return False


ARGUMENT = st.tuples(st.integers(0, 64).map(lambda k: 4096 + 16 * k),
                     st.sampled_from([0, 1, 16, 17, 48, 64, 1000]), st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(ARGUMENT, min_size=1, max_size=40) | st.lists(ARGUMENT, min_size=100,
                                                              max_size=150))
def test_the_sweep_agrees_with_every_pair(hides, arguments):
    run, ffi = hides
    words = []
    for i, (_, span, copied, written) in enumerate(arguments):
        words += [i, graphs.COPY_IN if copied else graphs.BY_POINTER, 0, span, int(written)]
    pointers = ffi.new("uint64_t[]", [p for p, *_ in arguments])
    assert bool(run(ffi.new("int64_t[]", words), len(arguments), pointers)) == _twin(arguments)
