"""A CUDA graph replay's copies (runtime/trident_cuda.h), checked on the CPU.

``trt_copy_hides_write`` decides whether a replay may copy its copied-in arguments (one that
overlaps another argument where either may be written would hide the write, and the call then
runs step by step). It sorts and sweeps the arguments' byte ranges; its Python twin here is the
definition, every pair of arguments. The copy kernel itself runs on the GPU machine
(tests/test_cuda_graphs.py, tests/test_unchanged_subtrees.py on CUDA).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _trident_helpers import c_module
from trident.frontend import graphs


@pytest.fixture(scope="module")
def hides(tmp_path_factory):
    pytest.importorskip("cffi")
    source = """#include <stdint.h>
#include "trident_rt.h"
#include "trident_cuda.h"
int hides(const int64_t* in, int n, const uint64_t* pointers) {
  trt_arg a[600] = {{0}};
  for (int i = 0; i < n; ++i) a[i].data_ptr = (void*)(uintptr_t)pointers[i];
  return trt_copy_hides_write(in, n, a);
}
static trt_graph slot;
/* the remembered check of one slot, over a sequence of calls; `fresh`: a new slot first */
int slot_hides(const int64_t* in, int n, const uint64_t* pointers, int fresh) {
  if (fresh) {
    free(slot.checked);
    memset(&slot, 0, sizeof slot);
  }
  trt_arg a[600] = {{0}};
  for (int i = 0; i < n; ++i) a[i].data_ptr = (void*)(uintptr_t)pointers[i];
  return trt_graph_hides_write(&slot, in, in, n, a);
}
"""
    ffi, lib = c_module(tmp_path_factory.mktemp("graph-copies"), "graph_copies",
                        "int hides(const int64_t* in, int n, const uint64_t* pointers);"
                        "int slot_hides(const int64_t* in, int n, const uint64_t* pointers, "
                        "int fresh);", source, cuda=True)
    return lambda *args: lib.hides(*args), ffi, lib.slot_hides


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """A cffi module over runtime/trident_cuda.h's graph keys: ``check(key, nkey, kinds,
    values, n)`` builds records of ints (kind 2, value) and 1-dim tensors (kind 1, size value,
    stride 1) and returns fits * 4 + (call hash == key hash) * 2 + 1."""
    pytest.importorskip("cffi")
    source = """#include <stdint.h>
#include "trident_rt.h"
#include "trident_cuda.h"
int check(const int64_t* key, int64_t nkey, const int* kinds, const int64_t* values, int n) {
  trt_arg a[16];
  static int64_t one = 1;
  memset(a, 0, sizeof a);
  for (int i = 0; i < n; ++i) {
    a[i].kind = (int8_t)kinds[i];
    if (kinds[i] == TRT_ARG_INT) a[i].i = values[i];
    if (kinds[i] == TRT_ARG_TENSOR) {
      a[i].dim = 1;
      a[i].sizes = &values[i];
      a[i].strides = &one;
    }
  }
  int same = trt_graph_call_hash(a, n) == trt_graph_key_hash(key, nkey);
  return trt_graph_fits(key, nkey, a) * 4 + same * 2 + 1;
}
"""
    ffi, lib = c_module(tmp_path_factory.mktemp("graph-keys"), "graph_keys",
                        "int check(const int64_t* key, int64_t nkey, const int* kinds, "
                        "const int64_t* values, int n);", source, cuda=True)
    return lib, ffi


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(0, 3)), min_size=1,
                max_size=6), st.data())
def test_an_int_arguments_value_is_part_of_the_graph_key(keys, arguments, data):
    """Note [Graphs per size]: the key of a graph (frontend/graphs.size_key, as _key_words
    packs it: an int as index, -1, value) fits a call exactly when every tensor's geometry and
    every keyed int's value is the call's, and hashes as the call does exactly when the
    tensors' geometry is (the hash, which picks among graphs and remembers new sizes, skips the
    ints). Kinds: 1 a tensor, 2 an int in the key, 4 a bool (guarded by value: not in it)."""
    lib, ffi = keys
    # the graph's arguments: (kind, value); the call's: the same kinds, values perhaps other
    called = [(k, data.draw(st.sampled_from([v, v, v + 1]))) for k, v in arguments]
    key = [w for i, (k, v) in enumerate(arguments) if k in (1, 2)
           for w in ((i, 1, v, 1, 0) if k == 1 else (i, -1, v))]
    got = lib.check(ffi.new("int64_t[]", key or [0]), len(key),
                    ffi.new("int[]", [k for k, _ in called]),
                    ffi.new("int64_t[]", [v for _, v in called]), len(called))
    same = [v == w for (k, v), (_, w) in zip(arguments, called) if k in (1, 2)]
    tensors = [v == w for (k, v), (_, w) in zip(arguments, called) if k == 1]
    assert got == 1 + 4 * all(same) + 2 * all(tensors), (arguments, called)


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
    run, ffi, _ = hides
    words = []
    for i, (_, span, copied, written) in enumerate(arguments):
        words += [i, graphs.COPY_IN if copied else graphs.BY_POINTER, 0, span, int(written)]
    pointers = ffi.new("uint64_t[]", [p for p, *_ in arguments])
    assert bool(run(ffi.new("int64_t[]", words), len(arguments), pointers)) == _twin(arguments)


def _words(arguments) -> list:
    words = []
    for i, (_, span, copied, written) in enumerate(arguments):
        words += [i, graphs.COPY_IN if copied else graphs.BY_POINTER, 0, span, int(written)]
    return words


# spread out: most calls overlap nowhere, where the slot checks only what moved
SPREAD = st.tuples(st.integers(0, 3000).map(lambda k: 4096 + 32 * k),
                   st.sampled_from([0, 1, 16, 17, 48, 64]), st.booleans(), st.booleans())
MOVES = st.lists(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 3000)), max_size=12),
                 min_size=1, max_size=8)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(SPREAD, min_size=1, max_size=40) | st.lists(SPREAD, min_size=60, max_size=80),
       MOVES)
def test_the_remembered_check_agrees_over_calls(hides, arguments, moves):
    """A slot's check over a sequence of calls, each moving some copied-in arguments (a decode
    step's new token tensor; a new cache; many at once, past TRT_GRAPH_MOVED; back where they
    were): the same answer as every pair at every call. By-pointer arguments stay put (a
    replay checks them first)."""
    _, ffi, slot_hides = hides
    words = ffi.new("int64_t[]", _words(arguments))
    copied = [i for i, (_, _, c, _) in enumerate(arguments) if c]
    for call, moved in enumerate([[]] + moves):
        for which, k in moved:
            if copied:
                i = copied[which % len(copied)]
                arguments[i] = (4096 + 32 * k,) + arguments[i][1:]
        pointers = ffi.new("uint64_t[]", [p for p, *_ in arguments])
        assert bool(slot_hides(words, len(arguments), pointers, call == 0)) == _twin(arguments)
