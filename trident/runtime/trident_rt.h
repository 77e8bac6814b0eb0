/*
 * trident_rt.h: the C ABI between Trident's runtime (runtime.cpp, C++, built once per torch
 * version) and the Specialization Cache Modules it runs (plain C, generated per function).
 *
 * Ownership (Note [Handle ownership]): a `trt_tensor` is an opaque `at::Tensor*`.
 *   - handles in `trt_arg.tensor` are BORROWED from the caller's Python tensors;
 *   - handles returned by `trt_api.call` / `trt_api.retain` are NEW and must be given back with
 *     `trt_api.release`, or handed to the dispatcher as outputs, which takes them over.
 * Every entry point returns 0 on success and non-zero on failure; on failure the runtime holds a
 * thread-local message (`trt_api.set_error` adds the failing step's source line).
 */
#ifndef TRIDENT_RT_H
#define TRIDENT_RT_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRT_ABI_VERSION 9
#define TRT_MAX_ARGS 4096 /* positional arguments the native path reads; more go to Python */
#define TRT_MAX_OUTS 256

typedef struct trt_tensor trt_tensor;
typedef struct trt_op trt_op;

/* What the dispatcher saw in one positional argument (filled in C++ before any guard runs). */
enum trt_arg_kind {
  TRT_ARG_OTHER = 0, /* anything the native guards cannot decide: always a miss */
  TRT_ARG_TENSOR = 1,
  TRT_ARG_INT = 2,
  TRT_ARG_FLOAT = 3,
  TRT_ARG_BOOL = 4,
  TRT_ARG_NONE = 5,
};

/* trt_arg.flags bits for tensors */
#define TRT_REQUIRES_GRAD 1 /* tensor.requires_grad */
#define TRT_ALIGNED16 2     /* data pointer % 16 == 0 */
#define TRT_INFERENCE 4     /* an inference tensor (made under torch.inference_mode()) */
#define TRT_PARAMETER 8     /* an nn.Parameter (Note [Tensor types and attributes]) */

/* Note [Argument records]: a hit writes one record per argument (a model's decode step: 378)
 * and its guards read them back, on cache lines that a `generate`'s own Python evicted since
 * the last step. So a record is one 64-byte line (aligned to one: the runtime's record
 * buffers are allocated at the type's alignment), and what a tensor's guards compare of it
 * besides its sizes and strides (its kind, dtype, device type and index, dim and flag bits)
 * is one word, `head`: codegen/guards.py checks an argument's such guards as one compare of
 * that word under a mask (TRT_HEAD_* give each field's place in it), where each was a compare
 * of its own (35 KB of a 16-layer Llama's guard code, 8 checks per tensor). The word's layout
 * is the fields' in memory on a little-endian machine (x86-64, AArch64), which the runtime
 * and every SCM share; a dim beyond int16 reads as TRT_ARG_OTHER (a miss). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "trident_rt.h: trt_arg.head is laid out for a little-endian machine"
#endif
#define TRT_HEAD_KIND 0          /* bit offsets in trt_arg.head */
#define TRT_HEAD_FLAGS 8
#define TRT_HEAD_DTYPE 16
#define TRT_HEAD_DEVICE_TYPE 24
#define TRT_HEAD_DEVICE_INDEX 32
#define TRT_HEAD_DIM 48

#if defined(__GNUC__)
#define TRT_LINE_ALIGNED __attribute__((aligned(64)))
#else
#define TRT_LINE_ALIGNED
#endif

typedef struct TRT_LINE_ALIGNED trt_arg {
  union {
    struct {
      int8_t kind;          /* trt_arg_kind */
      uint8_t flags;        /* TRT_REQUIRES_GRAD, ... */
      /* tensors */
      int8_t dtype;         /* c10::ScalarType */
      int8_t device_type;   /* c10::DeviceType: 0 CPU, 1 CUDA */
      int16_t device_index;
      int16_t dim;
    };
    uint64_t head;          /* the six fields above as one word (Note [Argument records]) */
  };
  const int64_t* sizes;
  const int64_t* strides;
  int64_t storage_offset;
  void* data_ptr;
  trt_tensor* tensor; /* borrowed */
  /* scalars; a tensor's: 1 where it has Python attributes, a non-empty instance dict, else 0
   * (Note [Tensor types and attributes] in trident/ir/guards.py: guarded where looked up) */
  int64_t i;
  double f;
} trt_arg;

