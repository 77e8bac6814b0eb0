// unboxed.cpp: typed calls of the hot operators (Note [Unboxed calls]), which api_call
// (shim.cpp) makes instead of a boxed call where an operator's signature is in kUnboxed.

#include "runtime_internal.h"

#include <string>
#include <type_traits>
#include <utility>

namespace {

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

// The typed call of `op`, where kUnboxed has its schema's kinds (Note [Unboxed calls]).
void set_unboxed(trt_op* op) {
  std::string kinds = unboxed_kinds(op->handle.schema());
  for (const auto& entry : kUnboxed) {
    if (kinds != entry.kinds) continue;
    try {
      op->typed = entry.make(op->handle);  // checks the C++ signature against the schema
      op->unboxed = entry.call;
      op->nargs = static_cast<int32_t>(kinds.size()) - (kinds.back() == '&');
    } catch (const c10::Error&) {
      op->typed = nullptr;  // a signature the operator does not have: boxed calls
    }
    break;
  }
}

}  // namespace
