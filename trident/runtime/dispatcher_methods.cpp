// dispatcher_methods.cpp: the methods Python installs a Dispatcher's specializations through
// and inspects it with, and the Dispatcher type (its slots are dispatcher.cpp's).

#include "runtime_internal.h"

#include <structmember.h>

#include <algorithm>

namespace {

// _hit_profile(args, kwargs, n, thread=False, keep=False) -> dict: n calls as the hit path makes them, each
// part's mean time in microseconds (benchmarks/bench_hf.py; a call that is not a hit is timed as
// far as it gets). The guards are timed alone, then again inside the module's call ("run").
// `thread`: the thread's CPU time (HitClock). `keep`: return (parts, the last call's result), so
// that a caller can stand it in for the call itself (a decode step timed inside `generate`).
PyObject* Dispatcher_hit_profile(Dispatcher* self, PyObject* args) {
  PyObject *call_args, *kwargs;
  Py_ssize_t n;
  int thread = 0, keep = 0;
  if (!PyArg_ParseTuple(args, "O!On|pp", &PyTuple_Type, &call_args, &kwargs, &n, &thread, &keep))
    return nullptr;
  if (kwargs != Py_None && !PyDict_Check(kwargs))
    return PyErr_Format(PyExc_TypeError, "kwargs must be a dict or None");
  HitClock clock;
  clock.thread = thread != 0;
  unsigned long long hits = self->hits;
  g_replay_clock = {};
  g_replay_clock.on = 1;
  PyObject* last = nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* out = hit(self, call_args, kwargs == Py_None ? nullptr : kwargs, &clock);
    if (!out) {
      g_replay_clock.on = 0;
      Py_XDECREF(last);
      return nullptr;
    }
    clock.lap(HitClock::kOutput);
    Py_XSETREF(last, out);
  }
  g_replay_clock.on = 0;
  static const char* const names[HitClock::kParts] = {
      "state guards", "binding", "argument tree", "environment and leaves", "guards",
      "run (guards, launches or graph replay)", "output rebuild"};
  PyObject* d = PyDict_New();
  for (int p = 0; d && p < HitClock::kParts; ++p) {
    PyObject* v = PyFloat_FromDouble(n ? clock.ns[p] / 1e3 / static_cast<double>(n) : 0.0);
    if (!v || PyDict_SetItemString(d, names[p], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  // the run's graph replay, in its parts (trt_replay_clock): zero where no graph replayed
  static const char* const replay[TRT_REPLAY_PARTS] = {
      "replay: checks", "replay: copies in", "replay: graph launch", "replay: copies back",
      "replay: outputs"};
  for (int p = 0; d && p < TRT_REPLAY_PARTS; ++p) {
    PyObject* v = PyFloat_FromDouble(
        n ? static_cast<double>(g_replay_clock.ns[p]) / 1e3 / static_cast<double>(n) : 0.0);
    if (!v || PyDict_SetItemString(d, replay[p], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  PyObject* h = PyLong_FromUnsignedLongLong(self->hits - hits);
  if (d && (!h || PyDict_SetItemString(d, "hits", h) < 0)) Py_CLEAR(d);
  Py_XDECREF(h);
  if (!keep || !d) {
    Py_XDECREF(last);
    return d;
  }
  return Py_BuildValue("(NN)", d, last ? last : Py_NewRef(Py_None));
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

// _capture_run(index, *args): run SCM `index`'s launch sequence on `args` without its guards
// (frontend/graphs.py's capture, whose arguments stand in for the call's: Note [Host scalars]).
PyObject* Dispatcher_capture_run(Dispatcher* self, PyObject* args) {
  Py_ssize_t n = PyTuple_GET_SIZE(args) - 1;
  Py_ssize_t index = n >= 0 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 0)) : -1;
  if (PyErr_Occurred()) return nullptr;
  std::shared_ptr<const std::vector<ScmEntry>> scms = self->scms;
  if (!scms || index < 0 || index >= static_cast<Py_ssize_t>(scms->size()) || n > TRT_MAX_ARGS)
    return PyErr_Format(PyExc_IndexError, "no specialization %zd to capture", index);
  int rc = TRT_MISS;
  PyObject* out = run_scm(self, tuple_items(args) + 1, n, &rc, nullptr, index);
  if (rc == TRT_MISS || rc == TRT_CAPTURE)
    PyErr_SetString(TridentError, "the specialization did not run its launch sequence");
  return out;
}

// _install(entries): point the hit path at the SCMs of the installed specializations, a tuple of
// (call_address, match_address[, attributes]) in guard order; () uninstalls. attributes (True
// when left out): the specialization's guards read a tensor's attributes (Note [Attribute
// reads] in args.cpp).
PyObject* Dispatcher_install(Dispatcher* self, PyObject* entries) {
  if (!PyTuple_Check(entries)) return PyErr_Format(PyExc_TypeError, "expected a tuple");
  auto scms = std::make_shared<std::vector<ScmEntry>>();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(entries); ++i) {
    unsigned long long call_addr, match_addr;
    int attributes = 1;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(entries, i), "KK|p", &call_addr, &match_addr,
                          &attributes))
      return nullptr;
    scms->push_back({reinterpret_cast<trt_scm_call_fn>(call_addr),
                     reinterpret_cast<trt_scm_match_fn>(match_addr), attributes != 0});
  }
  if (scms->empty())
    self->scms.reset();
  else
    self->scms = std::move(scms);
  Py_RETURN_NONE;
}

// _set_state(program or None): Note [State guards] in lower/state/; hits need its checks to hold.
PyObject* Dispatcher_set_state(Dispatcher* self, PyObject* program) {
  std::shared_ptr<Tree> tree;
  if (program != Py_None) {
    tree = std::make_shared<Tree>();
    if (!PyTuple_Check(program) || PyTuple_GET_SIZE(program) != 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(program, 1)) || !parse_tree(program, 0, *tree)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "_set_state: bad state tree");
      return nullptr;
    }
    tree->state_memo = std::make_unique<StateMemo>();
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

// _quiet_state() -> (made, proofs, checked, reread, watched) or None: Note [Quiet state], for
// tests and benchmarks: how many times the state memo was made, its proofs (-1: none now), the
// nodes still checked at each call, how many times a dict's proof held through its entries,
// and how many times the proofs held through their watchers (Note [Watched state]).
PyObject* Dispatcher_quiet_state(Dispatcher* self, PyObject*) {
  std::shared_ptr<Tree> tree = self->state;
  if (!tree || !tree->state_memo) Py_RETURN_NONE;
  const StateMemo& m = *tree->state_memo;
  return Py_BuildValue("(innKK)", m.remade,
                       m.valid ? static_cast<Py_ssize_t>(m.proofs.size()) : Py_ssize_t{-1},
                       static_cast<Py_ssize_t>(m.again.size()),
                       static_cast<unsigned long long>(m.reread),
                       static_cast<unsigned long long>(m.quiet));
}

// _tree_passes() -> [[(root node, quiet, unchanged, walked), ...] per argument tree]: Note
// [Unchanged subtrees], for benchmarks: how many times each root took each pass.
PyObject* Dispatcher_tree_passes(Dispatcher* self, PyObject*) {
  std::shared_ptr<CallTrees> t = self->trees;
  PyObject* out = PyList_New(0);
  for (size_t k = 0; out && t && k < t->trees.size(); ++k) {
    const TreeMemo* memo = t->trees[k].memo.get();
    PyObject* roots = PyList_New(0);
    for (size_t r = 0; roots && memo && r < memo->roots.size(); ++r) {
      const auto& p = memo->passes[r];
      PyObject* row = Py_BuildValue("(nKKK)", memo->roots[r], (unsigned long long)p[0],
                                    (unsigned long long)p[1], (unsigned long long)p[2]);
      if (!row || PyList_Append(roots, row) < 0) Py_CLEAR(roots);
      Py_XDECREF(row);
    }
    if (!roots || PyList_Append(out, roots) < 0) Py_CLEAR(out);
    Py_XDECREF(roots);
  }
  return out;
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
    tree.memo = make_memo(tree, t->params);
    t->trees.push_back(std::move(tree));
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(recipes); ++k) {
    PyObject* ops = PyTuple_GET_ITEM(recipes, k);
    if (ops == Py_None) continue;
    t->any_recipe = true;
    if (!PyTuple_Check(ops)) return fail("recipe");
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ops); ++i) {  // the nodes it reads
      PyObject* op = PyTuple_GET_ITEM(ops, i);
      if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) < 1) return fail("recipe op");
      long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
      if (code != TRT_R_INPUT && code != TRT_R_WRITE) continue;
      Py_ssize_t node = PyTuple_GET_SIZE(op) >= 2 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1)) : -1;
      if (node < 0) return fail("recipe node");
      if (code == TRT_R_WRITE && PyTuple_GET_SIZE(op) >= 3 &&
          PyUnicode_Check(PyTuple_GET_ITEM(op, 2)))
        t->writes.emplace_back(node, PyTuple_GET_ITEM(op, 2));
      if (std::find(t->recipe_nodes.begin(), t->recipe_nodes.end(), node) == t->recipe_nodes.end())
        t->recipe_nodes.push_back(node);
    }
  }
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

