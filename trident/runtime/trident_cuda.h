/*
 * trident_cuda.h: Triton kernel launches through the CUDA driver API, for SCMs with CUDA kernels.
 *
 * libcuda.so.1 is opened at the first launch (dlopen), so a module that holds cubins still
 * loads on a machine without a GPU. Each kernel's cubin is loaded once per device with
 * cuModuleLoadData in that device's primary context. Launches use cuLaunchKernelEx on the stream
 * the caller passes (PyTorch's current stream), as Triton 3.6's own launcher
 * (backends/nvidia/driver.py) does: grid x * num_ctas, 32 * num_warps threads, dynamic shared
 * memory (above 48 KiB after cuFuncSetAttribute), a (num_ctas, 1, 1) cluster with the spread
 * scheduling policy when num_ctas > 1, cooperative and PDL attributes when asked. The parameter array is the kernel's runtime parameters
 * followed by Triton's two scratch pointers (global, profile).
 */
#ifndef TRIDENT_CUDA_H
#define TRIDENT_CUDA_H

#include <cuda.h> /* from triton/backends/nvidia/include */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRT_MAX_DEVICES 16

typedef struct trt_kernel {
  const char* name; /* the kernel symbol */
  const unsigned char* cubin;
  unsigned threads;
  unsigned shared;
  unsigned num_ctas;
  int cooperative;
  int pdl;
  CUfunction function[TRT_MAX_DEVICES];
} trt_kernel;

static struct {
  int loaded;
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*ctx_get_device)(CUdevice*);
  CUresult (*ctx_push)(CUcontext);
  CUresult (*ctx_pop)(CUcontext*);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*func_set_attribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*launch_kernel_ex)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*get_error_string)(CUresult, const char**);
  CUresult (*graph_launch)(CUgraphExec, CUstream);
  CUresult (*memcpy_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
} trt_cu;

static char trt_cuda_message[256];

static int trt_cuda_fail(const char* what, CUresult rc) {
  const char* text = "unknown error";
  if (trt_cu.get_error_string) trt_cu.get_error_string(rc, &text);
  snprintf(trt_cuda_message, sizeof(trt_cuda_message), "%s failed: %s (CUresult %d)", what, text,
           (int)rc);
  return 1;
}

static int trt_cuda_load(void) {
  if (trt_cu.loaded) return 0;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    snprintf(trt_cuda_message, sizeof(trt_cuda_message), "cannot open libcuda.so.1: %s",
             dlerror());
    return 1;
  }
#define TRT_SYM(field, symbol)                                                    \
  if (!(*(void**)&trt_cu.field = dlsym(h, symbol))) {                             \
    snprintf(trt_cuda_message, sizeof(trt_cuda_message), "libcuda lacks %s", symbol); \
    return 1;                                                                     \
  }
  TRT_SYM(ctx_get_current, "cuCtxGetCurrent")
  TRT_SYM(ctx_get_device, "cuCtxGetDevice")
  TRT_SYM(ctx_push, "cuCtxPushCurrent_v2")
  TRT_SYM(ctx_pop, "cuCtxPopCurrent_v2")
  TRT_SYM(device_get, "cuDeviceGet")
  TRT_SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain")
  TRT_SYM(module_load_data, "cuModuleLoadData")
  TRT_SYM(module_get_function, "cuModuleGetFunction")
  TRT_SYM(func_set_attribute, "cuFuncSetAttribute")
  TRT_SYM(launch_kernel_ex, "cuLaunchKernelEx")
  TRT_SYM(get_error_string, "cuGetErrorString")
  TRT_SYM(graph_launch, "cuGraphLaunch")
  TRT_SYM(memcpy_async, "cuMemcpyAsync")
#undef TRT_SYM
  trt_cu.loaded = 1;
  return 0;
}

