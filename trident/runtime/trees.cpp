// trees.cpp: binding a call's arguments to parameters, what the nodes of argument and state
// trees read and check, and tree programs parsed (Note [Argument trees]).

#include "runtime_internal.h"

#include <torch/csrc/autograd/python_variable.h>

namespace {

// ---- Note [Argument trees] (trident/lower/flatten.py) --------------------------------------------
//
// A call's arguments are bound to the function's parameters here, as Python binds them, and
// each installed tree is evaluated over the bound values: every node reads its value from its
// parent and checks it; the LEAF nodes, after the tree's key, are the SCM's arguments.

// Note [Call buffers]: a hit needs vectors as long as the call's parameters, nodes and
// leaves (a model's: 380 leaves), and allocating and freeing them at every call costs the
// allocator's work on lines that `generate`'s own Python evicted since the last step (malloc
// may consolidate the chunks the last step's Python freed). So a CallValues takes its vectors
// from a per-thread pool and gives them back, cleared, with their storage: a call that
// re-enters (a finalizer, a Python callback inside a launch sequence) takes vectors of its own.
// Only what a call wrote is kept between calls, borrowed pointers that no one reads again
// (each vector is cleared before it goes back); vectors grown past kKeep entries are freed.
struct CallBuffers {
  std::vector<PyObject*> bound, values, dicts, leaves, owned;
};
constexpr size_t kKeep = 1 << 16;
constexpr size_t kPooled = 4;  // buffers a thread keeps (calls nested that deep)
thread_local std::vector<CallBuffers> t_call_buffers;

CallValues::CallValues() {
  auto& pool = t_call_buffers;
  if (pool.empty()) return;
  CallBuffers& b = pool.back();
  bound.swap(b.bound);
  values.swap(b.values);
  dicts.swap(b.dicts);
  leaves.swap(b.leaves);
  owned.swap(b.owned);
  pool.pop_back();
}

CallValues::~CallValues() {
  for (PyObject* o : owned) Py_DECREF(o);  // (may run Python that makes calls: their own)
  auto& pool = t_call_buffers;
  if (pool.size() >= kPooled) return;
  for (auto* v : {&bound, &values, &dicts, &leaves, &owned}) {
    if (v->capacity() > kKeep) std::vector<PyObject*>().swap(*v);
    v->clear();
  }
  pool.emplace_back();
  CallBuffers& b = pool.back();
  b.bound.swap(bound);
  b.values.swap(values);
  b.dicts.swap(dicts);
  b.leaves.swap(leaves);
  b.owned.swap(owned);
}

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
          if (!PyUnicode_Check(k)) return false;  // Python raises TypeError: the slow path's
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
// `keys` a frozenset (of str): the dict's keys in any order (Note [Dict orders] in
// trident/lower/orders.py), its length checked by the caller.
bool same_keys(PyObject* d, PyObject* keys) {
  if (PyFrozenSet_CheckExact(keys)) {
    Py_ssize_t pos = 0;
    PyObject *k, *item;
    while (PyDict_Next(d, &pos, &k, &item)) {
      int has = PyUnicode_CheckExact(k) ? PySet_Contains(keys, k) : 0;  // (str: no code runs)
      if (has != 1) {
        if (has < 0) PyErr_Clear();
        return false;
      }
    }
    return true;
  }
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

// A function's code or defaults as their getters read them (funcobject.c, CPython 3.11 to
// 3.13), borrowed; nullptr for another name.
PyObject* function_slot(PyObject* fn, PyObject* key) {
  auto* f = reinterpret_cast<PyFunctionObject*>(fn);
  if (PyUnicode_CompareWithASCIIString(key, "__code__") == 0) return f->func_code;
  if (PyUnicode_CompareWithASCIIString(key, "__defaults__") == 0)
    return f->func_defaults ? f->func_defaults : Py_None;
  if (PyUnicode_CompareWithASCIIString(key, "__kwdefaults__") == 0)
    return f->func_kwdefaults ? f->func_kwdefaults : Py_None;
  return nullptr;
}

PyObject* module_getattr_name() {
  static PyObject* const name = PyUnicode_InternFromString("__getattr__");
  return name;
}

// A state tree's attribute or item read (Note [State guards]): a module's or a dict's entry, a
// function's code or defaults without a call, anything else through Python's getattr / getitem
// (a new reference, which `cv` keeps). nullptr, with a Python error set or not, when there is
// none.
PyObject* read_state(PyObject* parent, int access, PyObject* key, CallValues& cv) {
  if (access == TRT_ACC_GETATTR && PyTuple_CheckExact(key)) {
    // a getter's result (Note [Library state] in lower/state/library_steps.py): the key () calls the parent, a C
    // function of no arguments (sys.getrecursionlimit, a torch.backends flag's getter)
    if (!PyCFunction_Check(parent)) return nullptr;
    PyObject* v = PyObject_CallNoArgs(parent);
    if (v) cv.owned.push_back(v);
    return v;
  }
  if (access == TRT_ACC_GETATTR && PyModule_CheckExact(parent)) {
    PyObject* d = PyModule_GetDict(parent);
    if (PyObject* v = PyDict_GetItemWithError(d, key)) return v;
    // `m.__dict__`, `vars(m)`: the dict itself, which ModuleType serves (Note [Module dicts]
    // in lower/state/chain.py)
    if (!PyErr_Occurred() && PyUnicode_Check(key) &&
        PyUnicode_CompareWithASCIIString(key, "__dict__") == 0)
      return d;
    // absent, unless a module __getattr__ (PEP 562) makes it: no AttributeError to raise
    if (PyErr_Occurred() || !PyDict_GetItemWithError(d, module_getattr_name())) return nullptr;
  }
  if (access == TRT_ACC_GETATTR && PyFunction_Check(parent) && PyUnicode_CheckExact(key))
    if (PyObject* v = function_slot(parent, key)) return v;
  if (access == TRT_ACC_GETITEM && PyDict_CheckExact(parent))
    return PyDict_GetItemWithError(parent, key);
  PyObject* v = nullptr;
  if (access == TRT_ACC_GETATTR) {  // a missing attribute without making an AttributeError
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
    if (node.keys && node.check != TRT_CHK_TENSOR &&
        !(PyTuple_Check(node.keys) && PyTuple_GET_SIZE(node.keys) == node.length) &&
        !(node.check == TRT_CHK_DICT && PyFrozenSet_CheckExact(node.keys) &&
          PySet_GET_SIZE(node.keys) == node.length))  // Note [Dict orders]
      return false;
    if (node.check == TRT_CHK_TENSOR && (!node.keys || !THPVariable_Check(node.keys)))
      return false;  // its contents' copy (Note [Global tensor values] in lower/state/tree.py)
    node.index = (node.access == TRT_ACC_ARG || node.access == TRT_ACC_INDEX)
                     ? PyLong_AsSsize_t(node.key)
                     : 0;
    node.same = node.check == TRT_CHK_SAME ? PyLong_AsSsize_t(node.expect) : 0;
    node.float_bits = node.check == TRT_CHK_CONST && PyFloat_CheckExact(node.expect);
    bool root =
        node.access == TRT_ACC_ARG || node.access == TRT_ACC_SELF || node.access == TRT_ACC_ROOT;
    const TreeNode* parent =
        node.parent >= 0 && node.parent < i ? &tree.nodes[node.parent] : nullptr;
    if (PyErr_Occurred() || node.parent >= i || root != (node.parent < 0) ||
        (parent && parent->check == TRT_CHK_ABSENT) ||
        (node.access == TRT_ACC_ARG && (node.index < 0 || node.index >= nparams)) ||
        (node.access == TRT_ACC_ATTR && parent->check != TRT_CHK_OBJECT) ||
        (node.access == TRT_ACC_ITEM && parent->check != TRT_CHK_DICT) ||
        (node.access == TRT_ACC_INDEX && (parent->check != TRT_CHK_SEQ || node.index < 0 ||
                                      node.index >= parent->length)) ||
        (node.check == TRT_CHK_SAME && (node.same < 0 || node.same >= i)) ||
        ((node.check == TRT_CHK_SEQ || node.check == TRT_CHK_DICT || node.check == TRT_CHK_OBJECT ||
          node.check == TRT_CHK_TYPE) && !PyType_Check(node.expect)))
      return false;
    tree.leaves += node.check == TRT_CHK_LEAF;
    tree.nodes.push_back(node);
  }
  return true;
}

}  // namespace
