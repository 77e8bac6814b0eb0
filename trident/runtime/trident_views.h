/*
 * trident_views.h: the size, stride and storage-offset arithmetic of ATen's view ops, for
 * Specialization Cache Modules (Note [Views in C] in trident/lower/plan.py).
 *
 * Each function mirrors the ATen kernel named above it (aten/src/ATen/native/TensorShape.cpp,
 * TensorUtils.cpp, ExpandUtils.cpp, InferSize.h; PyTorch 2.11-2.13) and writes the view of
 * `in` to `out` (never the same struct). Dims are wrapped by codegen (the rank of a view's
 * input is static). Each returns 0, or 1 where ATen would raise or where the arithmetic leaves
 * what it can check: the launch sequence then calls the op itself through the dispatcher, which
 * raises eager's exception (or returns the view). tests/test_views.py checks every function
 * against eager PyTorch.
 *
 * The sizes, strides and ints a view step reads may be the call's ints (`x.view(n, -1)`,
 * `x[::k]`), any int64: every product and sum that such a value reaches is checked
 * (GCC's and Clang's __builtin_*_overflow, as Note [Checked size steps] in
 * trident/codegen/render.py checks size steps), and one that int64 cannot hold returns 1: the
 * op itself then gives eager's view or raises eager's exception, never a wrapped size.
 */
#ifndef TRIDENT_VIEWS_H
#define TRIDENT_VIEWS_H

#include <stdint.h>

#include "trident_rt.h"

static inline void trt_view_header(const trt_view* in, trt_view* out, int32_t dim) {
  out->base = in->base;
  out->data = in->data;
  out->itemsize = in->itemsize;
  out->nbytes = in->nbytes;
  out->offset = in->offset;
  out->dim = dim;
}

static inline int64_t trt_view_numel(const trt_view* v) {
  int64_t n = 1;
  for (int32_t d = 0; d < v->dim; ++d) n *= v->sizes[d]; /* a tensor's: ATen checked it */
  return n;
}

/* a * b + c, or 1 where int64 cannot hold a step of it (Note [Checked size steps]). */
static inline int trt_view_muladd(int64_t a, int64_t b, int64_t c, int64_t* out) {
  return __builtin_mul_overflow(a, b, out) || __builtin_add_overflow(*out, c, out);
}

/* 1 where the number of elements of the sizes `out` holds is no int64 (ATen raises). */
static inline int trt_view_too_many(const trt_view* out) {
  int64_t n = 1;
  for (int32_t d = 0; d < out->dim; ++d)
    if (__builtin_mul_overflow(n, out->sizes[d], &n)) return 1;
  return 0;
}

/* aten::transpose.int; aten::t is transpose(0, dim < 2 ? 0 : 1). */
static inline int trt_view_transpose(const trt_view* in, int32_t d0, int32_t d1, trt_view* out) {
  trt_view_header(in, out, in->dim);
  for (int32_t d = 0; d < in->dim; ++d) {
    int32_t from = d == d0 ? d1 : d == d1 ? d0 : d;
    out->sizes[d] = in->sizes[from];
    out->strides[d] = in->strides[from];
  }
  return 0;
}

/* aten::permute (dims wrapped and checked by codegen). */
static inline int trt_view_permute(const trt_view* in, const int64_t* dims, trt_view* out) {
  trt_view_header(in, out, in->dim);
  for (int32_t d = 0; d < in->dim; ++d) {
    out->sizes[d] = in->sizes[dims[d]];
    out->strides[d] = in->strides[dims[d]];
  }
  return 0;
}

/* aten::unsqueeze: inferUnsqueezeGeometry. */
static inline int trt_view_unsqueeze(const trt_view* in, int32_t dim, trt_view* out) {
  if (in->dim + 1 > TRT_MAX_VIEW_DIM) return 1;
  trt_view_header(in, out, in->dim + 1);
  for (int32_t d = 0, o = 0; d <= in->dim; ++d, ++o) {
    if (d == dim) {
      out->sizes[o] = 1;
      if (dim >= in->dim) out->strides[o] = 1;
      else if (trt_view_muladd(in->sizes[dim], in->strides[dim], 0, &out->strides[o])) return 1;
      ++o;
    }
    if (d < in->dim) {
      out->sizes[o] = in->sizes[d];
      out->strides[o] = in->strides[d];
    }
  }
  return 0;
}

