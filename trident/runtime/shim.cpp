// shim.cpp: the trt_api services an SCM calls (the table in trident_rt.h): boxed and unboxed
// calls into PyTorch's dispatcher, tensor handles, the current CUDA stream, Python callbacks
// for Triton's interpreter, and the pending error they leave.

#include "runtime_internal.h"

#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/python_variable.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <pybind11/pybind11.h>

#include <cstring>

namespace {

// ---- the pending error ---------------------------------------------------------------------

thread_local std::string g_error;
thread_local int g_error_kind = TRT_ERR_GENERIC;

// Note [No exception crosses the ABI]: the trt_api entry points are called from C (the SCMs),
// where a C++ exception is undefined behaviour; each one catches everything PyTorch's C++ may
// throw and returns an error code (or NULL), leaving the message for trt_api.set_error, as
// PyTorch's AOTInductor shim does (AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE).
int fail_with_current_exception() noexcept {
  try {
    throw;
  } catch (const c10::Error& e) {
    g_error = e.what_without_backtrace();
    g_error_kind = dynamic_cast<const c10::IndexError*>(&e)            ? TRT_ERR_INDEX
                   : dynamic_cast<const c10::ValueError*>(&e)          ? TRT_ERR_VALUE
                   : dynamic_cast<const c10::TypeError*>(&e)           ? TRT_ERR_TYPE
                   : dynamic_cast<const c10::NotImplementedError*>(&e) ? TRT_ERR_NOT_IMPLEMENTED
                                                                       : TRT_ERR_GENERIC;
  } catch (const std::exception& e) {
    g_error = e.what();
    g_error_kind = TRT_ERR_GENERIC;
  } catch (...) {
    g_error = "trident: an unknown C++ exception";
    g_error_kind = TRT_ERR_GENERIC;
  }
  return 1;
}

// ---- trt_value and IValue ------------------------------------------------------------------

c10::IValue to_ivalue(const trt_value& v) {
  switch (v.tag) {
    case TRT_NONE: return c10::IValue();
    case TRT_TENSOR: return c10::IValue(as_tensor(v.u.t));
    case TRT_INT: return c10::IValue(v.u.i);
    case TRT_FLOAT: return c10::IValue(v.u.f);
    case TRT_BOOL: return c10::IValue(v.u.i != 0);
    case TRT_INT_LIST: return c10::IValue(std::vector<int64_t>(v.u.ints, v.u.ints + v.len));
    case TRT_FLOAT_LIST: return c10::IValue(std::vector<double>(v.u.floats, v.u.floats + v.len));
    case TRT_BOOL_LIST: {
      c10::List<bool> l;
      for (int32_t i = 0; i < v.len; ++i) l.push_back(v.u.ints[i] != 0);
      return c10::IValue(std::move(l));
    }
    case TRT_TENSOR_LIST: {
      c10::List<at::Tensor> l;
      l.reserve(v.len);
      for (int32_t i = 0; i < v.len; ++i) l.push_back(as_tensor(v.u.items[i].u.t));
      return c10::IValue(std::move(l));
    }
    case TRT_OPT_TENSOR_LIST: {
      c10::List<std::optional<at::Tensor>> l;
      l.reserve(v.len);
      for (int32_t i = 0; i < v.len; ++i) {
        const trt_value& item = v.u.items[i];
        l.push_back(item.tag == TRT_TENSOR ? std::optional<at::Tensor>(as_tensor(item.u.t))
                                           : std::nullopt);
      }
      return c10::IValue(std::move(l));
    }
    case TRT_STR: return c10::IValue(std::string(v.u.s));
    case TRT_DEVICE:
      return c10::IValue(c10::Device(static_cast<c10::DeviceType>(v.u.i >> 16),
                                     static_cast<c10::DeviceIndex>((v.u.i & 0xffff) - 1)));
  }
  TORCH_CHECK(false, "trident: bad value tag ", v.tag);
}

void from_ivalue(c10::IValue&& iv, trt_value* out) {
  out->len = 0;
  if (iv.isTensor()) {
    out->tag = TRT_TENSOR;
    out->u.t = new_handle(std::move(iv).toTensor());
  } else if (iv.isNone()) {
    out->tag = TRT_NONE;
  } else if (iv.isBool()) {
    out->tag = TRT_BOOL;
    out->u.i = iv.toBool();
  } else if (iv.isInt()) {
    out->tag = TRT_INT;
    out->u.i = iv.toInt();
  } else if (iv.isDouble()) {
    out->tag = TRT_FLOAT;
    out->u.f = iv.toDouble();
  } else if (iv.isTensorList()) {
    auto list = std::move(iv).toTensorList();
    auto* items = new trt_value[list.size()];
    for (size_t i = 0; i < list.size(); ++i) {
      items[i].tag = TRT_TENSOR;
      items[i].len = 0;
      items[i].u.t = new_handle(at::Tensor(list.get(i)));
    }
    out->tag = TRT_TENSOR_LIST;
    out->len = static_cast<int32_t>(list.size());
    out->u.items = items;
  } else {
    TORCH_CHECK(false, "trident: unsupported return type ", iv.tagKind());
  }
}

// ---- trt_api ------------------------------------------------------------------------------

trt_op* api_op(const char* name, const char* overload) noexcept try {
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!h) return nullptr;
  auto* op = new trt_op{*h};
  op->release_gil = std::strncmp(name, "_c10d_functional::", 18) == 0;
  op->sync_all_reduce = std::strcmp(name, "_c10d_functional::all_reduce_") == 0 &&
                        std::strcmp(overload, "") == 0;
  // collectives stay boxed: the unboxed path keeps the GIL (wait_tensor's "T" would match)
  if (!op->release_gil) set_unboxed(op);
  return op;
} catch (...) {
  fail_with_current_exception();
  return nullptr;
}

