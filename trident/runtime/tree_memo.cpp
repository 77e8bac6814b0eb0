// tree_memo.cpp: making an argument tree's memo (Note [Unchanged subtrees] in tree_eval.cpp)
// and its quiet table (Note [Quiet table]).

#include "runtime_internal.h"

namespace {

TreeMemo::~TreeMemo() {  // with the GIL (CallTrees' last holder has it)
#ifdef TRT_DICT_WATCHERS
  unwatch_memo(*this);
#endif
}

// Note [Unchanged subtrees]: the memo of an argument tree, empty: its first evaluation reads all.
std::unique_ptr<TreeMemo> make_memo(const Tree& tree, const std::vector<Param>& params) {
  size_t n = tree.nodes.size();
  auto memo = std::make_unique<TreeMemo>();
  memo->values.assign(n, nullptr);
  memo->dicts.assign(n, nullptr);
  memo->tags.assign(n, 0);
  memo->end.assign(n, 0);
  for (size_t i = n; i-- > 0;) {  // a subtree ends where its last child's does
    if (memo->end[i] == 0) memo->end[i] = i + 1;
    Py_ssize_t p = tree.nodes[i].parent;
    if (p >= 0 && memo->end[p] == 0) memo->end[p] = memo->end[i];
  }
  memo->kind.assign(n, TreeMemo::kOther);
  memo->watched.assign(n, 0);
  memo->types.assign(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const TreeNode& node = tree.nodes[i];
    auto* type = reinterpret_cast<PyTypeObject*>(node.expect);
    switch (node.check) {
      case TRT_CHK_LEAF: memo->kind[i] = TreeMemo::kLeaf; break;
      case TRT_CHK_ID: memo->kind[i] = TreeMemo::kImmutable; break;
      case TRT_CHK_CONST:
        if (!PyAnySet_Check(node.expect)) memo->kind[i] = TreeMemo::kImmutable;
        break;
      case TRT_CHK_DICT:
        memo->kind[i] = type == &PyODict_Type && node.length >= 2 ? TreeMemo::kOrderedDict
                                                                 : TreeMemo::kDict;
        memo->types[i] = type;
        break;
      case TRT_CHK_OBJECT:
        memo->kind[i] = TreeMemo::kObject;
        memo->types[i] = type;
        break;
      case TRT_CHK_SEQ:
        if (type == &PyTuple_Type) memo->kind[i] = TreeMemo::kTuple;
        break;
    }
  }
  memo->work_begin.assign(n + 1, 0);
  for (size_t p = 0; p < n; ++p) {
    memo->work_begin[p] = static_cast<Py_ssize_t>(memo->work.size());
    uint8_t kind = memo->kind[p];  // the containers an unchanged value of holds its children
    if (kind != TreeMemo::kDict && kind != TreeMemo::kOrderedDict && kind != TreeMemo::kObject &&
        kind != TreeMemo::kTuple)
      continue;
    for (size_t k = p + 1; k < memo->end[p]; k = memo->end[k]) {
      const TreeNode& child = tree.nodes[k];
      if (memo->kind[k] != TreeMemo::kImmutable) memo->work.push_back(static_cast<Py_ssize_t>(k));
    }
  }
  memo->work_begin[n] = static_cast<Py_ssize_t>(memo->work.size());
  // the unchanged pass's checks, per root (Note [Unchanged subtrees])
  using Check = TreeMemo::Check;
#ifdef TRT_DICT_WATCHERS
  constexpr bool kWatchers = true;
#else
  constexpr bool kWatchers = false;  // Note [Tag table]: the table keeps every dict's check
#endif
  // held[i]: node i's value is held by a container whose tag proves it unchanged (a dict, an
  // object's dict, or a tuple such a container holds), so it is the same object as at the last
  // walk. Elsewhere (a root, a list's item) only its address is known to be the same, and a new
  // object may have taken a freed one's: what is not a container with a tag of its own is
  // checked again (a tuple's items, a constant's value).
  std::vector<uint8_t> held(n, 0);
  // A shell: the *args tuple or **kwargs dict binding makes afresh at every call; what it holds
  // are roots of their own (Note [Unchanged subtrees]).
  std::vector<uint8_t> shell(n, 0);
  for (size_t r = 0; r < n; r = memo->end[r]) {
    const TreeNode& node = tree.nodes[r];
    if (node.access != TRT_ACC_ARG || node.index < 0 ||
        static_cast<size_t>(node.index) >= params.size())
      continue;
    int kind = params[static_cast<size_t>(node.index)].kind;
    shell[r] = (kind == PARAM_VAR_POSITIONAL && node.check == TRT_CHK_SEQ &&
                node.expect == reinterpret_cast<PyObject*>(&PyTuple_Type)) ||
               (kind == PARAM_VAR_KEYWORD && node.check == TRT_CHK_DICT &&
                node.expect == reinterpret_cast<PyObject*>(&PyDict_Type));
  }
  for (size_t p = 0; p < n; ++p) {
    bool holds = memo->kind[p] == TreeMemo::kDict || memo->kind[p] == TreeMemo::kOrderedDict ||
                 memo->kind[p] == TreeMemo::kObject ||
                 (tree.nodes[p].check == TRT_CHK_SEQ && held[p] &&
                  tree.nodes[p].expect != reinterpret_cast<PyObject*>(&PyList_Type));
    for (size_t c = p + 1; c < memo->end[p]; c = memo->end[c]) held[c] = holds && !shell[p];
  }
  memo->root_of.assign(n, 0);
  for (size_t r = 0; r < n; r = shell[r] ? r + 1 : memo->end[r]) {
    uint32_t k = static_cast<uint32_t>(memo->roots.size());
    memo->roots.push_back(static_cast<Py_ssize_t>(r));
    memo->shell.push_back(shell[r]);
    memo->checks_begin.push_back(memo->checks.size());
    memo->quiet_begin.push_back(memo->quiet_checks.size());
    memo->quiet_leaf_begin.push_back(memo->quiet_leaf_nodes.size());
    memo->root_of[r] = k;
    for (size_t i = r; i < memo->end[r] && !shell[r]; ++i) {
      memo->root_of[i] = k;
      const TreeNode& node = tree.nodes[i];
      // `quiet`: the check's form in the quiet pass (kLeaf with `drop`: none)
      auto add_both = [&](Check::Op op, Check::Op quiet, bool drop) {
        memo->checks.push_back({op, static_cast<uint32_t>(i)});
        if (!drop) memo->quiet_checks.push_back({quiet, static_cast<uint32_t>(i)});
      };
      auto add = [&](Check::Op op) { add_both(op, op, false); };
      // a value no dict holds, which no tag covers (a partial's func, args, keywords: Note
      // [Partials in arguments] in lower/partials.py): read afresh, before its own check
      if (node.access == TRT_ACC_GETATTR) add(Check::kRead);
      switch (node.check) {
        case TRT_CHK_LEAF:  // the SCM guards it; Note [Quiet leaves]
          add_both(Check::kLeaf, Check::kLeaf, true);
          memo->quiet_leaf_nodes.push_back(static_cast<uint32_t>(i));
          break;
        case TRT_CHK_OBJECT:  // Note [Tag table]: without watchers, its tag too
          add_both(Check::kObject, kWatchers ? Check::kObjectQuiet : Check::kObject, false);
          break;
        case TRT_CHK_DICT:  // a watched dict freed and another at its address: an event
          if (memo->kind[i] == TreeMemo::kOrderedDict)
            add(Check::kOrderedDict);
          else  // a dict subclass that is a heap type can have its class assigned
            add_both(Check::kDict, Check::kDict,
                     kWatchers && !(memo->types[i]->tp_flags & Py_TPFLAGS_HEAPTYPE));
          break;
        case TRT_CHK_SEQ:
          if (node.expect == reinterpret_cast<PyObject*>(&PyList_Type) || !held[i])
            add(Check::kItems);  // a list (no tag), or a tuple not known to be the same
          break;
        case TRT_CHK_CONST:  // a set's contents can change; a constant elsewhere may be new
          if (memo->kind[i] != TreeMemo::kImmutable || !held[i]) add(Check::kConst);
          break;
        case TRT_CHK_ID:  // the tree holds the object: an equal address is the same object
        case TRT_CHK_ABSENT:  // only in a dict, whose tag covers it
          break;
        case TRT_CHK_SAME: add(Check::kSame); break;  // its first node may be another root's
        default: add(Check::kNode); break;  // a type, a tensor's version: checked every call
      }
    }
  }
  memo->checks_begin.push_back(memo->checks.size());
  memo->quiet_begin.push_back(memo->quiet_checks.size());
  memo->quiet_leaf_begin.push_back(memo->quiet_leaf_nodes.size());
  memo->quiet_leaves.resize(memo->quiet_leaf_nodes.size());
  memo->root_held.assign(memo->roots.size(), 0);
  memo->root_events.assign(memo->roots.size(), 1);
  memo->root_clean.assign(memo->roots.size(), 0);
  memo->quiet.assign(memo->roots.size(), 0);
  memo->passes.assign(memo->roots.size(), {0, 0, 0});
  memo->quiet_table.resize(memo->quiet_checks.size());
  if (!kWatchers) memo->quiet_tags.resize(memo->quiet_checks.size());
  return memo;
}

// ---- Note [Quiet table] ----------------------------------------------------------------------
//
// The quiet pass (Note [Unchanged subtrees]) of a model's subtree reads, per module, its exact
// type and instance dict's identity, its `_non_persistent_buffers_set` (a set constant: no tag
// covers a set), and its leaves' places: a handful of words per module, but each from another
// place: the node's value, type and dict in three per-node arrays of the memo (thousands of
// nodes apart), the 80-byte TreeNode and the constant's own set object for a set's check. Inside
// `generate` a decode hit finds those cold (generate's own Python runs between two hits), and
// each of them is a cache miss. The quiet table holds, per quiet check in the same order, the
// words it compares in one 32-byte record: the value, its expected type and instance dict; an
// empty set constant (every module's `_non_persistent_buffers_set` but those holding a buffer
// that state_dict leaves out) is checked as its exact type and size 0, which is what
// const_equal decides of it, without reading the tree's copy of the set. So a quiet pass
// scans one array in order and reads, beyond it, only the objects it checks (their headers,
// and a managed dict's pointer beside it). The rest (a list's items, an OrderedDict's key order,
// a non-empty set, a SAME node, a type, a tensor's version) runs the check of the unchanged pass.
// The records are copied from the memo when the root's unchanged pass finds it quiet, and the
// memo's values change only in a walk, which ends the root's quiet run first (a watched dict
// changed or freed: an event; anything else a check sees fails it): while the root is quiet,
// its records are the memo's values, alive as they are (held by watched, unchanged dicts).
//
// Not skipped in O(1) (one count of dict events, unchanged since the last hit): what the table
// still reads is what no dict watcher sees. A module's class is assigned without a dict event
// (object_set_class changes no dict); an instance dict replaced while the old one is held
// elsewhere frees nothing (no event); a set's contents, a list's items, an OrderedDict's key
// order (move_to_end) and a tensor's metadata (`.data =`, `requires_grad_`) have no watcher.
// Each is a change the walk catches (tests/test_unchanged_subtrees.py, test_quiet_table.py),
// so each stays a check: per module its header, its dict pointer, its set's header, its leaves.
//
// Note [Quiet leaves]: a quiet root's leaves are not records of the table: a leaf has no check
// there (the SCM guards it), only its place among the call's leaves, and a model's are most of
// the table (378 of a 16-layer Llama's decode tree's records: parameters, their None biases, a
// cache's ints). Each root keeps its leaves' values in pre-order in one array beside the table,
// copied with it, and a quiet pass that held appends them in one copy after its checks: the
// same leaves in the same order as the pre-order pass pushed them (a root's leaves are
// contiguous among the call's, and a pass that fails drops what it pushed).
//
// Note [Tag table]: without dict watchers (Python 3.11) no root is quiet, and every hit took the
// unchanged pass through the memo: per check its node's value, type, instance dict, tag and
// watched flag, each from another per-node array, and each leaf pushed alone. A 16-layer Llama's
// decode tree is a few thousand such checks (each module's instance dict and its parameter,
// buffer, submodule and hook dicts), so this pass was the largest part of a hit on 3.11, and
// in `generate`, where each of those arrays' lines is cold, more than twice its repeated cost.
// So on 3.11 the same table serves the unchanged pass: a root whose unchanged pass held gets its
// table filled, with every dict's check kept (a dict no watcher sees is checked by its tag) and
// each record's tag beside it (quiet_tags, one word per record: 3.12's records stay 32 bytes);
// its next pass scans the table and copies its leaves in one insert (Note [Quiet leaves]). The
// checks are the unchanged pass's, in its order, on the same values: per object its exact type,
// instance dict's identity and that dict's tag; per dict its exact type and tag (an
// OrderedDict's key order too); the rest as the unchanged pass. Its values and tags are the
// memo's as they were when the pass held, and the memo changes only in a walk (which clears
// the root's table first) or by an own write (Note [Own writes], which clears it too), so a
// table pass holds exactly where the unchanged pass would. tree_passes() counts it as quiet.
void fill_quiet_table(TreeMemo& memo, const Tree& tree, size_t root) {
  for (size_t c = memo.quiet_begin[root]; c < memo.quiet_begin[root + 1]; ++c) {
    const TreeMemo::Check& check = memo.quiet_checks[c];
    uint32_t i = check.node;
    PyObject* expect = tree.nodes[i].expect;
    TreeMemo::Check::Op op = check.op;
    if (op == TreeMemo::Check::kConst && expect && PyAnySet_CheckExact(expect) &&
        PySet_GET_SIZE(expect) == 0)
      op = TreeMemo::Check::kEmptySet;
    PyTypeObject* type = op == TreeMemo::Check::kEmptySet ? Py_TYPE(expect) : memo.types[i];
    memo.quiet_table[c] = {memo.values[i], type, memo.dicts[i], i, op};
    if (!memo.quiet_tags.empty()) memo.quiet_tags[c] = memo.tags[i];  // Note [Tag table]
  }
  for (size_t j = memo.quiet_leaf_begin[root]; j < memo.quiet_leaf_begin[root + 1]; ++j)
    memo.quiet_leaves[j] = memo.values[memo.quiet_leaf_nodes[j]];
}

// Note [Own writes]: a hit that sets an attribute of an object its tree holds (Note [Attribute
// writes] in lower/writes.py: a DynamicCache layer's `keys` and `values`, new tensors at every
// decode step) changes that object's dict, so the next call would find its tag moved and walk
// the root again, reading afresh every entry of every such object: at every step, what the hit
// itself wrote. Where the written attribute is a leaf of the tree (the SCM guards its value, so
// any value holds in the tree) and the dict is exactly as the memo last held it (the same
// object, the same instance dict, the tag the memo recorded once the subtree held, the
// attribute bound to the memo's value), the memo follows the write: the leaf's value becomes
// the one written, and the dict's tag the one it has right after the write. The old value is
// held across the write, so that no finalizer runs between the write and the tag's read (one
// that changed the dict would then be covered by the new tag); the tag is read only if the
// dict is still the object's and holds the value written. Only where the write is a store
// into the dict and nothing else: the object's type has the generic setattr and no data
// descriptor of that name (a custom __setattr__ or a property setter runs Python code, which
// may change other entries that the new tag would then cover unread: there the memo is left as
// it was, and the next call walks). What the memo then says
// is what a walk would find: every other entry as at the last walk (the tag before the write
// was the memo's), the written one a leaf. The root leaves its quiet run (its quiet table holds
// the old leaf), so the next call takes the unchanged pass, which reads the leaf from the memo;
// on Python 3.12 the write is a watched dict's event anyway. Not while a walk writes the memo.
Py_ssize_t own_write_leaf(const TreeMemo* memo, const Tree& tree, Py_ssize_t node,
                          PyObject* target, PyObject* name) {
#ifdef TRT_DICT_TAGS
  if (!memo || memo->busy || node < 0 || static_cast<size_t>(node) >= tree.nodes.size() ||
      memo->kind[node] != TreeMemo::kObject || memo->values[node] != target ||
      Py_TYPE(target) != memo->types[node] || !memo->root_held[memo->root_of[node]])
    return -1;
  // only a store into the dict, no Python code: the generic setattr, no data descriptor
  PyTypeObject* type = Py_TYPE(target);
  PyObject* descr = type->tp_setattro == PyObject_GenericSetAttr ? _PyType_Lookup(type, name)
                                                                 : nullptr;
  if (type->tp_setattro != PyObject_GenericSetAttr || (descr && Py_TYPE(descr)->tp_descr_set))
    return -1;
  PyObject** dict = _PyObject_GetDictPtr(target);
  if (!dict || *dict != memo->dicts[node] || dict_tag(*dict) != memo->tags[node]) return -1;
  for (size_t c = node + 1; c < memo->end[node]; c = memo->end[c]) {
    const TreeNode& child = tree.nodes[c];
    if (child.access != TRT_ACC_ATTR || child.key != name) continue;  // (both interned)
    if (child.check != TRT_CHK_LEAF) return -1;
    PyObject* now = PyDict_GetItemWithError(*dict, name);
    if (!now) PyErr_Clear();
    return now && now == memo->values[c] ? static_cast<Py_ssize_t>(c) : -1;
  }
#else
  (void)memo, (void)tree, (void)node, (void)target, (void)name;
#endif
  return -1;
}

void own_write_done(TreeMemo& memo, Py_ssize_t node, Py_ssize_t leaf, PyObject* target,
                    PyObject* name, PyObject* value) {
#ifdef TRT_DICT_TAGS
  PyObject** dict = _PyObject_GetDictPtr(target);
  if (memo.busy || !dict || *dict != memo.dicts[node]) return;
  PyObject* now = PyDict_GetItemWithError(*dict, name);
  if (!now) PyErr_Clear();
  if (now != value) return;
  memo.values[leaf] = value;  // (borrowed: the dict holds it, as the memo's other values)
  memo.tags[node] = dict_tag(*dict);
  memo.quiet[memo.root_of[node]] = 0;
#else
  (void)memo, (void)node, (void)leaf, (void)target, (void)name, (void)value;
#endif
}

}  // namespace
