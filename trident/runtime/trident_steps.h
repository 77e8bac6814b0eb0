/* The calls of an SCM's launch sequence that every step shares (templates/scm_common.jinja), so
 * a step is one line of C, not a block of them: the C compiler's time grows with an SCM's
 * length (docs/benchmarks.md, "The C build"). Included by SCMs only, not by the runtime's
 * build; the Build key of an SCM (trident/build.py) hashes it. */
#ifndef TRIDENT_STEPS_H
#define TRIDENT_STEPS_H

#include "trident_rt.h"

/* Note [Parallel C build] in trident/build.py: what one translation unit of an SCM defines and
 * another uses (the runtime's table, the operators, the guard, the parts of the launch
 * sequence) is hidden: seen by the module's units, not exported, and reached without the
 * global offset table. */
#if defined(__GNUC__)
#define TRT_SHARED __attribute__((visibility("hidden")))
#else
#define TRT_SHARED
#endif

/* `op` called on `args`; on failure (non-zero) the error names the step: `at`, the user's
 * "file.py:LINE (aten::op)" that codegen wrote. */
static inline int trt_call_at(const trt_api* rt, trt_op* op, const trt_value* args, int32_t nargs,
                              trt_value* rets, int32_t nrets, const char* at) {
  if (!rt->call(op, args, nargs, rets, nrets)) return 0;
  rt->set_error(at, NULL);
  return 1;
}

/* Note [Buffer reuse] in trident/lower/plan.py: a functional op that writes into `*buffer`, an
 * earlier call's result, through its .out overload `op_out` where `reuse` holds and the buffer
 * is made; else `op` itself, whose result becomes the buffer (when `reuse` holds). `args` has
 * `nargs` operands and one more slot, the buffer's (read only by `op_out`). */
static inline int trt_call_into(const trt_api* rt, trt_op* op, trt_op* op_out,
                                const trt_value* args, int32_t nargs, trt_tensor** buffer,
                                int reuse, trt_value* rets, int32_t nrets, const char* at,
                                const char* at_out) {
  if (*buffer && reuse) return trt_call_at(rt, op_out, args, nargs + 1, rets, nrets, at_out);
  if (trt_call_at(rt, op, args, nargs, rets, nrets, at)) return 1;
  if (reuse && !*buffer) *buffer = rt->retain(rets[0].u.t); /* NULL: not reused */
  return 0;
}

/* A tensor a step owns, released where it was made (Note [Handle ownership] in trident_rt.h),
 * and forgotten. */
static inline void trt_drop(const trt_api* rt, trt_tensor** t) {
  if (*t) rt->release(*t);
  *t = NULL;
}

/* Note [Views in C] in trident/lower/plan.py: the tensor of view `w` made `how` into `*t`,
 * unless a step made it; on failure the error names `at`. */
static inline int trt_view_at(const trt_api* rt, trt_tensor** t, const trt_view* w, int32_t how,
                              const char* at) {
  if (*t || (*t = rt->view_tensor(w, how))) return 0;
  rt->set_error(at, NULL);
  return 1;
}

#endif