/* Make `device`'s primary context current if it is not; *pushed says whether to pop after. */
static int trt_cuda_enter(int device, int* pushed) {
  CUcontext ctx = NULL;
  CUdevice current;
  CUresult rc;
  *pushed = 0;
  trt_cu.ctx_get_current(&ctx);
  if (ctx && trt_cu.ctx_get_device(&current) == CUDA_SUCCESS && current == device) return 0;
  CUdevice dev;
  if ((rc = trt_cu.device_get(&dev, device))) return trt_cuda_fail("cuDeviceGet", rc);
  if ((rc = trt_cu.primary_ctx_retain(&ctx, dev)))
    return trt_cuda_fail("cuDevicePrimaryCtxRetain", rc);
  if ((rc = trt_cu.ctx_push(ctx))) return trt_cuda_fail("cuCtxPushCurrent", rc);
  *pushed = 1;
  return 0;
}

static int trt_cuda_function(trt_kernel* k, int device) {
  CUresult rc;
  CUmodule module;
  if (!k->cubin) {  /* scm_set_cubin() was not called: an install that went wrong */
    snprintf(trt_cuda_message, sizeof(trt_cuda_message), "%s: no cubin was set", k->name);
    return 1;
  }
  if ((rc = trt_cu.module_load_data(&module, k->cubin))) return trt_cuda_fail("cuModuleLoadData", rc);
  if ((rc = trt_cu.module_get_function(&k->function[device], module, k->name)))
    return trt_cuda_fail("cuModuleGetFunction", rc);
  if (k->num_ctas == 16 &&
      (rc = trt_cu.func_set_attribute(k->function[device],
                                      CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)))
    return trt_cuda_fail("cuFuncSetAttribute", rc);
  if (k->shared > 49152 &&
      (rc = trt_cu.func_set_attribute(k->function[device],
                                      CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k->shared)))
    return trt_cuda_fail("cuFuncSetAttribute", rc);
  return 0;
}

/* Launch `k` on `device` and `stream`; on failure trt_cuda_message says why. */
static int trt_cuda_launch(trt_kernel* k, int device, void* stream, unsigned gx, unsigned gy,
                           unsigned gz, void** params) {
  if (device < 0 || device >= TRT_MAX_DEVICES) {
    snprintf(trt_cuda_message, sizeof(trt_cuda_message), "device %d out of range", device);
    return 1;
  }
  if (gx * gy * gz == 0) return 0; /* an empty grid launches nothing, as in Triton */
  if (trt_cuda_load()) return 1;
  int pushed, failed = 0;
  if (trt_cuda_enter(device, &pushed)) return 1;
  if (!k->function[device]) failed = trt_cuda_function(k, device);
  if (!failed) {
    CUlaunchAttribute attrs[4];
    unsigned n = 0;
    if (k->num_ctas != 1) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim.x = k->num_ctas;
      attrs[n].value.clusterDim.y = 1;
      attrs[n].value.clusterDim.z = 1;
      ++n;
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
      attrs[n].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
      ++n;
    }
    if (k->cooperative) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[n].value.cooperative = 1;
      ++n;
    }
    if (k->pdl) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n].value.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    CUlaunchConfig config = {0};
    config.gridDimX = gx * k->num_ctas;
    config.gridDimY = gy;
    config.gridDimZ = gz;
    config.blockDimX = k->threads;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = k->shared;
    config.hStream = (CUstream)stream;
    config.attrs = attrs;
    config.numAttrs = n;
    CUresult rc = trt_cu.launch_kernel_ex(&config, k->function[device], params, NULL);
    if (rc) failed = trt_cuda_fail("cuLaunchKernelEx", rc);
  }
  if (pushed) {
    CUcontext ignored;
    trt_cu.ctx_pop(&ignored);
  }
  return failed;
}

/* ---- batched copies ---------------------------------------------------------------------
 *
 * A graph replay copies each copied-in argument into the graph's buffer and each written one
 * back (Note [CUDA graphs] in trident/frontend/graphs.py). A Hugging Face generate makes a new static
 * cache per call, so every layer's keys, values and position are copied in and back at every
 * token, and one cuMemcpyAsync call each costs host time per buffer (docs/benchmarks.md).
 * trt_copy_buffers issues them as launches of one small kernel instead, TRT_COPY_BATCH copies
 * per launch, the table passed by value in the kernel's parameters (no device memory, nothing
 * shared between calls or streams): each block row copies one buffer, in 16-byte words where
 * both addresses and the length allow, else bytewise. The kernel is PTX, compiled by the driver
 * once per device; where that fails the copies are cuMemcpyAsync calls, one per buffer. */