/* A value on an op's boxed stack. */
enum trt_tag {
  TRT_NONE = 0,
  TRT_TENSOR = 1,
  TRT_INT = 2,
  TRT_FLOAT = 3,
  TRT_BOOL = 4,
  TRT_INT_LIST = 5,    /* u.ints[0..len) */
  TRT_FLOAT_LIST = 6,  /* u.floats[0..len) */
  TRT_BOOL_LIST = 7,   /* u.ints[0..len), 0 or 1 */
  TRT_TENSOR_LIST = 8, /* u.items[0..len), each TRT_TENSOR */
  TRT_OPT_TENSOR_LIST = 9, /* u.items[0..len), each TRT_TENSOR or TRT_NONE */
  TRT_STR = 10,        /* u.s, NUL-terminated */
  TRT_DEVICE = 11,     /* u.i = device_type * 65536 + (device_index + 1) */
};

typedef struct trt_value {
  int32_t tag;
  int32_t len;
  union {
    trt_tensor* t;
    int64_t i;
    double f;
    const int64_t* ints;
    const double* floats;
    const struct trt_value* items;
    const char* s;
  } u;
} trt_value;

/* Results that the SCM hands back to the dispatcher for one call. `spec` says how to rebuild the
 * user's output structure from `outs` (Note [Output spec] in trident/runtime/args.cpp). */
typedef struct trt_result {
  const char* spec;
  int32_t nouts;
  trt_value outs[TRT_MAX_OUTS];
} trt_result;

/* Note [Optimized guards]: an SCM is built at -O0 (trident/build.py), but its guard() runs at
 * every hit and is thousands of compare-and-return lines for a model (a 24-layer Qwen2's decode
 * step: 4,506 checks, 217 KB of -O0 code that reloads `a` from the stack for each, past the
 * instruction cache). So that function is optimized (GCC; other compilers build it as the
 * rest): at -O1 its code is 61 KB and its time on a hit 7x shorter, for 0.6 s more of GCC's
 * CPU time (docs/benchmarks.md, issue 25). So are the headers' functions a graph
 * replay runs (trt_graph_replay and what it calls: loops over every argument of the graph),
 * which each SCM compiles too. */
#if defined(__GNUC__) && !defined(__clang__)
#define TRT_OPTIMIZED __attribute__((optimize("O1")))
#else
#define TRT_OPTIMIZED
#endif

/* One specialization's CUDA graphs (Note [CUDA graphs] in trident/frontend/graphs.py): one graph for a
 * static specialization, one per concrete size for a symbolic one. Owned by the function's
 * Dispatcher, not by the SCM: two functions built from the same source share one SCM.
 * Each of `descs` (int64 words, written by graphs.py):
 *   exec, device, ninputs, noutputs, nkey,
 *   the size key (nkey words; none for a static specialization): per tensor input, arg, dim,
 *                      sizes[dim], strides[dim], storage offset, and per int argument whose
 *                      value the launch sequence reads (a symbolic int: graphs.size_key), arg,
 *                      -1, its value: the graph replays only a call whose arguments have
 *                      exactly these (the hashes below skip the ints),
 *   per tensor input:  arg, mode (TRT_GRAPH_BY_POINTER / _COPY_IN / _HOST_IN), pointer the graph
 *                      reads, bytes, 1 if the function may write it (copied back),
 *   per output:        tag (trt_tag); a tensor: source pointer, bytes, the static output
 *                      handed out (graph_output's `held`, or 0: copied out), dtype, dim,
 *                      sizes[dim], strides[dim]; an int/float/bool/None: its value (a float's
 *                      bits). */
