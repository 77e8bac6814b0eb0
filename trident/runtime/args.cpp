// args.cpp: reading a call's arguments and environment into trt_args and a trt_env (what the
// guards read), and building the result from the SCM's outputs (Note [Output spec]).

#include "runtime_internal.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

namespace {

// ---- reading arguments ---------------------------------------------------------------------

void read_tensor(PyObject* obj, trt_arg* a, bool forward_ad, bool attributes);

// Whether a forward-AD level is open (torch.autograd.forward_ad.dual_level): only then can a
// tensor carry a tangent. Levels close in the order they opened, and closing one clears its
// tangents (torch/csrc/autograd/forward_grad.h), so level 0 is open if any is. Reading a tensor's
// tangent takes two mutexes; this takes one per call.
bool forward_ad_open() {
  return torch::autograd::ForwardADLevel::try_get_by_idx(0) != nullptr;
}

static_assert(sizeof(trt_arg) == 64 && alignof(trt_arg) == 64 && offsetof(trt_arg, sizes) == 8,
              "Note [Argument records]: one cache line per argument, the header one word");
static_assert(sizeof(c10::DeviceIndex) <= sizeof(int16_t) &&
                  sizeof(c10::ScalarType) == 1 && sizeof(c10::DeviceType) == 1,
              "Note [Argument records]: the header's fields hold c10's");

// What the guards read of one argument; anything they cannot read is TRT_ARG_OTHER (a miss that
// Python runs eagerly): no C++ exception leaves this function.
void read_arg(PyObject* obj, trt_arg* a, bool forward_ad, bool attributes) {
  std::memset(a, 0, sizeof(*a));
  if (THPVariable_CheckExact(obj)) {
    try {
      read_tensor(obj, a, forward_ad, attributes);
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

void read_tensor(PyObject* obj, trt_arg* a, bool forward_ad, bool attributes) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  auto* impl = t.unsafeGetTensorImpl();
  // Nested, non-strided layouts, symbolic shapes, conjugate/negative views, ZeroTensors (no
  // memory: a null data pointer, which a graph replay would read) and wrapper tensors are left
  // to Python.
  if (!t.defined() || t.is_nested() || t.layout() != c10::kStrided ||
      impl->has_symbolic_sizes_strides() ||
      (!t.is_cpu() && !t.is_cuda()) ||
      t.is_conj() || t.is_neg() || t._is_zerotensor() || impl->is_python_dispatch() ||
      !t.has_storage() ||
      (forward_ad && (t._fw_grad(0).defined() || t._fw_grad(1).defined()))) {  // a dual tensor
    a->kind = TRT_ARG_OTHER;
    return;
  }
  // Note [Argument records] in trident_rt.h: c10's ScalarType and DeviceType are int8 and
  // DeviceIndex at most int16; a dim past int16 (none in practice) is left to Python
  if (t.dim() > INT16_MAX) {
    a->kind = TRT_ARG_OTHER;
    return;
  }
  a->kind = TRT_ARG_TENSOR;
  a->dtype = static_cast<int8_t>(t.scalar_type());
  a->device_type = static_cast<int8_t>(t.device().type());
  a->device_index = t.device().index();
  a->dim = static_cast<int16_t>(t.dim());
  a->sizes = t.sizes().data();
  a->strides = t.strides().data();
  a->storage_offset = t.storage_offset();
  a->data_ptr = const_cast<void*>(t.const_data_ptr());
  a->tensor = reinterpret_cast<trt_tensor*>(const_cast<at::Tensor*>(&t));
  if (t.requires_grad()) a->flags |= TRT_REQUIRES_GRAD;
  if (t.is_inference()) a->flags |= TRT_INFERENCE;
  if ((reinterpret_cast<uintptr_t>(a->data_ptr) & 15) == 0) a->flags |= TRT_ALIGNED16;
  // Note [Tensor types and attributes] (trident/ir/guards.py): THPVariable_CheckExact holds of
  // a Tensor and an nn.Parameter; a non-empty instance dict (`x.scale = 3.0`) is its `i`,
  // read where an installed specialization guards it (Note [Attribute reads])
  if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) a->flags |= TRT_PARAMETER;
  if (!attributes) return;
  PyObject** dict = _PyObject_GetDictPtr(obj);
  a->i = dict && *dict && PyDict_Check(*dict) && PyDict_GET_SIZE(*dict) > 0;
}

// One tensor object in two argument positions (`tensors`: how many of the n are tensors):
// pairwise for a few tensors, an open-addressing set on the stack for more (no allocation on the
// hit path; its slots hold an argument's index + 1, two bytes each: a model's 200 tensors clear
// 1 KiB, not 8), sorted beyond.
bool tensor_passed_twice(const trt_arg* a, Py_ssize_t n, Py_ssize_t tensors) {
  if (tensors < 2) return false;
  if (tensors <= 16) {
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (a[i].kind != TRT_ARG_TENSOR) continue;
      for (Py_ssize_t j = 0; j < i; ++j)
        if (a[j].kind == TRT_ARG_TENSOR && a[i].tensor == a[j].tensor) return true;
    }
    return false;
  }
  constexpr size_t kSlots = 8192;  // a power of two, at least twice the tensors it takes
  if (static_cast<size_t>(tensors) <= kSlots / 2 && n < 65535) {
    size_t size = 32;
    while (size < 2 * static_cast<size_t>(tensors)) size <<= 1;
    uint16_t slots[kSlots];
    std::memset(slots, 0, size * sizeof(slots[0]));
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (a[i].kind != TRT_ARG_TENSOR) continue;
      uint64_t h = reinterpret_cast<uintptr_t>(a[i].tensor) * 0x9E3779B97F4A7C15ull;
      for (size_t s = (h >> 40) & (size - 1);; s = (s + 1) & (size - 1)) {
        if (!slots[s]) {
          slots[s] = static_cast<uint16_t>(i + 1);
          break;
        }
        if (a[slots[s] - 1].tensor == a[i].tensor) return true;
      }
    }
    return false;
  }
  std::vector<trt_tensor*> sorted;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (a[i].kind == TRT_ARG_TENSOR) sorted.push_back(a[i].tensor);
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
}