int api_call(trt_op* op, const trt_value* args, int32_t nargs, trt_value* rets,
             int32_t nrets) noexcept {
  // Reused across calls: the GIL serializes SCM calls, and no op calls back into an SCM.
  thread_local torch::jit::Stack stack;
  try {
    if (op->unboxed && nargs == op->nargs && nrets == 1 && op->unboxed(op, args, rets)) return 0;
#ifdef TRT_HAVE_C10D
    if (op->sync_all_reduce && nrets == 1 && PyGILState_Check() &&
        sync_all_reduce(args, nargs, rets))
      return 0;
#endif
    stack.clear();
    for (int32_t i = 0; i < nargs; ++i) stack.emplace_back(to_ivalue(args[i]));
    if (op->release_gil && PyGILState_Check()) {
      pybind11::gil_scoped_release no_gil;
      op->handle.callBoxed(stack);
    } else {
      op->handle.callBoxed(stack);
    }
    TORCH_CHECK(static_cast<int32_t>(stack.size()) >= nrets, "trident: ",
                op->handle.schema().name(), " returned ", stack.size(), " values, expected ",
                nrets);
    for (int32_t i = 0; i < nrets; ++i) from_ivalue(std::move(stack[i]), &rets[i]);
    return 0;
  } catch (...) {
    return fail_with_current_exception();
  }
}

trt_tensor* api_retain(trt_tensor* t) noexcept {
  try {
    return new_handle(at::Tensor(as_tensor(t)));
  } catch (...) {
    fail_with_current_exception();
    return nullptr;
  }
}
void api_release(trt_tensor* t) noexcept { delete reinterpret_cast<at::Tensor*>(t); }
void api_release_list(trt_value* list) noexcept {
  for (int32_t i = 0; i < list->len; ++i) api_release(list->u.items[i].u.t);
  delete[] list->u.items;
  list->u.items = nullptr;
  list->len = 0;
}
int api_data_ptr(trt_tensor* t, void** out) noexcept {
  try {
    *out = as_tensor(t).data_ptr();
    return 0;
  } catch (...) {
    return fail_with_current_exception();
  }
}

int api_cuda_stream(int32_t device_index, void** stream) noexcept {
  try {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    *stream = impl.getStream(c10::Device(c10::DeviceType::CUDA, device_index)).native_handle();
    return 0;
  } catch (...) {
    return fail_with_current_exception();
  }
}

std::vector<PyObject*> g_callbacks;  // strong references, never freed (a few per function)

