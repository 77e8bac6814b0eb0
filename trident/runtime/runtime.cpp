// Trident's native runtime, built once per (torch, Python) pair by trident/runtime/__init__.py.
//
// It owns the two things plain C cannot do:
//   * the `Dispatcher` type: the object a user calls. Its tp_call reads the arguments into
//     `trt_arg`s and enters the installed SCM; on a hit no Python code runs (Note [Hit path]);
//   * the `trt_api` services an SCM calls: boxed calls into PyTorch's dispatcher, tensor handles,
//     the current CUDA stream, Python callbacks for Triton's interpreter.
//
// Note [Hit path]: user call -> Dispatcher.tp_call -> scm_call (guards, launch sequence) -> wrap
// outputs -> return. Python is entered only when the SCM reports TRT_MISS (`_tree_miss`, or
// `_slow_path` when no installed tree accepts the call) or for a kernel that the SCM runs
// through a registered callback (counted by the SCM's owner).

#include <Python.h>
#include <structmember.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/Dtype.h>
#if __has_include(<torch/csrc/distributed/c10d/GroupRegistry.hpp>)
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#define TRT_HAVE_C10D 1
#endif
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "trident_rt.h"

struct trt_op {
  c10::OperatorHandle handle;
  // A collective (the _c10d_functional namespace) runs without the GIL, as every op called
  // from Python does (torch's invokeOperatorFromPython releases it): the process group's
  // worker thread may drop the last reference to a tensor that has a Python object, which takes
  // the GIL, while wait_tensor waits for that thread. Holding the GIL there deadlocked gloo.
  bool release_gil = false;
  // Note [Synchronous all-reduce] in trident/collectives.py: _c10d_functional::all_reduce_ is
  // served by the process group's allreduce with asyncOp off, as dist.all_reduce(t) does.
  bool sync_all_reduce = false;
  // Note [Unboxed calls]: the operator's c10::TypedOperatorHandle and the function that calls
  // it with trt_values, for the signatures in kUnboxed; null: boxed calls only.
  void* typed = nullptr;
  bool (*unboxed)(const trt_op* op, const trt_value* args, trt_value* ret) = nullptr;
  int32_t nargs = 0;
};

namespace {

thread_local std::string g_error;
// The pending error's kind (TRT_ERR_* in trident_rt.h), an index into ErrorTypes (trident/
// errors.py: TridentError and its IndexError, ValueError, TypeError, NotImplementedError twins).
thread_local int g_error_kind = TRT_ERR_GENERIC;

at::Tensor& as_tensor(trt_tensor* t) { return *reinterpret_cast<at::Tensor*>(t); }
trt_tensor* new_handle(at::Tensor&& t) {
  return reinterpret_cast<trt_tensor*>(new at::Tensor(std::move(t)));
}

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

// ---- Note [Unboxed calls] -------------------------------------------------------------------
//
// A boxed call turns every operand into an IValue on a stack, and the kernel's boxed wrapper
// turns them back. For operators of the common signatures below (the matmul family,
// elementwise ops, their .out and in-place overloads, allocation), the runtime calls the
// operator's typed handle instead: the same dispatcher, dispatch keys and kernel, so the same
// result bit for bit, without the stack. An operand whose tag the signature does not expect
// takes the boxed call. Each argument kind is one letter: T Tensor, W Tensor(a!) (written),
// O Tensor?, S Scalar, I int, B bool, Z SymInt[], d ScalarType?, l Layout?, v Device?,
// p bool?, m MemoryFormat?; "&" after them: the return is the written tensor.

template <char K> struct Arg;
template <> struct Arg<'T'> {
  using type = const at::Tensor&;
  static bool ok(const trt_value& v) { return v.tag == TRT_TENSOR; }
  static const at::Tensor& get(const trt_value& v) { return as_tensor(v.u.t); }
};
template <> struct Arg<'W'> {
  using type = at::Tensor&;
  static bool ok(const trt_value& v) { return v.tag == TRT_TENSOR; }
  static at::Tensor& get(const trt_value& v) { return as_tensor(v.u.t); }
};
template <> struct Arg<'O'> {
  using type = const std::optional<at::Tensor>&;
  static bool ok(const trt_value& v) { return v.tag == TRT_TENSOR || v.tag == TRT_NONE; }
  static std::optional<at::Tensor> get(const trt_value& v) {
    return v.tag == TRT_TENSOR ? std::optional<at::Tensor>(as_tensor(v.u.t)) : std::nullopt;
  }
};
template <> struct Arg<'S'> {
  using type = const at::Scalar&;
  static bool ok(const trt_value& v) {
    return v.tag == TRT_INT || v.tag == TRT_FLOAT || v.tag == TRT_BOOL;
  }
  static at::Scalar get(const trt_value& v) {  // as IValue::toScalar makes it
    return v.tag == TRT_FLOAT ? at::Scalar(v.u.f)
           : v.tag == TRT_BOOL ? at::Scalar(v.u.i != 0)
                               : at::Scalar(v.u.i);
  }
};
template <> struct Arg<'I'> {
  using type = int64_t;
  static bool ok(const trt_value& v) { return v.tag == TRT_INT; }
  static int64_t get(const trt_value& v) { return v.u.i; }
};
template <> struct Arg<'B'> {
  using type = bool;
  static bool ok(const trt_value& v) { return v.tag == TRT_BOOL; }
  static bool get(const trt_value& v) { return v.u.i != 0; }
};
template <> struct Arg<'Z'> {
  using type = c10::SymIntArrayRef;
  static bool ok(const trt_value& v) { return v.tag == TRT_INT_LIST; }
  static c10::SymIntArrayRef get(const trt_value& v) {
    return c10::fromIntArrayRefSlow(c10::IntArrayRef(v.u.ints, v.len));
  }
};
template <class E> struct OptionalEnum {
  using type = std::optional<E>;
  static bool ok(const trt_value& v) { return v.tag == TRT_INT || v.tag == TRT_NONE; }
  static std::optional<E> get(const trt_value& v) {
    return v.tag == TRT_INT ? std::optional<E>(static_cast<E>(v.u.i)) : std::nullopt;
  }
};
template <> struct Arg<'d'> : OptionalEnum<c10::ScalarType> {};
template <> struct Arg<'l'> : OptionalEnum<c10::Layout> {};
template <> struct Arg<'m'> : OptionalEnum<c10::MemoryFormat> {};
template <> struct Arg<'v'> {
  using type = std::optional<c10::Device>;
  static bool ok(const trt_value& v) { return v.tag == TRT_DEVICE || v.tag == TRT_NONE; }
  static std::optional<c10::Device> get(const trt_value& v) {
    if (v.tag == TRT_NONE) return std::nullopt;
    return c10::Device(static_cast<c10::DeviceType>(v.u.i >> 16),
                       static_cast<c10::DeviceIndex>((v.u.i & 0xffff) - 1));
  }
};
template <> struct Arg<'p'> {
  using type = std::optional<bool>;
  static bool ok(const trt_value& v) { return v.tag == TRT_BOOL || v.tag == TRT_NONE; }
  static std::optional<bool> get(const trt_value& v) {
    return v.tag == TRT_BOOL ? std::optional<bool>(v.u.i != 0) : std::nullopt;
  }
};

template <bool Written, char... Ks>
struct Unboxed {
  using Ret = std::conditional_t<Written, at::Tensor&, at::Tensor>;
  using Sig = Ret(typename Arg<Ks>::type...);
  using Handle = c10::TypedOperatorHandle<Sig>;

  static void* make(const c10::OperatorHandle& h) { return new Handle(h.typed<Sig>()); }

  static bool call(const trt_op* op, const trt_value* a, trt_value* ret) {
    return call_with(op, a, ret, std::make_index_sequence<sizeof...(Ks)>{});
  }

  template <size_t... I>
  static bool call_with(const trt_op* op, const trt_value* a, trt_value* ret,
                        std::index_sequence<I...>) {
    if (!(Arg<Ks>::ok(a[I]) && ...)) return false;
    Ret r = static_cast<const Handle*>(op->typed)->call(Arg<Ks>::get(a[I])...);
    ret->tag = TRT_TENSOR;
    ret->len = 0;
    ret->u.t = new_handle(at::Tensor(r));
    return true;
  }
};

struct UnboxedSignature {
  const char* kinds;
  void* (*make)(const c10::OperatorHandle&);
  bool (*call)(const trt_op*, const trt_value*, trt_value*);
};

template <bool Written, char... Ks>
constexpr UnboxedSignature sig(const char* kinds) {
  return {kinds, &Unboxed<Written, Ks...>::make, &Unboxed<Written, Ks...>::call};
}

const UnboxedSignature kUnboxed[] = {
    // functional: relu, mul/div/mm/bmm/matmul, add/sub, mul.Scalar, add.Scalar, where,
    // addmm/baddbmm, linear, softmax/_softmax
    sig<false, 'T'>("T"), sig<false, 'T', 'T'>("TT"), sig<false, 'T', 'T', 'S'>("TTS"),
    sig<false, 'T', 'S'>("TS"), sig<false, 'T', 'S', 'S'>("TSS"),
    sig<false, 'T', 'T', 'T'>("TTT"), sig<false, 'T', 'T', 'T', 'S', 'S'>("TTTSS"),
    sig<false, 'T', 'T', 'O'>("TTO"), sig<false, 'T', 'I', 'd'>("TId"),
    sig<false, 'T', 'I', 'B'>("TIB"),
    // .out overloads (Note [Buffer reuse] in plan.py)
    sig<true, 'T', 'W'>("TW&"), sig<true, 'T', 'T', 'W'>("TTW&"),
    sig<true, 'T', 'T', 'S', 'W'>("TTSW&"), sig<true, 'T', 'S', 'W'>("TSW&"),
    sig<true, 'T', 'S', 'S', 'W'>("TSSW&"), sig<true, 'T', 'T', 'T', 'W'>("TTTW&"),
    sig<true, 'T', 'T', 'T', 'S', 'S', 'W'>("TTTSSW&"),
    // in place: relu_, mul_, add_, mul_.Scalar, copy_
    sig<true, 'W'>("W&"), sig<true, 'W', 'T'>("WT&"), sig<true, 'W', 'T', 'S'>("WTS&"),
    sig<true, 'W', 'S'>("WS&"), sig<true, 'W', 'T', 'B'>("WTB&"),
    // allocation: empty.memory_format, empty_like
    sig<false, 'Z', 'd', 'l', 'v', 'p', 'm'>("Zdlvpm"),
    sig<false, 'T', 'd', 'l', 'v', 'p', 'm'>("Tdlvpm"),
};

// The kinds string of a schema (Note [Unboxed calls]); "" for one no kUnboxed entry can take.
std::string unboxed_kinds(const c10::FunctionSchema& schema) {
  using c10::TypeKind;
  std::string kinds;
  for (const auto& arg : schema.arguments()) {
    const c10::TypePtr& type = arg.real_type();
    bool written = arg.alias_info() && arg.alias_info()->isWrite();
    TypeKind kind = type->kind();
    if (kind == TypeKind::TensorType) {
      kinds += written ? 'W' : 'T';
      continue;
    }
    if (written) return "";
    if (kind == TypeKind::NumberType) kinds += 'S';
    else if (kind == TypeKind::IntType) kinds += 'I';
    else if (kind == TypeKind::BoolType) kinds += 'B';
    else if (kind == TypeKind::ListType &&
             type->expectRef<c10::ListType>().getElementType()->kind() == TypeKind::SymIntType)
      kinds += 'Z';
    else if (kind == TypeKind::OptionalType) {
      TypeKind inner = type->expectRef<c10::OptionalType>().getElementType()->kind();
      kinds += inner == TypeKind::TensorType         ? 'O'
               : inner == TypeKind::ScalarTypeType   ? 'd'
               : inner == TypeKind::LayoutType       ? 'l'
               : inner == TypeKind::DeviceObjType    ? 'v'
               : inner == TypeKind::BoolType         ? 'p'
               : inner == TypeKind::MemoryFormatType ? 'm'
                                                     : '?';
    } else {
      return "";
    }
  }
  const auto& returns = schema.returns();
  if (returns.size() != 1 || returns[0].real_type()->kind() != TypeKind::TensorType) return "";
  if (returns[0].alias_info() && returns[0].alias_info()->isWrite()) kinds += '&';
  return kinds;
}

// ---- trt_api ------------------------------------------------------------------------------

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

trt_op* api_op(const char* name, const char* overload) noexcept try {
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!h) return nullptr;
  auto* op = new trt_op{*h};
  op->release_gil = std::strncmp(name, "_c10d_functional::", 18) == 0;
  op->sync_all_reduce = std::strcmp(name, "_c10d_functional::all_reduce_") == 0 &&
                        std::strcmp(overload, "") == 0;
  // collectives stay boxed: the unboxed path keeps the GIL (wait_tensor's "T" would match)
  std::string kinds = op->release_gil ? "" : unboxed_kinds(h->schema());
  for (const auto& entry : kUnboxed) {
    if (kinds != entry.kinds) continue;
    try {
      op->typed = entry.make(*h);  // checks the C++ signature against the schema
      op->unboxed = entry.call;
      op->nargs = static_cast<int32_t>(kinds.size()) - (kinds.back() == '&');
    } catch (const c10::Error&) {
      op->typed = nullptr;  // a signature the operator does not have: boxed calls
    }
    break;
  }
  return op;
} catch (...) {
  fail_with_current_exception();
  return nullptr;
}

