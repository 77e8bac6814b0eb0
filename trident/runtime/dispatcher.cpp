// dispatcher.cpp: the `Dispatcher` type, the object a user calls (Note [Hit path] in
// runtime.cpp): its hit path, and the methods Python installs and inspects it through.

#include "runtime_internal.h"

#include <structmember.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>

#include <algorithm>
#include <ctime>
#include <cstdlib>
#include <cstring>

namespace {

struct ScmEntry {
  trt_scm_call_fn call;
  trt_scm_match_fn match;
};

struct Dispatcher {
  PyObject_HEAD
  PyObject* dict;
  PyObject* weaklist;
  // What the installed specializations read outside the arguments (Note [State guards] in
  // lower/state/): a tree program and its parsed form (nullptr: nothing to check).
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
  std::free(g.checked);  // (trt_graph_hides_write's, malloc'd by an SCM: the same C heap)
  g.checked = nullptr;
  g.checked_room = 0;
  g.descs = nullptr;
  g.hashes = nullptr;
  g.ndescs = 0;
  g.checked_desc = nullptr;  // a new descriptor may take a freed one's address
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

// Argument records: on the C stack for the common case; a call with more arguments takes a heap
// buffer from the thread's pool (Note [Call buffers] in trees.cpp: a Python callback inside a
// launch sequence may re-enter, and takes another), uninitialized: read_args writes every record
// (a model's 400 records are 32 KB to clear).
struct ArgBuffer {
  struct Heap {
    std::unique_ptr<trt_arg[]> records;
    size_t size = 0;
  };
  static constexpr size_t kPooled = 4;
  static thread_local std::vector<Heap> pool;
  trt_arg local[64];
  Heap heap;
  trt_arg* get(Py_ssize_t n) {
    if (n <= 64) return local;
    if (!pool.empty()) {
      heap = std::move(pool.back());
      pool.pop_back();
    }
    if (heap.size < static_cast<size_t>(n)) {
      heap.records.reset(new trt_arg[static_cast<size_t>(n)]);
      heap.size = static_cast<size_t>(n);
    }
    return heap.records.get();
  }
  ~ArgBuffer() {
    if (heap.records && pool.size() < kPooled && heap.size <= TRT_MAX_ARGS)
      pool.push_back(std::move(heap));
  }
};
thread_local std::vector<ArgBuffer::Heap> ArgBuffer::pool;

// The graph slot of installed specialization `i`, or nullptr.
trt_graph* graph_slot(Dispatcher* self, size_t i) {
  return static_cast<Py_ssize_t>(i) < self->num_graphs ? &self->graphs[i] : nullptr;
}

// The parts of one hit, for `_hit_profile` (benchmarks/bench_hf.py): nanoseconds each part took,
// summed over the calls it timed. The hit path passes none and reads no clock. `thread`: the
// calling thread's CPU time instead of the wall clock (on a machine shared with other work, the
// time other processes held the core is not counted; each lap costs a clock read, ~0.1-0.5 µs).
struct HitClock {
  enum Part { kState, kBind, kTree, kRead, kGuards, kRun, kOutput, kParts };
  bool thread = false;
  double last = 0;
  double ns[kParts] = {};
  double now() const {
    timespec ts;
    clock_gettime(thread ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  }
  void start() { last = now(); }
  void lap(Part part) {
    double t = now();
    ns[part] += t - last;
    last = t;
  }
};

// Runs the installed SCMs on the leaves `items[0..n)`, the first whose guards hold. Returns
// nullptr with *rc_out set to TRT_MISS when no guard holds, or to TRT_CAPTURE when the matching
// specialization wants its CUDA graph captured first; otherwise *rc_out is the specialization
// that ran. `capture` >= 0: a CUDA graph's capture runs that SCM's launch sequence without its
// guards (trt_env.capturing).
PyObject* run_scm(Dispatcher* self, PyObject* const* items, Py_ssize_t n, int* rc_out,
                  HitClock* clock = nullptr, Py_ssize_t capture = -1) {
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
                        Py_ssize_t* failed = nullptr, HitClock* clock = nullptr) {
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
  // A result may return the call's own objects (R_INPUT): keep this call's values of the nodes
  // the recipes read, which another call may write into the memo while this one's launch
  // sequence releases the GIL (without a memo, cv.values holds them all).
  NodeValues nv;
  nv.dense = &cv.values;
  if (const TreeMemo* memo = t->trees[k].memo.get(); memo && t->any_recipe) {
    nv.dense = nullptr;
    for (Py_ssize_t node : t->recipe_nodes)
      if (node >= 0 && node < static_cast<Py_ssize_t>(memo->values.size()))
        nv.add(node, memo->values[node]);
  }
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
    {"_reset_graphs", reinterpret_cast<PyCFunction>(Dispatcher_reset_graphs), METH_O,
     "_reset_graphs(n): n empty CUDA graph slots, one per specialization."},
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