#define TRT_COPY_BATCH 160 /* 160 * 24 bytes of table fit the 4 KiB of kernel parameters */

static const char trt_copy_ptx[] =
    ".version 7.8\n.target sm_70\n.address_size 64\n"
    ".visible .entry trt_copy_batch(.param .align 8 .b8 table[3840], .param .u32 count)\n{\n"
    ".reg .pred %p<6>;\n.reg .b32 %r<16>;\n.reg .b64 %rd<32>;\n"
    "ld.param.u32 %r1, [count];\nmov.u32 %r2, %ctaid.y;\nsetp.ge.u32 %p1, %r2, %r1;\n"
    "@%p1 bra DONE;\n"
    /* entry r2 of the table: dst, src, bytes */
    "mov.u64 %rd1, table;\nmul.wide.u32 %rd2, %r2, 24;\nadd.s64 %rd3, %rd1, %rd2;\n"
    "ld.param.u64 %rd4, [%rd3];\nld.param.u64 %rd5, [%rd3+8];\nld.param.u64 %rd6, [%rd3+16];\n"
    /* i: this thread's first word; rd9: the threads of the row */
    "mov.u32 %r3, %ctaid.x;\nmov.u32 %r4, %ntid.x;\nmov.u32 %r5, %tid.x;\nmov.u32 %r6, %nctaid.x;\n"
    "mul.wide.u32 %rd7, %r3, %r4;\ncvt.u64.u32 %rd8, %r5;\nadd.s64 %rd7, %rd7, %rd8;\n"
    "mul.wide.u32 %rd9, %r6, %r4;\n"
    "or.b64 %rd10, %rd4, %rd5;\nor.b64 %rd10, %rd10, %rd6;\nand.b64 %rd10, %rd10, 15;\n"
    "setp.ne.s64 %p2, %rd10, 0;\n@%p2 bra BYTES;\nshr.u64 %rd11, %rd6, 4;\n"
    "VEC:\nsetp.ge.u64 %p3, %rd7, %rd11;\n@%p3 bra DONE;\nshl.b64 %rd12, %rd7, 4;\n"
    "add.s64 %rd13, %rd5, %rd12;\nadd.s64 %rd14, %rd4, %rd12;\n"
    "ld.global.v4.u32 {%r7, %r8, %r9, %r10}, [%rd13];\n"
    "st.global.v4.u32 [%rd14], {%r7, %r8, %r9, %r10};\nadd.s64 %rd7, %rd7, %rd9;\nbra VEC;\n"
    "BYTES:\nsetp.ge.u64 %p4, %rd7, %rd6;\n@%p4 bra DONE;\nadd.s64 %rd13, %rd5, %rd7;\n"
    "add.s64 %rd14, %rd4, %rd7;\nld.global.u8 %r11, [%rd13];\nst.global.u8 [%rd14], %r11;\n"
    "add.s64 %rd7, %rd7, %rd9;\nbra BYTES;\nDONE:\nret;\n}\n";

typedef struct trt_copy {
  CUdeviceptr dst, src;
  uint64_t bytes;
} trt_copy;

static CUfunction trt_copy_function[TRT_MAX_DEVICES];
static int trt_copy_state[TRT_MAX_DEVICES]; /* 0: not tried, 1: loaded, -1: failed */