#ifdef TRT_HAVE_C10D
template <typename O, typename = void>
struct has_async_op : std::false_type {};
template <typename O>
struct has_async_op<O, std::void_t<decltype(std::declval<O&>().asyncOp)>> : std::true_type {};

// Note [Synchronous all-reduce] in trident/collectives.py: all_reduce_(t, op, group) as
// dist.all_reduce(t, op, group) runs it: the group's allreduce with asyncOp off (NCCL then works
// on the caller's stream), then Work::wait. False: an op name this does not map (the boxed op).
bool sync_all_reduce(const trt_value* args, int32_t nargs, trt_value* rets) {
  if (nargs != 3 || args[0].tag != TRT_TENSOR || args[1].tag != TRT_STR || args[2].tag != TRT_STR)
    return false;
  static const std::pair<const char*, c10d::ReduceOp::RedOpType> kOps[] = {
      {"sum", c10d::ReduceOp::SUM}, {"avg", c10d::ReduceOp::AVG},
      {"product", c10d::ReduceOp::PRODUCT}, {"min", c10d::ReduceOp::MIN},
      {"max", c10d::ReduceOp::MAX}};
  const auto* found = std::find_if(std::begin(kOps), std::end(kOps), [&](const auto& entry) {
    return std::strcmp(entry.first, args[1].u.s) == 0;
  });
  if (found == std::end(kOps)) return false;
  auto group = c10d::resolve_process_group(args[2].u.s);
  std::vector<at::Tensor> tensors{as_tensor(args[0].u.t)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(found->second);
  if constexpr (has_async_op<c10d::AllreduceOptions>::value) opts.asyncOp = false;
  {
    pybind11::gil_scoped_release no_gil;  // as for every collective (trt_op::release_gil)
    auto work = group->allreduce(tensors, opts);
    if (work) work->wait();
  }
  from_ivalue(c10::IValue(tensors[0]), &rets[0]);
  return true;
}
#endif

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

PyObject* wrap_value(const trt_value& v, bool steal);

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

// Note [Views in C] (trident/plan.py): a tensor's geometry, and tensors of computed views.
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

const trt_api g_api = {
    TRT_ABI_VERSION, api_op,          api_call,         api_retain,
    api_release,     api_release_list, api_data_ptr,     api_cuda_stream,
    api_python_callback, api_set_error, api_empty_strided, api_view_of,
    api_view_tensor,
};

// ---- reading arguments and building results ------------------------------------------------

void read_tensor(PyObject* obj, trt_arg* a, bool forward_ad);

// Whether a forward-AD level is open (torch.autograd.forward_ad.dual_level): only then can a
// tensor carry a tangent. Levels close in the order they opened, and closing one clears its
// tangents (torch/csrc/autograd/forward_grad.h), so level 0 is open if any is. Reading a tensor's
// tangent takes two mutexes; this takes one per call.
bool forward_ad_open() {
  return torch::autograd::ForwardADLevel::try_get_by_idx(0) != nullptr;
}

// What the guards read of one argument; anything they cannot read is TRT_ARG_OTHER (a miss that
// Python runs eagerly): no C++ exception leaves this function.
void read_arg(PyObject* obj, trt_arg* a, bool forward_ad) {
  std::memset(a, 0, sizeof(*a));
  if (THPVariable_CheckExact(obj)) {
    try {
      read_tensor(obj, a, forward_ad);
    } catch (const std::exception&) {
      std::memset(a, 0, sizeof(*a));
      a->kind = TRT_ARG_OTHER;
    }
  } else if (obj == Py_None) {
    a->kind = TRT_ARG_NONE;
  } else if (PyBool_Check(obj)) {
    a->kind = TRT_ARG_BOOL;
    a->i = obj == Py_True;
  } else if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    a->i = PyLong_AsLongLongAndOverflow(obj, &overflow);
    a->kind = overflow ? TRT_ARG_OTHER : TRT_ARG_INT;
  } else if (PyFloat_CheckExact(obj)) {
    a->kind = TRT_ARG_FLOAT;
    a->f = PyFloat_AS_DOUBLE(obj);
  } else {
    a->kind = TRT_ARG_OTHER;
  }
}

void read_tensor(PyObject* obj, trt_arg* a, bool forward_ad) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  auto* impl = t.unsafeGetTensorImpl();
  // Nested, non-strided layouts, symbolic shapes, conjugate/negative views and wrapper tensors
  // are left to Python.
  if (!t.defined() || t.is_nested() || t.layout() != c10::kStrided ||
      impl->has_symbolic_sizes_strides() ||
      (!t.is_cpu() && !t.is_cuda()) ||
      t.is_conj() || t.is_neg() || impl->is_python_dispatch() || !t.has_storage() ||
      (forward_ad && (t._fw_grad(0).defined() || t._fw_grad(1).defined()))) {  // a dual tensor
    a->kind = TRT_ARG_OTHER;
    return;
  }
  a->kind = TRT_ARG_TENSOR;
  a->dtype = static_cast<int32_t>(t.scalar_type());
  a->device_type = static_cast<int32_t>(t.device().type());
  a->device_index = t.device().index();
  a->dim = static_cast<int32_t>(t.dim());
  a->sizes = t.sizes().data();
  a->strides = t.strides().data();
  a->storage_offset = t.storage_offset();
  a->data_ptr = const_cast<void*>(t.const_data_ptr());
  a->tensor = reinterpret_cast<trt_tensor*>(const_cast<at::Tensor*>(&t));
  if (t.requires_grad()) a->flags |= TRT_REQUIRES_GRAD;
  if (t.is_inference()) a->flags |= TRT_INFERENCE;
  if ((reinterpret_cast<uintptr_t>(a->data_ptr) & 15) == 0) a->flags |= TRT_ALIGNED16;
}

// steal=true: the value's tensor handle is owned by us and released here.
PyObject* wrap_value(const trt_value& v, bool steal) {
  switch (v.tag) {
    case TRT_TENSOR: {
      at::Tensor* t = reinterpret_cast<at::Tensor*>(v.u.t);
      PyObject* r = steal ? THPVariable_Wrap(std::move(*t)) : THPVariable_Wrap(*t);
      if (steal) delete t;
      return r;
    }
    case TRT_INT: return PyLong_FromLongLong(v.u.i);
    case TRT_FLOAT: return PyFloat_FromDouble(v.u.f);
    case TRT_BOOL: return PyBool_FromLong(v.u.i != 0);
    case TRT_NONE: Py_RETURN_NONE;
  }
  PyErr_Format(PyExc_RuntimeError, "trident: cannot return a value of tag %d", v.tag);
  return nullptr;
}

// Note [Output spec]: '(' ... ')' tuple, '[' ... ']' list, 'v' the next flat value, 'n' None.
PyObject* build_output(const char*& p, trt_result* r, int32_t& next) {
  char c = *p++;
  if (c == 'v') {
    PyObject* o = wrap_value(r->outs[next], /*steal=*/true);
    r->outs[next].tag = TRT_NONE;  // taken over
    ++next;
    return o;
  }
  if (c == 'n') Py_RETURN_NONE;
  char close = c == '(' ? ')' : ']';
  PyObject* list = PyList_New(0);
  if (!list) return nullptr;
  while (*p != close) {
    PyObject* item = build_output(p, r, next);
    if (!item || PyList_Append(list, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(item);
  }
  ++p;
  if (c == '[') return list;
  PyObject* tuple = PyList_AsTuple(list);
  Py_DECREF(list);
  return tuple;
}

void release_outputs(trt_result* r, int32_t from) {
  for (int32_t i = from; i < r->nouts; ++i)
    if (r->outs[i].tag == TRT_TENSOR) api_release(r->outs[i].u.t);
}


// ---- Note [Argument trees] (trident/flatten.py) --------------------------------------------
//
// A call's arguments are bound to the function's parameters here, as Python binds them, and
// each installed tree is evaluated over the bound values: every node reads its value from its
// parent and checks it; the LEAF nodes, after the tree's key, are the SCM's arguments.

enum { PARAM_POSITIONAL_ONLY = 0, PARAM_POSITIONAL_OR_KEYWORD, PARAM_VAR_POSITIONAL,
       PARAM_KEYWORD_ONLY, PARAM_VAR_KEYWORD };
// ROOT, GETATTR, GETITEM, CELL, and TYPE, ABSENT, TENSOR: state trees (Note [State guards] in
// state.py), which read what a function reads outside its arguments.
enum tree_access { ACC_ARG = 0, ACC_ITEM, ACC_INDEX, ACC_ATTR, ACC_SELF, ACC_ROOT, ACC_GETATTR,
                   ACC_GETITEM, ACC_CELL };
enum tree_check { CHK_LEAF = 0, CHK_SEQ, CHK_DICT, CHK_OBJECT, CHK_CONST, CHK_ID, CHK_SAME,
                  CHK_TYPE, CHK_ABSENT, CHK_TENSOR };
enum recipe_op { R_VALUE = 0, R_CONST, R_INPUT, R_TUPLE, R_LIST, R_DICT, R_NAMEDTUPLE, R_OBJECT,
                 R_AGAIN, R_BUILT, R_STRUCTSEQ };
enum { BASE_OBJECT = 0, BASE_DICT, BASE_ODICT };

struct Param {
  PyObject* name;  // borrowed from CallTrees::source
  int kind;
  PyObject* default_value;  // nullptr: none
};

struct TreeNode {
  Py_ssize_t parent;
  int access;
  PyObject* key;  // ITEM, ATTR: the key; borrowed
  Py_ssize_t index;  // ARG, INDEX: the position
  int check;
  Py_ssize_t same;   // SAME: the node whose object this one must be
  PyObject* expect;  // SEQ/DICT/OBJECT/TYPE: the type; CONST: the value; ID, TENSOR: the object
  Py_ssize_t length;  // TENSOR: its version counter
  PyObject* keys;   // DICT, OBJECT: the keys in iteration order (a tuple), or nullptr
  bool float_bits;  // a float CONST: compared by bit pattern (NaN, -0.0)
};

// Note [Unchanged subtrees]: an argument tree's nodes as its evaluations last read them.
struct TreeMemo {
  std::vector<PyObject*> values;  // per node: its value (borrowed: see the Note)
  std::vector<PyObject*> dicts;   // OBJECT: its instance dict
  // OBJECT: its instance dict's version tag, DICT: its own, when its whole subtree last held
  std::vector<uint64_t> tags;
  std::vector<size_t> end;        // per node: one past the last node of its subtree
  // per container node p: work[work_begin[p] .. work_begin[p + 1]) are its children that no tag
  // covers (leaves, containers, SAME, sets): what an unchanged p still visits
  std::vector<Py_ssize_t> work_begin;
  std::vector<Py_ssize_t> work;
  // per node: what its value needs when it is the memo's (TreeEval::visit)
  enum Kind : uint8_t {
    kOther,        // checked: a list, a namedtuple, a set, SAME
    kDict,         // unchanged with its exact type and tag
    kOrderedDict,  // an OrderedDict of two or more keys: also its key order
    kObject,       // unchanged with its exact type, instance dict and that dict's tag
    kTuple,        // a plain tuple: immutable, its children are the memo's where it is held
    kImmutable,    // CONST (but a set) and ID: the same object holds where it is held
    kLeaf,         // the SCM's argument: its guards are the SCM's
  };
  std::vector<uint8_t> kind;
  std::vector<PyTypeObject*> types;  // kDict, kOrderedDict, kObject: the exact type
  std::vector<uint8_t> watched;      // the node's dict is watched (TRT_DICT_WATCHERS)
  uint64_t events = 0;               // dict_events when the tree last held
  bool busy = false;                 // a walk is writing it
};

struct Tree {
  PyObject* key;  // leaf 0, a Python int
  std::vector<TreeNode> nodes;
  Py_ssize_t leaves;
  std::unique_ptr<TreeMemo> memo;  // argument trees only
};

// Everything a Dispatcher needs to bind and flatten a call. The Python tuples it was read from
// are kept in `source` and `programs`, so every borrowed pointer stays valid.
struct CallTrees {
  PyObject* source = nullptr;    // (params, self object, has self); owned, as are the next two
  PyObject* programs = nullptr;  // the trees, as flatten.ArgTree.program() made them
  PyObject* recipes = nullptr;   // per specialization: an OutputRecipe's ops, or None
  std::vector<Param> params;
  PyObject* self_obj = nullptr;
  bool has_self = false;
  bool any_recipe = false;  // some specialization's result is rebuilt by an OutputRecipe
  std::vector<Tree> trees;
  ~CallTrees() {  // the GIL is held wherever the last holder lets go
    Py_XDECREF(source);
    Py_XDECREF(programs);
    Py_XDECREF(recipes);
  }
};

// The values of one call: bound parameters, node values, leaves. `owned` holds the *args
// tuple and **kwargs dict made by binding.
struct CallValues {
  std::vector<PyObject*> bound;
  std::vector<PyObject*> values;
  std::vector<PyObject*> dicts;  // per OBJECT node: its instance dict
  std::vector<PyObject*> leaves;
  std::vector<PyObject*> owned;
  ~CallValues() {
    for (PyObject* o : owned) Py_DECREF(o);
  }
};

// Python's binding of positional and keyword arguments to parameters (inspect.Signature.bind
// with defaults applied). false: the call does not bind; Python raises eager's TypeError.
bool bind_call(const CallTrees& t, PyObject* args, PyObject* kwargs, CallValues& cv) {
  Py_ssize_t nargs = PyTuple_GET_SIZE(args), i = 0, used = 0;
  Py_ssize_t nkw = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
  cv.bound.clear();
  for (const Param& p : t.params) {
    PyObject* v = nullptr;
    if (p.kind == PARAM_VAR_POSITIONAL) {
      v = PyTuple_GetSlice(args, i, nargs);
      if (!v) return false;
      cv.owned.push_back(v);
      i = nargs;
    } else if (p.kind == PARAM_VAR_KEYWORD) {
      v = PyDict_New();
      if (!v) return false;
      cv.owned.push_back(v);
      if (nkw) {
        PyObject *k, *item;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kwargs, &pos, &k, &item)) {
          bool named = false;
          for (const Param& q : t.params)
            if ((q.kind == PARAM_POSITIONAL_OR_KEYWORD || q.kind == PARAM_KEYWORD_ONLY) &&
                PyUnicode_Compare(q.name, k) == 0) {
              named = true;
              break;
            }
          if (!named) {
            if (PyDict_SetItem(v, k, item) < 0) return false;
            ++used;
          }
        }
      }
    } else if (p.kind != PARAM_KEYWORD_ONLY && i < nargs) {
      if (p.kind == PARAM_POSITIONAL_OR_KEYWORD && nkw && PyDict_GetItem(kwargs, p.name))
        return false;
      v = PyTuple_GET_ITEM(args, i++);
    } else if (p.kind != PARAM_POSITIONAL_ONLY && nkw && (v = PyDict_GetItem(kwargs, p.name))) {
      ++used;
    } else if (p.default_value) {
      v = p.default_value;
    } else {
      return false;
    }
    cv.bound.push_back(v);
  }
  return i == nargs && used == nkw;
}

