// tree_eval.cpp: evaluating a tree over a call, every node or through the argument tree's
// memo (Note [Unchanged subtrees]).

#include "runtime_internal.h"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace {

constexpr int kStateMemoRemakes = 16;  // Note [Quiet state]: then every node at every call

// ---- Note [Unchanged subtrees] ---------------------------------------------------------------
//
// A hit must cost what its specialization reads, not what its arguments reach: a Hugging Face
// model's tree has thousands of nodes (every module's __dict__, its hook dicts, its config).
// CPython gives every dict a version tag (PyDictObject.ma_version_tag, Python 3.11 and 3.12)
// that takes a new value from one process-wide counter at every insertion, replacement,
// deletion or clear of that dict, and at its creation, so equal tags on the same dict object
// mean the dict was not changed. Each argument tree keeps every node's value as last read, and
// each OBJECT's instance dict and DICT's tag as they were when its whole subtree last held
// (TreeMemo). A container node whose value is that same object with that same dict and tag has
// the same entries as then: its children are taken from the memo without reading them, and the
// checks of its immutable children (CONST, ID) hold without running. What no tag covers is
// still checked on every call: each object's exact type (``__class__`` can be assigned), its
// instance dict's identity (``__dict__`` can be assigned), a list's items (a list has no tag), a
// set's contents, the key order of an OrderedDict (``move_to_end`` changes no tag), and every
// leaf (the SCM's guards). A value is taken from the memo only below a container that holds it
// and whose tag held, so it is alive; a value read afresh is trusted only through a tag (a new
// object at a freed one's address has a new dict, and so a new tag).
//
// The roots are each parameter's value and self, except that the *args tuple and the **kwargs
// dict are new at every call (binding makes them): such a shell is checked alone (its type,
// length and keys, in order), and each item it holds is a root of its own, so a model or a
// cache passed as a keyword is not walked again at every call. The shells are checked before
// any other root, and the hit path tries first the tree that held at the last call
// (flatten_args): a prefill's tree and a decode step's differ in their **kwargs keys, and the
// decode step would otherwise pass the whole model's checks of the prefill's tree before its
// shell failed, then the same checks again in its own tree.
//
// The unchanged pass: a root (a parameter's value, or self) that is the memo's object, and
// whose whole subtree held at its last walk, is checked by its flat list of what remains
// (TreeMemo::checks, in pre-order, so that each value is read only once the container holding
// it held): per OBJECT its type, dict identity and tag; per DICT its type and tag; per SAME node
// its first node's object (which may be another root's, read afresh); per leaf, nothing but its
// place among the leaves (the SCM guards it). A value held by a container whose tag held is the
// same object as at the last walk, so its immutable nodes need no check. A root, or a list's
// item, is only known to be at the same address, where a new object may have taken a freed
// one's place (the memo holds no reference): there a tuple's items and a constant's value are
// checked again, as are a list's items and a set's contents everywhere. A value read through
// getattr (a functools.partial's func, args and keywords, which no dict holds and no tag
// covers: Note [Partials in arguments] in lower/flatten.py) is read afresh in either pass and
// must be the memo's object (kRead): ``__setstate__`` replaces them in the same partial. The
// first check that fails sends that root to the walk above, which reads afresh what changed
// and updates the memo.
//
// Python 3.12's dict watchers (PEP 699's way to see changes) make an unchanged dict cost nothing
// to check: a dict the memo found unchanged across two calls is watched, and an event on it (a
// change, a copy into it, its deallocation) marks the root whose subtree holds it dirty. A root
// that is not dirty reads no tag of its watched dicts; a dirty one reads them all, and is clean
// again once they all held. A root whose every dict is watched and that is not dirty takes the
// quiet pass: its list of checks without the dicts' (a builtin dict held by an unchanged
// container is the same dict with the same entries, its type fixed), per object only its type
// and its instance dict's identity (neither is a dict event), and the rest as above (leaves,
// lists, sets, OrderedDicts' key order, types, tensors' versions). Its cost is then that of
// the objects and leaves the function reads, not of every dict they reach. Not on 3.11 (no
// watchers) or where no watcher slot is free. Python 3.13 and later evaluate every node.
#if PY_VERSION_HEX < 0x030D0000
#define TRT_DICT_TAGS 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
inline uint64_t dict_tag(PyObject* d) { return reinterpret_cast<PyDictObject*>(d)->ma_version_tag; }
#pragma GCC diagnostic pop
#else
inline uint64_t dict_tag(PyObject*) { return 0; }
#endif

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define TRT_DICT_WATCHERS 1
int dict_watcher = -1;  // -2: none could be had
int type_watcher = -1;  // (Note [Watched state])
// What watches each watched dict: an argument tree's root (memo, root), or a state memo (Note
// [Watched state]). Never freed: the watcher outlives every memo.
struct Watcher {
  TreeMemo* memo;
  uint32_t root;
  StateMemo* state;
  bool operator==(const Watcher& o) const {
    return memo == o.memo && root == o.root && state == o.state;
  }
};
auto* const watchers = new std::unordered_map<PyObject*, std::vector<Watcher>>();
auto* const type_watchers = new std::unordered_map<PyObject*, std::vector<StateMemo*>>();