// _match(*args) -> int: the specialization the native guards pick, or -1. For tests and explain.
PyObject* Dispatcher_match(Dispatcher* self, PyObject* args) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  std::shared_ptr<const std::vector<ScmEntry>> scms = self->scms;
  if (!scms || n > TRT_MAX_ARGS) return PyLong_FromLong(-1);
  ArgBuffer buffer;
  trt_arg* a = buffer.get(n);
  trt_env env;
  read_args(tuple_items(args), a, n, &env, reads_attributes(*scms));
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
    {"_capture_run", reinterpret_cast<PyCFunction>(Dispatcher_capture_run), METH_VARARGS,
     "_capture_run(index, *args): specialization index's launch sequence, no guards checked."},
    {"_set_state", reinterpret_cast<PyCFunction>(Dispatcher_set_state), METH_O,
     "_set_state(program or None): the state tree hits need to hold (Note [State guards])."},
    {"_quiet_state", reinterpret_cast<PyCFunction>(Dispatcher_quiet_state), METH_NOARGS,
     "_quiet_state() -> (made, proofs or -1, checked, reread, watched) or None: Note [Quiet "
     "state]."},
    {"_tree_passes", reinterpret_cast<PyCFunction>(Dispatcher_tree_passes), METH_NOARGS,
     "per argument tree, per root: (node, quiet, unchanged, walked) pass counts"},
    {"_state_failure", reinterpret_cast<PyCFunction>(Dispatcher_state_failure), METH_NOARGS,
     "_state_failure() -> int: the first failing state tree node, or -1."},
    {"_flatten_native", reinterpret_cast<PyCFunction>(Dispatcher_flatten_native), METH_VARARGS,
     "_flatten_native(args, kwargs) -> (tree, leaves) or (-1, failing node): for tests."},
    {"_set_call_trees", reinterpret_cast<PyCFunction>(Dispatcher_set_call_trees), METH_VARARGS,
     "_set_call_trees(binding, trees, recipes): how calls bind, flatten and build results."},
    {"_reset_graphs", reinterpret_cast<PyCFunction>(Dispatcher_reset_graphs), METH_VARARGS,
     "_reset_graphs(n, previous=()): n empty CUDA graph slots, one per specialization; "
     "previous[i]: the old slot whose sizes seen new slot i keeps."},
    {"_set_graph", reinterpret_cast<PyCFunction>(Dispatcher_set_graph), METH_VARARGS,
     "_set_graph(index, state, recaptures=0, descs=(), open=0): a specialization's CUDA graphs."},
    {"_graph_seen", reinterpret_cast<PyCFunction>(Dispatcher_graph_seen), METH_VARARGS,
     "_graph_seen(index, *args) -> bool: the slot saw these sizes before (remembers them)."},
    {"_graph_replays", reinterpret_cast<PyCFunction>(Dispatcher_graph_replays), METH_NOARGS,
     "_graph_replays() -> int: hits served by a CUDA graph."},
    {"_hit_profile", reinterpret_cast<PyCFunction>(Dispatcher_hit_profile), METH_VARARGS,
     "_hit_profile(args, kwargs, n, thread=False, keep=False) -> dict (keep: (dict, the last "
     "result)): mean microseconds per part of n hits."},
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

PyTypeObject* dispatcher_type() {
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
  return &DispatcherType;
}

}  // namespace
