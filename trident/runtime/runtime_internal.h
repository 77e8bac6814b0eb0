// runtime_internal.h: what the runtime's parts (runtime.cpp lists them) share: the operator
// handle, the pending error, tensor handles, the argument trees' types, the Dispatcher object,
// and each part's entry points that another part calls. The parts are one translation unit
// with one unnamed namespace, so a part defines what this header declares for the others. Not
// seen by the SCMs, which see trident_rt.h alone.
#ifndef TRIDENT_RUNTIME_INTERNAL_H
#define TRIDENT_RUNTIME_INTERNAL_H

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <array>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "trident_rt.h"
#include "trident_trees.h"

#if __has_include(<torch/csrc/distributed/c10d/GroupRegistry.hpp>)
#define TRT_HAVE_C10D 1
#endif

struct trt_op {
  c10::OperatorHandle handle;
  // A collective (the _c10d_functional namespace) runs without the GIL, as every op called
  // from Python does (torch's invokeOperatorFromPython releases it): the process group's
  // worker thread may drop the last reference to a tensor that has a Python object, which takes
  // the GIL, while wait_tensor waits for that thread, so holding the GIL there deadlocks.
  bool release_gil = false;
  // Note [Synchronous all-reduce] in trident/lower/collectives.py: _c10d_functional::all_reduce_ is
  // served by the process group's allreduce with asyncOp off, as dist.all_reduce(t) does.
  bool sync_all_reduce = false;
  // Note [Unboxed calls]: the operator's c10::TypedOperatorHandle and the function that calls
  // it with trt_values, for the signatures in kUnboxed; null: boxed calls only.
  void* typed = nullptr;
  bool (*unboxed)(const trt_op* op, const trt_value* args, trt_value* ret) = nullptr;
  int32_t nargs = 0;
};