#define TRT_GRAPH_SEEN 1024 /* slots of trt_graph.seen; cleared when 3/4 full */
#define TRT_GRAPH_MOVED 8 /* moved copied-in arguments checked alone (trt_graph_hides_write) */

typedef struct trt_graph {
  int32_t state;           /* TRT_GRAPH_OFF / _PENDING / _READY */
  int32_t recaptures_left; /* a by-pointer input at a new address, or a handed-out output
                            * still held, asks for one more capture */
  int32_t bound;           /* replays stay on the stream of the first one */
  int32_t open;            /* ready and symbolic: a call of a size no graph has asks Python,
                            * which may capture one (graphs.GraphStates bounds how many) */
  void* stream;
  int64_t replays;
  int32_t ndescs;
  int64_t** descs;
  uint64_t* hashes; /* of each desc's size key (trt_graph_key_hash) */
  /* Note [Graphs per size]: trt_graph_call_hash of calls no graph had, each run step by
   * step once before Python is asked to capture its size (open addressing, 0 empty) */
  int32_t nseen;
  uint64_t seen[TRT_GRAPH_SEEN];
  /* the last overlap check (trt_graph_hides_write): the descriptor and the copied-in
   * arguments' addresses it was made for (`checked`, malloc'd, room for `checked_room`; freed
   * with the slot's descriptors), and its answer; checked_desc NULL: none */
  const int64_t* checked_desc;
  int32_t nchecked;
  int32_t checked_hidden;
  int32_t checked_room;
  uintptr_t* checked;
} trt_graph;

enum { TRT_GRAPH_OFF = 0, TRT_GRAPH_PENDING = 1, TRT_GRAPH_READY = 2 };
/* HOST_IN: a host scalar (Note [Host scalars] in trident/ir/specialization.py), copied from the
 * host into the graph's device buffer before each replay */
enum { TRT_GRAPH_BY_POINTER = 0, TRT_GRAPH_COPY_IN = 1, TRT_GRAPH_HOST_IN = 2 };

/* Note [Graphs per size]: a hash of what picks a symbolic specialization's graph: every
 * tensor argument's index, sizes, strides and storage offset (not a key's ints, which only
 * trt_graph_fits compares), FNV-1a over those words in that
 * order; from a call's arguments (trt_graph_call_hash) or from a graph's size key
 * (trt_graph_key_hash), equal when the key fits the call. Never 0, which marks an empty slot. */
#define TRT_FNV(h, w) ((h) = ((h) ^ (uint64_t)(w)) * 1099511628211ull)

TRT_OPTIMIZED static inline uint64_t trt_graph_call_hash(const trt_arg* a, int32_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t k = 0; k < n; ++k) {
    const trt_arg* t = &a[k];
    if (t->kind != TRT_ARG_TENSOR) continue;
    TRT_FNV(h, k);
    for (int32_t i = 0; i < t->dim; ++i) TRT_FNV(h, t->sizes[i]);
    for (int32_t i = 0; i < t->dim; ++i) TRT_FNV(h, t->strides[i]);
    TRT_FNV(h, t->storage_offset);
  }
  return h | 1;
}

TRT_OPTIMIZED static inline uint64_t trt_graph_key_hash(const int64_t* key, int64_t nkey) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t p = 0; p < nkey; p += key[p + 1] < 0 ? 3 : 3 + 2 * key[p + 1]) {
    if (key[p + 1] < 0) continue; /* an int argument's value: trt_graph_fits compares it */
    TRT_FNV(h, key[p]);
    for (int64_t i = 0; i < 2 * key[p + 1] + 1; ++i) TRT_FNV(h, key[p + 2 + i]);
  }
  return h | 1;
}

/* Whether `g` saw a call whose trt_graph_call_hash is `h` before, remembering it if not. A
 * collision only captures a size one call early. */