bool same_key(PyObject* k, PyObject* want) {
  if (k == want) return true;
  if (Py_TYPE(k) != Py_TYPE(want)) return false;
  int eq = PyObject_RichCompareBool(k, want, Py_EQ);
  if (eq != 1) PyErr_Clear();
  return eq == 1;
}

// The dict's keys are `keys`, in the order it iterates them (str and int keys: compared by exact
// type and value). An OrderedDict iterates in the order of its own linked list, which
// move_to_end changes without changing the dict it is built on (nor that dict's order).
bool same_keys(PyObject* d, PyObject* keys) {
  if (PyODict_CheckExact(d)) {
    PyObject* it = PyObject_GetIter(d);  // C's odict iterator: no Python code runs
    if (!it) {
      PyErr_Clear();
      return false;
    }
    bool same = true;
    Py_ssize_t i = 0;
    for (PyObject* k; same && (k = PyIter_Next(it));) {
      same = i < PyTuple_GET_SIZE(keys) && same_key(k, PyTuple_GET_ITEM(keys, i++));
      Py_DECREF(k);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return same && i == PyTuple_GET_SIZE(keys);
  }
  Py_ssize_t pos = 0, i = 0;
  PyObject *k, *item;
  while (PyDict_Next(d, &pos, &k, &item))
    if (!same_key(k, PyTuple_GET_ITEM(keys, i++))) return false;
  return true;
}

bool const_equal(const TreeNode& n, PyObject* v) {
  if (v == n.expect) return true;
  if (Py_TYPE(v) != Py_TYPE(n.expect)) return false;
  if (n.float_bits)
    return trt_f64_bits(PyFloat_AS_DOUBLE(v)) == trt_f64_bits(PyFloat_AS_DOUBLE(n.expect));
  if (PyComplex_CheckExact(v)) {  // by bit pattern too (NaN, -0.0)
    Py_complex a = PyComplex_AsCComplex(v), b = PyComplex_AsCComplex(n.expect);
    return trt_f64_bits(a.real) == trt_f64_bits(b.real) &&
           trt_f64_bits(a.imag) == trt_f64_bits(b.imag);
  }
  if (PyAnySet_CheckExact(v)) {  // of str (flatten.py): equal sizes first, no call for empty sets
    if (PySet_GET_SIZE(v) != PySet_GET_SIZE(n.expect)) return false;
    if (PySet_GET_SIZE(v) == 0) return true;
  }
  if (PySlice_Check(v)) {  // each bound by exact type too: 1.0 == 1, but x[1.0:] raises
    auto* a = reinterpret_cast<PySliceObject*>(v);
    auto* b = reinterpret_cast<PySliceObject*>(n.expect);
    PyObject* mine[] = {a->start, a->stop, a->step};
    PyObject* theirs[] = {b->start, b->stop, b->step};
    for (int i = 0; i < 3; ++i) {
      if (Py_TYPE(mine[i]) != Py_TYPE(theirs[i])) return false;
      int eq = PyObject_RichCompareBool(mine[i], theirs[i], Py_EQ);
      if (eq < 0) PyErr_Clear();
      if (eq != 1) return false;
    }
    return true;
  }
  int eq = PyObject_RichCompareBool(v, n.expect, Py_EQ);
  if (eq < 0) PyErr_Clear();
  return eq == 1;
}

// The instance dict of an object (borrowed; the object holds it), or nullptr.
PyObject* instance_dict(PyObject* obj) {
  PyObject* d = PyObject_GenericGetDict(obj, nullptr);
  if (!d) {
    PyErr_Clear();
    return nullptr;
  }
  Py_DECREF(d);
  return PyDict_Check(d) ? d : nullptr;
}

// A state tree's attribute or item read (Note [State guards]): a module's or a dict's entry
// without a call, anything else through Python's getattr / getitem (a new reference, which `cv`
// keeps). nullptr, with a Python error set or not, when there is none.
PyObject* read_state(PyObject* parent, int access, PyObject* key, CallValues& cv) {
  if (access == ACC_GETATTR && PyTuple_CheckExact(key)) {
    // a getter's result (Note [Library state] in state.py): the key () calls the parent, a C
    // function of no arguments (sys.getrecursionlimit, a torch.backends flag's getter)
    if (!PyCFunction_Check(parent)) return nullptr;
    PyObject* v = PyObject_CallNoArgs(parent);
    if (v) cv.owned.push_back(v);
    return v;
  }
  if (access == ACC_GETATTR && PyModule_CheckExact(parent)) {
    PyObject* d = PyModule_GetDict(parent);
    if (PyObject* v = PyDict_GetItemWithError(d, key)) return v;
    // absent, unless a module __getattr__ (PEP 562) makes it: no AttributeError to raise
    static PyObject* const module_getattr = PyUnicode_InternFromString("__getattr__");
    if (PyErr_Occurred() || !PyDict_GetItemWithError(d, module_getattr)) return nullptr;
  }
  if (access == ACC_GETITEM && PyDict_CheckExact(parent))
    return PyDict_GetItemWithError(parent, key);
  PyObject* v = nullptr;
  if (access == ACC_GETATTR) {  // a missing attribute without making an AttributeError
#if PY_VERSION_HEX >= 0x030D0000
    PyObject_GetOptionalAttr(parent, key, &v);
#else
    _PyObject_LookupAttr(parent, key, &v);
#endif
  } else {
    v = PyObject_GetItem(parent, key);
  }
  if (v) cv.owned.push_back(v);
  return v;
}

// ---- Note [Unchanged subtrees] ---------------------------------------------------------------
//
// A hit must cost what its specialization reads, not what its arguments reach: a Hugging Face
// model's tree has thousands of nodes (every module's __dict__, its hook dicts, its config), and
// checking each one on every call cost more than the launches. CPython gives every dict a version
// tag (PyDictObject.ma_version_tag, Python 3.11 and 3.12) that takes a new value from one
// process-wide counter at every insertion, replacement, deletion or clear of that dict, and at
// its creation, so equal tags on the same dict object mean the dict was not changed. Each
// argument tree keeps every node's value as last read, and each OBJECT's instance dict and
// DICT's tag as they were when its whole subtree last held (TreeMemo). A container node whose
// value is that same object with that same dict and tag has the same entries as then: its
// children are taken from the memo without reading them, and the checks of its immutable
// children (CONST, ID) hold without running. What no tag covers is still checked on every call: each object's exact type
// (``__class__`` can be assigned), its instance dict's identity (``__dict__`` can be assigned), a
// list's items (a list has no tag), a set's contents, the key order of an OrderedDict
// (``move_to_end`` changes no tag), a SAME node's identity, and every leaf (the SCM's guards).
// A value is taken from the memo only below a container that holds it and whose tag held, so it
// is alive; a value read afresh is trusted only through a tag (a new object at a freed one's
// address has a new dict, and so a new tag). Python 3.13 and later evaluate every node.
#if PY_VERSION_HEX < 0x030D0000
#define TRT_DICT_TAGS 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
inline uint64_t dict_tag(PyObject* d) { return reinterpret_cast<PyDictObject*>(d)->ma_version_tag; }
#pragma GCC diagnostic pop
#else
inline uint64_t dict_tag(PyObject*) { return 0; }
#endif

// Python 3.12's dict watchers (PEP 699's way to see changes) make an unchanged dict cost
// nothing to check: a dict the memo found unchanged across two calls is watched, and every event
// on any watched dict (a change, a copy into it, its deallocation) counts in dict_events. A memo
// that last held at the current count knows that none of its watched dicts changed since, and
// reads no tag of theirs. Not on 3.11 (no watchers) or where all watcher slots are taken.
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define TRT_DICT_WATCHERS 1
uint64_t dict_events = 0;
int dict_watcher = -1;  // -2: none could be had

int on_dict_event(PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) {
  ++dict_events;
  return 0;
}

// Watches `d` (its tag changes: read it again). false: not watched.
bool watch_dict(PyObject* d) {
  if (dict_watcher == -1) {
    dict_watcher = PyDict_AddWatcher(on_dict_event);
    if (dict_watcher < 0) {
      PyErr_Clear();
      dict_watcher = -2;
    }
  }
  if (dict_watcher < 0 || PyDict_Watch(dict_watcher, d) < 0) {
    PyErr_Clear();
    return false;
  }
  return true;
}
#endif

// One tree's evaluation: where values go (the memo's arrays for argument trees, so that the next
// call finds them; the call's own for state trees).
struct TreeEval {
  const CallTrees& t;
  const Tree& tree;
  CallValues& cv;
  TreeMemo* memo;  // nullptr: every node is evaluated
  PyObject** values;
  PyObject** dicts;
  Py_ssize_t* failed;

  bool fail(size_t i) {
    if (failed) *failed = static_cast<Py_ssize_t>(i);
    return false;
  }

  // Reads node i's value from its parent (or the call); nullptr when there is none.
  PyObject* read(size_t i) {
    const TreeNode& node = tree.nodes[i];
    PyObject* parent = node.parent >= 0 ? values[node.parent] : nullptr;
    switch (node.access) {
      case ACC_ARG: return cv.bound[node.index];
      case ACC_SELF: return t.self_obj;
      case ACC_ITEM: return PyDict_GetItemWithError(parent, node.key);
      case ACC_INDEX:  // the parent's type and length were checked
        return PyTuple_Check(parent) ? PyTuple_GET_ITEM(parent, node.index)
                                     : PyList_GET_ITEM(parent, node.index);
      case ACC_ATTR: return PyDict_GetItemWithError(dicts[node.parent], node.key);
      case ACC_ROOT: return node.key;
      case ACC_GETATTR:
      case ACC_GETITEM: return parent ? read_state(parent, node.access, node.key, cv) : nullptr;
      case ACC_CELL: return parent && PyCell_Check(parent) ? PyCell_GET(parent) : nullptr;
    }
    return nullptr;
  }

  // Checks node i holding v, the node alone (its children are the caller's).
  bool check(size_t i, PyObject* v) {
    const TreeNode& node = tree.nodes[i];
    values[i] = v;
#ifdef TRT_DICT_WATCHERS
    if (memo) memo->watched[i] = 0;  // a value read afresh: perhaps another dict than the watched
#endif
    bool ok = true;
    switch (node.check) {
      case CHK_LEAF: cv.leaves.push_back(v); break;
      case CHK_SEQ:
        ok = Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(node.expect) && Py_SIZE(v) == node.length;
        break;
      case CHK_DICT:
        ok = Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(node.expect) &&
             PyDict_GET_SIZE(v) == node.length && (!node.keys || same_keys(v, node.keys));
        break;
      case CHK_OBJECT: {
        if (Py_TYPE(v) != reinterpret_cast<PyTypeObject*>(node.expect)) {
          ok = false;
          break;
        }
        PyObject* d = dicts[i] = instance_dict(v);
        ok = d && PyDict_GET_SIZE(d) == node.length && (!node.keys || same_keys(d, node.keys));
        break;
      }
      case CHK_CONST: ok = const_equal(node, v); break;
      case CHK_ID: ok = v == node.expect; break;
      case CHK_SAME: ok = v == values[node.same]; break;
      case CHK_TYPE: ok = Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(node.expect); break;
      case CHK_TENSOR:  // the same tensor, not written since (its version counter)
        ok = v == node.expect && THPVariable_Check(v) &&
             static_cast<Py_ssize_t>(THPVariable_Unpack(v)._version()) == node.length;
        break;
    }
    return ok;
  }

  // Every node, in order (state trees, and argument trees without a memo that held).
  bool all() {
    size_t n = tree.nodes.size();
    for (size_t i = 0; i < n; ++i) {
      PyObject* v = read(i);
      const TreeNode& node = tree.nodes[i];
      if (!v || node.check == CHK_ABSENT) {
        PyErr_Clear();
        if (!v && node.check == CHK_ABSENT) {
          values[i] = nullptr;
          continue;
        }
        return fail(i);
      }
      if (!check(i, v)) return fail(i);
    }
    return true;
  }

  // Whether d, node i's dict (its own, or its object's) as the memo holds it, is unchanged.
  bool same_dict(size_t i, PyObject* d) {
#ifdef TRT_DICT_WATCHERS
    if (memo->watched[i]) {
      if (memo->events == dict_events) return true;
    } else if (dict_tag(d) == memo->tags[i] && watch_dict(d)) {  // unchanged twice: watched
      memo->watched[i] = 1;
      memo->tags[i] = dict_tag(d);
      return true;
    }
#endif
    return dict_tag(d) == memo->tags[i];
  }

  // Node i, and its subtree. `held`: its value is the memo's, held by an unchanged container (or
  // an immutable tuple such a container holds); otherwise it is read afresh. The memo's `kind`
  // says what an unchanged value needs (it is read before the node: a node is 80 bytes).
  bool visit(size_t i, bool held) {
    PyObject* v = held ? values[i] : read(i);
    if (!v) {
      PyErr_Clear();
      return fail(i);
    }
    switch (memo->kind[i]) {
#ifdef TRT_DICT_TAGS
      case TreeMemo::kDict:
      case TreeMemo::kOrderedDict:  // move_to_end reorders an OrderedDict without a new tag
        if (v == values[i] && Py_TYPE(v) == memo->types[i] && same_dict(i, v) &&
            (memo->kind[i] == TreeMemo::kDict || same_keys(v, tree.nodes[i].keys)))
          return children(i, true);
        break;
      case TreeMemo::kObject:  // (the value may be one that failed its check: its type first)
        if (v == values[i] && Py_TYPE(v) == memo->types[i]) {
          PyObject** dict = _PyObject_GetDictPtr(v);
          if (dict && *dict == dicts[i] && same_dict(i, *dict)) return children(i, true);
        }
        break;
#endif
      case TreeMemo::kTuple:
        if (held) return children(i, true);
        break;
      case TreeMemo::kImmutable:
        if (held) return true;  // the same object as when it was checked
        break;
      case TreeMemo::kLeaf:
        cv.leaves.push_back(v);
        values[i] = v;
        return true;
    }
    const TreeNode& node = tree.nodes[i];
    int c = node.check;
    if (!check(i, v)) return fail(i);
    if (!children(i, false)) return false;
    // the tag once the whole subtree held: a subtree cut short by a failure keeps its older tag,
    // which its dict no longer has, so the next call reads it afresh
    if (c == CHK_DICT || c == CHK_OBJECT) memo->tags[i] = dict_tag(c == CHK_DICT ? v : dicts[i]);
    return true;
  }

  // The children of node p. `held`: p is unchanged, so only the children that a tag does not
  // cover are visited (the memo's `work` list); otherwise all, afresh.
  bool children(size_t p, bool held) {
    if (held) {
      for (Py_ssize_t k = memo->work_begin[p]; k < memo->work_begin[p + 1]; ++k)
        if (!visit(static_cast<size_t>(memo->work[k]), true)) return false;
      return true;
    }
    for (size_t c = p + 1; c < memo->end[p]; c = memo->end[c])
      if (!visit(c, false)) return false;
    return true;
  }

  bool memoized() {
    size_t n = tree.nodes.size();
    for (size_t i = 0; i < n; i = memo->end[i])
      if (!visit(i, false)) return false;
    return true;
  }
};

// Evaluates one tree over the bound values: true and cv.leaves filled when every check holds
// (an argument tree's values are then in its memo, a state tree's in cv.values).
bool eval_tree(const CallTrees& t, const Tree& tree, CallValues& cv, Py_ssize_t* failed = nullptr) {
  size_t n = tree.nodes.size();
  TreeMemo* memo = tree.memo.get();
  if (memo && memo->busy) memo = nullptr;  // re-entered during a walk: this one walks alone
  if (!memo) {
    cv.values.resize(n);
    cv.dicts.resize(n);
  }
  cv.leaves.clear();
  cv.leaves.reserve(tree.leaves + 1);
  cv.leaves.push_back(tree.key);
  TreeEval e{t, tree, cv, memo, memo ? memo->values.data() : cv.values.data(),
             memo ? memo->dicts.data() : cv.dicts.data(), failed};
  if (!memo) return e.all();
  // No Python runs in a walk, but an allocation in it (an object's instance dict, made when it
  // is first read) may start a collection whose finalizers call this function again: the memo
  // is written as the walk goes, so no collection runs during it.
  int collecting = PyGC_Disable();
  memo->busy = true;
  bool ok = e.memoized();
  memo->busy = false;
  if (collecting) PyGC_Enable();
#ifdef TRT_DICT_WATCHERS
  if (ok) memo->events = dict_events;
#endif
  return ok;
}

// Note [Argument trees]: the result of a recipe op sequence, from the SCM's flat outputs.
// `built[k]`: the object op k made (borrowed: the result holds it), for R_BUILT.
PyObject* build_op(PyObject* ops, Py_ssize_t& pc, PyObject* flat, Py_ssize_t& next,
                   const std::vector<PyObject*>& values, std::vector<PyObject*>& built);

PyObject* build_recipe(PyObject* ops, Py_ssize_t& pc, PyObject* flat, Py_ssize_t& next,
                       const std::vector<PyObject*>& values, std::vector<PyObject*>& built) {
  Py_ssize_t here = pc;
  PyObject* out = build_op(ops, pc, flat, next, values, built);
  if (out) built[here] = out;
  return out;
}

PyObject* build_op(PyObject* ops, Py_ssize_t& pc, PyObject* flat, Py_ssize_t& next,
                   const std::vector<PyObject*>& values, std::vector<PyObject*>& built) {
  if (pc >= PyTuple_GET_SIZE(ops))
    return PyErr_Format(PyExc_RuntimeError, "trident: output recipe ends early");
  PyObject* op = PyTuple_GET_ITEM(ops, pc++);
  long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
  auto child = [&]() { return build_recipe(ops, pc, flat, next, values, built); };
  switch (code) {
    case R_VALUE: {
      if (next >= PyTuple_GET_SIZE(flat))
        return PyErr_Format(PyExc_RuntimeError, "trident: output recipe reads past the outputs");
      PyObject* v = PyTuple_GET_ITEM(flat, next++);
      Py_INCREF(v);
      return v;
    }
    case R_BUILT: {  // a container or object the result holds a second time
      Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
      if (k < 0 || k >= static_cast<Py_ssize_t>(built.size()) || !built[k])
        return PyErr_Format(PyExc_RuntimeError, "trident: no object built by op %zd", k);
      Py_INCREF(built[k]);
      return built[k];
    }
    case R_AGAIN: {  // a flat output the result holds a second time
      Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
      if (k < 0 || k >= PyTuple_GET_SIZE(flat))
        return PyErr_Format(PyExc_RuntimeError, "trident: no flat output %zd", k);
      PyObject* v = PyTuple_GET_ITEM(flat, k);
      Py_INCREF(v);
      return v;
    }
    case R_CONST: {
      PyObject* v = PyTuple_GET_ITEM(op, 1);
      Py_INCREF(v);
      return v;
    }
    case R_INPUT: {
      Py_ssize_t node = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
      if (node < 0 || node >= static_cast<Py_ssize_t>(values.size()))
        return PyErr_Format(PyExc_RuntimeError, "trident: no call value %zd", node);
      Py_INCREF(values[node]);
      return values[node];
    }
    case R_TUPLE:
    case R_LIST:
    case R_NAMEDTUPLE:
    case R_STRUCTSEQ: {
      bool typed = code == R_NAMEDTUPLE || code == R_STRUCTSEQ;
      PyObject* cls = typed ? PyTuple_GET_ITEM(op, 1) : nullptr;
      Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, typed ? 2 : 1));
      PyObject* items = code == R_LIST ? PyList_New(n) : PyTuple_New(n);
      if (!items) return nullptr;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = child();
        if (!item) {
          Py_DECREF(items);
          return nullptr;
        }
        if (code == R_LIST) PyList_SET_ITEM(items, i, item);
        else PyTuple_SET_ITEM(items, i, item);
      }
      if (!cls) return items;
      if (code == R_STRUCTSEQ) {  // torch.return_types.max(items): structseq_new, C
        PyObject* out = PyObject_CallOneArg(cls, items);
        Py_DECREF(items);
        return out;
      }
      // tuple.__new__(cls, items): C, unlike a namedtuple's generated Python __new__
      PyObject* pack = PyTuple_Pack(1, items);
      Py_DECREF(items);
      if (!pack) return nullptr;
      PyObject* out = PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(cls), pack, nullptr);
      Py_DECREF(pack);
      return out;
    }
    case R_DICT: {
      PyObject* keys = PyTuple_GET_ITEM(op, 1);
      PyObject* d = PyDict_New();
      if (!d) return nullptr;
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); ++i) {
        PyObject* item = child();
        if (!item || PyDict_SetItem(d, PyTuple_GET_ITEM(keys, i), item) < 0) {
          Py_XDECREF(item);
          Py_DECREF(d);
          return nullptr;
        }
        Py_DECREF(item);
      }
      return d;
    }
    case R_OBJECT: {
      // (R_OBJECT, cls, base, attribute names, item keys): made by the C base type's tp_new,
      // its __dict__ and items set without running the class's Python methods
      auto* cls = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(op, 1));
      long base = PyLong_AsLong(PyTuple_GET_ITEM(op, 2));
      PyObject* attrs = PyTuple_GET_ITEM(op, 3);
      PyObject* keys = PyTuple_GET_ITEM(op, 4);
      PyTypeObject* maker = base == BASE_ODICT ? &PyODict_Type
                            : base == BASE_DICT ? &PyDict_Type : &PyBaseObject_Type;
      PyObject* empty = PyTuple_New(0);
      if (!empty) return nullptr;
      PyObject* obj = maker->tp_new(cls, empty, nullptr);
      if (obj && base == BASE_ODICT && PyODict_Type.tp_init(obj, empty, nullptr) < 0)
        Py_CLEAR(obj);
      Py_DECREF(empty);
      if (!obj) return nullptr;
      PyObject* d = PyObject_GenericGetDict(obj, nullptr);
      bool ok = d != nullptr;
      for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(attrs); ++i) {
        PyObject* item = child();
        ok = item && PyDict_SetItem(d, PyTuple_GET_ITEM(attrs, i), item) == 0;
        Py_XDECREF(item);
      }
      for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(keys); ++i) {
        PyObject* item = child();
        ok = item && (base == BASE_ODICT ? PyODict_SetItem(obj, PyTuple_GET_ITEM(keys, i), item)
                                         : PyDict_SetItem(obj, PyTuple_GET_ITEM(keys, i), item)) == 0;
        Py_XDECREF(item);
      }
      Py_XDECREF(d);
      if (!ok) Py_CLEAR(obj);
      return obj;
    }
  }
  return PyErr_Format(PyExc_RuntimeError, "trident: bad output recipe op %ld", code);
}

