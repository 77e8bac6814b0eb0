// dispatcher.cpp: the `Dispatcher` object a user calls (Note [Hit path] in runtime.cpp): its
// lifetime and its hit path. Its methods are dispatcher_methods.cpp's, its CUDA graph slots
// graph_slots.cpp's.

#include "runtime_internal.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace {

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
  if (self->state && self->state->state_memo)  // Note [Quiet state]: the values it holds
    for (PyObject* o : self->state->state_memo->owned) Py_VISIT(o);
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
bool state_holds(Dispatcher* self, Py_ssize_t* failed) {
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

thread_local std::vector<ArgBuffer::Heap> ArgBuffer::pool;

// Note [Attribute reads] in args.cpp: whether an installed specialization guards a tensor's
// attributes.
bool reads_attributes(const std::vector<ScmEntry>& scms) {
  for (const ScmEntry& e : scms)
    if (e.attributes) return true;
  return false;
}

// The graph slot of installed specialization `i`, or nullptr.
trt_graph* graph_slot(Dispatcher* self, size_t i) {
  return static_cast<Py_ssize_t>(i) < self->num_graphs ? &self->graphs[i] : nullptr;
}

// Runs the installed SCMs on the leaves `items[0..n)`, the first whose guards hold. Returns
// nullptr with *rc_out set to TRT_MISS when no guard holds, or to TRT_CAPTURE when the matching
// specialization wants its CUDA graph captured first; otherwise *rc_out is the specialization
// that ran. `capture` >= 0: a CUDA graph's capture runs that SCM's launch sequence without its
// guards (trt_env.capturing).
PyObject* run_scm(Dispatcher* self, PyObject* const* items, Py_ssize_t n, int* rc_out,
                  HitClock* clock, Py_ssize_t capture) {
  std::shared_ptr<const std::vector<ScmEntry>> scms = self->scms;
  if (!scms) {  // uninstalled meanwhile (a state check ran Python code)
    *rc_out = TRT_MISS;
    return nullptr;
  }
  ArgBuffer buffer;
  trt_arg* a = buffer.get(n);
  trt_env env;
  read_args(items, a, n, &env, reads_attributes(*scms));
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
      env.capturing = capture >= 0;
      for (size_t i = 0; i < scms->size() && rc == TRT_MISS; ++i) {
        if (capture >= 0 && static_cast<Py_ssize_t>(i) != capture) continue;
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
                        Py_ssize_t* failed, HitClock* clock) {
  if (!bind_call(t, args, kwargs, cv)) {
    PyErr_Clear();
    return -1;
  }
  if (clock) clock->lap(HitClock::kBind);
  // The tree that held last first (Note [Unchanged subtrees]: a decode loop's calls share
  // one tree, and another tried before it checks the model's subtree in vain); `failed` asks
  // for the order itself (tests). Each tree's checks are complete, so any that holds is right.
  size_t m = t.trees.size(), first = !failed && t.last_held < m ? t.last_held : 0;
  Py_ssize_t found = -1;
  for (size_t j = 0; j < m && found < 0; ++j) {
    size_t k = j == 0 ? first : j <= first ? j - 1 : j;
    if (eval_tree(t, t.trees[k], cv, failed)) found = static_cast<Py_ssize_t>(k);
  }
  if (found >= 0) t.last_held = static_cast<size_t>(found);
  if (found < 0) PyErr_Clear();  // a miss: the slow path decides, with no error pending
  if (clock) clock->lap(HitClock::kTree);
  return found;
}

// Note [Eager decisions] in frontend/eager.py: a call an installed tree accepted that no
// installed SCM accepts (or none is installed) goes to Python with the leaves the tree read:
// _tree_miss(args, kwargs, leaves): a list, which Python empties before the call runs
// (Note [Finalizers of written values] in lower/writes.py: no reference of the call's own).
PyObject* tree_miss(Dispatcher* self, PyObject* args, PyObject* kwargs, const CallValues& cv) {
  PyObject* leaves = PyList_New(static_cast<Py_ssize_t>(cv.leaves.size()));
  if (!leaves) return nullptr;
  for (size_t i = 0; i < cv.leaves.size(); ++i)
    PyList_SET_ITEM(leaves, static_cast<Py_ssize_t>(i), Py_NewRef(cv.leaves[i]));
  return PyObject_CallMethod(reinterpret_cast<PyObject*>(self), "_tree_miss", "OON", args,
                             kwargs ? kwargs : Py_None, leaves);
}

// Note [Finalizers of written values] in lower/writes.py: a finalizer attached after the
// specialization compiled to the value that a replayed attribute write drops runs, in eager,
// at the write, which the launch sequence does not make until its end. So before it, the value
// each write of the installed recipes would drop is read from its object's `__dict__`; where
// it may have a finalizer (its class has `__del__`, or it has weak references: the weakref
// module's public `getweakrefcount`, asked only of a type that takes weak references), Python
// (`_finalized_write`) tells one of its own from torch's and runs the call eagerly. A write
// of another tree's specialization reads a node of this tree: at worst a needless eager call.
// 1: Python ran the call (`*out`: its result, or nullptr with an exception set); 0: none;
// -1: an error (set).
int finalized_write(Dispatcher* self, const CallTrees& t, const NodeValues& nv, PyObject* args,
                    PyObject* kwargs, PyObject** out) {
  static PyObject* del_name = PyUnicode_InternFromString("__del__");
  static PyObject* weak_count = nullptr;  // _weakref.getweakrefcount, held for the process
  for (const auto& [node, name] : t.writes) {
    PyObject* target = nv.get(node);
    if (!target) continue;
    PyObject* dict = PyObject_GenericGetDict(target, nullptr);
    if (!dict) {
      PyErr_Clear();  // (no __dict__: nothing the write drops is read here)
      continue;
    }
    PyObject* old = PyDict_Check(dict) ? Py_XNewRef(PyDict_GetItemWithError(dict, name)) : nullptr;
    Py_DECREF(dict);
    if (!old) {
      if (PyErr_Occurred()) return -1;
      continue;
    }
    PyTypeObject* type = Py_TYPE(old);
    bool may = del_name && _PyType_Lookup(type, del_name) != nullptr;
    if (!may && type->tp_weaklistoffset != 0) {
      if (!weak_count) {
        PyObject* module = PyImport_ImportModule("_weakref");
        weak_count = module ? PyObject_GetAttrString(module, "getweakrefcount") : nullptr;
        Py_XDECREF(module);
        if (!weak_count) {
          Py_DECREF(old);
          return -1;
        }
      }
      PyObject* n = PyObject_CallOneArg(weak_count, old);
      may = !n || PyLong_AsSsize_t(n) != 0;  // (an error: asked of Python, which raises it)
      Py_XDECREF(n);
      PyErr_Clear();
    }
    Py_DECREF(old);  // (the eager run holds no reference of the call's own to it)
    if (!may) continue;
    PyObject* ran = PyObject_CallMethod(reinterpret_cast<PyObject*>(self), "_finalized_write",
                                        "OOOO", args, kwargs ? kwargs : Py_None, target, name);
    if (!ran) return -1;
    if (!PyTuple_Check(ran) || PyTuple_GET_SIZE(ran) != 2) {
      Py_DECREF(ran);
      PyErr_SetString(PyExc_RuntimeError, "trident: _finalized_write returned no pair");
      return -1;
    }
    if (PyObject_IsTrue(PyTuple_GET_ITEM(ran, 0))) {
      *out = Py_NewRef(PyTuple_GET_ITEM(ran, 1));
      Py_DECREF(ran);
      return 1;
    }
    Py_DECREF(ran);
  }
  return 0;
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
  // A result may return the call's own objects (R_INPUT): keep this call's values of the nodes
  // the recipes read, which another call may write into the memo while this one's launch
  // sequence releases the GIL (without a memo, cv.values holds them all).
  NodeValues nv;
  nv.dense = &cv.values;
  if (TreeMemo* memo = t->trees[k].memo.get(); memo && t->any_recipe) {
    nv.dense = nullptr;
    nv.tree = &t->trees[k];  // (Note [Own writes] in tree_memo.cpp)
    nv.memo = memo;
    for (Py_ssize_t node : t->recipe_nodes)
      if (node >= 0 && node < static_cast<Py_ssize_t>(memo->values.size()))
        nv.add(node, memo->values[node]);
  }
  Py_ssize_t n = static_cast<Py_ssize_t>(cv.leaves.size());
  if (!self->scms || n > TRT_MAX_ARGS) return tree_miss(self, args, kwargs, cv);
  if (!t->writes.empty()) {  // Note [Finalizers of written values] in lower/writes.py
    PyObject* eager = nullptr;
    int ran = finalized_write(self, *t, nv, args, kwargs, &eager);
    if (ran != 0) return ran < 0 ? nullptr : eager;
  }
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
  if (rc == TRT_EAGER) {  // Note [Errors inside try] in source_lines.py: eager takes its branch
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
  PyObject* built = apply_recipe(recipe, out, nv);
  Py_DECREF(out);
  return built;
}

PyObject* Dispatcher_call(Dispatcher* self, PyObject* args, PyObject* kwargs) {
  return hit(self, args, kwargs, nullptr);
}

}  // namespace