TRT_OPTIMIZED static inline int trt_graph_seen_before(trt_graph* g, uint64_t h) {
  uint32_t i = (uint32_t)(h ^ (h >> 32)) % TRT_GRAPH_SEEN;
  for (; g->seen[i]; i = (i + 1) % TRT_GRAPH_SEEN)
    if (g->seen[i] == h) return 1;
  if (++g->nseen > TRT_GRAPH_SEEN * 3 / 4) { /* sizes seen once, as prompt lengths: forget */
    memset(g->seen, 0, sizeof(g->seen));
    g->nseen = 1;
    i = (uint32_t)(h ^ (h >> 32)) % TRT_GRAPH_SEEN;
  }
  g->seen[i] = h;
  return 0;
}

/* A view computed in C (Note [Views in C] in trident/lower/plan.py): the size, stride and storage
 * offset arithmetic of a view op, with no tensor made until a kernel or the caller needs one.
 * `base` is borrowed: the tensor whose storage (and, once materialized, autograd base) the view
 * shares; the launch sequence keeps it alive while the view is used. */
#define TRT_MAX_VIEW_DIM 16
typedef struct trt_view {
  trt_tensor* base;
  char* data;       /* the storage's data at element 0 (a Triton launch's pointer: data + offset) */
  int64_t itemsize; /* bytes per element */
  int64_t nbytes;   /* the storage's size in bytes (as_strided's bounds check) */
  int64_t offset;   /* storage offset, in elements */
  int32_t dim;
  int64_t sizes[TRT_MAX_VIEW_DIM];
  int64_t strides[TRT_MAX_VIEW_DIM];
} trt_view;

/* How trt_api.view_tensor makes a tensor of a trt_view. */
enum {
  TRT_VIEW_KERNEL = 0, /* for a functional ATen op that only reads it: the storage and version
                          counter of the base, not a view in autograd's sense, no dispatcher */
  TRT_VIEW_EAGER = 1,  /* what eager makes: aten::as_strided of the base through the dispatcher
                          (ADInplaceOrView: `_base`, shared version counter), for a result the
                          caller gets, a tensor an op writes or keeps */
  TRT_VIEW_ALIAS = 2,  /* aten::_unsafe_view's result: the base's storage, its own version
                          counter, not a view (as ATen's alias_with_sizes_and_strides makes it) */
};

/* Call-wide state read once per call. */
typedef struct trt_env {
  int32_t grad_enabled;
  int32_t inference_mode; /* torch.inference_mode() is on: no reused buffers (Note [Buffer reuse]) */
  int32_t autocast;       /* autocast is on for the CPU or CUDA */
  int32_t aliased;        /* one tensor object is passed in two argument positions */
  int32_t default_dtype;  /* torch.get_default_dtype() as a c10::ScalarType */
  int32_t transforms;     /* a torch.func transform (vmap, grad, functionalize) is active */
  int32_t function_modes; /* a TorchFunctionMode (torch.set_default_device, ...) is active */
  /* the default process group, "<name>:<rank>/<size>", "" when none (Note [Process group
   * guard] in trident/lower/collectives.py); owned by the runtime */
  const char* process_group;
  int32_t num_threads;    /* torch.get_num_threads() */
  uint64_t flags;         /* torch's global flags (determinism, SDPA backends, TF32, ...):
                             TRT_FLAG_* and TRT_FIELD_* below */
  trt_graph* graphs;      /* the calling function's graph slot for the SCM it calls, or NULL */
  int32_t capturing;      /* the call is a CUDA graph's capture, whose arguments stand in for
                             the call's (Note [Host scalars]): the guards were checked on the
                             call's own, and are not checked again */
} trt_env;

/* trt_env.flags (global_flags() in args.cpp; ir/facts.py names each): bit TRT_FLAG_X holds one
 * of torch's global bool flags, the 4 bits from TRT_FIELD_X one of its enum settings. */