PyObject* apply_recipe(PyObject* ops, PyObject* flat, const std::vector<PyObject*>& values) {
  Py_ssize_t pc = 0, next = 0;
  std::vector<PyObject*> built(static_cast<size_t>(PyTuple_GET_SIZE(ops)), nullptr);
  return build_recipe(ops, pc, flat, next, values, built);
}

// ---- Dispatcher ----------------------------------------------------------------------------

PyObject* TridentError = nullptr;
PyObject* ErrorTypes[TRT_ERR_KINDS] = {nullptr};

struct ScmEntry {
  trt_scm_call_fn call;
  trt_scm_match_fn match;
};

struct Dispatcher {
  PyObject_HEAD
  PyObject* dict;
  PyObject* weaklist;
  // What the installed specializations read outside the arguments (Note [State guards] in
  // state.py): a tree program and its parsed form (nullptr: nothing to check).
  PyObject* state_program;
  std::shared_ptr<Tree> state;
  // The installed SCMs, one per specialization, in guard order (Note [Incremental modules] in
  // build.py); nullptr: none. Held by each call: a Python callback may install another table.
  std::shared_ptr<const std::vector<ScmEntry>> scms;
  unsigned long long hits;
  // CUDA graph slots, one per installed specialization (Note [CUDA graphs]).
  trt_graph* graphs;
  Py_ssize_t num_graphs;
  long long replays_before;  // replays counted by slots since reset
  // How calls bind and flatten (Note [Argument trees]); nullptr until the first install. Held
  // by each call: the launch sequence may run Python that installs another table.
  std::shared_ptr<CallTrees> trees;
};