int on_dict_event(PyDict_WatchEvent event, PyObject* d, PyObject*, PyObject*) {
  auto it = watchers->find(d);
  if (it == watchers->end()) return 0;
  for (const Watcher& w : it->second) {
    if (w.state)
      ++w.state->events;
    else
      ++w.memo->root_events[w.root];
  }
  if (event == PyDict_EVENT_DEALLOCATED) watchers->erase(it);
  return 0;
}

int on_type_event(PyTypeObject* type) {
  auto it = type_watchers->find(reinterpret_cast<PyObject*>(type));
  if (it != type_watchers->end())
    for (StateMemo* m : it->second) ++m->events;
  return 0;
}

// `d` watched for `w`. false: not watched (no watcher slot).
bool watch(PyObject* d, const Watcher& w) {
  if (dict_watcher == -1) {
    dict_watcher = PyDict_AddWatcher(on_dict_event);
    if (dict_watcher < 0) {
      PyErr_Clear();
      dict_watcher = -2;
    }
  }
  if (dict_watcher < 0) return false;
  auto [it, added] = watchers->try_emplace(d);
  if (added && PyDict_Watch(dict_watcher, d) < 0) {
    PyErr_Clear();
    watchers->erase(it);
    return false;
  }
  if (std::find(it->second.begin(), it->second.end(), w) != it->second.end()) return true;
  it->second.push_back(w);
  if (w.state)
    w.state->watched_dicts.push_back(d);
  else
    w.memo->watching.push_back(d);
  return true;
}

// `memo` watches `d`, held by root `root`'s subtree. false: not watched (no watcher slot).
bool watch_dict(TreeMemo* memo, uint32_t root, PyObject* d) { return watch(d, {memo, root, nullptr}); }

// `d`, watched for whatever `gone` says, is no longer watched for it; unwatched when nothing else
// watches it.
template <typename Gone>
void unwatch(PyObject* d, Gone gone) {
  auto it = watchers->find(d);  // absent: deallocated since
  if (it == watchers->end()) return;
  auto& ws = it->second;
  ws.erase(std::remove_if(ws.begin(), ws.end(), gone), ws.end());
  if (ws.empty()) {
    if (PyDict_Unwatch(dict_watcher, d) < 0) PyErr_Clear();
    watchers->erase(it);
  }
}

// Note [Watched state]: state memo `m` watches type `t`. false: not watched (no watcher slot).
bool watch_type(StateMemo* m, PyObject* t) {
  if (type_watcher == -1) {
    type_watcher = PyType_AddWatcher(on_type_event);
    if (type_watcher < 0) {
      PyErr_Clear();
      type_watcher = -2;
    }
  }
  if (type_watcher < 0) return false;
  auto [it, added] = type_watchers->try_emplace(t);
  if (added && PyType_Watch(type_watcher, t) < 0) {
    PyErr_Clear();
    type_watchers->erase(it);
    return false;
  }
  if (std::find(it->second.begin(), it->second.end(), m) == it->second.end()) {
    it->second.push_back(m);
    m->watched_types.push_back(t);
  }
  return true;
}

// Note [Watched state]: `m` watches nothing any more (with the GIL).
void unwatch_state(StateMemo& m) {
  for (PyObject* d : m.watched_dicts)
    unwatch(d, [&m](const Watcher& w) { return w.state == &m; });
  for (PyObject* t : m.watched_types) {
    auto it = type_watchers->find(t);
    if (it == type_watchers->end()) continue;
    auto& ms = it->second;
    ms.erase(std::remove(ms.begin(), ms.end(), &m), ms.end());
    if (ms.empty()) {
      if (PyType_Unwatch(type_watcher, t) < 0) PyErr_Clear();
      type_watchers->erase(it);
    }
  }
  m.watched_dicts.clear();
  m.watched_types.clear();
  m.watched = false;
}
#endif

TreeMemo::~TreeMemo() {  // with the GIL (CallTrees' last holder has it)
#ifdef TRT_DICT_WATCHERS
  for (PyObject* d : watching)
    unwatch(d, [this](const Watcher& w) { return w.memo == this && !w.state; });
#endif
}

// Whether `t` holds what `copy` (a contiguous CPU tensor) does: its dtype, sizes and bytes. A
// write through `.data` moves no version counter of `t` (Note [Global tensor values]).
bool same_contents(const at::Tensor& t, const at::Tensor& copy) {
  if (t.scalar_type() != copy.scalar_type() || t.sizes() != copy.sizes() || !t.is_cpu() ||
      t.layout() != at::kStrided || !t.is_contiguous() || t.is_conj() || t.is_neg())
    return false;
  size_t n = copy.nbytes();
  return n == 0 || std::memcmp(t.const_data_ptr(), copy.const_data_ptr(), n) == 0;
}

