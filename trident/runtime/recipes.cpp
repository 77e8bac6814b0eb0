// recipes.cpp: a result rebuilt from the SCM's flat outputs by an output recipe
// (flatten.OutputRecipe, Note [Argument trees]).

#include "runtime_internal.h"

namespace {

// The objects a recipe's ops made, by op (R_BUILT reads them): in place for a recipe of up to
// kLocal ops (a ModelOutput's: a handful), so that a hit allocates none.
struct Built {
  static constexpr Py_ssize_t kLocal = 32;
  PyObject* local[kLocal] = {};
  std::vector<PyObject*> heap;
  PyObject** items;
  Py_ssize_t n;
  explicit Built(Py_ssize_t size) : n(size) {
    if (size > kLocal) heap.assign(static_cast<size_t>(size), nullptr);
    items = size > kLocal ? heap.data() : local;
  }
  PyObject*& operator[](Py_ssize_t k) { return items[k]; }
  Py_ssize_t size() const { return n; }
};

// Note [Argument trees]: the result of a recipe op sequence, from the SCM's flat outputs.
// `built[k]`: the object op k made (borrowed: the result holds it), for R_BUILT.
PyObject* build_op(PyObject* ops, Py_ssize_t& pc, PyObject* flat, Py_ssize_t& next,
                   const NodeValues& values, Built& built);

PyObject* build_recipe(PyObject* ops, Py_ssize_t& pc, PyObject* flat, Py_ssize_t& next,
                       const NodeValues& values, Built& built) {
  Py_ssize_t here = pc;
  PyObject* out = build_op(ops, pc, flat, next, values, built);
  if (out) built[here] = out;
  return out;
}

PyObject* build_op(PyObject* ops, Py_ssize_t& pc, PyObject* flat, Py_ssize_t& next,
                   const NodeValues& values, Built& built) {
  if (pc >= PyTuple_GET_SIZE(ops))
    return PyErr_Format(PyExc_RuntimeError, "trident: output recipe ends early");
  PyObject* op = PyTuple_GET_ITEM(ops, pc++);
  long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
  auto child = [&]() { return build_recipe(ops, pc, flat, next, values, built); };
  switch (code) {
    case TRT_R_VALUE: {
      if (next >= PyTuple_GET_SIZE(flat))
        return PyErr_Format(PyExc_RuntimeError, "trident: output recipe reads past the outputs");
      PyObject* v = PyTuple_GET_ITEM(flat, next++);
      Py_INCREF(v);
      return v;
    }
    case TRT_R_BUILT: {  // a container or object the result holds a second time
      Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
      if (k < 0 || k >= built.size() || !built[k])
        return PyErr_Format(PyExc_RuntimeError, "trident: no object built by op %zd", k);
      Py_INCREF(built[k]);
      return built[k];
    }
    case TRT_R_AGAIN: {  // a flat output the result holds a second time
      Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
      if (k < 0 || k >= PyTuple_GET_SIZE(flat))
        return PyErr_Format(PyExc_RuntimeError, "trident: no flat output %zd", k);
      PyObject* v = PyTuple_GET_ITEM(flat, k);
      Py_INCREF(v);
      return v;
    }
    case TRT_R_CONST: {
      PyObject* v = PyTuple_GET_ITEM(op, 1);
      Py_INCREF(v);
      return v;
    }
    case TRT_R_INPUT: {
      Py_ssize_t node = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
      PyObject* v = values.get(node);
      if (!v) return PyErr_Format(PyExc_RuntimeError, "trident: no call value %zd", node);
      return Py_NewRef(v);
    }
    case TRT_R_TUPLE:
    case TRT_R_LIST:
    case TRT_R_NAMEDTUPLE:
    case TRT_R_STRUCTSEQ: {
      bool typed = code == TRT_R_NAMEDTUPLE || code == TRT_R_STRUCTSEQ;
      PyObject* cls = typed ? PyTuple_GET_ITEM(op, 1) : nullptr;
      Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, typed ? 2 : 1));
      PyObject* items = code == TRT_R_LIST ? PyList_New(n) : PyTuple_New(n);
      if (!items) return nullptr;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = child();
        if (!item) {
          Py_DECREF(items);
          return nullptr;
        }
        if (code == TRT_R_LIST) PyList_SET_ITEM(items, i, item);
        else PyTuple_SET_ITEM(items, i, item);
      }
      if (!cls) return items;
      if (code == TRT_R_STRUCTSEQ) {  // torch.return_types.max(items): structseq_new, C
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
    case TRT_R_DICT: {
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
    case TRT_R_OBJECT: {
      // (R_OBJECT, cls, base, attribute names, item keys): made by the C base type's tp_new,
      // its __dict__ and items set without running the class's Python methods
      auto* cls = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(op, 1));
      long base = PyLong_AsLong(PyTuple_GET_ITEM(op, 2));
      PyObject* attrs = PyTuple_GET_ITEM(op, 3);
      PyObject* keys = PyTuple_GET_ITEM(op, 4);
      PyTypeObject* maker = base == TRT_BASE_ODICT ? &PyODict_Type
                            : base == TRT_BASE_DICT ? &PyDict_Type : &PyBaseObject_Type;
      PyObject* empty = PyTuple_New(0);
      if (!empty) return nullptr;
      PyObject* obj = maker->tp_new(cls, empty, nullptr);
      if (obj && base == TRT_BASE_ODICT && PyODict_Type.tp_init(obj, empty, nullptr) < 0)
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
        ok = item && (base == TRT_BASE_ODICT
                          ? PyODict_SetItem(obj, PyTuple_GET_ITEM(keys, i), item)
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

// Note [Attribute writes] in lower/writes.py: (R_WRITE, node, name, ((attribute, constant),
// ...)) and one value's ops: the attribute the function set on the call's object at `node`,
// set again with the value this call computed (a STORE_ATTR, as eager's), after the constant
// attributes the function set on that value (a tensor). 0, or -1 with an exception set.
int write_attribute(PyObject* ops, Py_ssize_t& pc, PyObject* flat, Py_ssize_t& next,
                    const NodeValues& values, Built& built) {
  PyObject* op = PyTuple_GET_ITEM(ops, pc++);
  if (PyLong_AsLong(PyTuple_GET_ITEM(op, 0)) != TRT_R_WRITE) {
    PyErr_SetString(PyExc_RuntimeError, "trident: output recipe has ops after its result");
    return -1;
  }
  Py_ssize_t node = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
  PyObject* target = values.get(node);
  if (!target) {
    PyErr_Format(PyExc_RuntimeError, "trident: no call value %zd", node);
    return -1;
  }
  PyObject* value = build_recipe(ops, pc, flat, next, values, built);
  if (!value) return -1;
  PyObject* attrs = PyTuple_GET_ITEM(op, 3);
  int rc = 0;
  for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(attrs); ++i) {
    PyObject* pair = PyTuple_GET_ITEM(attrs, i);
    rc = PyObject_SetAttr(value, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
  }
  PyObject* name = PyTuple_GET_ITEM(op, 2);
  Py_ssize_t leaf = rc == 0 && values.memo
                        ? own_write_leaf(values.memo, *values.tree, node, target, name) : -1;
  PyObject* old = nullptr;  // Note [Own writes]: held across the write
  if (leaf >= 0) old = Py_XNewRef(values.memo->values[leaf]);
  if (rc == 0) rc = PyObject_SetAttr(target, name, value);
  if (rc == 0 && leaf >= 0) own_write_done(*values.memo, node, leaf, target, name, value);
  Py_XDECREF(old);
  Py_DECREF(value);
  return rc;
}

PyObject* apply_recipe(PyObject* ops, PyObject* flat, const NodeValues& values) {
  Py_ssize_t pc = 0, next = 0;
  Built built(PyTuple_GET_SIZE(ops));
  PyObject* out = build_recipe(ops, pc, flat, next, values, built);
  while (out && pc < PyTuple_GET_SIZE(ops))
    if (write_attribute(ops, pc, flat, next, values, built) < 0) Py_CLEAR(out);
  return out;
}

}  // namespace
