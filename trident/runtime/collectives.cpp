// collectives.cpp: what the runtime does for torch.distributed: the synchronous all-reduce
// (Note [Synchronous all-reduce] in trident/lower/collectives.py) and the process group fact that
// guards read (Note [Process group guard] there).

#include "runtime_internal.h"

#ifdef TRT_HAVE_C10D
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#endif
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace {

#ifdef TRT_HAVE_C10D
template <typename O, typename = void>
struct has_async_op : std::false_type {};
template <typename O>
struct has_async_op<O, std::void_t<decltype(std::declval<O&>().asyncOp)>> : std::true_type {};

// Note [Synchronous all-reduce] in trident/lower/collectives.py: all_reduce_(t, op, group) as
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

// Note [Process group guard] in trident/lower/collectives.py: the default process group as
// "<name>:<rank>/<size>", "" when none is initialized; `fact()` there is the Python twin. Read
// from torch.distributed.distributed_c10d._world.__dict__["_default_pg"] (a dict lookup per
// call); the text is made again only when that object changes. The last group is held by a weak
// reference: a strong one keeps a destroyed gloo group's connections open, and a dead weak
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

}  // namespace
