"""Note [Copies out in the batch] (runtime/trident_cuda.h), checked on the CPU: which copies a
replay issues, in which launch, for a graph that copies its output out.

The replay's host logic (``trt_graph_replay``) runs here over a driver stand-in that records
each call it receives (the copy kernel's launches with their tables, ``cuMemcpyAsync``,
``cuGraphLaunch``) and a runtime stand-in that hands out fake tensors: no CUDA here. The copies
themselves run on the GPU machine (tests/test_cuda_graphs.py: every copied-out replay compared
with eager).
"""

from __future__ import annotations

import pytest

from _trident_helpers import c_module

SOURCE = r"""#include <stdint.h>
#include "trident_rt.h"
#include "trident_cuda.h"

/* events: kind (1 copy launch, 2 memcpy, 3 graph launch), then for 1 the entries' count and
   (dst, src, bytes) each, for 2 (dst, src, bytes) */
static int64_t log_[4096];
static int nlog, fail_alloc, released;
static void put(int64_t w) { if (nlog < 4096) log_[nlog++] = w; }

static CUresult ctx_get_current(CUcontext* c) { *c = (CUcontext)1; return CUDA_SUCCESS; }
static CUresult ctx_get_device(CUdevice* d) { *d = 0; return CUDA_SUCCESS; }
static CUresult launch(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  (void)config; (void)f; (void)extra;
  const trt_copy* table = (const trt_copy*)params[0];
  uint32_t n = *(const uint32_t*)params[1];
  put(1);
  put(n);
  for (uint32_t i = 0; i < n; ++i) { put((int64_t)table[i].dst); put((int64_t)table[i].src);
                                      put((int64_t)table[i].bytes); }
  return CUDA_SUCCESS;
}
static CUresult memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  (void)s;
  put(2); put((int64_t)dst); put((int64_t)src); put((int64_t)bytes);
  return CUDA_SUCCESS;
}
static CUresult graph_launch(CUgraphExec e, CUstream s) { (void)e; (void)s; put(3); return CUDA_SUCCESS; }

/* a fake tensor: its data address */
typedef struct fake { int64_t data; } fake;
static int64_t next_data = 0x700000;
static int cuda_stream(int32_t d, void** s) { (void)d; *s = (void*)0x10; return 0; }
static trt_tensor* empty_strided(int32_t dim, const int64_t* sizes, const int64_t* strides,
                                 int32_t dtype, int32_t device) {
  (void)dim; (void)sizes; (void)strides; (void)dtype; (void)device;
  if (fail_alloc) return NULL;
  fake* t = (fake*)malloc(sizeof(fake));
  t->data = next_data;
  next_data += 0x100000;
  return (trt_tensor*)t;
}
static int data_ptr(trt_tensor* t, void** out) { *out = (void*)(uintptr_t)((fake*)t)->data; return 0; }
static void release(trt_tensor* t) { ++released; free(t); }
static int output_in_use(const void* held) { (void)held; return 0; }
static trt_replay_clock clock_;

/* One replay of a static graph: `nin` inputs (arg, mode, pointer, bytes, written: 5 words
   each) over records whose data pointers are `pointers`, then one tensor output of `out_bytes`
   bytes at 0x900000, copied out. Returns the replay's answer; the events are in `events`. */
int replay(const int64_t* inputs, int nin, const uint64_t* pointers, int64_t out_bytes,
           int fail, int64_t* events, int* nevents, int* nreleased) {
  trt_cu.loaded = 1;
  trt_cu.ctx_get_current = ctx_get_current;
  trt_cu.ctx_get_device = ctx_get_device;
  trt_cu.launch_kernel_ex = launch;
  trt_cu.memcpy_async = memcpy_async;
  trt_cu.graph_launch = graph_launch;
  trt_copy_state[0] = 1;  /* the copy kernel is loaded */
  trt_api rt;
  memset(&rt, 0, sizeof rt);
  rt.cuda_stream = cuda_stream;
  rt.empty_strided = empty_strided;
  rt.data_ptr = data_ptr;
  rt.release = release;
  rt.output_in_use = output_in_use;
  rt.replay_clock = &clock_;
  int64_t desc[5 + 5 * 64 + 8];
  int w = 0;
  desc[w++] = 1; desc[w++] = 0; desc[w++] = nin; desc[w++] = 1; desc[w++] = 0;
  for (int i = 0; i < 5 * nin; ++i) desc[w++] = inputs[i];
  desc[w++] = TRT_TENSOR; desc[w++] = 0x900000; desc[w++] = out_bytes; desc[w++] = 0;
  desc[w++] = 6; desc[w++] = 1; desc[w++] = out_bytes / 4; desc[w++] = 1;
  int64_t* descs[1] = {desc};
  uint64_t hashes[1] = {0};
  trt_graph g;
  memset(&g, 0, sizeof g);
  g.state = TRT_GRAPH_READY;
  g.ndescs = 1;
  g.descs = descs;
  g.hashes = hashes;
  trt_arg a[64];
  memset(a, 0, sizeof a);
  for (int i = 0; i < nin; ++i) { a[i].kind = TRT_ARG_TENSOR; a[i].data_ptr = (void*)(uintptr_t)pointers[i]; }
  static trt_result result;
  nlog = 0; released = 0; fail_alloc = fail;
  int rc = trt_graph_replay(&g, a, nin, &rt, &result);
  if (rc == TRT_GRAPH_REPLAYED)
    for (int k = 0; k < result.nouts; ++k)
      if (result.outs[k].tag == TRT_TENSOR) release(result.outs[k].u.t);
  free(g.checked);
  memcpy(events, log_, sizeof(int64_t) * (size_t)nlog);
  *nevents = nlog;
  *nreleased = released;
  return rc;
}
"""