namespace {

// ---- errors and handles (shim.cpp) ---------------------------------------------------------

extern thread_local std::string g_error;
// The pending error's kind (TRT_ERR_* in trident_rt.h), an index into ErrorTypes (trident/
// errors.py: TridentError and its IndexError, ValueError, TypeError, NotImplementedError twins).
extern thread_local int g_error_kind;
// The error classes, set by set_error_types (module.cpp): ErrorTypes[kind], TridentError first.
extern PyObject* TridentError;
extern PyObject* ErrorTypes[TRT_ERR_KINDS];

// Note [No exception crosses the ABI] (shim.cpp): the current exception into g_error; returns 1.
int fail_with_current_exception() noexcept;

inline at::Tensor& as_tensor(trt_tensor* t) { return *reinterpret_cast<at::Tensor*>(t); }
inline trt_tensor* new_handle(at::Tensor&& t) {
  return reinterpret_cast<trt_tensor*>(new at::Tensor(std::move(t)));
}
inline PyObject* const* tuple_items(PyObject* tuple) {
  return reinterpret_cast<PyTupleObject*>(tuple)->ob_item;
}

// ---- the parts' entry points ---------------------------------------------------------------

// shim.cpp: the trt_api services
extern const trt_api g_api;
extern trt_replay_clock g_replay_clock;  // Dispatcher._hit_profile turns it on
extern std::vector<PyObject*> g_callbacks;  // trt_api.python_callback's, by id
trt_op* api_op(const char* name, const char* overload) noexcept;
void api_release(trt_tensor* t) noexcept;
void from_ivalue(c10::IValue&& iv, trt_value* out);

// unboxed.cpp: Note [Unboxed calls]
std::string unboxed_kinds(const c10::FunctionSchema& schema);
void set_unboxed(trt_op* op);

// views.cpp: Note [Views in C] (trident/lower/plan.py)
int api_view_of(trt_tensor* handle, trt_view* out) noexcept;
trt_tensor* api_view_tensor(const trt_view* view, int32_t how) noexcept;

// collectives.cpp
#ifdef TRT_HAVE_C10D
bool sync_all_reduce(const trt_value* args, int32_t nargs, trt_value* rets);
#endif
const char* process_group_fact();

// args.cpp: reading arguments and building results
void read_args(PyObject* const* items, trt_arg* out, Py_ssize_t n, trt_env* env,
               bool attributes = true);
uint64_t global_flags();
PyObject* wrap_value(const trt_value& v, bool steal);
PyObject* build_output(const char*& p, trt_result* r, int32_t& next);
void release_outputs(trt_result* r, int32_t from);

// ---- argument trees (Note [Argument trees] in trees.cpp) -----------------------------------

// inspect.Parameter's kinds, in its order
enum { PARAM_POSITIONAL_ONLY = 0, PARAM_POSITIONAL_OR_KEYWORD, PARAM_VAR_POSITIONAL,
       PARAM_KEYWORD_ONLY, PARAM_VAR_KEYWORD };

struct Param {
  PyObject* name;  // borrowed from CallTrees::source
  int kind;        // PARAM_*
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

// Note [Unchanged subtrees] (tree_eval.cpp): an argument tree's nodes as its evaluations last
// read them.
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
  // The unchanged pass: per root (a parameter, or self), the checks that remain of its subtree
  // when its value is the memo's, in pre-order (a container's before what it holds).
  struct Check {
    // kObjectQuiet: an object's exact type and instance dict's identity (its dict is watched)
    // kEmptySet: a set constant that was empty, its exact type and size (the quiet table's)
    // kRead: a value read through getattr (a functools.partial's func, args, keywords: Note
    // [Partials in arguments] in lower/partials.py), read afresh: the memo's object
    enum Op : uint8_t {
      kLeaf, kObject, kObjectQuiet, kDict, kOrderedDict, kItems, kConst, kSame, kNode, kEmptySet,
      kRead
    };
    Op op;
    uint32_t node;
  };
  // the root nodes, in order: each parameter's value (or self), and for a shell (the *args
  // tuple or **kwargs dict, new at every call) the shell, then each item it holds
  std::vector<Py_ssize_t> roots;
  std::vector<uint8_t> shell;          // per root: a shell, checked alone (type, length, keys)
  std::vector<size_t> checks_begin;    // per root: its checks, to checks_begin[root + 1]
  std::vector<Check> checks;
  std::vector<uint8_t> root_held;      // per root: its whole subtree held at its last walk
  // The quiet pass (TRT_DICT_WATCHERS): per root, the checks that remain when every dict of its
  // subtree is watched and none changed since they last held.
  std::vector<size_t> quiet_begin;
  std::vector<Check> quiet_checks;
  // Note [Quiet table] (tree_memo.cpp): per quiet check, in quiet_checks' order, what it
  // reads of the memo, copied into one record when its root turns quiet
  struct QuietStep {
    PyObject* value;     // the node's value
    PyTypeObject* type;  // kObjectQuiet, kDict, kEmptySet: the exact type
    PyObject* dict;      // kObjectQuiet: the instance dict
    uint32_t node;
    Check::Op op;
  };
  std::vector<QuietStep> quiet_table;
  // Note [Tag table] (tree_memo.cpp): without dict watchers (Python 3.11), per record the
  // version tag its kObject's instance dict or its kDict had when the table was filled
  std::vector<uint64_t> quiet_tags;
  // Note [Quiet leaves] (tree_memo.cpp): per root, its leaves' nodes in pre-order (from
  // quiet_leaf_begin[root] to quiet_leaf_begin[root + 1]), not in the quiet table, and their
  // values, copied with the table
  std::vector<size_t> quiet_leaf_begin;
  std::vector<uint32_t> quiet_leaf_nodes;
  std::vector<PyObject*> quiet_leaves;
  std::vector<uint32_t> root_of;       // per node: its root's index in `roots`
  // per root: events on the watched dicts of its subtree, and their count when its last pass
  // began that then held (it is dirty while they differ: a watched dict may have changed)
  std::vector<uint64_t> root_events;
  std::vector<uint64_t> root_clean;
  bool dirty(uint32_t root) const { return root_events[root] != root_clean[root]; }
  // per root: its last pass held with every dict watched (Python 3.11: its last pass held, its
  // table holds its tags: Note [Tag table])
  std::vector<uint8_t> quiet;
  // per root, for benchmarks (Dispatcher._tree_passes): passes taken quiet, unchanged, walked
  std::vector<std::array<uint64_t, 3>> passes;
  std::vector<PyObject*> watching;     // the dicts this memo watches (TRT_DICT_WATCHERS)
  bool busy = false;                   // a walk is writing it
  ~TreeMemo();
};

// Note [Quiet state] (state_memo.cpp): a state tree's values as its last evaluation that held
// read them, and what proves them unchanged.
struct StateMemo {
  struct Proof {
    enum Op : uint8_t {
      kDictTag,    // the dict `obj` has version tag `tag`
      kTypeTag,    // the type `obj` has version tag `tag`
      kExactType,  // `obj`'s type is `type` (a module's or a class's class can be assigned)
    };
    Op op;
    PyObject* obj;  // owned (`owned` below)
    uint64_t tag;
    PyTypeObject* type;
    // kDictTag: the (key, value or nullptr) the proven nodes read of the dict, which a new tag
    // re-reads (another key changed); `whole`: a check reads it all (its length and keys).
    std::vector<std::pair<PyObject*, PyObject*>> entries;
    bool whole = false;
  };
  std::vector<Proof> proofs;
  std::vector<uint8_t> proven;   // per node: its value is the memo's while the proofs hold
  std::vector<uint32_t> again;   // the nodes read (unless proven) and checked at every call
  std::vector<PyObject*> values; // per node: its value at the evaluation the memo was made at
  std::vector<PyObject*> owned;  // what the proofs and the proven values hold
  // a pass's values and instance dicts (borrowed, this call's), kept from call to call: the
  // state tree's pass allocates nothing (Note [Quiet state])
  std::vector<PyObject*> scratch, scratch_dicts;
  uint64_t reread = 0;           // proofs held through their entries (another key changed)
  // Note [Watched state] (state_memo.cpp, Python 3.12): the proofs' dicts and types are watched
  // (`watched`: all of them); `events` counts the watchers' events, `clean` their count when
  // the proofs last held. The exact-type proofs, which no watcher sees, are checked at every
  // call from `exact`.
  std::vector<std::pair<PyObject*, PyTypeObject*>> exact;
  std::vector<PyObject*> watched_dicts, watched_types;
  uint64_t events = 0, clean = 0;
  bool watched = false;
  uint64_t quiet = 0;            // proofs taken as holding through the watchers (benchmarks)
  static constexpr int kRemakes = 16;  // then every node at every call
  bool valid = false;            // made, and not dropped since
  bool busy = false;             // a pass is reading it (one that re-enters walks alone)
  int remade = 0;                // times made: a state that changes at every call stops it
  void clear();                  // with the GIL
  ~StateMemo() { clear(); }
};

// ---- version tags and watchers (watchers.cpp) ------------------------------------------------
//
// CPython's dict version tags (Python 3.11 and 3.12: TRT_DICT_TAGS) and type version tags, which
// Note [Unchanged subtrees] (tree_eval.cpp) and Note [Quiet state] (state_memo.cpp) read, and on
// 3.12 the dict and type watchers that spare reading them (TRT_DICT_WATCHERS).
#if PY_VERSION_HEX < 0x030D0000
#define TRT_DICT_TAGS 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
inline uint64_t dict_tag(PyObject* d) { return reinterpret_cast<PyDictObject*>(d)->ma_version_tag; }
#pragma GCC diagnostic pop
inline uint64_t type_tag(PyTypeObject* t) {
  return PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG) ? t->tp_version_tag : 0;
}
#else
inline uint64_t dict_tag(PyObject*) { return 0; }
#endif

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define TRT_DICT_WATCHERS 1
// `memo` watches `d`, held by root `root`'s subtree; `m` watches dict `d`, type `t`. false: not
// watched (no watcher slot).
bool watch_dict(TreeMemo* memo, uint32_t root, PyObject* d);
bool watch_state_dict(StateMemo* m, PyObject* d);
bool watch_type(StateMemo* m, PyObject* t);
// what the memo watches, no longer watched for it (with the GIL)
void unwatch_memo(TreeMemo& memo);
void unwatch_state(StateMemo& m);
#endif