// torch's global flags that ops read when they run or when they are traced (which SDPA backend a
// trace picks), one bit or field each (TRT_FLAG_*, TRT_FIELD_* in trident_rt.h).
//
// Note [Flags that raise]: at::Context::allowTF32CuDNN() and float32MatmulPrecision() without
// an op or backend throw a c10::Error where the legacy and the fp32_precision settings disagree
// (`torch.backends.cudnn.allow_tf32 = False`, then `torch.backends.fp32_precision = "tf32"`;
// `torch.backends.mkldnn.matmul.fp32_precision = "bf16"`: Python's getters raise RuntimeError
// too, torch 2.13). Thrown here, inside the dispatcher's call, it ended the process
// (`terminate called`) where eager ran the function. Such a state is a value of its own
// (TRT_FLAG_CUDNN_TF32_MIXED; the precision field's MATMUL_PRECISION_MIXED): a call in it
// misses, traces as eager runs, and hits while it lasts.
static std::pair<bool, bool> cudnn_tf32(const at::Context& c) {
  try {
    return {c.allowTF32CuDNN(), false};
  } catch (const c10::Error&) {
    return {false, true};
  }
}

static uint64_t matmul_precision(const at::Context& c) {
  try {
    return static_cast<uint64_t>(c.float32MatmulPrecision());
  } catch (const c10::Error&) {
    return TRT_MATMUL_PRECISION_MIXED;
  }
}

uint64_t global_flags() {
  const at::Context& c = at::globalContext();
  const auto [tf32, tf32_mixed] = cudnn_tf32(c);  // Note [Flags that raise]
  const std::pair<int, bool> bits[] = {
      {TRT_FLAG_DETERMINISTIC, c.deterministicAlgorithms()},
      {TRT_FLAG_DETERMINISTIC_WARN, c.deterministicAlgorithmsWarnOnly()},
      {TRT_FLAG_FLASH_SDP, c.userEnabledFlashSDP()},
      {TRT_FLAG_MEM_EFFICIENT_SDP, c.userEnabledMemEfficientSDP()},
      {TRT_FLAG_MATH_SDP, c.userEnabledMathSDP()},
      {TRT_FLAG_CUDNN_SDP, c.userEnabledCuDNNSDP()},
      {TRT_FLAG_CUDNN_TF32, tf32},
      {TRT_FLAG_CUDNN_TF32_MIXED, tf32_mixed},
      {TRT_FLAG_WARN_ALWAYS, c10::WarningUtils::get_warnAlways()},
      {TRT_FLAG_CUDNN, c.userEnabledCuDNN()},
      {TRT_FLAG_CUDNN_BENCHMARK, c.benchmarkCuDNN()},
      {TRT_FLAG_CUDNN_DETERMINISTIC, c.deterministicCuDNN()}};
  uint64_t flags = 0;
  for (const auto& [bit, on] : bits) flags |= (on ? 1ULL : 0ULL) << bit;
  // fields of 4 bits: the float32 matmul precision and the cuBLAS fp16/bf16 reduction options
  flags |= matmul_precision(c) << TRT_FIELD_MATMUL_PRECISION;
  flags |= static_cast<uint64_t>(c.allowFP16ReductionCuBLAS()) << TRT_FIELD_FP16_REDUCTION;
  flags |= static_cast<uint64_t>(c.allowBF16ReductionCuBLAS()) << TRT_FIELD_BF16_REDUCTION;
  return flags;
}