// One tree's evaluation: where values go (the memo's arrays for argument trees, so that the next
// call finds them; the call's own for state trees).
struct TreeEval {
  const CallTrees& t;
  const Tree& tree;
  CallValues& cv;
  TreeMemo* memo;  // nullptr: every node is evaluated
  PyObject** values;
  PyObject** dicts;
  Py_ssize_t* failed;

  bool fail(size_t i) {
    if (failed) *failed = static_cast<Py_ssize_t>(i);
    return false;
  }

  // Reads node i's value from its parent (or the call); nullptr when there is none.
  PyObject* read(size_t i) {
    const TreeNode& node = tree.nodes[i];
    PyObject* parent = node.parent >= 0 ? values[node.parent] : nullptr;
    switch (node.access) {
      case TRT_ACC_ARG: return cv.bound[node.index];
      case TRT_ACC_SELF: return t.self_obj;
      case TRT_ACC_ITEM: return PyDict_GetItemWithError(parent, node.key);
      case TRT_ACC_INDEX:  // the parent's type and length were checked
        return PyTuple_Check(parent) ? PyTuple_GET_ITEM(parent, node.index)
                                     : PyList_GET_ITEM(parent, node.index);
      case TRT_ACC_ATTR: return PyDict_GetItemWithError(dicts[node.parent], node.key);
      case TRT_ACC_ROOT: return node.key;
      case TRT_ACC_GETATTR:
      case TRT_ACC_GETITEM: return parent ? read_state(parent, node.access, node.key, cv) : nullptr;
      case TRT_ACC_CELL: return parent && PyCell_Check(parent) ? PyCell_GET(parent) : nullptr;
    }
    return nullptr;
  }

  // Checks node i holding v, the node alone (its children are the caller's).
  bool check(size_t i, PyObject* v) {
    const TreeNode& node = tree.nodes[i];
    values[i] = v;
#ifdef TRT_DICT_WATCHERS
    if (memo) memo->watched[i] = 0;  // a value read afresh: perhaps another dict than the watched
#endif
    bool ok = true;
    switch (node.check) {
      case TRT_CHK_LEAF: cv.leaves.push_back(v); break;
      case TRT_CHK_SEQ:
        ok = Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(node.expect) && Py_SIZE(v) == node.length;
        break;
      case TRT_CHK_DICT:
        ok = Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(node.expect) &&
             PyDict_GET_SIZE(v) == node.length && (!node.keys || same_keys(v, node.keys));
        break;
      case TRT_CHK_OBJECT: {
        if (Py_TYPE(v) != reinterpret_cast<PyTypeObject*>(node.expect)) {
          ok = false;
          break;
        }
        PyObject* d = dicts[i] = instance_dict(v);
        ok = d && PyDict_GET_SIZE(d) == node.length && (!node.keys || same_keys(d, node.keys));
        break;
      }
      case TRT_CHK_CONST: ok = const_equal(node, v); break;
      case TRT_CHK_ID: ok = v == node.expect; break;
      case TRT_CHK_SAME: ok = v == values[node.same]; break;
      case TRT_CHK_TYPE: ok = Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(node.expect); break;
      case TRT_CHK_TENSOR:  // the same tensor, not written since (its version counter), with
        // the same contents (Note [Global tensor values] in lower/state/tree.py)
        ok = v == node.expect && THPVariable_Check(v) &&
             static_cast<Py_ssize_t>(THPVariable_Unpack(v)._version()) == node.length &&
             same_contents(THPVariable_Unpack(v), THPVariable_Unpack(node.keys));
        break;
    }
    return ok;
  }

  // Node i read and checked.
  bool one(size_t i) {
    PyObject* v = read(i);
    const TreeNode& node = tree.nodes[i];
    if (!v || node.check == TRT_CHK_ABSENT) {
      PyErr_Clear();
      if (!v && node.check == TRT_CHK_ABSENT) {
        values[i] = nullptr;
        return true;
      }
      return fail(i);
    }
    return check(i, v) || fail(i);
  }

  // Every node, in order (state trees, and argument trees without a memo that held).
  bool all() {
    size_t n = tree.nodes.size();
    for (size_t i = 0; i < n; ++i)
      if (!one(i)) return false;
    return true;
  }

  // Note [Quiet state]: the state tree's pass through its memo, whose proofs hold.
  bool quiet_state(const StateMemo& m) {
    std::copy(m.values.begin(), m.values.end(), values);
    for (uint32_t i : m.again) {
      bool ok = m.proven[i] ? check(i, m.values[i]) || fail(i) : one(i);
      if (!ok) return false;
    }
    return true;
  }