struct Tree {
  PyObject* key;  // leaf 0, a Python int
  std::vector<TreeNode> nodes;
  Py_ssize_t leaves;
  std::unique_ptr<TreeMemo> memo;         // argument trees only
  std::unique_ptr<StateMemo> state_memo;  // state trees only
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
  std::vector<Py_ssize_t> recipe_nodes;  // the nodes the recipes read (R_INPUT, R_WRITE)
  // (node, name) of each attribute write the recipes replay (R_WRITE; the name borrowed from
  // `recipes`): Note [Finalizers of written values] in lower/writes.py
  std::vector<std::pair<Py_ssize_t, PyObject*>> writes;
  std::vector<Tree> trees;
  mutable size_t last_held = 0;  // the tree that held at the last call (the GIL guards it)
  ~CallTrees() {  // the GIL is held wherever the last holder lets go
    Py_XDECREF(source);
    Py_XDECREF(programs);
    Py_XDECREF(recipes);
  }
};

// The values of one call: bound parameters, node values, leaves. `owned` holds the *args
// tuple and **kwargs dict made by binding. Note [Call buffers] (trees.cpp): the vectors' storage
// comes from the thread's pool and goes back to it.
struct CallValues {
  std::vector<PyObject*> bound;
  std::vector<PyObject*> values;
  std::vector<PyObject*> dicts;  // per OBJECT node: its instance dict
  std::vector<PyObject*> leaves;
  std::vector<PyObject*> owned;
  CallValues();
  ~CallValues();  // with the GIL
  CallValues(const CallValues&) = delete;
  CallValues& operator=(const CallValues&) = delete;
};

