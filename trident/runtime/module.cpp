// module.cpp: the trident_rt extension module: its functions and its init.

#include "runtime_internal.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

PyObject* TridentError = nullptr;
PyObject* ErrorTypes[TRT_ERR_KINDS] = {nullptr};

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
  NodeValues nv;
  nv.dense = &v;
  return apply_recipe(ops, flat, nv);
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

// storage_holders(tensor) -> int: how many references its storage has (c10::StorageImpl's
// refcount, as trt_api.output_in_use reads it; Note [Graph outputs] in frontend/graphs.py).
PyObject* storage_holders(PyObject*, PyObject* t) {
  if (!THPVariable_Check(t)) {
    PyErr_SetString(PyExc_TypeError, "storage_holders expects a tensor");
    return nullptr;
  }
  return PyLong_FromSize_t(storage_holders_of(THPVariable_Unpack(t)));
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

// global_flags() -> int: what read_args reads into trt_env.flags (ir/facts.py env_facts).
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
    {"storage_holders", storage_holders, METH_O,
     "storage_holders(tensor) -> int: the references its storage has."},
    {"global_flags", global_flags_py, METH_NOARGS, "global_flags() -> int: trt_env.flags now."},
    {"set_error_types", set_error_types, METH_O,
     "set_error_types(classes): TridentError and its twins, raised on TRT_ERROR."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "trident_rt", nullptr, -1, module_methods};

}  // namespace

#define TRT_CONCAT2(a, b) a##b
#define TRT_CONCAT(a, b) TRT_CONCAT2(a, b)

extern "C" PyMODINIT_FUNC TRT_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyTypeObject* dispatcher = dispatcher_type();
  if (!dispatcher) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(dispatcher);
  PyModule_AddObject(m, "Dispatcher", reinterpret_cast<PyObject*>(dispatcher));
  return m;
}