  // Whether d, node i's dict (its own, or its object's) as the memo holds it, is unchanged.
  bool same_dict(size_t i, PyObject* d) {
#ifdef TRT_DICT_WATCHERS
    uint32_t root = memo->root_of[i];
    if (memo->watched[i] && !memo->dirty(root)) return true;
    if (!memo->watched[i] && dict_tag(d) == memo->tags[i] && watch_dict(memo, root, d)) {
      memo->watched[i] = 1;  // unchanged twice: watched (watching changes its tag's low bits)
      memo->tags[i] = dict_tag(d);
      return true;
    }
#endif
    return dict_tag(d) == memo->tags[i];
  }

  // Node i, and its subtree. `held`: its value is the memo's, held by an unchanged container (or
  // an immutable tuple such a container holds); otherwise it is read afresh. The memo's `kind`
  // says what an unchanged value needs (it is read before the node: a node is 80 bytes).
  bool visit(size_t i, bool held) {
    PyObject* v = held ? values[i] : read(i);
    if (!v) {
      PyErr_Clear();
      return fail(i);
    }
    switch (memo->kind[i]) {
#ifdef TRT_DICT_TAGS
      case TreeMemo::kDict:
      case TreeMemo::kOrderedDict:  // move_to_end reorders an OrderedDict without a new tag
        if (v == values[i] && Py_TYPE(v) == memo->types[i] && same_dict(i, v) &&
            (memo->kind[i] == TreeMemo::kDict || same_keys(v, tree.nodes[i].keys)))
          return children(i, true);
        break;
      case TreeMemo::kObject:  // (the value may be one that failed its check: its type first)
        if (v == values[i] && Py_TYPE(v) == memo->types[i]) {
          PyObject** dict = _PyObject_GetDictPtr(v);
          if (dict && *dict == dicts[i] && same_dict(i, *dict)) return children(i, true);
        }
        break;
#endif
      case TreeMemo::kTuple:
        if (held) return children(i, true);
        break;
      case TreeMemo::kImmutable:
        if (held) return true;  // the same object as when it was checked
        break;
      case TreeMemo::kLeaf:
        cv.leaves.push_back(v);
        values[i] = v;
        return true;
    }
    const TreeNode& node = tree.nodes[i];
    int c = node.check;
    if (!check(i, v)) return fail(i);
    if (!children(i, false)) return false;
    // the tag once the whole subtree held: a subtree cut short by a failure keeps its older tag,
    // which its dict no longer has, so the next call reads it afresh
    if (c == TRT_CHK_DICT || c == TRT_CHK_OBJECT)
      memo->tags[i] = dict_tag(c == TRT_CHK_DICT ? v : dicts[i]);
    return true;
  }

  // The children of node p. `held`: p is unchanged, so only the children that a tag does not
  // cover are visited (the memo's `work` list); otherwise all, afresh.
  bool children(size_t p, bool held) {
    if (held) {
      for (Py_ssize_t k = memo->work_begin[p]; k < memo->work_begin[p + 1]; ++k)
        if (!visit(static_cast<size_t>(memo->work[k]), true)) return false;
      return true;
    }
    for (size_t c = p + 1; c < memo->end[p]; c = memo->end[c])
      if (!visit(c, false)) return false;
    return true;
  }

  // One check of the unchanged pass (below), v being node step.node's value in the memo.
  // `all_watched`: cleared by a dict that is not watched. Inlined: on Python 3.11 (no quiet
  // pass) a model's every dict is a check at every hit, thousands of them.
  __attribute__((always_inline)) bool holds(const TreeMemo::Check& step, PyObject* v,
                                            bool& all_watched) {
    size_t i = step.node;
    switch (step.op) {
      case TreeMemo::Check::kLeaf: cv.leaves.push_back(v); break;
      case TreeMemo::Check::kObject: {
        if (Py_TYPE(v) != memo->types[i]) return false;
        PyObject** dict = _PyObject_GetDictPtr(v);
        if (!dict || *dict != dicts[i] || !same_dict(i, *dict)) return false;
        all_watched = all_watched && memo->watched[i];
        break;
      }
      case TreeMemo::Check::kObjectQuiet: {
        if (Py_TYPE(v) != memo->types[i]) return false;
        PyObject** dict = _PyObject_GetDictPtr(v);
        if (!dict || *dict != dicts[i]) return false;
        break;
      }
      case TreeMemo::Check::kDict:
      case TreeMemo::Check::kOrderedDict:  // move_to_end reorders it without a new tag
        if (Py_TYPE(v) != memo->types[i] || !same_dict(i, v) ||
            (step.op == TreeMemo::Check::kOrderedDict && !same_keys(v, tree.nodes[i].keys)))
          return false;
        all_watched = all_watched && memo->watched[i];
        break;
      case TreeMemo::Check::kItems: {  // a list's or a tuple's type, length and items
        const TreeNode& node = tree.nodes[i];
        if (Py_TYPE(v) != reinterpret_cast<PyTypeObject*>(node.expect) ||
            Py_SIZE(v) != node.length)
          return false;
        bool list = PyList_Check(v);
        for (size_t c = i + 1; c < memo->end[i]; c = memo->end[c])
          if ((list ? PyList_GET_ITEM(v, tree.nodes[c].index)
                    : PyTuple_GET_ITEM(v, tree.nodes[c].index)) != values[c])
            return false;
        break;
      }
      case TreeMemo::Check::kConst:
      case TreeMemo::Check::kEmptySet:
        if (!const_equal(tree.nodes[i], v)) return false;
        break;
      case TreeMemo::Check::kNode:
        if (!check(i, v)) return false;
        break;
      case TreeMemo::Check::kSame:
        if (v != values[tree.nodes[i].same]) return false;
        break;
      case TreeMemo::Check::kRead: {  // read from its parent (checked before it) afresh: the
        // memo's object, or the root is walked again (__setstate__ replaced it)
        PyObject* now = read(i);
        if (!now) {
          PyErr_Clear();
          return false;
        }
        if (now != v) return false;
        break;
      }
    }
    return true;
  }