void clear_descs(trt_graph& g) {
  for (int32_t i = 0; i < g.ndescs; ++i) std::free(g.descs[i]);
  std::free(g.descs);
  std::free(g.hashes);
  g.descs = nullptr;
  g.hashes = nullptr;
  g.ndescs = 0;
}

void free_graphs(Dispatcher* self) {
  for (Py_ssize_t i = 0; i < self->num_graphs; ++i) {
    self->replays_before += self->graphs[i].replays;
    clear_descs(self->graphs[i]);
  }
  std::free(self->graphs);
  self->graphs = nullptr;
  self->num_graphs = 0;
}

PyObject* Dispatcher_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<Dispatcher*>(type->tp_alloc(type, 0));
  if (self) {
    new (&self->state) std::shared_ptr<Tree>();
    new (&self->scms) std::shared_ptr<const std::vector<ScmEntry>>();
    new (&self->trees) std::shared_ptr<CallTrees>();
  }
  return reinterpret_cast<PyObject*>(self);
}

int Dispatcher_traverse(Dispatcher* self, visitproc visit, void* arg) {
  Py_VISIT(self->dict);
  Py_VISIT(self->state_program);
  if (self->trees) {
    Py_VISIT(self->trees->source);
    Py_VISIT(self->trees->programs);
    Py_VISIT(self->trees->recipes);
  }
  return 0;
}

int Dispatcher_clear(Dispatcher* self) {
  Py_CLEAR(self->dict);
  self->state.reset();
  Py_CLEAR(self->state_program);
  self->trees.reset();
  return 0;
}

// Note [State guards]: every check of the state tree holds. `failed`: the failing node.
// The tree and its program stay alive while they are read: a check may run Python code (an
// __eq__, a __getattribute__) in which another thread installs a new tree.
bool state_holds(Dispatcher* self, Py_ssize_t* failed = nullptr) {
  if (!self->state) return true;
  static const CallTrees no_call;
  std::shared_ptr<Tree> tree = self->state;
  PyObject* program = self->state_program;
  Py_INCREF(program);
  CallValues cv;
  bool ok = eval_tree(no_call, *tree, cv, failed);
  Py_DECREF(program);
  return ok;
}

void Dispatcher_dealloc(Dispatcher* self) {
  PyObject_GC_UnTrack(self);
  free_graphs(self);
  if (self->weaklist) PyObject_ClearWeakRefs(reinterpret_cast<PyObject*>(self));
  Dispatcher_clear(self);
  self->state.~shared_ptr();
  self->scms.~shared_ptr();
  self->trees.~shared_ptr();
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// One tensor object in two argument positions: pairwise for short argument lists, an open-
// addressing set on the stack for longer ones (no allocation on the hit path), sorted beyond.
bool tensor_passed_twice(const trt_arg* a, Py_ssize_t n) {
  if (n <= 32) {
    for (Py_ssize_t i = 0; i < n; ++i)
      for (Py_ssize_t j = 0; j < i; ++j)
        if (a[i].kind == TRT_ARG_TENSOR && a[j].kind == TRT_ARG_TENSOR &&
            a[i].tensor == a[j].tensor)
          return true;
    return false;
  }
  constexpr size_t kSlots = 4096;  // a power of two, at least twice the arguments it takes
  if (static_cast<size_t>(n) <= kSlots / 2) {
    size_t size = 64;
    while (size < 2 * static_cast<size_t>(n)) size <<= 1;
    const trt_tensor* slots[kSlots];
    std::memset(slots, 0, size * sizeof(slots[0]));
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (a[i].kind != TRT_ARG_TENSOR) continue;
      uint64_t h = reinterpret_cast<uintptr_t>(a[i].tensor) * 0x9E3779B97F4A7C15ull;
      for (size_t s = (h >> 40) & (size - 1);; s = (s + 1) & (size - 1)) {
        if (!slots[s]) {
          slots[s] = a[i].tensor;
          break;
        }
        if (slots[s] == a[i].tensor) return true;
      }
    }
    return false;
  }
  std::vector<trt_tensor*> tensors;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (a[i].kind == TRT_ARG_TENSOR) tensors.push_back(a[i].tensor);
  std::sort(tensors.begin(), tensors.end());
  return std::adjacent_find(tensors.begin(), tensors.end()) != tensors.end();
}

// Note [Process group guard] in trident/collectives.py: the default process group as
// "<name>:<rank>/<size>", "" when none is initialized; `fact()` there is the Python twin. Read
// from torch.distributed.distributed_c10d._world.__dict__["_default_pg"] (a dict lookup per
// call); the text is made again only when that object changes. The last group is held by a weak
// reference: a strong one kept a destroyed gloo group's connections open, and a dead weak
// reference never equals a new group allocated at the same address.
const char* process_group_fact() {
  static PyObject* world = nullptr;  // _world.__dict__, or Py_None without torch.distributed
  static PyObject* key = nullptr;
  static PyObject* last = nullptr;   // a weak reference to the group `text` describes
  static std::string text;
  if (!world) {
    PyObject* module = PyImport_ImportModule("torch.distributed.distributed_c10d");
    PyObject* w = module ? PyObject_GetAttrString(module, "_world") : nullptr;
    world = w ? PyObject_GenericGetDict(w, nullptr) : nullptr;
    Py_XDECREF(w);
    Py_XDECREF(module);
    PyErr_Clear();
    if (!world || !PyDict_Check(world)) {
      Py_XDECREF(world);
      world = Py_NewRef(Py_None);
    }
    key = PyUnicode_InternFromString("_default_pg");
  }
  if (world == Py_None) return "";
  PyObject* group = PyDict_GetItemWithError(world, key);  // borrowed
  if (!group || group == Py_None) {
    PyErr_Clear();
    return "";
  }
  if (last && PyWeakref_GetObject(last) == group) return text.c_str();  // a dead one is None
  PyObject* name = PyObject_GetAttrString(group, "group_name");
  PyObject* rank = PyObject_CallMethod(group, "rank", nullptr);
  PyObject* size = PyObject_CallMethod(group, "size", nullptr);
  const char* name_text = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
  if (name_text && rank && size && PyLong_Check(rank) && PyLong_Check(size))
    text = std::string(name_text) + ":" + std::to_string(PyLong_AsLong(rank)) + "/" +
           std::to_string(PyLong_AsLong(size));
  else
    text = "?";  // matches no specialization: the call goes to Python
  Py_XDECREF(name);
  Py_XDECREF(rank);
  Py_XDECREF(size);
  PyErr_Clear();
  Py_XSETREF(last, PyWeakref_NewRef(group, nullptr));
  PyErr_Clear();  // a group without weak references: its text is made at every call
  return text.c_str();
}

// torch's global flags that ops read when they run or when they are traced (which SDPA backend a
// trace picks), one bit or field each, in the order guards.FLAG_BITS names them. About 170 ns
// (2-core CPU machine, torch 2.13), 150 of them in allowTF32CuDNN() and float32MatmulPrecision(),
// which go through torch's string-keyed float32 precision settings.
uint64_t global_flags() {
  const at::Context& c = at::globalContext();
  uint64_t bits[] = {c.deterministicAlgorithms(), c.deterministicAlgorithmsWarnOnly(),
                     c.userEnabledFlashSDP(), c.userEnabledMemEfficientSDP(),
                     c.userEnabledMathSDP(), c.userEnabledCuDNNSDP(), c.allowTF32CuDNN(),
                     c.userEnabledCuDNN(), c.benchmarkCuDNN(), c.deterministicCuDNN()};
  uint64_t flags = 0;
  for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); ++i) flags |= (bits[i] ? 1ULL : 0ULL) << i;
  // fields of 4 bits: the float32 matmul precision and the cuBLAS fp16/bf16 reduction options
  flags |= static_cast<uint64_t>(c.float32MatmulPrecision()) << 16;
  flags |= static_cast<uint64_t>(c.allowFP16ReductionCuBLAS()) << 20;
  flags |= static_cast<uint64_t>(c.allowBF16ReductionCuBLAS()) << 24;
  return flags;
}

void read_args(PyObject* const* items, trt_arg* out, Py_ssize_t n, trt_env* env) {
  env->grad_enabled = at::GradMode::is_enabled();
  env->inference_mode = c10::InferenceMode::is_enabled();
  env->autocast = at::autocast::is_autocast_enabled(c10::DeviceType::CPU) ||
                  at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
  env->default_dtype = static_cast<int32_t>(c10::typeMetaToScalarType(c10::get_default_dtype()));
  env->transforms =
      c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
  env->function_modes = at::impl::PythonTorchFunctionTLS::stack_len() > 0;
  env->process_group = process_group_fact();
  env->num_threads = at::get_num_threads();
  env->flags = global_flags();
  bool forward_ad = forward_ad_open();
  for (Py_ssize_t i = 0; i < n; ++i) read_arg(items[i], &out[i], forward_ad);
  env->aliased = tensor_passed_twice(out, n);
  env->graphs = nullptr;
}

PyObject* const* tuple_items(PyObject* tuple) {
  return reinterpret_cast<PyTupleObject*>(tuple)->ob_item;
}

// Argument records: on the C stack for the common case; a call with more arguments takes a heap
// buffer (not a thread-local one: a Python callback inside a launch sequence may re-enter).
struct ArgBuffer {
  trt_arg local[64];
  std::vector<trt_arg> heap;
  trt_arg* get(Py_ssize_t n) {
    if (n <= 64) return local;
    heap.resize(n);
    return heap.data();
  }
};

// The graph slot of installed specialization `i`, or nullptr.
trt_graph* graph_slot(Dispatcher* self, size_t i) {
  return static_cast<Py_ssize_t>(i) < self->num_graphs ? &self->graphs[i] : nullptr;
}

// The parts of one hit, for `_hit_profile` (benchmarks/bench_hf.py): nanoseconds each part took,
// summed over the calls it timed. The hit path passes none and reads no clock.
struct HitClock {
  enum Part { kState, kBind, kTree, kRead, kGuards, kRun, kOutput, kParts };
  std::chrono::steady_clock::time_point last;
  double ns[kParts] = {};
  void start() { last = std::chrono::steady_clock::now(); }
  void lap(Part part) {
    auto now = std::chrono::steady_clock::now();
    ns[part] += std::chrono::duration<double, std::nano>(now - last).count();
    last = now;
  }
};