/* Copies copies[0..n) on `stream` (device memory on `device`, its context current). */
static int trt_copy_buffers(int device, CUstream stream, const trt_copy* copies, int n,
                            const char* what) {
  if (device >= 0 && device < TRT_MAX_DEVICES && trt_copy_state[device] == 0) {
    CUmodule module;
    trt_copy_state[device] =
        trt_cu.module_load_data(&module, trt_copy_ptx) == CUDA_SUCCESS &&
                trt_cu.module_get_function(&trt_copy_function[device], module,
                                           "trt_copy_batch") == CUDA_SUCCESS
            ? 1 : -1;
  }
  int batched = n >= 3 && device >= 0 && device < TRT_MAX_DEVICES && trt_copy_state[device] == 1;
  for (int first = 0; first < n;) {
    int count = n - first < TRT_COPY_BATCH ? n - first : TRT_COPY_BATCH;
    CUresult rc;
    if (!batched) {
      count = 1;
      rc = trt_cu.memcpy_async(copies[first].dst, copies[first].src, (size_t)copies[first].bytes,
                               stream);
    } else {
      trt_copy table[TRT_COPY_BATCH];
      uint64_t most = 0;
      for (int i = 0; i < count; ++i) {
        table[i] = copies[first + i];
        if (table[i].bytes > most) most = table[i].bytes;
      }
      uint32_t blocks = (uint32_t)((most + 256 * 16 - 1) / (256 * 16));
      if (blocks > 64) blocks = 64;
      if (blocks < 1) blocks = 1;
      uint32_t entries = (uint32_t)count;
      void* params[] = {table, &entries};
      CUlaunchConfig config = {0};
      config.gridDimX = blocks;
      config.gridDimY = entries;
      config.gridDimZ = 1;
      config.blockDimX = 256;
      config.blockDimY = 1;
      config.blockDimZ = 1;
      config.hStream = stream;
      rc = trt_cu.launch_kernel_ex(&config, trt_copy_function[device], params, NULL);
    }
    if (rc) return trt_cuda_fail(what, rc);
    first += count;
  }
  return 0;
}

/* Adds one copy to `copies` (n of them so far), which copies a full table at once. */
static inline int trt_copy_push(int device, CUstream stream, trt_copy* copies, int* n,
                                CUdeviceptr dst, CUdeviceptr src, uint64_t bytes) {
  copies[*n].dst = dst;
  copies[*n].src = src;
  copies[*n].bytes = bytes;
  if (++*n < TRT_COPY_BATCH) return 0;
  *n = 0;
  return trt_copy_buffers(device, stream, copies, TRT_COPY_BATCH, "graph input copy");
}

/* Note [Copies out in the batch]: a replay that copies an output out (Note [Graph outputs] in
 * trident/frontend/graphs.py: a new tensor per call once a caller kept one, as a server does)
 * made one cuMemcpyAsync per output after the launch that copies the written arguments back,
 * each a few microseconds of host time (docs/benchmarks.md, a decode hit's "outputs"). Both
 * copy from the graph's memory after the replay, on the same stream, into memory no other of
 * the copies reads or writes (a new tensor; a caller's tensor that overlaps no other argument
 * where either is written: trt_graph_hides_write), so an output's copy joins that launch's
 * table: the order of the copies within it does not matter. Outputs up to
 * TRT_COPY_OUT_BATCHED bytes only: the copy kernel's rows use at most 64 blocks, where the
 * driver's copy of a large output (a prefill's logits, over 100 MB for a 512-token prompt)
 * is faster on the GPU. */
#define TRT_COPY_OUT_BATCHED (4 << 20)

/* ---- CUDA graph replay (Note [CUDA graphs] in trident/frontend/graphs.py) ----------------------- */

/* trt_graph_replay's answers */
enum { TRT_GRAPH_NONE = 0, TRT_GRAPH_REPLAYED = 1, TRT_GRAPH_CAPTURE = 2, TRT_GRAPH_FAILED = 3 };

static inline int trt_graph_error(const char* what) {
  snprintf(trt_cuda_message, sizeof(trt_cuda_message), "%s", what);
  return TRT_GRAPH_FAILED;
}

typedef struct trt_span {
  uintptr_t start, end; /* an argument's bytes, [start, end) */
  int copied, written;
} trt_span;

TRT_OPTIMIZED static int trt_span_order(const void* a, const void* b) {
  uintptr_t x = ((const trt_span*)a)->start, y = ((const trt_span*)b)->start;
  return x < y ? -1 : x > y;
}