  // Note [Unchanged subtrees]: the unchanged pass over root k's checks, its value being the
  // memo's; a quiet one through its table (Note [Quiet table]). false: a check failed (the
  // leaves it pushed are the caller's to drop).
  bool unchanged(size_t k) {
#ifdef TRT_DICT_TAGS
    bool all_watched = true;  // every dict of the subtree is watched: quiet from now on
    if (memo->quiet[k] && !memo->dirty(static_cast<uint32_t>(k))) {
      const TreeMemo::QuietStep* table = memo->quiet_table.data();
      for (size_t c = memo->quiet_begin[k]; c < memo->quiet_begin[k + 1]; ++c) {
        const TreeMemo::QuietStep& step = table[c];
        PyObject* v = step.value;
        switch (step.op) {
          case TreeMemo::Check::kObjectQuiet: {
            if (Py_TYPE(v) != step.type) return false;
            PyObject** dict = _PyObject_GetDictPtr(v);
            if (!dict || *dict != step.dict) return false;
            break;
          }
          case TreeMemo::Check::kEmptySet:  // const_equal's answer for an empty set
            if (Py_TYPE(v) != step.type || PySet_GET_SIZE(v) != 0) return false;
            break;
          default:
            if (!holds(memo->quiet_checks[c], v, all_watched)) return false;
        }
      }
      const auto leaves = memo->quiet_leaves.begin();  // Note [Quiet leaves]
      cv.leaves.insert(cv.leaves.end(), leaves + static_cast<Py_ssize_t>(memo->quiet_leaf_begin[k]),
                       leaves + static_cast<Py_ssize_t>(memo->quiet_leaf_begin[k + 1]));
      return true;
    }
    for (size_t c = memo->checks_begin[k]; c < memo->checks_begin[k + 1]; ++c) {
      const TreeMemo::Check& step = memo->checks[c];
      if (!holds(step, values[step.node], all_watched)) return false;
    }
#ifdef TRT_DICT_WATCHERS
    memo->quiet[k] = all_watched;
    if (all_watched) fill_quiet_table(*memo, tree, k);
#else
    (void)all_watched;
#endif
    return true;
#else
    (void)k;
    return false;
#endif
  }

  bool memoized() {
    // the shells first: a new tuple or dict, its type, length and keys (its items are roots
    // below), so that a call of another structure fails there before a model's subtree is read
    for (size_t k = 0; k < memo->roots.size(); ++k) {
      size_t r = static_cast<size_t>(memo->roots[k]);
      if (!memo->shell[k]) continue;
      PyObject* v = read(r);
      if (!v || !check(r, v)) return fail(r);
    }
    for (size_t k = 0; k < memo->roots.size(); ++k) {
      size_t r = static_cast<size_t>(memo->roots[k]);
      if (memo->shell[k]) continue;
      // the events before this pass: once it held, the root is clean up to them (an event
      // during the pass, from Python code a check ran, leaves it dirty)
      uint64_t events = memo->root_events[k];
      if (memo->root_held[k]) {
        PyObject* v = read(r);
        size_t mark = cv.leaves.size();
        bool quiet = memo->quiet[k] && !memo->dirty(static_cast<uint32_t>(k));
        if (v && v == values[r] && unchanged(k)) {
          ++memo->passes[k][quiet ? 0 : 1];
          memo->root_clean[k] = events;
          continue;
        }
        cv.leaves.resize(mark);
        PyErr_Clear();
      }
      memo->root_held[k] = 0;
      memo->quiet[k] = 0;
      ++memo->passes[k][2];
      if (!visit(r, false)) return false;
      memo->root_held[k] = 1;
      memo->root_clean[k] = events;
    }
    return true;
  }
};