enum {
  TRT_FLAG_DETERMINISTIC = 0,       /* torch.are_deterministic_algorithms_enabled() */
  TRT_FLAG_DETERMINISTIC_WARN = 1,  /* torch.is_deterministic_algorithms_warn_only_enabled() */
  TRT_FLAG_FLASH_SDP = 2,           /* torch.backends.cuda.flash_sdp_enabled() */
  TRT_FLAG_MEM_EFFICIENT_SDP = 3,   /* torch.backends.cuda.mem_efficient_sdp_enabled() */
  TRT_FLAG_MATH_SDP = 4,            /* torch.backends.cuda.math_sdp_enabled() */
  TRT_FLAG_CUDNN_SDP = 5,           /* torch.backends.cuda.cudnn_sdp_enabled() */
  TRT_FLAG_CUDNN_TF32 = 6,          /* torch.backends.cudnn.allow_tf32 */
  TRT_FLAG_CUDNN = 7,               /* torch.backends.cudnn.enabled */
  TRT_FLAG_CUDNN_BENCHMARK = 8,     /* torch.backends.cudnn.benchmark */
  TRT_FLAG_CUDNN_DETERMINISTIC = 9, /* torch.backends.cudnn.deterministic */
  TRT_FLAG_CUDNN_TF32_MIXED = 10,   /* torch.backends.cudnn.allow_tf32 raises (Note [Flags that
                                       raise] in args.cpp) */
  TRT_FLAG_WARN_ALWAYS = 11,        /* torch.is_warn_always_enabled() */
  TRT_FIELD_MATMUL_PRECISION = 16,  /* torch.get_float32_matmul_precision() */
  TRT_FIELD_FP16_REDUCTION = 20,    /* ...matmul.allow_fp16_reduced_precision_reduction */
  TRT_FIELD_BF16_REDUCTION = 24,    /* ...matmul.allow_bf16_reduced_precision_reduction */
  TRT_MATMUL_PRECISION_MIXED = 15   /* the MATMUL_PRECISION field where the getter raises */
};

/* The runtime's services, handed to an SCM once by scm_init(). Note [No exception crosses the
 * ABI] in runtime.cpp: every entry point catches what PyTorch's C++ throws and reports it as
 * its return value (non-zero, or NULL), with the message pending for set_error(). */
/* A CUDA graph replay's parts (trt_graph_replay in trident_cuda.h), timed only while
 * Dispatcher._hit_profile runs (`on`): nanoseconds summed per part. */
enum {
  TRT_REPLAY_CHECK,     /* the graph for the call, its inputs' addresses, overlaps, outputs */
  TRT_REPLAY_COPY_IN,   /* the context, the copied-in arguments' copy launches */
  TRT_REPLAY_LAUNCH,    /* cuGraphLaunch */
  TRT_REPLAY_COPY_BACK, /* the written arguments' copy launches back */
  TRT_REPLAY_OUTPUTS,   /* outputs handed out or copied out */
  TRT_REPLAY_PARTS
};
typedef struct trt_replay_clock {
  int on;
  uint64_t last;
  uint64_t ns[TRT_REPLAY_PARTS];
} trt_replay_clock;