/* Whether a copied-in argument overlaps another argument where either may be written: the copy
 * would hide the write. `in`: the graph's input descriptors (5 words each), `a` the call's
 * arguments. One sort of the byte ranges, then a sweep that keeps, for each kind of range seen
 * so far, the furthest end: a range overlaps an earlier one exactly when that end passes its
 * start. 1 also when there is no memory to sort in (the caller then runs step by step). */
TRT_OPTIMIZED static int trt_copy_hides_write(const int64_t* in, int ninputs, const trt_arg* a) {
  trt_span local[256];
  trt_span* spans = ninputs <= 256 ? local : (trt_span*)malloc(sizeof(trt_span) * (size_t)ninputs);
  if (!spans) return 1;
  int n = 0, copies = 0, hidden = 0;
  for (int i = 0; i < ninputs; ++i) {
    const int64_t* x = in + 5 * i;
    if (x[3] <= 0 || x[1] == TRT_GRAPH_HOST_IN) continue; /* host memory, only read */
    uintptr_t start = (uintptr_t)a[x[0]].data_ptr;
    trt_span s = {start, start + (uintptr_t)x[3], x[1] == TRT_GRAPH_COPY_IN, x[4] != 0};
    copies += s.copied;
    spans[n++] = s;
  }
  if (copies) {
    qsort(spans, (size_t)n, sizeof(trt_span), trt_span_order);
    uintptr_t any = 0, copied = 0, written = 0, both = 0;
    for (int k = 0; k < n && !hidden; ++k) {
      const trt_span* q = &spans[k];
      uintptr_t reach = q->copied ? (q->written ? any : written) : (q->written ? copied : both);
      hidden = reach > q->start;
      if (q->end > any) any = q->end;
      if (q->copied && q->end > copied) copied = q->end;
      if (q->written && q->end > written) written = q->end;
      if (q->copied && q->written && q->end > both) both = q->end;
    }
  }
  if (spans != local) free(spans);
  return hidden;
}

/* trt_copy_hides_write, remembered per slot: its answer is decided by the arguments' addresses
 * and the descriptor's spans, and a replay has checked that each by-pointer argument is at the
 * graph's address, so the copied-in arguments' addresses decide it. A decode step's copied-in
 * arguments are mostly at the last call's addresses (a KV cache's tensors, which move once per
 * new cache), a few not (a new token's tensor): when the last answer was no overlap, only the
 * arguments that moved can make one, so each is checked against every other argument
 * (`TRT_GRAPH_MOVED` at most; more take the sort). The whole check sorts every argument's range,
 * which for a few hundred arguments costs more than the rest of the replay's host work. */
TRT_OPTIMIZED static int trt_graph_hides_write(trt_graph* g, const int64_t* d, const int64_t* in, int ninputs,
                                 const trt_arg* a) {
  if (g->checked_room < ninputs) {
    uintptr_t* room = (uintptr_t*)realloc(g->checked, sizeof(uintptr_t) * (size_t)ninputs);
    if (!room) return trt_copy_hides_write(in, ninputs, a);
    g->checked = room;
    g->checked_room = ninputs;
  }
  int same = g->checked_desc == d, moved[TRT_GRAPH_MOVED];
  int32_t n = 0, nmoved = 0;
  for (int i = 0; i < ninputs; ++i) {
    const int64_t* x = in + 5 * i;
    if (x[1] != TRT_GRAPH_COPY_IN) continue;
    uintptr_t now = (uintptr_t)a[x[0]].data_ptr;
    if (same && n < g->nchecked && g->checked[n] != now) {
      if (nmoved < TRT_GRAPH_MOVED) moved[nmoved] = i;
      ++nmoved;
    }
    g->checked[n++] = now;
  }
  if (same && n == g->nchecked && nmoved == 0) return g->checked_hidden;
  int hidden = 0;
  if (same && n == g->nchecked && !g->checked_hidden && nmoved <= TRT_GRAPH_MOVED) {
    for (int k = 0; k < nmoved && !hidden; ++k) { /* each moved one against every other */
      const int64_t* q = in + 5 * moved[k];
      uintptr_t qs = (uintptr_t)a[q[0]].data_ptr, qe = qs + (uintptr_t)q[3];
      if (q[3] <= 0) continue;
      for (int i = 0; i < ninputs && !hidden; ++i) {
        const int64_t* x = in + 5 * i;
        uintptr_t s = (uintptr_t)a[x[0]].data_ptr;
        hidden = i != moved[k] && x[3] > 0 && x[1] != TRT_GRAPH_HOST_IN && (q[4] || x[4]) &&
                 qs < s + (uintptr_t)x[3] && s < qe;
      }
    }
  } else {
    hidden = trt_copy_hides_write(in, ninputs, a);
  }
  g->checked_desc = d;
  g->nchecked = n;
  g->checked_hidden = hidden;
  return hidden;
}