// ---- Note [Quiet state] ----------------------------------------------------------------------
//
// A state tree (Note [State guards] in lower/state/) reads the globals, class attributes and
// module attributes a function depends on: on every call, a dict lookup or an attribute lookup
// per node, more than the rest of a small function's hit. Most of those reads are lookups in a
// module's dict, a plain dict, or a class's MRO, whose results follow from state CPython tags:
// a dict's version tag changes at every change of the dict (Note [Unchanged subtrees]), and a
// type's version tag (tp_version_tag, Python 3.11 and 3.12) is cleared whenever the type or
// one of its bases gains, loses or rebinds an attribute or its bases, and is never given out
// again. After an evaluation that held, a node is proven when its value follows from its proven
// parent's through such a lookup:
//   - a root (its value is the tree's own object);
//   - an attribute of a module of exactly ModuleType (a module's class can be assigned), held
//     in its dict, or absent from a dict without a module ``__getattr__``: the dict's tag;
//   - an item of an exact dict by a str or int key: that dict's tag;
//   - an item of an exact tuple;
//   - an attribute of a class, found in its MRO as the very object the lookup returned (no
//     ``__get__`` made another: functions, C methods, properties, plain values), where the
//     class's metaclass has type's own attribute lookup and no attribute of that name (a data
//     descriptor there would win): the class's version tag, its metaclass's, its class.
// The memo keeps the proofs and a reference to each proven value. While every proof holds, a
// proven value is the same object as then, and its check holds without running when it does
// not depend on the object's contents (an identity, an absence, an immutable constant, a
// tuple's length, an exact dict's keys, which its tag covers). Every other node is read and
// checked at every call as before: what Python code serves (a property, a getter, an object's
// own attributes, a closure cell), and the checks of contents (a list, a set, an object's type
// and attributes, a tensor's version). A proof that fails makes the call evaluate every node,
// and the memo is made again from it; a state that changes at every call stops it after a few.
// Not on Python 3.13 and later (no dict tags there): every node, at every call.
//
// Note [Watched state]: on Python 3.12 the proofs' dicts and types are watched (PEP 699's dict
// watchers, and type watchers), so that while no event came since the proofs last held, their
// tags are not read: a decode hit's state tree proves its 30 nodes with 28 proofs, a module's
// dict or a class each, scattered objects that generate's Python evicted from the caches since
// the last step. What a watcher sees is what a tag says: a dict's event comes with every
// change that gives it a new tag (and its copy into or deallocation; the memo owns what it
// watches, so none is deallocated while watched), and a type's with PyType_Modified, the one
// place a valid version tag is cleared (a class's or a base's attribute set or deleted, its
// bases or MRO changed), which calls the type's watchers whenever its tag was valid, as it was
// when its proof was made. An event makes the next call check every proof by its tag, as
// without watchers (a dict whose tag moved for another key is re-read, and its proof holds
// again). The exact-type proofs (a module's ``__class__``, which no watcher sees) are checked
// at every call, as are the nodes that are not proven. Where no watcher slot is free, the tags
// are read at every call. Two proofs more make a model's state tree proven in every node, so
// that a hit reads only the memo, its module objects' headers and no node: a class whose
// metaclass is an immutable type (``type``) cannot have its class assigned (object_set_class
// refuses it), so its metaclass needs no proof (fixed_class), and an OrderedDict of at most one
// key (``torch.nn.modules.module``'s global hook dicts, empty) has no order to change, so its
// tag covers its check as an exact dict's does (its insertions and deletions are dict events).

#ifdef TRT_DICT_TAGS
inline uint64_t type_tag(PyTypeObject* t) {
  return PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG) ? t->tp_version_tag : 0;
}
#endif

void StateMemo::clear() {
#ifdef TRT_DICT_WATCHERS
  unwatch_state(*this);  // (before the references go: what it watches is alive)
#endif
  exact.clear();
  for (PyObject* o : owned) Py_DECREF(o);
  owned.clear();
  proofs.clear();
  again.clear();
  valid = false;
}