/* aten::squeeze, squeeze.dim, squeeze.dims: inferSqueezeGeometry over the dims in `mask`. */
static inline int trt_view_squeeze(const trt_view* in, uint32_t mask, trt_view* out) {
  int32_t o = 0;
  for (int32_t d = 0; d < in->dim; ++d) {
    if ((mask >> d & 1) && in->sizes[d] == 1) continue;
    out->sizes[o] = in->sizes[d];
    out->strides[o] = in->strides[d];
    ++o;
  }
  trt_view_header(in, out, o);
  return 0;
}

/* aten::slice.Tensor (start None is 0, end None is INT64_MAX). */
static inline int trt_view_slice(const trt_view* in, int32_t dim, int64_t start, int64_t end,
                                 int64_t step, trt_view* out) {
  if (in->dim == 0 || step <= 0) return 1;
  int64_t size = in->sizes[dim];
  if (start == INT64_MAX) start = 0;
  if (start < 0) start += size;
  if (end < 0) end += size;
  if (start < 0) start = 0;
  else if (start >= size) start = size;
  if (end < start) end = start;
  else if (end >= size) end = size;
  trt_view_header(in, out, in->dim);
  for (int32_t d = 0; d < in->dim; ++d) {
    out->sizes[d] = in->sizes[d];
    out->strides[d] = in->strides[d];
  }
  int64_t len; /* end - start + step - 1 (0 <= start <= end <= size) */
  if (trt_view_muladd(start, in->strides[dim], in->offset, &out->offset) ||
      trt_view_muladd(in->strides[dim], step, 0, &out->strides[dim]) ||
      __builtin_add_overflow(end - start, step - 1, &len))
    return 1;
  out->sizes[dim] = len / step;
  return 0;
}

/* aten::select.int */
static inline int trt_view_select(const trt_view* in, int32_t dim, int64_t index, trt_view* out) {
  if (in->dim == 0) return 1;
  int64_t size = in->sizes[dim];
  if (size <= -1 - index || size <= index) return 1; /* IndexError: out of range */
  if (index < 0) index += size;
  trt_view_header(in, out, in->dim - 1);
  for (int32_t d = 0, o = 0; d < in->dim; ++d) {
    if (d == dim) continue;
    out->sizes[o] = in->sizes[d];
    out->strides[o] = in->strides[d];
    ++o;
  }
  return trt_view_muladd(index, in->strides[dim], in->offset, &out->offset);
}