/* Whether the call's arguments `a` have the sizes, strides and offsets (an int argument: the
 * value) of a graph's size key (`nkey` words at `key`, trt_graph in trident_rt.h). */
TRT_OPTIMIZED static inline int trt_graph_fits(const int64_t* key, int64_t nkey, const trt_arg* a) {
  for (int64_t p = 0; p < nkey;) {
    const trt_arg* t = &a[key[p]];
    int64_t dim = key[p + 1];
    const int64_t* sizes = key + p + 2;
    if (dim < 0) { /* an int argument's entry: its value */
      if (t->kind != TRT_ARG_INT || t->i != sizes[0]) return 0;
      p += 3;
      continue;
    }
    if (t->dim != dim || t->storage_offset != sizes[2 * dim]) return 0;
    for (int64_t i = 0; i < dim; ++i)
      if (t->sizes[i] != sizes[i] || t->strides[i] != sizes[dim + i]) return 0;
    p += 3 + 2 * dim;
  }
  return 1;
}

/* Note [Graph outputs] (frontend/graphs.py): whether a replay of the descriptor whose outputs
 * start at `o` would overwrite a static output it hands out that a tensor other than the
 * graph's own holds (an earlier replay's result, still alive). */
TRT_OPTIMIZED static int trt_graph_outputs_busy(const int64_t* o, int noutputs, const trt_api* rt) {
  for (int k = 0; k < noutputs; ++k) {
    int32_t tag = (int32_t)*o++;
    if (tag != TRT_TENSOR) {
      ++o;
      continue;
    }
    if (o[2] && rt->output_in_use((const void*)(uintptr_t)o[2])) return 1;
    o += 5 + 2 * o[4];
  }
  return 0;
}

/* trt_replay_clock (trident_rt.h): the time since the last lap goes to `part` (-1: none). */
static inline void trt_replay_lap(const trt_api* rt, int part) {
  trt_replay_clock* c = rt->replay_clock;
  if (!c->on) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  if (part >= 0) c->ns[part] += now - c->last;
  c->last = now;
}

/* Replay `g` (trt_graph in trident_rt.h) for the call's arguments `a` after the specialization's
 * guards held: pick the graph of the call's sizes, copy in, launch, copy written inputs back,
 * hand out or copy out the outputs (Note [Graph outputs]). Returns TRT_GRAPH_CAPTURE when
 * Python should decide (no graph yet, a symbolic specialization's new size while it takes
 * more, a handed-out output still held: a copy-out recapture), TRT_GRAPH_NONE when no graph
 * applies to this call (none for its size, an input at a new address, another stream, a
 * copied input overlapping another where either may be written, a held output past the
 * recaptures): the caller then runs the launch sequence. */