// Runs the installed SCMs on the leaves `items[0..n)`, the first whose guards hold. Returns
// nullptr with *rc_out set to TRT_MISS when no guard holds, or to TRT_CAPTURE when the matching
// specialization wants its CUDA graph captured first; otherwise *rc_out is the specialization
// that ran.
PyObject* run_scm(Dispatcher* self, PyObject* const* items, Py_ssize_t n, int* rc_out,
                  HitClock* clock = nullptr) {
  std::shared_ptr<const std::vector<ScmEntry>> scms = self->scms;
  if (!scms) {  // uninstalled meanwhile (a state check ran Python code)
    *rc_out = TRT_MISS;
    return nullptr;
  }
  ArgBuffer buffer;
  trt_arg* a = buffer.get(n);
  trt_env env;
  read_args(items, a, n, &env);
  if (clock) {  // the guards alone, through each module's match entry (the call checks them again)
    clock->lap(HitClock::kRead);
    for (size_t i = 0; i < scms->size(); ++i) {
      env.graphs = graph_slot(self, i);
      if ((*scms)[i].match(a, static_cast<int32_t>(n), &env) >= 0) break;
    }
    clock->lap(HitClock::kGuards);
  }
  trt_result result;
  result.nouts = 0;
  int rc = TRT_ERROR;
  try {
    // ATen's warnings reach Python's warnings module (its filters apply: under "error" the
    // call raises, as in eager), as torch's own Python bindings do with this handler.
    torch::PyWarningHandler warnings;
    {
      // Specializations exist only for calls that need no autograd (a tensor that requires
      // grad under grad mode misses), so the launch sequence skips the Autograd dispatch keys.
      // ADInplaceOrView still runs: in-place ops bump version counters, views are views.
      c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
      rc = TRT_MISS;
      for (size_t i = 0; i < scms->size() && rc == TRT_MISS; ++i) {
        env.graphs = graph_slot(self, i);
        rc = (*scms)[i].call(a, static_cast<int32_t>(n), &env, &result);
        if (rc >= 0) rc = static_cast<int>(i);
      }
    }
    if (rc == TRT_ERROR || rc == TRT_EAGER) {
      PyErr_SetString(ErrorTypes[rc == TRT_EAGER ? TRT_ERR_EAGER : g_error_kind], g_error.c_str());
      warnings.set_in_exception();
    }
  } catch (python_error& e) {  // a warning the filters turned into an exception
    e.restore();
    if (rc >= 0) release_outputs(&result, 0);
    *rc_out = TRT_ERROR;
    return nullptr;
  }
  *rc_out = rc;
  if (clock) clock->lap(HitClock::kRun);
  if (rc == TRT_MISS || rc == TRT_CAPTURE || rc == TRT_ERROR || rc == TRT_EAGER) return nullptr;
  const char* p = result.spec;
  int32_t next = 0;
  PyObject* out = build_output(p, &result, next);
  if (!out) release_outputs(&result, next);
  return out;
}

PyObject* slow_path(Dispatcher* self, PyObject* args, PyObject* kwargs) {
  return PyObject_CallMethod(reinterpret_cast<PyObject*>(self), "_slow_path", "OO", args,
                             kwargs ? kwargs : Py_None);
}

// Note [Hit path]: bind, flatten (the first installed tree whose checks hold), run the SCM,
// rebuild the result. Anything that does not hold goes to Python.
// Binds the call and evaluates the installed trees in order: the index of the first whose checks
// hold (cv holds its leaves and node values), or -1 (*failed: the last tree's failing node, -1
// when the call does not bind). No Python error is left set.
Py_ssize_t flatten_args(const CallTrees& t, PyObject* args, PyObject* kwargs, CallValues& cv,
                        Py_ssize_t* failed = nullptr, HitClock* clock = nullptr) {
  if (!bind_call(t, args, kwargs, cv)) {
    PyErr_Clear();
    return -1;
  }
  if (clock) clock->lap(HitClock::kBind);
  Py_ssize_t found = -1;
  for (size_t k = 0; k < t.trees.size() && found < 0; ++k)
    if (eval_tree(t, t.trees[k], cv, failed)) found = static_cast<Py_ssize_t>(k);
  if (clock) clock->lap(HitClock::kTree);
  return found;
}

// Note [Eager decisions] in frontend/policy.py: a call an installed tree accepted that no
// installed SCM accepts (or none is installed) goes to Python with the leaves the tree read:
// _tree_miss(args, kwargs, leaves).
PyObject* tree_miss(Dispatcher* self, PyObject* args, PyObject* kwargs, const CallValues& cv) {
  PyObject* leaves = PyTuple_New(static_cast<Py_ssize_t>(cv.leaves.size()));
  if (!leaves) return nullptr;
  for (size_t i = 0; i < cv.leaves.size(); ++i)
    PyTuple_SET_ITEM(leaves, static_cast<Py_ssize_t>(i), Py_NewRef(cv.leaves[i]));
  return PyObject_CallMethod(reinterpret_cast<PyObject*>(self), "_tree_miss", "OON", args,
                             kwargs ? kwargs : Py_None, leaves);
}

// Note [Hit path]. `clock`: `_hit_profile`'s, which times each part.
PyObject* hit(Dispatcher* self, PyObject* args, PyObject* kwargs, HitClock* clock) {
  std::shared_ptr<CallTrees> held = self->trees;
  CallTrees* t = held.get();
  if (clock) clock->start();
  if (!t || !state_holds(self)) return slow_path(self, args, kwargs);
  if (clock) clock->lap(HitClock::kState);
  CallValues cv;
  Py_ssize_t k = flatten_args(*t, args, kwargs, cv, nullptr, clock);
  if (k < 0) return slow_path(self, args, kwargs);
  // A result may return the call's own objects (R_INPUT): keep this call's node values, which
  // another call may write into the memo while this one's launch sequence releases the GIL.
  if (const TreeMemo* memo = t->trees[k].memo.get(); memo && t->any_recipe) cv.values = memo->values;
  Py_ssize_t n = static_cast<Py_ssize_t>(cv.leaves.size());
  if (!self->scms || n > TRT_MAX_ARGS) return tree_miss(self, args, kwargs, cv);
  // The leaves are the containers' own (borrowed); the launch sequence may run Python (a custom
  // op's body, Triton's interpreter, another thread while a collective releases the GIL) that
  // drops them from their containers: the call holds them until it returns.
  struct Hold {
    const std::vector<PyObject*>& objects;
    explicit Hold(const std::vector<PyObject*>& o) : objects(o) {
      for (PyObject* x : objects) Py_INCREF(x);
    }
    ~Hold() {
      for (PyObject* x : objects) Py_DECREF(x);
    }
  } hold(cv.leaves);
  int rc = TRT_MISS;
  PyObject* out = run_scm(self, cv.leaves.data(), n, &rc, clock);
  if (rc == TRT_CAPTURE)
    return PyObject_CallMethod(reinterpret_cast<PyObject*>(self), "_capture_path", "OO", args,
                               kwargs ? kwargs : Py_None);
  if (rc == TRT_MISS) return tree_miss(self, args, kwargs, cv);
  if (rc == TRT_EAGER) {  // Note [Errors inside try] in capture.py: eager takes its branch
    PyObject *type, *error, *tb;
    PyErr_Fetch(&type, &error, &tb);
    PyErr_NormalizeException(&type, &error, &tb);
    PyObject* eager = PyObject_CallMethod(reinterpret_cast<PyObject*>(self), "_eager_path",
                                          "OOO", args, kwargs ? kwargs : Py_None, error);
    Py_XDECREF(type);
    Py_XDECREF(error);
    Py_XDECREF(tb);
    return eager;
  }
  if (!out) return nullptr;
  ++self->hits;
  PyObject* recipe = t->recipes && rc < PyTuple_GET_SIZE(t->recipes)
                         ? PyTuple_GET_ITEM(t->recipes, rc) : Py_None;
  if (recipe == Py_None) return out;
  PyObject* built = apply_recipe(recipe, out, cv.values);
  Py_DECREF(out);
  return built;
}

PyObject* Dispatcher_call(Dispatcher* self, PyObject* args, PyObject* kwargs) {
  return hit(self, args, kwargs, nullptr);
}

// _hit_profile(args, kwargs, n) -> dict: n calls as the hit path makes them, each part's mean
// time in microseconds (benchmarks/bench_hf.py; a call that is not a hit is timed as far as it
// gets). The guards are timed alone, then again inside the module's call ("run").
PyObject* Dispatcher_hit_profile(Dispatcher* self, PyObject* args) {
  PyObject *call_args, *kwargs;
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "O!On", &PyTuple_Type, &call_args, &kwargs, &n)) return nullptr;
  if (kwargs != Py_None && !PyDict_Check(kwargs))
    return PyErr_Format(PyExc_TypeError, "kwargs must be a dict or None");
  HitClock clock;
  unsigned long long hits = self->hits;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* out = hit(self, call_args, kwargs == Py_None ? nullptr : kwargs, &clock);
    if (!out) return nullptr;
    clock.lap(HitClock::kOutput);
    Py_DECREF(out);
  }
  static const char* const names[HitClock::kParts] = {
      "state guards", "binding", "argument tree", "environment and leaves", "guards",
      "run (guards, launches or graph replay)", "output rebuild"};
  PyObject* d = PyDict_New();
  for (int p = 0; d && p < HitClock::kParts; ++p) {
    PyObject* v = PyFloat_FromDouble(n ? clock.ns[p] / 1e3 / static_cast<double>(n) : 0.0);
    if (!v || PyDict_SetItemString(d, names[p], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  PyObject* h = PyLong_FromUnsignedLongLong(self->hits - hits);
  if (d && (!h || PyDict_SetItemString(d, "hits", h) < 0)) Py_CLEAR(d);
  Py_XDECREF(h);
  return d;
}

// _run(*args): run the installed SCM without counting a hit; TridentError if no guard holds.
// A specialization that wants its CUDA graph captured runs its launch sequence instead.
PyObject* Dispatcher_run(Dispatcher* self, PyObject* args) {
  int rc = TRT_MISS;
  PyObject* out = (self->scms && PyTuple_GET_SIZE(args) <= TRT_MAX_ARGS)
                      ? run_scm(self, tuple_items(args), PyTuple_GET_SIZE(args), &rc) : nullptr;
  if (rc == TRT_MISS || rc == TRT_CAPTURE)
    PyErr_SetString(TridentError, "no specialization accepts these arguments");
  return out;
}

// _install(entries): point the hit path at the SCMs of the installed specializations, a tuple of
// (call_address, match_address) in guard order; () uninstalls.
PyObject* Dispatcher_install(Dispatcher* self, PyObject* entries) {
  if (!PyTuple_Check(entries)) return PyErr_Format(PyExc_TypeError, "expected a tuple");
  auto scms = std::make_shared<std::vector<ScmEntry>>();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(entries); ++i) {
    unsigned long long call_addr, match_addr;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(entries, i), "KK", &call_addr, &match_addr))
      return nullptr;
    scms->push_back({reinterpret_cast<trt_scm_call_fn>(call_addr),
                     reinterpret_cast<trt_scm_match_fn>(match_addr)});
  }
  if (scms->empty())
    self->scms.reset();
  else
    self->scms = std::move(scms);
  Py_RETURN_NONE;
}

// A tree program (flatten.ArgTree.program() or state.StateTree.program()) into `tree`; false
// for a malformed one. `nparams`: the parameters ARG nodes may read (0 for a state tree, whose
// nodes start at ROOT nodes).
bool parse_tree(PyObject* prog, Py_ssize_t nparams, Tree& tree) {
  tree.key = PyTuple_GET_ITEM(prog, 0);
  tree.leaves = 0;
  PyObject* nodes = PyTuple_GET_ITEM(prog, 1);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nodes); ++i) {
    PyObject* n = PyTuple_GET_ITEM(nodes, i);
    if (!PyTuple_Check(n) || PyTuple_GET_SIZE(n) != 7) return false;
    TreeNode node;
    node.parent = PyLong_AsSsize_t(PyTuple_GET_ITEM(n, 0));
    node.access = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(n, 1)));
    node.key = PyTuple_GET_ITEM(n, 2);
    node.check = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(n, 3)));
    node.expect = PyTuple_GET_ITEM(n, 4);
    node.length = PyLong_AsSsize_t(PyTuple_GET_ITEM(n, 5));
    node.keys = PyTuple_GET_ITEM(n, 6) == Py_None ? nullptr : PyTuple_GET_ITEM(n, 6);
    if (node.keys && (!PyTuple_Check(node.keys) || PyTuple_GET_SIZE(node.keys) != node.length))
      return false;
    node.index = (node.access == ACC_ARG || node.access == ACC_INDEX) ? PyLong_AsSsize_t(node.key)
                                                                      : 0;
    node.same = node.check == CHK_SAME ? PyLong_AsSsize_t(node.expect) : 0;
    node.float_bits = node.check == CHK_CONST && PyFloat_CheckExact(node.expect);
    bool root = node.access == ACC_ARG || node.access == ACC_SELF || node.access == ACC_ROOT;
    const TreeNode* parent =
        node.parent >= 0 && node.parent < i ? &tree.nodes[node.parent] : nullptr;
    if (PyErr_Occurred() || node.parent >= i || root != (node.parent < 0) ||
        (parent && parent->check == CHK_ABSENT) ||
        (node.access == ACC_ARG && (node.index < 0 || node.index >= nparams)) ||
        (node.access == ACC_ATTR && parent->check != CHK_OBJECT) ||
        (node.access == ACC_ITEM && parent->check != CHK_DICT) ||
        (node.access == ACC_INDEX && (parent->check != CHK_SEQ || node.index < 0 ||
                                      node.index >= parent->length)) ||
        (node.check == CHK_SAME && (node.same < 0 || node.same >= i)) ||
        ((node.check == CHK_SEQ || node.check == CHK_DICT || node.check == CHK_OBJECT ||
          node.check == CHK_TYPE) && !PyType_Check(node.expect)))
      return false;
    tree.leaves += node.check == CHK_LEAF;
    tree.nodes.push_back(node);
  }
  return true;
}