CDEF = ("int replay(const int64_t* inputs, int nin, const uint64_t* pointers, int64_t out_bytes,"
        " int fail, int64_t* events, int* nevents, int* nreleased);")
REPLAYED, FAILED = 1, 3
COPY_IN, BY_POINTER = 1, 0


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    pytest.importorskip("cffi")
    ffi, lib = c_module(tmp_path_factory.mktemp("graph-outputs"), "graph_outputs", CDEF, SOURCE,
                        cuda=True)

    def run(inputs, pointers, out_bytes, fail=0):
        words = [w for x in inputs for w in x]
        events, n, released = ffi.new("int64_t[4096]"), ffi.new("int*"), ffi.new("int*")
        rc = lib.replay(words, len(inputs), pointers, out_bytes, fail, events, n, released)
        return rc, _parse(list(events[0:n[0]])), released[0]

    return run


def _parse(words):
    out, i = [], 0
    while i < len(words):
        if words[i] == 1:
            n = words[i + 1]
            out.append(("launch", [tuple(words[i + 2 + 3 * k:i + 5 + 3 * k]) for k in range(n)]))
            i += 2 + 3 * n
        elif words[i] == 2:
            out.append(("memcpy", tuple(words[i + 1:i + 4])))
            i += 4
        else:
            out.append(("graph",))
            i += 1
    return out


# three copied-in arguments the function writes (a layer's keys, values and length), one read
# by pointer (a weight): their graph buffers at 0x1000 + 0x100 i, the caller's at 0x100000 + ...
INPUTS = [(0, COPY_IN, 0x1000, 64, 1), (1, COPY_IN, 0x1100, 64, 1), (2, COPY_IN, 0x1200, 16, 1),
          (3, BY_POINTER, 0x5000, 256, 0)]
POINTERS = [0x100000, 0x200000, 0x300000, 0x5000]
IN = [(0x1000, 0x100000, 64), (0x1100, 0x200000, 64), (0x1200, 0x300000, 16)]
BACK = [(d, s, b) for s, d, b in IN]


def test_an_output_copied_out_joins_the_copy_back_launch(replay):
    rc, events, released = replay(INPUTS, POINTERS, 1024)
    assert rc == REPLAYED and released == 1
    # the output's copy (its new tensor's memory, from the static output) is the back table's
    assert events == [("launch", IN), ("graph",), ("launch", BACK + [(0x700000, 0x900000, 1024)])]


def test_a_large_output_keeps_the_drivers_copy(replay):
    big = 8 << 20
    rc, events, _ = replay(INPUTS, POINTERS, big)
    assert rc == REPLAYED
    assert events[:2] == [("launch", IN), ("graph",)] and len(events) == 4
    assert ("launch", BACK) in events[2:]
    assert [e[1][1:] for e in events[2:] if e[0] == "memcpy"] == [(0x900000, big)]


def test_without_written_arguments_the_output_is_one_copy(replay):
    inputs = [(0, COPY_IN, 0x1000, 64, 0), (1, BY_POINTER, 0x5000, 256, 0)]
    rc, events, _ = replay(inputs, [0x100000, 0x5000], 1024)
    assert rc == REPLAYED
    # one copy in and one out: each a cuMemcpyAsync (the copy kernel takes 3 or more)
    assert events[0] == ("memcpy", (0x1000, 0x100000, 64)) and events[1] == ("graph",)
    assert events[2][0] == "memcpy" and events[2][1][1:] == (0x900000, 1024) and len(events) == 3


def test_an_output_that_cannot_be_made_still_copies_the_written_arguments_back(replay):
    rc, events, released = replay(INPUTS, POINTERS, 1024, fail=1)
    assert rc == FAILED and released == 0
    assert events == [("launch", IN), ("graph",), ("launch", BACK)]
