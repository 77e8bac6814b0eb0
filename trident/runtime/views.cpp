// views.cpp: the trt_api services for the views an SCM computes in C (trident_views.h).

#include "runtime_internal.h"

#include <ATen/ops/as_strided.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>

namespace {

// Note [Views in C] (trident/lower/plan.py): a tensor's geometry, and tensors of computed views.
int api_view_of(trt_tensor* handle, trt_view* out) noexcept try {
  const at::Tensor& t = as_tensor(handle);
  int64_t dim = t.dim();
  if (dim > TRT_MAX_VIEW_DIM || !t.has_storage() || t.layout() != c10::kStrided) {
    g_error = "trident: a view computed in C of a tensor that is not strided, or of more than "
              "16 dims";
    g_error_kind = TRT_ERR_GENERIC;
    return 1;
  }
  const c10::Storage& storage = t.unsafeGetTensorImpl()->unsafe_storage();
  out->base = handle;
  out->data = static_cast<char*>(const_cast<void*>(storage.data()));
  out->itemsize = static_cast<int64_t>(t.itemsize());
  out->nbytes = static_cast<int64_t>(storage.nbytes());
  out->offset = t.storage_offset();
  out->dim = static_cast<int32_t>(dim);
  std::copy(t.sizes().begin(), t.sizes().end(), out->sizes);
  std::copy(t.strides().begin(), t.strides().end(), out->strides);
  return 0;
} catch (...) {
  return fail_with_current_exception();
}

trt_tensor* api_view_tensor(const trt_view* view, int32_t how) noexcept {
  try {
    const at::Tensor& base = as_tensor(view->base);
    c10::IntArrayRef sizes(view->sizes, view->dim), strides(view->strides, view->dim);
    if (how == TRT_VIEW_EAGER) return new_handle(at::as_strided(base, sizes, strides, view->offset));
    // ATen's alias_with_sizes_and_strides (TensorShape.cpp), the kernel of every view op
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), base.dtype());
    auto* impl = t.unsafeGetTensorImpl();
    impl->set_sizes_and_strides(sizes, strides, view->offset);
    if (how == TRT_VIEW_KERNEL && !base.is_inference())
      impl->set_version_counter(base.unsafeGetTensorImpl()->version_counter());
    // Eager's view of a tensor that requires grad requires grad, under no_grad and
    // inference_mode too, unless the base is an inference tensor (torch 2.11-2.13), and
    // composite ops read the flag: ATen's matmul folds into one mm where the smaller operand
    // requires grad (should_fold, LinearAlgebra.cpp), another kernel than bmm.
    if (how == TRT_VIEW_KERNEL && base.requires_grad() && !base.is_inference())
      t.set_requires_grad(true);
    return new_handle(std::move(t));
  } catch (...) {
    fail_with_current_exception();
    g_error_kind = TRT_ERR_GENERIC;
    return nullptr;
  }
}

}  // namespace