// Note [Unchanged subtrees]: the memo of an argument tree, empty: its first evaluation reads all.
std::unique_ptr<TreeMemo> make_memo(const Tree& tree) {
  size_t n = tree.nodes.size();
  auto memo = std::make_unique<TreeMemo>();
  memo->values.assign(n, nullptr);
  memo->dicts.assign(n, nullptr);
  memo->tags.assign(n, 0);
  memo->end.assign(n, 0);
  for (size_t i = n; i-- > 0;) {  // a subtree ends where its last child's does
    if (memo->end[i] == 0) memo->end[i] = i + 1;
    Py_ssize_t p = tree.nodes[i].parent;
    if (p >= 0 && memo->end[p] == 0) memo->end[p] = memo->end[i];
  }
  memo->kind.assign(n, TreeMemo::kOther);
  memo->watched.assign(n, 0);
  memo->types.assign(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const TreeNode& node = tree.nodes[i];
    auto* type = reinterpret_cast<PyTypeObject*>(node.expect);
    switch (node.check) {
      case CHK_LEAF: memo->kind[i] = TreeMemo::kLeaf; break;
      case CHK_ID: memo->kind[i] = TreeMemo::kImmutable; break;
      case CHK_CONST:
        if (!PyAnySet_Check(node.expect)) memo->kind[i] = TreeMemo::kImmutable;
        break;
      case CHK_DICT:
        memo->kind[i] = type == &PyODict_Type && node.length >= 2 ? TreeMemo::kOrderedDict
                                                                 : TreeMemo::kDict;
        memo->types[i] = type;
        break;
      case CHK_OBJECT:
        memo->kind[i] = TreeMemo::kObject;
        memo->types[i] = type;
        break;
      case CHK_SEQ:
        if (type == &PyTuple_Type) memo->kind[i] = TreeMemo::kTuple;
        break;
    }
  }
  memo->work_begin.assign(n + 1, 0);
  for (size_t p = 0; p < n; ++p) {
    memo->work_begin[p] = static_cast<Py_ssize_t>(memo->work.size());
    uint8_t kind = memo->kind[p];  // the containers an unchanged value of holds its children
    if (kind != TreeMemo::kDict && kind != TreeMemo::kOrderedDict && kind != TreeMemo::kObject &&
        kind != TreeMemo::kTuple)
      continue;
    for (size_t k = p + 1; k < memo->end[p]; k = memo->end[k]) {
      const TreeNode& child = tree.nodes[k];
      if (memo->kind[k] != TreeMemo::kImmutable) memo->work.push_back(static_cast<Py_ssize_t>(k));
    }
  }
  memo->work_begin[n] = static_cast<Py_ssize_t>(memo->work.size());
  return memo;
}

// _set_state(program or None): Note [State guards] in state.py; hits need its checks to hold.
PyObject* Dispatcher_set_state(Dispatcher* self, PyObject* program) {
  std::shared_ptr<Tree> tree;
  if (program != Py_None) {
    tree = std::make_shared<Tree>();
    if (!PyTuple_Check(program) || PyTuple_GET_SIZE(program) != 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(program, 1)) || !parse_tree(program, 0, *tree)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "_set_state: bad state tree");
      return nullptr;
    }
  }
  self->state = std::move(tree);
  Py_INCREF(program);
  Py_XSETREF(self->state_program, program);
  Py_RETURN_NONE;
}

// _state_failure() -> int: the first state tree node whose check fails, or -1.
PyObject* Dispatcher_state_failure(Dispatcher* self, PyObject*) {
  Py_ssize_t failed = -1;
  return PyLong_FromSsize_t(state_holds(self, &failed) ? -1 : failed);
}

// _set_call_trees(binding, trees, recipes): Note [Argument trees]. binding is (params, self
// object, has self) with params ((name, kind, has default, default), ...); trees are
// flatten.ArgTree.program() tuples; recipes one OutputRecipe's ops (or None) per specialization.
PyObject* Dispatcher_set_call_trees(Dispatcher* self, PyObject* args) {
  PyObject *binding, *programs, *recipes;
  if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &binding, &PyTuple_Type, &programs,
                        &PyTuple_Type, &recipes))
    return nullptr;
  auto t = std::make_shared<CallTrees>();
  auto fail = [&](const char* what) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "_set_call_trees: bad %s", what);
    return nullptr;
  };
  if (PyTuple_GET_SIZE(binding) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(binding, 0)))
    return fail("binding");
  PyObject* params = PyTuple_GET_ITEM(binding, 0);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(params); ++i) {
    PyObject* p = PyTuple_GET_ITEM(params, i);
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 4 || !PyUnicode_Check(PyTuple_GET_ITEM(p, 0)))
      return fail("parameter");
    t->params.push_back({PyTuple_GET_ITEM(p, 0), static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(p, 1))),
                         PyObject_IsTrue(PyTuple_GET_ITEM(p, 2)) ? PyTuple_GET_ITEM(p, 3) : nullptr});
  }
  t->self_obj = PyTuple_GET_ITEM(binding, 1);
  t->has_self = PyObject_IsTrue(PyTuple_GET_ITEM(binding, 2));
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(programs); ++k) {
    PyObject* prog = PyTuple_GET_ITEM(programs, k);
    if (!PyTuple_Check(prog) || PyTuple_GET_SIZE(prog) != 2 ||
        !PyLong_Check(PyTuple_GET_ITEM(prog, 0)) || !PyTuple_Check(PyTuple_GET_ITEM(prog, 1)))
      return fail("tree");
    Tree tree;
    if (!parse_tree(prog, static_cast<Py_ssize_t>(t->params.size()), tree))
      return fail("tree node");
    tree.memo = make_memo(tree);
    t->trees.push_back(std::move(tree));
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(recipes); ++k)
    t->any_recipe |= PyTuple_GET_ITEM(recipes, k) != Py_None;
  t->source = binding;
  t->programs = programs;
  t->recipes = recipes;
  Py_INCREF(binding);
  Py_INCREF(programs);
  Py_INCREF(recipes);
  self->trees = std::move(t);  // a call in flight keeps the old table
  Py_RETURN_NONE;
}

// _flatten_native(args, kwargs) -> (tree index, leaves) or (-1, first failing node of the last
// tree, or -1 when the call does not bind): the native binding and flattening alone, so that
// tests can hold them against flatten.py's.
PyObject* Dispatcher_flatten_native(Dispatcher* self, PyObject* args) {
  PyObject *call_args, *kwargs;
  if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &call_args, &kwargs)) return nullptr;
  if (kwargs != Py_None && !PyDict_Check(kwargs))
    return PyErr_Format(PyExc_TypeError, "kwargs must be a dict or None");
  CallValues cv;
  Py_ssize_t failed = -1;
  Py_ssize_t k = self->trees ? flatten_args(*self->trees, call_args,
                                            kwargs == Py_None ? nullptr : kwargs, cv, &failed)
                             : -1;
  if (k < 0) return Py_BuildValue("(nn)", static_cast<Py_ssize_t>(-1), failed);
  PyObject* leaves = PyTuple_New(static_cast<Py_ssize_t>(cv.leaves.size()));
  if (!leaves) return nullptr;
  for (size_t i = 0; i < cv.leaves.size(); ++i) {
    Py_INCREF(cv.leaves[i]);
    PyTuple_SET_ITEM(leaves, static_cast<Py_ssize_t>(i), cv.leaves[i]);
  }
  return Py_BuildValue("(nN)", k, leaves);
}

// A JitFunction in a class body binds like a function: obj.method is a bound method (C).
PyObject* Dispatcher_descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

// _reset_graphs(n): n empty CUDA graph slots (a new SCM is being installed).
PyObject* Dispatcher_reset_graphs(Dispatcher* self, PyObject* arg) {
  Py_ssize_t n = PyLong_AsSsize_t(arg);
  if (n < 0) return PyErr_Occurred() ? nullptr : PyErr_Format(PyExc_ValueError, "n < 0");
  free_graphs(self);
  self->graphs = static_cast<trt_graph*>(std::calloc(n ? n : 1, sizeof(trt_graph)));
  if (!self->graphs) return PyErr_NoMemory();
  self->num_graphs = n;
  Py_RETURN_NONE;
}

// _set_graph(index, state, recaptures=0, descs=(), open=0): descs holds one bytes object of
// int64 words per graph (trt_graph in trident_rt.h).
PyObject* Dispatcher_set_graph(Dispatcher* self, PyObject* args) {
  Py_ssize_t index;
  int state, recaptures = 0, open = 0;
  PyObject* descs = nullptr;
  if (!PyArg_ParseTuple(args, "ni|iO!p", &index, &state, &recaptures, &PyTuple_Type, &descs,
                        &open))
    return nullptr;
  if (index < 0 || index >= self->num_graphs)
    return PyErr_Format(PyExc_IndexError, "no graph slot %zd", index);
  Py_ssize_t n = descs ? PyTuple_GET_SIZE(descs) : 0;
  if (state == TRT_GRAPH_READY && n == 0 && !open)
    return PyErr_Format(PyExc_ValueError, "a ready graph slot needs a descriptor or sizes to take");
  int64_t** copies = static_cast<int64_t**>(std::calloc(n ? n : 1, sizeof(int64_t*)));
  uint64_t* hashes = static_cast<uint64_t*>(std::calloc(n ? n : 1, sizeof(uint64_t)));
  trt_graph staged{};
  staged.descs = copies;
  staged.hashes = hashes;
  if (!copies || !hashes) {
    clear_descs(staged);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    char* data;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(descs, i), &data, &size) < 0 ||
        !(copies[i] = static_cast<int64_t*>(std::malloc(size ? size : 1)))) {
      clear_descs(staged);
      return PyErr_Occurred() ? nullptr : PyErr_NoMemory();
    }
    staged.ndescs = static_cast<int32_t>(i + 1);
    std::memcpy(copies[i], data, size);
    if (size < 5 * 8 || size < (5 + copies[i][4]) * 8) {
      clear_descs(staged);
      return PyErr_Format(PyExc_ValueError, "graph descriptor %zd is too short", i);
    }
    hashes[i] = trt_graph_key_hash(copies[i] + 5, copies[i][4]);
  }
  trt_graph& g = self->graphs[index];
  clear_descs(g);
  g.descs = copies;
  g.hashes = hashes;
  g.ndescs = static_cast<int32_t>(n);
  g.state = state;
  g.open = open;
  g.recaptures_left = recaptures;
  g.bound = 0;
  Py_RETURN_NONE;
}

// _graph_seen(index, *args) -> bool: whether specialization `index`'s graph slot saw a call of
// these arguments' sizes, remembering them if not (Note [Graphs per size]: a warm-up that ran
// from Python counts as the size's first call).
PyObject* Dispatcher_graph_seen(Dispatcher* self, PyObject* args) {
  Py_ssize_t n = PyTuple_GET_SIZE(args) - 1;
  Py_ssize_t index = n >= 0 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 0)) : -1;
  if (PyErr_Occurred()) return nullptr;
  if (index < 0 || index >= self->num_graphs)
    return PyErr_Format(PyExc_IndexError, "no graph slot %zd", index);
  if (n > TRT_MAX_ARGS) Py_RETURN_FALSE;  // no SCM reads so many: never replayed
  ArgBuffer buffer;
  trt_arg* a = buffer.get(n);
  trt_env env;
  read_args(tuple_items(args) + 1, a, n, &env);
  return PyBool_FromLong(trt_graph_seen_before(
      &self->graphs[index], trt_graph_call_hash(a, static_cast<int32_t>(n))));
}

// _graph_replays() -> int: CUDA graph replays of this function, all SCMs it had included.
PyObject* Dispatcher_graph_replays(Dispatcher* self, PyObject*) {
  long long total = self->replays_before;
  for (Py_ssize_t i = 0; i < self->num_graphs; ++i) total += self->graphs[i].replays;
  return PyLong_FromLongLong(total);
}