typedef struct trt_api {
  int32_t abi_version;
  /* Look an operator up in PyTorch's dispatcher ("aten::add", "Tensor"); NULL if absent. */
  trt_op* (*op)(const char* name, const char* overload);
  /* Boxed call: args[0..nargs) in schema order; writes nrets returns (new tensor handles). */
  int (*call)(trt_op* op, const trt_value* args, int32_t nargs, trt_value* rets, int32_t nrets);
  trt_tensor* (*retain)(trt_tensor* t); /* new handle to the same tensor; NULL on failure */
  void (*release)(trt_tensor* t);
  void (*release_list)(trt_value* list); /* a TRT_TENSOR_LIST returned by call() */
  /* A tensor's data pointer (a Triton launch's argument); non-zero on failure. */
  int (*data_ptr)(trt_tensor* t, void** out);
  /* Current stream of a CUDA device as a CUstream; NULL for the default stream. */
  int (*cuda_stream)(int32_t device_index, void** stream);
  /* Run a Python callback registered by the SCM's owner (a Triton kernel on CPU tensors through
   * Triton's interpreter). args are tensors and scalars; returns 0 on success. */
  int (*python_callback)(int64_t callback_id, const trt_value* args, int32_t nargs);
  /* Prefix the pending error with where it happened (the user's source line). */
  void (*set_error)(const char* where, const char* message);
  /* A new, uninitialized CUDA tensor (at::empty_strided): a CUDA graph's outputs are copied
   * into these (Note [CUDA graphs] in trident/frontend/graphs.py). NULL on failure. */
  trt_tensor* (*empty_strided)(int32_t dim, const int64_t* sizes, const int64_t* strides,
                               int32_t dtype, int32_t device_index);
  /* Note [Views in C]: a tensor's geometry as a trt_view whose base is `t` (borrowed); non-zero
   * for a tensor of more than TRT_MAX_VIEW_DIM dims. */
  int (*view_of)(trt_tensor* t, trt_view* out);
  /* A new tensor of a computed view, made as `how` says (TRT_VIEW_*); NULL on failure. */
  trt_tensor* (*view_tensor)(const trt_view* view, int32_t how);
  /* Note [Graph outputs] (frontend/graphs.py): `held` is a CUDA graph's static output (a
   * torch.Tensor PyObject* its owner keeps alive). output_in_use: whether a tensor other than
   * `held` holds its storage. graph_output: a new tensor of that storage, with its dtype and
   * geometry; NULL on failure. */
  int (*output_in_use)(const void* held);
  trt_tensor* (*graph_output)(const void* held);
  trt_replay_clock* replay_clock; /* never NULL */
} trt_api;

/* Operand constructors used by generated launch sequences. */
#define TRT_T(x) ((trt_value){TRT_TENSOR, 0, {.t = (x)}})
#define TRT_I(x) ((trt_value){TRT_INT, 0, {.i = (x)}})
#define TRT_F(x) ((trt_value){TRT_FLOAT, 0, {.f = (x)}})
#define TRT_B(x) ((trt_value){TRT_BOOL, 0, {.i = (x)}})
#define TRT_NONE_V ((trt_value){TRT_NONE, 0, {.i = 0}})
#define TRT_S(x) ((trt_value){TRT_STR, 0, {.s = (x)}})
#define TRT_DEV(type, index) ((trt_value){TRT_DEVICE, 0, {.i = (type) * 65536 + (index) + 1}})
#define TRT_IL(p, n) ((trt_value){TRT_INT_LIST, (n), {.ints = (p)}})
#define TRT_FL(p, n) ((trt_value){TRT_FLOAT_LIST, (n), {.floats = (p)}})
#define TRT_BL(p, n) ((trt_value){TRT_BOOL_LIST, (n), {.ints = (p)}})
#define TRT_TL(p, n) ((trt_value){TRT_TENSOR_LIST, (n), {.items = (p)}})
#define TRT_OTL(p, n) ((trt_value){TRT_OPT_TENSOR_LIST, (n), {.items = (p)}})


/* Float guards compare bit patterns, so NaN and -0.0 guard like any other value. */
static inline uint64_t trt_f64_bits(double f) {
  union { double f; uint64_t u; } v;
  v.f = f;
  return v.u;
}