// trees.cpp: binding, and what a node's check and read need
bool bind_call(const CallTrees& t, PyObject* args, PyObject* kwargs, CallValues& cv);
bool same_keys(PyObject* d, PyObject* keys);
bool const_equal(const TreeNode& n, PyObject* v);
PyObject* instance_dict(PyObject* obj);
PyObject* read_state(PyObject* parent, int access, PyObject* key, CallValues& cv);
// the interned name "__getattr__": a module's own serves names its dict lacks (PEP 562)
PyObject* module_getattr_name();
bool parse_tree(PyObject* prog, Py_ssize_t nparams, Tree& tree);

// tree_eval.cpp: evaluating a tree, and the memo of Note [Unchanged subtrees]
bool eval_tree(const CallTrees& t, const Tree& tree, CallValues& cv, Py_ssize_t* failed = nullptr);

// state_memo.cpp: Note [Quiet state]: whether the memo's proofs hold; the memo of a state tree
// from the node values of an evaluation that held
bool proofs_hold(StateMemo& m);
void make_state_memo(const Tree& tree, PyObject* const* values, StateMemo& m);

// tree_memo.cpp: the memo of Note [Unchanged subtrees], its quiet table (Note [Quiet table])
std::unique_ptr<TreeMemo> make_memo(const Tree& tree, const std::vector<Param>& params);
void fill_quiet_table(TreeMemo& memo, const Tree& tree, size_t root);
// Note [Own writes]: the leaf of `target` (node `node`) that holds attribute `name`, whose
// write the memo may follow, or -1; then `written` sets it, and the memo follows if it may.
Py_ssize_t own_write_leaf(const TreeMemo* memo, const Tree& tree, Py_ssize_t node,
                          PyObject* target, PyObject* name);