// _match(*args) -> int: the specialization the native guards pick, or -1. For tests and explain.
PyObject* Dispatcher_match(Dispatcher* self, PyObject* args) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  std::shared_ptr<const std::vector<ScmEntry>> scms = self->scms;
  if (!scms || n > TRT_MAX_ARGS) return PyLong_FromLong(-1);
  ArgBuffer buffer;
  trt_arg* a = buffer.get(n);
  trt_env env;
  read_args(tuple_items(args), a, n, &env);
  for (size_t i = 0; i < scms->size(); ++i)
    if ((*scms)[i].match(a, static_cast<int32_t>(n), &env) >= 0)
      return PyLong_FromSize_t(i);
  return PyLong_FromLong(-1);
}

PyObject* Dispatcher_get_hits(Dispatcher* self, void*) { return PyLong_FromUnsignedLongLong(self->hits); }
int Dispatcher_set_hits(Dispatcher* self, PyObject* value, void*) {
  if (!value) return -1;
  self->hits = PyLong_AsUnsignedLongLong(value);
  return PyErr_Occurred() ? -1 : 0;
}

PyMethodDef Dispatcher_methods[] = {
    {"_install", reinterpret_cast<PyCFunction>(Dispatcher_install), METH_O,
     "_install(entries): install the SCMs' (call_address, match_address), in guard order."},
    {"_run", reinterpret_cast<PyCFunction>(Dispatcher_run), METH_VARARGS,
     "_run(*args): run the installed module without counting a hit (the miss path's call)."},
    {"_set_state", reinterpret_cast<PyCFunction>(Dispatcher_set_state), METH_O,
     "_set_state(program or None): the state tree hits need to hold (Note [State guards])."},
    {"_state_failure", reinterpret_cast<PyCFunction>(Dispatcher_state_failure), METH_NOARGS,
     "_state_failure() -> int: the first failing state tree node, or -1."},
    {"_flatten_native", reinterpret_cast<PyCFunction>(Dispatcher_flatten_native), METH_VARARGS,
     "_flatten_native(args, kwargs) -> (tree, leaves) or (-1, failing node): for tests."},
    {"_set_call_trees", reinterpret_cast<PyCFunction>(Dispatcher_set_call_trees), METH_VARARGS,
     "_set_call_trees(binding, trees, recipes): how calls bind, flatten and build results."},
    {"_reset_graphs", reinterpret_cast<PyCFunction>(Dispatcher_reset_graphs), METH_O,
     "_reset_graphs(n): n empty CUDA graph slots, one per specialization."},
    {"_set_graph", reinterpret_cast<PyCFunction>(Dispatcher_set_graph), METH_VARARGS,
     "_set_graph(index, state, recaptures=0, descs=(), open=0): a specialization's CUDA graphs."},
    {"_graph_seen", reinterpret_cast<PyCFunction>(Dispatcher_graph_seen), METH_VARARGS,
     "_graph_seen(index, *args) -> bool: the slot saw these sizes before (remembers them)."},
    {"_graph_replays", reinterpret_cast<PyCFunction>(Dispatcher_graph_replays), METH_NOARGS,
     "_graph_replays() -> int: hits served by a CUDA graph."},
    {"_hit_profile", reinterpret_cast<PyCFunction>(Dispatcher_hit_profile), METH_VARARGS,
     "_hit_profile(args, kwargs, n) -> dict: mean microseconds per part of n hits."},
    {"_match", reinterpret_cast<PyCFunction>(Dispatcher_match), METH_VARARGS,
     "_match(*args) -> int: index of the specialization the native guards select, -1 if none."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef Dispatcher_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {"hits", reinterpret_cast<getter>(Dispatcher_get_hits),
     reinterpret_cast<setter>(Dispatcher_set_hits), "calls served by the native hit path", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject DispatcherType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- module ---------------------------------------------------------------------------------

PyObject* api_address(PyObject*, PyObject*) {
  return PyLong_FromVoidPtr(const_cast<trt_api*>(&g_api));
}

PyObject* register_callback(PyObject*, PyObject* fn) {
  Py_INCREF(fn);
  g_callbacks.push_back(fn);
  return PyLong_FromSize_t(g_callbacks.size() - 1);
}

// build_result(ops, flat, values) -> object: an OutputRecipe applied in Python's slow path, by the
// same code as on a hit.
PyObject* build_result(PyObject*, PyObject* args) {
  PyObject *ops, *flat, *values;
  if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &ops, &PyTuple_Type, &flat, &PyTuple_Type,
                        &values))
    return nullptr;
  std::vector<PyObject*> v(tuple_items(values), tuple_items(values) + PyTuple_GET_SIZE(values));
  return apply_recipe(ops, flat, v);
}

PyObject* last_error(PyObject*, PyObject*) { return PyUnicode_FromString(g_error.c_str()); }

// unboxed_signature(name, overload) -> str | None: the argument kinds of the typed call that
// api_call makes for this operator (Note [Unboxed calls]), or None where it calls boxed.
PyObject* unboxed_signature(PyObject*, PyObject* args) {
  const char *name, *overload;
  if (!PyArg_ParseTuple(args, "ss", &name, &overload)) return nullptr;
  trt_op* op = api_op(name, overload);
  if (!op) {
    PyErr_Format(PyExc_ValueError, "no operator %s.%s", name, overload);
    return nullptr;
  }
  if (!op->unboxed) Py_RETURN_NONE;
  return PyUnicode_FromString(unboxed_kinds(op->handle.schema()).c_str());
}

// dtype_code(dtype) -> int: the c10::ScalarType a torch.dtype stands for (what read_arg reports).
PyObject* dtype_code(PyObject*, PyObject* dtype) {
  if (!THPDtype_Check(dtype)) {
    PyErr_SetString(PyExc_TypeError, "dtype_code expects a torch.dtype");
    return nullptr;
  }
  return PyLong_FromLong(static_cast<long>(reinterpret_cast<THPDtype*>(dtype)->scalar_type));
}

// The error classes are defined in Python (trident/errors.py, ERROR_TYPES) and handed over once
// at load time, in the order of the TRT_ERR_ kinds: TridentError first, then its twins.
PyObject* set_error_types(PyObject*, PyObject* types) {
  if (!PyTuple_Check(types) || PyTuple_GET_SIZE(types) != TRT_ERR_KINDS) {
    PyErr_Format(PyExc_TypeError, "set_error_types expects a tuple of %d classes", TRT_ERR_KINDS);
    return nullptr;
  }
  for (int i = 0; i < TRT_ERR_KINDS; ++i) {
    Py_INCREF(PyTuple_GET_ITEM(types, i));
    Py_XSETREF(ErrorTypes[i], PyTuple_GET_ITEM(types, i));
  }
  Py_INCREF(ErrorTypes[0]);
  Py_XSETREF(TridentError, ErrorTypes[0]);
  Py_RETURN_NONE;
}

// global_flags() -> int: what read_args reads into trt_env.flags (guards.env_facts).
PyObject* global_flags_py(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(global_flags());
}

PyMethodDef module_methods[] = {
    {"api_address", api_address, METH_NOARGS, "Address of the runtime's trt_api table."},
    {"register_callback", register_callback, METH_O,
     "register_callback(fn) -> int: an id an SCM passes to trt_api.python_callback."},
    {"last_error", last_error, METH_NOARGS, "The runtime's pending error message."},
    {"unboxed_signature", unboxed_signature, METH_VARARGS,
     "unboxed_signature(name, overload) -> str | None: an operator's typed call, if any."},
    {"build_result", build_result, METH_VARARGS,
     "build_result(ops, flat, values): an output recipe applied to flat outputs."},
    {"dtype_code", dtype_code, METH_O, "dtype_code(dtype) -> int: its c10::ScalarType."},
    {"global_flags", global_flags_py, METH_NOARGS, "global_flags() -> int: trt_env.flags now."},
    {"set_error_types", set_error_types, METH_O,
     "set_error_types(classes): TridentError and its twins, raised on TRT_ERROR."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "trident_rt", nullptr, -1, module_methods};

// ---- trident:: operators ---------------------------------------------------------------------

// Note [Random state steps] (trident/rng.py): torch.manual_seed, torch.get_rng_state and
// torch.set_rng_state (and their torch.cuda twins) as operators a plan calls, on the default
// generators, at the point where the function called them. Each holds the generator's mutex, as
// torch's Python bindings do (Note [Acquire lock when using random generators] in ATen).
at::Generator default_generator(c10::Device device) {
  if (device.is_cuda() && !device.has_index())  // torch.cuda's "cuda": the current device
    device = c10::Device(c10::kCUDA, c10::impl::VirtualGuardImpl(c10::kCUDA).getDevice().index());
  return at::globalContext().defaultGenerator(device);
}

void seed_generator(at::Generator gen, int64_t seed) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(static_cast<uint64_t>(seed));  // torch's bindings take [-2^63, 2^64)
}

// device None: what torch.manual_seed seeds, every CUDA device's generator (rng.py compiles the
// call only where CUDA is absent or initialized, so torch.cuda.manual_seed_all seeds at once)
// and then the CPU's; a device: its generator (torch.cuda.manual_seed, manual_seed_all).
void op_manual_seed(int64_t seed, std::optional<c10::Device> device) {
  if (device) return seed_generator(default_generator(*device), seed);
  if (at::globalContext().hasCUDA())
    for (c10::DeviceIndex i = 0; i < c10::impl::VirtualGuardImpl(c10::kCUDA).deviceCount(); ++i)
      seed_generator(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, i)), seed);
  seed_generator(at::detail::getDefaultCPUGenerator(), seed);
}

at::Tensor op_get_rng_state(c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void op_set_rng_state(const at::Tensor& state, c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Note [Bool results] (trident/capture.py): aten::equal and aten::allclose return a C++ bool,
// which a trace on fake tensors cannot know; as a 0-dim bool tensor it is a value of the plan,
// read by aten::_local_scalar_dense as `.item()` is.
at::Tensor op_equal(const at::Tensor& self, const at::Tensor& other) {
  return at::scalar_tensor(at::equal(self, other), at::kBool);
}

at::Tensor op_allclose(const at::Tensor& self, const at::Tensor& other, double rtol, double atol,
                       bool equal_nan) {
  return at::scalar_tensor(at::allclose(self, other, rtol, atol, equal_nan), at::kBool);
}

}  // namespace

TORCH_LIBRARY(trident, m) {
  // nondeterministic_seeded: they act on the random state, so no CUDA graph holds them
  // (graphs._draws_random) and a failure after them is not run again (plan.rerun_eagerly)
  const std::vector<at::Tag> rng = {at::Tag::nondeterministic_seeded};
  m.def("manual_seed(int seed, Device? device=None) -> ()", rng);
  m.def("get_rng_state(Device device) -> Tensor", rng);
  m.def("set_rng_state(Tensor state, Device device) -> ()", rng);
  m.def("equal(Tensor self, Tensor other) -> Tensor");
  m.def("allclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, "
        "bool equal_nan=False) -> Tensor");
}

// CompositeExplicitAutograd: one kernel for every backend, and for calls without a tensor
TORCH_LIBRARY_IMPL(trident, CompositeExplicitAutograd, m) {
  m.impl("manual_seed", &op_manual_seed);
  m.impl("get_rng_state", &op_get_rng_state);
  m.impl("set_rng_state", &op_set_rng_state);
  m.impl("equal", &op_equal);
  m.impl("allclose", &op_allclose);
}

#define TRT_CONCAT2(a, b) a##b
#define TRT_CONCAT(a, b) TRT_CONCAT2(a, b)

extern "C" PyMODINIT_FUNC TRT_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  DispatcherType.tp_name = "trident.runtime.Dispatcher";
  DispatcherType.tp_basicsize = sizeof(Dispatcher);
  DispatcherType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  DispatcherType.tp_doc =
      "Native entry of a @trident.jit function: guards and launches run in the installed SCM.";
  DispatcherType.tp_new = Dispatcher_new;
  DispatcherType.tp_dealloc = reinterpret_cast<destructor>(Dispatcher_dealloc);
  DispatcherType.tp_traverse = reinterpret_cast<traverseproc>(Dispatcher_traverse);
  DispatcherType.tp_clear = reinterpret_cast<inquiry>(Dispatcher_clear);
  DispatcherType.tp_call = reinterpret_cast<ternaryfunc>(Dispatcher_call);
  DispatcherType.tp_descr_get = Dispatcher_descr_get;
  DispatcherType.tp_methods = Dispatcher_methods;
  DispatcherType.tp_getset = Dispatcher_getset;
  DispatcherType.tp_dictoffset = offsetof(Dispatcher, dict);
  DispatcherType.tp_weaklistoffset = offsetof(Dispatcher, weaklist);
  if (PyType_Ready(&DispatcherType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&DispatcherType);
  PyModule_AddObject(m, "Dispatcher", reinterpret_cast<PyObject*>(&DispatcherType));
  return m;
}