bool proofs_hold(StateMemo& m) {
#ifdef TRT_DICT_TAGS
#ifdef TRT_DICT_WATCHERS
  uint64_t events = m.events;  // Note [Watched state]
  if (m.watched && events == m.clean) {
    for (auto [obj, type] : m.exact)
      if (Py_TYPE(obj) != type) return false;
    ++m.quiet;
    return true;
  }
#endif
  for (StateMemo::Proof& p : m.proofs) {
    switch (p.op) {
      case StateMemo::Proof::kDictTag:
        if (dict_tag(p.obj) == p.tag) break;
        if (p.whole) return false;
        for (auto [key, value] : p.entries) {  // the keys the memo read: the same objects
          PyObject* now = PyDict_GetItemWithError(p.obj, key);  // (str and int keys: no code)
          if (now != value) {
            PyErr_Clear();
            return false;
          }
        }
        p.tag = dict_tag(p.obj);
        ++m.reread;
        break;
      case StateMemo::Proof::kTypeTag:
        if (type_tag(reinterpret_cast<PyTypeObject*>(p.obj)) != p.tag) return false;
        break;
      case StateMemo::Proof::kExactType:
        if (Py_TYPE(p.obj) != p.type) return false;
        break;
    }
  }
#ifdef TRT_DICT_WATCHERS
  m.clean = events;  // (no Python ran: the lookups above are of str and int keys)
#endif
  return true;
#else
  (void)m;
  return false;
#endif
}

#ifdef TRT_DICT_WATCHERS
// Note [Watched state]: `m`'s dicts and types watched, and its exact types listed, once its
// proofs are made (and hold: they were just read).
void watch_proofs(StateMemo& m) {
  bool all = true;
  for (StateMemo::Proof& p : m.proofs) {
    if (p.op == StateMemo::Proof::kExactType) {
      m.exact.emplace_back(p.obj, p.type);
    } else if (p.op == StateMemo::Proof::kDictTag) {
      all = watch(p.obj, {nullptr, 0, &m}) && all;
      p.tag = dict_tag(p.obj);  // watching changes its tag's low bits
    } else {
      all = watch_type(&m, p.obj) && all;
      // a type's tag is assigned when it is watched, and proofs are only made of assigned ones
      all = all && type_tag(reinterpret_cast<PyTypeObject*>(p.obj)) == p.tag;
    }
  }
  m.watched = all;
  m.clean = m.events;
}
#endif

// Whether no object of class `meta` can have its class assigned: object_set_class refuses an
// immutable type (a static type: `type` itself, the metaclass of most classes) unless both
// classes are modules' (Note [Quiet state]: a class's metaclass proof is then not needed).
inline bool fixed_class(PyTypeObject* meta) {
  return PyType_HasFeature(meta, Py_TPFLAGS_IMMUTABLETYPE) &&
         !PyType_IsSubtype(meta, &PyModule_Type);
}