void own_write_done(TreeMemo& memo, Py_ssize_t node, Py_ssize_t leaf, PyObject* target,
                    PyObject* name, PyObject* value);

// The call's node values an output recipe reads (R_INPUT, R_WRITE): every node's (`dense`), or
// the (node, value) pairs of the nodes the installed recipes read (the hit path's: a model's
// tree has thousands of nodes, a recipe reads one or two), in place up to kLocal of them (no
// allocation on the hit path), in `more` beyond.
struct NodeValues {
  static constexpr size_t kLocal = 8;
  const std::vector<PyObject*>* dense = nullptr;
  // the tree that held and its memo, which an attribute write refreshes (Note [Own writes] in
  // tree_memo.cpp); nullptr: none
  const Tree* tree = nullptr;
  TreeMemo* memo = nullptr;
  std::pair<Py_ssize_t, PyObject*> local[kLocal];
  size_t nlocal = 0;
  std::vector<std::pair<Py_ssize_t, PyObject*>> more;
  void add(Py_ssize_t node, PyObject* v) {
    if (nlocal < kLocal) local[nlocal++] = {node, v};
    else more.emplace_back(node, v);
  }
  PyObject* get(Py_ssize_t node) const {  // nullptr: none
    if (dense)
      return node >= 0 && node < static_cast<Py_ssize_t>(dense->size()) ? (*dense)[node] : nullptr;
    for (size_t i = 0; i < nlocal; ++i)
      if (local[i].first == node) return local[i].second;
    for (const auto& [k, v] : more)
      if (k == node) return v;
    return nullptr;
  }
};

// recipes.cpp: output recipes
PyObject* apply_recipe(PyObject* ops, PyObject* flat, const NodeValues& values);

// ---- the Dispatcher (dispatcher.cpp, dispatcher_methods.cpp, graph_slots.cpp) ------------------

struct ScmEntry {
  trt_scm_call_fn call;
  trt_scm_match_fn match;
  bool attributes;  // its guards read a tensor's attributes (Note [Attribute reads] in args.cpp)
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

// dispatcher.cpp: the object's lifetime (its type's slots) and the hit path (Note [Hit path])
PyObject* Dispatcher_new(PyTypeObject* type, PyObject*, PyObject*);
int Dispatcher_traverse(Dispatcher* self, visitproc visit, void* arg);
int Dispatcher_clear(Dispatcher* self);
void Dispatcher_dealloc(Dispatcher* self);
PyObject* Dispatcher_call(Dispatcher* self, PyObject* args, PyObject* kwargs);
bool state_holds(Dispatcher* self, Py_ssize_t* failed = nullptr);
trt_graph* graph_slot(Dispatcher* self, size_t i);
PyObject* run_scm(Dispatcher* self, PyObject* const* items, Py_ssize_t n, int* rc_out,
                  HitClock* clock = nullptr, Py_ssize_t capture = -1);
Py_ssize_t flatten_args(const CallTrees& t, PyObject* args, PyObject* kwargs, CallValues& cv,
                        Py_ssize_t* failed = nullptr, HitClock* clock = nullptr);
PyObject* hit(Dispatcher* self, PyObject* args, PyObject* kwargs, HitClock* clock);

// graph_slots.cpp: the CUDA graph slots and the methods that set and read them
void free_graphs(Dispatcher* self);
PyObject* Dispatcher_reset_graphs(Dispatcher* self, PyObject* args);
PyObject* Dispatcher_set_graph(Dispatcher* self, PyObject* args);
PyObject* Dispatcher_graph_seen(Dispatcher* self, PyObject* args);
PyObject* Dispatcher_graph_replays(Dispatcher* self, PyObject*);

// dispatcher_methods.cpp: the Dispatcher type, ready (nullptr with a Python error if it cannot be)
PyTypeObject* dispatcher_type();

}  // namespace

#endif  // TRIDENT_RUNTIME_INTERNAL_H