/* aten::view, aten::_unsafe_view: infer_size (a -1) and at::detail::computeStride. */
static inline int trt_view_view(const trt_view* in, const int64_t* shape, int32_t n,
                                trt_view* out) {
  if (n > TRT_MAX_VIEW_DIM) return 1;
  int64_t numel = trt_view_numel(in), known = 1;
  int32_t infer = -1;
  for (int32_t d = 0; d < n; ++d) {
    if (shape[d] == -1) {
      if (infer >= 0) return 1;
      infer = d;
    } else if (shape[d] >= 0) {
      if (__builtin_mul_overflow(known, shape[d], &known)) return 1;
    } else {
      return 1;
    }
  }
  trt_view_header(in, out, n);
  for (int32_t d = 0; d < n; ++d) out->sizes[d] = shape[d];
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) return 1;
    out->sizes[infer] = numel / known;
  } else if (known != numel) {
    return 1;
  }
  if (in->dim == 0) {
    for (int32_t d = 0; d < n; ++d) out->strides[d] = 1;
    return 0;
  }
  if (numel == 0) {
    int same = in->dim == n;
    for (int32_t d = 0; same && d < n; ++d) same = in->sizes[d] == out->sizes[d];
    for (int32_t d = n - 1; d >= 0; --d)
      if (same || d == n - 1) out->strides[d] = same ? in->strides[d] : 1;
      else if (trt_view_muladd(out->sizes[d + 1] > 1 ? out->sizes[d + 1] : 1,
                               out->strides[d + 1], 0, &out->strides[d]))
        return 1;
    return 0;
  }
  int32_t view_d = n - 1;
  int64_t chunk_base_stride = in->strides[in->dim - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int32_t tensor_d = in->dim - 1; tensor_d >= 0; --tensor_d) {
    int64_t contiguous; /* (a size-1 dim's stride may be any int64) */
    tensor_numel *= in->sizes[tensor_d];
    if (trt_view_muladd(tensor_numel, chunk_base_stride, 0, &contiguous)) return 1;
    if (tensor_d == 0 || (in->sizes[tensor_d - 1] != 1 &&
                          in->strides[tensor_d - 1] != contiguous)) {
      while (view_d >= 0 && (view_numel < tensor_numel || out->sizes[view_d] == 1)) {
        if (trt_view_muladd(view_numel, chunk_base_stride, 0, &out->strides[view_d]) ||
            __builtin_mul_overflow(view_numel, out->sizes[view_d], &view_numel))
          return 1;
        --view_d;
      }
      if (view_numel != tensor_numel) return 1; /* not viewable: ATen raises */
      if (tensor_d > 0) {
        chunk_base_stride = in->strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d != -1;
}

/* aten::expand: inferExpandGeometry. */
static inline int trt_view_expand(const trt_view* in, const int64_t* shape, int32_t n,
                                  trt_view* out) {
  if (n < in->dim || n > TRT_MAX_VIEW_DIM) return 1;
  trt_view_header(in, out, n);
  for (int32_t i = n - 1; i >= 0; --i) {
    int32_t dim = in->dim - 1 - (n - 1 - i);
    int64_t size = dim >= 0 ? in->sizes[dim] : 1;
    int64_t stride = dim >= 0 || i == n - 1 ? (dim >= 0 ? in->strides[dim] : 1) : 0;
    if (dim < 0 && i < n - 1 &&
        trt_view_muladd(out->sizes[i + 1], out->strides[i + 1], 0, &stride))
      return 1;
    int64_t target = shape[i];
    if (target < -1) return 1;
    if (target == -1) {
      if (dim < 0) return 1;
      target = size;
    }
    if (size != target) {
      if (size != 1) return 1;
      size = target;
      stride = 0;
    }
    out->sizes[i] = size;
    out->strides[i] = stride;
  }
  if (in->dim == 0)
    for (int32_t i = 0; i < n; ++i) out->strides[i] = 0;
  return trt_view_too_many(out);
}

/* aten::as_strided (has_offset 0: the input's storage offset): setStrided's checks. */
static inline int trt_view_as_strided(const trt_view* in, const int64_t* sizes,
                                      const int64_t* strides, int32_t n, int32_t has_offset,
                                      int64_t offset, trt_view* out) {
  if (n > TRT_MAX_VIEW_DIM) return 1;
  if (!has_offset) offset = in->offset;
  if (offset < 0) return 1;
  int64_t extent = 1, empty = 0;
  for (int32_t d = 0; d < n; ++d) {
    int64_t step;
    if (sizes[d] < 0 || strides[d] < 0) return 1;
    if (sizes[d] == 0) empty = 1;
    else if (__builtin_mul_overflow(strides[d], sizes[d] - 1, &step) ||
             __builtin_add_overflow(extent, step, &extent))
      return 1;
  }
  int64_t end;
  if (!empty && (__builtin_add_overflow(extent, offset, &end) ||
                 __builtin_mul_overflow(end, in->itemsize, &end) || end > in->nbytes))
    return 1;
  trt_view_header(in, out, n);
  out->offset = offset;
  for (int32_t d = 0; d < n; ++d) {
    out->sizes[d] = sizes[d];
    out->strides[d] = strides[d];
  }
  return trt_view_too_many(out);
}

/* A view step that the arithmetic above does not compute: the op itself, through the
 * dispatcher, on `tensor` (or, when NULL, on view `in` made as eager makes it) and the op's other
 * arguments `rest`. Its result goes to *result and, unless `out` is NULL, its geometry to *out.
 * On failure (non-zero) the error names the step: `at`, the user's "file.py:LINE (aten::op)". */
static inline int trt_view_by_op(const trt_api* rt, trt_op* op, trt_tensor* tensor,
                                 const trt_view* in, const trt_value* rest, int32_t nrest,
                                 trt_tensor** result, trt_view* out, const char* at) {
  trt_value args[8], r;
  trt_tensor* src = tensor ? tensor : rt->view_tensor(in, TRT_VIEW_EAGER);
  if (!src || nrest > 7) goto failed;
  args[0] = TRT_T(src);
  for (int32_t i = 0; i < nrest; ++i) args[i + 1] = rest[i];
  int called = rt->call(op, args, nrest + 1, &r, 1);
  if (!tensor) rt->release(src);
  if (called) goto failed;
  *result = r.u.t;
  if (!out || !rt->view_of(*result, out)) return 0;
failed:
  rt->set_error(at, NULL);
  return 1;
}

#endif /* TRIDENT_VIEWS_H */