TRT_OPTIMIZED static inline int trt_graph_replay(trt_graph* g, const trt_arg* a, int32_t n, const trt_api* rt,
                                   trt_result* out) {
  if (!g || g->state == TRT_GRAPH_OFF) return TRT_GRAPH_NONE;
  if (g->state == TRT_GRAPH_PENDING) return TRT_GRAPH_CAPTURE;
  trt_replay_lap(rt, -1);
  const int64_t* d = NULL;
  if (g->ndescs == 1 && g->descs[0][4] == 0) {
    d = g->descs[0]; /* a static specialization's one graph */
  } else if (g->ndescs == 1 && trt_graph_fits(g->descs[0] + 5, g->descs[0][4], a)) {
    d = g->descs[0]; /* a symbolic one's only graph (a decode step's: its batch size), whose
                      * key fits: no hash of every tensor argument's geometry (a serial chain
                      * of multiplies, ten words per tensor of a model), which picks among
                      * several graphs and remembers a size no graph has */
  } else {           /* Note [Graphs per size]: the graph of the call's sizes */
    uint64_t h = trt_graph_call_hash(a, n);
    for (int32_t i = 0; i < g->ndescs && !d; ++i)
      if (g->hashes[i] == h && trt_graph_fits(g->descs[i] + 5, g->descs[i][4], a)) d = g->descs[i];
    if (!d) /* a size no graph has: its second call asks Python for a capture */
      return g->open && trt_graph_seen_before(g, h) ? TRT_GRAPH_CAPTURE : TRT_GRAPH_NONE;
  }
  CUgraphExec exec = (CUgraphExec)(uintptr_t)d[0];
  int device = (int)d[1], ninputs = (int)d[2], noutputs = (int)d[3];
  const int64_t* in = d + 5 + d[4];
  void* stream;
  if (rt->cuda_stream(device, &stream)) return trt_graph_error("cannot read the current stream");
  if (g->bound && stream != g->stream) return TRT_GRAPH_NONE;
  for (int i = 0; i < ninputs; ++i) {
    const int64_t* x = in + 5 * i;
    if (x[1] == TRT_GRAPH_BY_POINTER && (uintptr_t)a[x[0]].data_ptr != (uintptr_t)x[2]) {
      if (g->recaptures_left > 0) {
        --g->recaptures_left;
        g->state = TRT_GRAPH_PENDING;
      }
      return TRT_GRAPH_NONE;
    }
  }
  if (trt_graph_hides_write(g, d, in, ninputs, a)) return TRT_GRAPH_NONE;
  if (trt_graph_outputs_busy(in + 5 * ninputs, noutputs, rt)) {
    /* Note [Hand out after a move]: Python recaptures now, while the caller holds the output,
     * so the new graph copies out; a bounded number of times, as a moved argument's */
    if (g->recaptures_left <= 0) return TRT_GRAPH_NONE;
    --g->recaptures_left;
    return TRT_GRAPH_CAPTURE;
  }
  if (trt_cuda_load()) return TRT_GRAPH_FAILED;
  trt_replay_lap(rt, TRT_REPLAY_CHECK);
  int pushed, failed = TRT_GRAPH_REPLAYED;
  CUresult rc;
  if (trt_cuda_enter(device, &pushed)) return TRT_GRAPH_FAILED;
  trt_copy copies[TRT_COPY_BATCH];
  int ncopies = 0, k = 0; /* k: the outputs made (released on failure) */
  const int64_t* o = in + 5 * ninputs;
  for (int back = 0; back < 2 && failed == TRT_GRAPH_REPLAYED; ++back) {
    /* back = 0: the copied-in arguments into the graph's buffers, then the replay; back = 1:
     * the written ones back to the caller's tensors, and the outputs */
    for (int i = 0; i < ninputs && failed == TRT_GRAPH_REPLAYED; ++i) {
      const int64_t* x = in + 5 * i;
      CUdeviceptr mine = (CUdeviceptr)x[2], theirs = (CUdeviceptr)(uintptr_t)a[x[0]].data_ptr;
      if (x[1] == TRT_GRAPH_HOST_IN && !back) { /* Note [Host scalars]: pageable host memory,
                                                 * read before cuMemcpyAsync returns */
        if ((rc = trt_cu.memcpy_async(mine, theirs, (size_t)x[3], (CUstream)stream)))
          failed = trt_cuda_fail("cuMemcpyAsync (host scalar)", rc) ? TRT_GRAPH_FAILED : failed;
        continue;
      }
      if (x[1] != TRT_GRAPH_COPY_IN || x[3] <= 0 || (back && !x[4])) continue;
      if (trt_copy_push(device, (CUstream)stream, copies, &ncopies, back ? theirs : mine,
                        back ? mine : theirs, (uint64_t)x[3]))
        failed = TRT_GRAPH_FAILED;
    }
    int made = TRT_GRAPH_REPLAYED; /* the outputs' answer; the copies back are made either way */
    for (; back && failed == TRT_GRAPH_REPLAYED && k < noutputs && made == TRT_GRAPH_REPLAYED;
         ++k) {
      int32_t tag = (int32_t)*o++;
      out->outs[k].tag = tag;
      out->outs[k].len = 0;
      if (tag != TRT_TENSOR) {
        out->outs[k].u.i = *o++; /* an int, a bool, or a float's bits; unused for None */
        continue;
      }
      int64_t src = o[0], bytes = o[1];
      const void* held = (const void*)(uintptr_t)o[2];
      int32_t dtype = (int32_t)o[3], dim = (int32_t)o[4];
      const int64_t* geometry = o + 5;
      o += 5 + 2 * dim;
      trt_tensor* t;
      if (held) { /* Note [Graph outputs]: the static output itself (trt_graph_outputs_busy) */
        if (!(t = rt->graph_output(held))) {
          made = trt_graph_error("cannot hand out a graph output");
          break;
        }
        out->outs[k].u.t = t;
        continue;
      }
      t = rt->empty_strided(dim, geometry, geometry + dim, dtype, device);
      if (!t) {
        made = trt_graph_error("cannot allocate a graph output");
        break;
      }
      out->outs[k].u.t = t;
      void* data = NULL;
      if (bytes > 0 && rt->data_ptr(t, &data)) {
        made = trt_graph_error("no data pointer for a graph output");
        ++k;
        break;
      }
      if (bytes <= 0) continue;
      if (bytes <= TRT_COPY_OUT_BATCHED) { /* Note [Copies out in the batch] */
        if (trt_copy_push(device, (CUstream)stream, copies, &ncopies, (CUdeviceptr)data,
                          (CUdeviceptr)src, (uint64_t)bytes))
          made = TRT_GRAPH_FAILED;
      } else if ((rc = trt_cu.memcpy_async((CUdeviceptr)data, (CUdeviceptr)src, (size_t)bytes,
                                           (CUstream)stream))) {
        made = trt_cuda_fail("cuMemcpyAsync (graph output)", rc) ? TRT_GRAPH_FAILED : made;
      }
      if (made != TRT_GRAPH_REPLAYED) {
        ++k;
        break;
      }
    }
    if (back) trt_replay_lap(rt, TRT_REPLAY_OUTPUTS);
    if (failed == TRT_GRAPH_REPLAYED && ncopies &&
        trt_copy_buffers(device, (CUstream)stream, copies, ncopies, "graph input copy"))
      failed = TRT_GRAPH_FAILED;
    if (failed == TRT_GRAPH_REPLAYED) failed = made;
    ncopies = 0;
    trt_replay_lap(rt, back ? TRT_REPLAY_COPY_BACK : TRT_REPLAY_COPY_IN);
    if (!back && failed == TRT_GRAPH_REPLAYED && (rc = trt_cu.graph_launch(exec, (CUstream)stream)))
      failed = trt_cuda_fail("cuGraphLaunch", rc) ? TRT_GRAPH_FAILED : failed;
    if (!back) trt_replay_lap(rt, TRT_REPLAY_LAUNCH);
  }
  if (pushed) {
    CUcontext ignored;
    trt_cu.ctx_pop(&ignored);
  }
  if (failed != TRT_GRAPH_REPLAYED) {
    for (int i = 0; i < k; ++i)
      if (out->outs[i].tag == TRT_TENSOR && out->outs[i].u.t) rt->release(out->outs[i].u.t);
    return failed;
  }
  out->nouts = noutputs;
  g->bound = 1;
  g->stream = stream;
  ++g->replays;
  return TRT_GRAPH_REPLAYED;
}

#endif /* TRIDENT_CUDA_H */
