// tree_eval.cpp: evaluating a tree over a call, every node or through the argument tree's
// memo (Note [Unchanged subtrees]) or the state tree's (Note [Quiet state] in state_memo.cpp).

#include "runtime_internal.h"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>

namespace {

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
// covers: Note [Partials in arguments] in lower/partials.py) is read afresh in either pass and
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
// watchers: there the unchanged pass reads its checks from the same table, tags included, Note
// [Tag table]) or where no watcher slot is free. Python 3.13 and later evaluate every node.

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
      const uint64_t* tags = memo->quiet_tags.data();  // Note [Tag table]
      (void)tags;
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
#ifndef TRT_DICT_WATCHERS
          case TreeMemo::Check::kObject: {  // Note [Tag table]: the unchanged pass's checks
            if (Py_TYPE(v) != step.type) return false;
            PyObject** dict = _PyObject_GetDictPtr(v);
            if (!dict || *dict != step.dict || dict_tag(step.dict) != tags[c]) return false;
            break;
          }
          case TreeMemo::Check::kDict:
            if (Py_TYPE(v) != step.type || dict_tag(v) != tags[c]) return false;
            break;
          case TreeMemo::Check::kOrderedDict:  // move_to_end reorders it without a new tag
            if (Py_TYPE(v) != step.type || dict_tag(v) != tags[c] ||
                !same_keys(v, tree.nodes[step.node].keys))
              return false;
            break;
#endif
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
    memo->quiet[k] = 1;  // Note [Tag table]: the next pass reads the same checks from a table
    fill_quiet_table(*memo, tree, k);
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

// its memo proves every node: then cv is untouched, and state_holds reads none of it).
bool eval_tree(const CallTrees& t, const Tree& tree, CallValues& cv, Py_ssize_t* failed) {
  StateMemo* m = tree.state_memo.get();
  if (m && !m->busy && m->valid && m->again.empty() && proofs_hold(*m))
    return true;  // Note [Watched state]: every node proven, so cv is not written
  size_t n = tree.nodes.size();
  TreeMemo* memo = tree.memo.get();
  if (memo && memo->busy) memo = nullptr;  // re-entered during a walk: this one walks alone
  // a state tree's pass reads into its memo's scratch (no allocation per call, whose cost
  // after a launch sequence's frees is a heap consolidation), a re-entered one into cv's
  const bool scratch = !memo && m && !m->busy;
  if (scratch) {
    m->scratch.resize(n);
    m->scratch_dicts.assign(n, nullptr);
  } else if (!memo) {
    cv.values.resize(n);
    cv.dicts.resize(n);
  }
  cv.leaves.clear();
  cv.leaves.reserve(tree.leaves + 1);
  cv.leaves.push_back(tree.key);
  TreeEval e{t, tree, cv, memo,
             memo ? memo->values.data() : scratch ? m->scratch.data() : cv.values.data(),
             memo ? memo->dicts.data() : scratch ? m->scratch_dicts.data() : cv.dicts.data(),
             failed};
  if (m && !m->busy) {  // Note [Quiet state]
    m->busy = true;  // (a check may run Python code that calls this function again)
    bool quiet = m->valid && proofs_hold(*m);
    bool ok = quiet ? e.quiet_state(*m) : e.all();
    if (!quiet && ok && m->remade < StateMemo::kRemakes)
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