int api_python_callback(int64_t id, const trt_value* args, int32_t nargs) noexcept try {
  PyObject* tuple = PyTuple_New(nargs);
  if (!tuple) goto fail;
  for (int32_t i = 0; i < nargs; ++i) {
    PyObject* item = wrap_value(args[i], /*steal=*/false);
    if (!item) {
      Py_DECREF(tuple);
      goto fail;
    }
    PyTuple_SET_ITEM(tuple, i, item);
  }
  if (id < 0 || id >= static_cast<int64_t>(g_callbacks.size())) {
    Py_DECREF(tuple);
    PyErr_Format(PyExc_RuntimeError, "trident: no Python callback %lld", (long long)id);
    goto fail;
  }
  {
    PyObject* r = PyObject_Call(g_callbacks[id], tuple, nullptr);
    Py_DECREF(tuple);
    if (!r) goto fail;
    Py_DECREF(r);
  }
  return 0;
fail:
  // Keep the Python exception's text; the dispatcher raises a fresh error with the step's line.
  {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* s = value ? PyObject_Str(value) : nullptr;
    g_error = s ? PyUnicode_AsUTF8(s) : "python callback failed";
    auto is = [&](PyObject* cls) { return type && PyErr_GivenExceptionMatches(type, cls); };
    g_error_kind = is(PyExc_IndexError)            ? TRT_ERR_INDEX
                   : is(PyExc_ValueError)          ? TRT_ERR_VALUE
                   : is(PyExc_TypeError)           ? TRT_ERR_TYPE
                   : is(PyExc_NotImplementedError) ? TRT_ERR_NOT_IMPLEMENTED
                                                   : TRT_ERR_GENERIC;
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
  return 1;
} catch (...) {
  return fail_with_current_exception();
}

void api_set_error(const char* where, const char* message) noexcept {
  try {
    if (message) g_error_kind = TRT_ERR_GENERIC;  // the SCM's own error, not a failed op's
    std::string msg = message ? std::string(message) : g_error;
    g_error = std::string(where) + ": " + msg;
  } catch (...) {  // std::bad_alloc: keep the pending message
  }
}

trt_tensor* api_empty_strided(int32_t dim, const int64_t* sizes, const int64_t* strides,
                              int32_t dtype, int32_t device_index) noexcept {
  try {
    auto options = at::TensorOptions()
                       .dtype(static_cast<c10::ScalarType>(dtype))
                       .device(c10::Device(c10::DeviceType::CUDA,
                                           static_cast<c10::DeviceIndex>(device_index)));
    return new_handle(at::empty_strided(c10::IntArrayRef(sizes, dim),
                                        c10::IntArrayRef(strides, dim), options));
  } catch (...) {
    fail_with_current_exception();
    return nullptr;
  }
}

// Note [Graph outputs] in frontend/graphs.py. Called with the GIL held (from a hit).
const at::Tensor& static_output(const void* held) {
  return THPVariable_Unpack(static_cast<PyObject*>(const_cast<void*>(held)));
}

// The references a tensor's storage has (c10::StorageImpl's refcount): what output_in_use
// checks before a replay and Python's graphs._alone before it hands an output out.
size_t storage_holders_of(const at::Tensor& t) { return t.storage().use_count(); }

int api_output_in_use(const void* held) noexcept {
  return storage_holders_of(static_output(held)) != 1;
}

trt_tensor* api_graph_output(const void* held) noexcept {
  try {
    const at::Tensor& base = static_output(held);
    const c10::Storage& storage = base.storage();
    at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                              base.key_set(), base.dtype());
    c10::TensorImpl* impl = out.unsafeGetTensorImpl();
    impl->set_sizes_and_strides(base.sizes(), base.strides());
    impl->set_storage_offset(base.storage_offset());
    return new_handle(std::move(out));
  } catch (...) {
    fail_with_current_exception();
    return nullptr;
  }
}

trt_replay_clock g_replay_clock = {};

const trt_api g_api = {
    TRT_ABI_VERSION, api_op,          api_call,         api_retain,
    api_release,     api_release_list, api_data_ptr,     api_cuda_stream,
    api_python_callback, api_set_error, api_empty_strided, api_view_of,
    api_view_tensor, api_output_in_use, api_graph_output, &g_replay_clock,
};

}  // namespace