/* Equal NUL-terminated strings (the process group guard). */
static inline int trt_streq(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

/* Python's // and % on ints, for size arithmetic (Note [Symbolic sizes] in trident/lower/plan.py).
   A divisor of 0 gives 0 and INT64_MIN // -1 wraps, where C would trap: the callers that may
   meet them check first (Note [Checked size steps] in trident/codegen/render.py). */
static inline int64_t trt_floordiv(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return b ? (int64_t)(0 - (uint64_t)a) : 0;
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t trt_mod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t m = a % b;
  return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}

/* Note [Checked size steps] in trident/codegen/render.py: Python's int operators on int64.
   A size step's form writes *r and returns non-zero where Python's answer is no int64 (it grew
   past 2**63) or Python raises (a zero divisor): the call runs eagerly. A guard's form returns
   the value and sets *bad instead: the guard is undecidable in C. */
static inline int trt_add_ck(int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); }
static inline int trt_sub_ck(int64_t a, int64_t b, int64_t* r) { return __builtin_sub_overflow(a, b, r); }
static inline int trt_mul_ck(int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); }
static inline int trt_neg_ck(int64_t a, int64_t* r) { return __builtin_sub_overflow((int64_t)0, a, r); }
static inline int trt_floordiv_ck(int64_t a, int64_t b, int64_t* r) {
  if (b == 0 || (b == -1 && a == INT64_MIN)) return 1;
  *r = trt_floordiv(a, b);
  return 0;
}
static inline int trt_mod_ck(int64_t a, int64_t b, int64_t* r) {
  if (b == 0) return 1;
  *r = trt_mod(a, b);
  return 0;
}
static inline int64_t trt_add_x(int64_t a, int64_t b, int* bad) { int64_t r; *bad |= trt_add_ck(a, b, &r); return r; }
static inline int64_t trt_mul_x(int64_t a, int64_t b, int* bad) { int64_t r; *bad |= trt_mul_ck(a, b, &r); return r; }
static inline int64_t trt_floordiv_x(int64_t a, int64_t b, int* bad) { int64_t r = 0; *bad |= trt_floordiv_ck(a, b, &r); return r; }
static inline int64_t trt_mod_x(int64_t a, int64_t b, int* bad) { int64_t r = 0; *bad |= trt_mod_ck(a, b, &r); return r; }
static inline int64_t trt_pow_x(int64_t a, int64_t e, int* bad) {  /* by squaring */
  int64_t r = 1;
  if (e < 0) { *bad = 1; return 0; }
  while (e > 0) {
    if (e & 1) *bad |= trt_mul_ck(r, a, &r);
    e >>= 1;
    if (e) *bad |= trt_mul_ck(a, a, &a);
  }
  return r;
}

/* The entry points every SCM exports. An SCM holds one specialization (Note [Incremental
   modules] in trident/build.py): match returns 0 when its guards hold, else TRT_MISS. */
typedef int (*trt_scm_init_fn)(const trt_api* api);
typedef int (*trt_scm_match_fn)(const trt_arg* args, int32_t nargs, const trt_env* env);
/* Returns 0 (the specialization ran), TRT_MISS, TRT_ERROR, TRT_CAPTURE or TRT_EAGER. */
typedef int (*trt_scm_call_fn)(const trt_arg* args, int32_t nargs, const trt_env* env,
                               trt_result* result);
#define TRT_MISS (-1)
#define TRT_ERROR (-2)
#define TRT_CAPTURE (-3) /* guards hold, and the specialization wants its CUDA graph captured */
/* a step failed before anything the call did was visible, inside the function's `try`: the call
   runs eagerly, which takes eager's branch (Note [Errors inside try] in source_lines.py) */
#define TRT_EAGER (-4)

/* The Python class a TRT_ERROR or TRT_EAGER raises, by the error's kind (runtime.cpp): the
   class eager PyTorch's exception has (c10::IndexError, ... or a Python callback's), so that
   `except IndexError` around a call catches it. trident/errors.py maps each name to its class;
   Python reads the values from here. TRT_ERR_EAGER is no op's error: what TRT_EAGER raises. */
enum {
  TRT_ERR_GENERIC = 0,
  TRT_ERR_INDEX = 1,
  TRT_ERR_VALUE = 2,
  TRT_ERR_TYPE = 3,
  TRT_ERR_NOT_IMPLEMENTED = 4,
  TRT_ERR_EAGER = 5,
  TRT_ERR_KINDS = 6,
};

#ifdef __cplusplus
}
#endif

#endif /* TRIDENT_RT_H */