// Note [Quiet state]: the memo of state tree `tree` from `values`, an evaluation that held.
void make_state_memo(const Tree& tree, PyObject* const* values, StateMemo& m) {
  m.clear();
#ifdef TRT_DICT_TAGS
  size_t n = tree.nodes.size();
  m.proven.assign(n, 0);
  m.values.assign(values, values + n);
  auto own = [&](PyObject* o) {
    Py_INCREF(o);
    m.owned.push_back(o);
  };
  // the proof (op, obj), made once
  auto prove = [&](StateMemo::Proof::Op op, PyObject* obj, uint64_t tag,
                   PyTypeObject* type) -> StateMemo::Proof& {
    for (StateMemo::Proof& p : m.proofs)
      if (p.op == op && p.obj == obj) return p;
    own(obj);
    m.proofs.push_back({op, obj, tag, type, {}, false});
    return m.proofs.back();
  };
  for (size_t i = 0; i < n; ++i) {
    const TreeNode& node = tree.nodes[i];
    PyObject* v = values[i];
    PyObject* parent = node.parent >= 0 && m.proven[node.parent] ? values[node.parent] : nullptr;
    bool proven = false;
    if (node.access == TRT_ACC_ROOT) {
      proven = true;
    } else if (parent && node.access == TRT_ACC_GETATTR && PyUnicode_CheckExact(node.key)) {
      if (PyModule_CheckExact(parent)) {
        PyObject* d = PyModule_GetDict(parent);
        PyObject* const module_getattr = module_getattr_name();
        proven = v ? PyDict_GetItemWithError(d, node.key) == v
                   : !PyDict_GetItemWithError(d, module_getattr);
        PyErr_Clear();
        if (proven) {
          prove(StateMemo::Proof::kExactType, parent, 0, &PyModule_Type);
          auto& entries = prove(StateMemo::Proof::kDictTag, d, dict_tag(d), nullptr).entries;
          entries.emplace_back(node.key, v);
          if (!v) entries.emplace_back(module_getattr, nullptr);
        }
      } else if (PyType_Check(parent) && v) {
        auto* type = reinterpret_cast<PyTypeObject*>(parent);
        PyTypeObject* meta = Py_TYPE(parent);
        PyObject* found = meta->tp_getattro == PyType_Type.tp_getattro &&
                                  !_PyType_Lookup(meta, node.key)
                              ? _PyType_Lookup(type, node.key) : nullptr;  // (assigns the tags)
        descrgetfunc get = found ? Py_TYPE(found)->tp_descr_get : nullptr;
        bool plain = !get || Py_TYPE(found) == &PyFunction_Type ||
                     Py_TYPE(found) == &PyMethodDescr_Type ||
                     Py_TYPE(found) == &PyWrapperDescr_Type || Py_TYPE(found) == &PyProperty_Type;
        proven = found == v && plain && type_tag(type) &&
                 (!(meta->tp_flags & Py_TPFLAGS_HEAPTYPE) || type_tag(meta));
        if (proven) {
          if (!fixed_class(meta)) prove(StateMemo::Proof::kExactType, parent, 0, meta);
          prove(StateMemo::Proof::kTypeTag, parent, type_tag(type), nullptr);
          if (meta->tp_flags & Py_TPFLAGS_HEAPTYPE)
            prove(StateMemo::Proof::kTypeTag, reinterpret_cast<PyObject*>(meta), type_tag(meta),
                  nullptr);
        }
      }
    } else if (parent && (node.access == TRT_ACC_GETITEM || node.access == TRT_ACC_ITEM) &&
               PyDict_CheckExact(parent) &&
               (PyUnicode_CheckExact(node.key) || PyLong_CheckExact(node.key))) {
      proven = true;
      prove(StateMemo::Proof::kDictTag, parent, dict_tag(parent), nullptr)
          .entries.emplace_back(node.key, v);
    } else if (parent && node.access == TRT_ACC_INDEX && PyTuple_CheckExact(parent)) {
      proven = true;
    }
    m.proven[i] = proven;
    bool holds = false;  // a proven value's check holds without running
    if (proven) {
      if (v) own(v);
      switch (node.check) {
        case TRT_CHK_ID:
        case TRT_CHK_ABSENT:
          holds = true;
          break;
        case TRT_CHK_CONST:
          holds = PyLong_CheckExact(v) || PyFloat_CheckExact(v) || PyUnicode_CheckExact(v) ||
                  PyBytes_CheckExact(v) || PyBool_Check(v) || v == Py_None ||
                  PyComplex_CheckExact(v);
          break;
        case TRT_CHK_SEQ: holds = PyTuple_CheckExact(v); break;
        case TRT_CHK_DICT:  // an OrderedDict's order: no tag covers it, but one key has one
          holds = PyDict_CheckExact(v) || (PyODict_CheckExact(v) && PyDict_GET_SIZE(v) <= 1);
          if (holds) prove(StateMemo::Proof::kDictTag, v, dict_tag(v), nullptr).whole = true;
          break;
        case TRT_CHK_SAME: holds = m.proven[node.same] != 0; break;
      }
    }
    if (!holds) m.again.push_back(static_cast<uint32_t>(i));
  }
#ifdef TRT_DICT_WATCHERS
  watch_proofs(m);
#endif
  m.valid = true;
  ++m.remade;
#else
  (void)tree;
  (void)values;
#endif
}

// Evaluates one tree over the bound values: true and cv.leaves filled when every check holds
// (an argument tree's values are then in its memo, a state tree's in cv.values, except where
// its memo proves every node: then cv is untouched, and state_holds reads none of it).
bool eval_tree(const CallTrees& t, const Tree& tree, CallValues& cv, Py_ssize_t* failed) {
  StateMemo* m = tree.state_memo.get();
  if (m && !m->busy && m->valid && m->again.empty() && proofs_hold(*m))
    return true;  // Note [Watched state]: every node proven, so cv is not written
  size_t n = tree.nodes.size();
  TreeMemo* memo = tree.memo.get();
  if (memo && memo->busy) memo = nullptr;  // re-entered during a walk: this one walks alone
  if (!memo) {
    cv.values.resize(n);
    cv.dicts.resize(n);
  }
  cv.leaves.clear();
  cv.leaves.reserve(tree.leaves + 1);
  cv.leaves.push_back(tree.key);
  TreeEval e{t, tree, cv, memo, memo ? memo->values.data() : cv.values.data(),
             memo ? memo->dicts.data() : cv.dicts.data(), failed};
  if (m && !m->busy) {  // Note [Quiet state]
    m->busy = true;  // (a check may run Python code that calls this function again)
    bool quiet = m->valid && proofs_hold(*m);
    bool ok = quiet ? e.quiet_state(*m) : e.all();
    if (!quiet && ok && m->remade < kStateMemoRemakes)
      make_state_memo(tree, e.values, *m);
    else if (!quiet)
      m->clear();
    m->busy = false;
    return ok;
  }
  if (!memo) return e.all();
  // No Python runs in a walk, but an allocation in it (an object's instance dict, made when it
  // is first read) may start a collection whose finalizers call this function again: the memo
  // is written as the walk goes, so no collection runs during it.
  int collecting = PyGC_Disable();
  memo->busy = true;
  bool ok = e.memoized();
  memo->busy = false;
  if (collecting) PyGC_Enable();
  return ok;
}

}  // namespace