// Note [Leaf prefetch]: inside `generate` a decode hit finds its leaves cold (generate's own
// Python runs between two hits), and each tensor it reads is four objects, each behind the
// one before: the Python object, its TensorImpl (sizes, strides, dtype, device, key set: 4
// cache lines), its StorageImpl (the data pointer) and its AutogradMeta (requires_grad): for a
// 16-layer Llama's 195 tensors over a thousand lines, each tensor's behind a chain of loads.
// So before reading them, two passes ask for every tensor's lines: the TensorImpls (their
// Python objects were just touched by the caller's reference), then the objects the TensorImpls
// point to; the loads of the passes are independent of each other. The passes read only the
// pointers from one object to the next, of objects the caller holds; a prefetch never faults.
void prefetch_leaves(PyObject* const* items, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPVariable_CheckExact(items[i])) continue;
    const auto* impl =
        reinterpret_cast<const char*>(THPVariable_Unpack(items[i]).unsafeGetTensorImpl());
    for (int line = 0; line < 4; ++line) __builtin_prefetch(impl + 64 * line);
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPVariable_CheckExact(items[i])) continue;
    const c10::TensorImpl* impl = THPVariable_Unpack(items[i]).unsafeGetTensorImpl();
    __builtin_prefetch(impl->unsafe_storage().unsafeGetStorageImpl());
    const char* meta = reinterpret_cast<const char*>(impl->autograd_meta());
    if (meta)
      for (int line = 0; line < 3; ++line) __builtin_prefetch(meta + 64 * line);
  }
}

// Note [Attribute reads]: whether a tensor has Python attributes (its record's `i`) is guarded
// only where its function looked one up (Note [Tensor types and attributes] in ir/guards.py: an
// `Attributes` guard), which a model's forward does not; finding out costs a tensor its
// instance dict's pointer and size (about 27 instructions; leaving it out took 6% off reading
// a 16-layer Llama's decode step, 199 tensors: docs/benchmarks.md hit49). So `attributes`
// says whether any installed specialization has such a guard (ScmEntry::attributes, from
// `_install`), and a tensor's `i` stays 0, read by nothing, where none has.
void read_args(PyObject* const* items, trt_arg* out, Py_ssize_t n, trt_env* env,
               bool attributes) {
  if (n > 16) prefetch_leaves(items, n);
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
  env->capturing = 0;
  bool forward_ad = forward_ad_open();
  Py_ssize_t tensors = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    read_arg(items[i], &out[i], forward_ad, attributes);
    tensors += out[i].kind == TRT_ARG_TENSOR;
  }
  env->aliased = tensor_passed_twice(out, n, tensors);
  env->graphs = nullptr;
}

// ---- building results ----------------------------------------------------------------------

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
  // the container's items, counted in the spec (its nested containers skipped), so that it
  // is made at its size: no list grown and copied into a tuple at every hit
  Py_ssize_t n = 0;
  int depth = 0;
  for (const char* q = p; *q != close || depth > 0; ++q) {
    if (*q == '\0') return PyErr_Format(PyExc_RuntimeError, "trident: bad output spec");
    n += depth == 0;  // an item starts here: 'v', 'n', '(' or '['
    if (*q == '(' || *q == '[') ++depth;
    else if (*q == ')' || *q == ']') --depth;
  }
  PyObject* items = c == '[' ? PyList_New(n) : PyTuple_New(n);
  if (!items) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = build_output(p, r, next);
    if (!item) {
      Py_DECREF(items);
      return nullptr;
    }
    if (c == '[') PyList_SET_ITEM(items, i, item);
    else PyTuple_SET_ITEM(items, i, item);
  }
  ++p;
  return items;
}

void release_outputs(trt_result* r, int32_t from) {
  for (int32_t i = from; i < r->nouts; ++i)
    if (r->outs[i].tag == TRT_TENSOR) api_release(r->outs[i].u.t);
}

}  // namespace
