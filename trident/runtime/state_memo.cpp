// state_memo.cpp: a state tree's memo, whose proofs let a call skip reading the globals,
// class attributes and module attributes it proves unchanged (Note [Quiet state], Note
// [Watched state]).

#include "runtime_internal.h"

namespace {

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
//     class's metaclass has type's own attribute lookup and no data descriptor of that name
//     (which would win; another attribute there, as ``type.__call__`` under a module class's
//     ``__call__``, loses to the class's own): the class's version tag, its metaclass's, its
//     class.
// The memo keeps the proofs and a reference to each proven value. While every proof holds, a
// proven value is the same object as then, and its check holds without running when it does
// not depend on the object's contents (an identity, an absence, an immutable constant, a
// tuple's length, an exact dict's keys, which its tag covers, a class's names, which its
// version tag covers: Note [Classes of held objects] in lower/state/wholes.py, whose OBJECT
// check of a class reads its own dict's keys). Every other node is read and
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
      all = watch_state_dict(&m, p.obj) && all;
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
        // the metaclass's own attribute of that name wins only as a data descriptor, or
        // where the class's MRO has none (type's __call__, a slot wrapper, under a module
        // class's __call__: Note [Module forwards])
        PyObject* meta_found = meta->tp_getattro == PyType_Type.tp_getattro
                                   ? _PyType_Lookup(meta, node.key) : nullptr;
        PyObject* found = meta->tp_getattro == PyType_Type.tp_getattro &&
                                  (!meta_found || !Py_TYPE(meta_found)->tp_descr_set)
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
        case TRT_CHK_OBJECT:  // a class's names (Note [Classes of held objects] in
          // lower/state/wholes.py): its own dict changes only with its version tag
          if (PyType_Check(v)) {
            auto* type = reinterpret_cast<PyTypeObject*>(v);
            _PyType_Lookup(type, module_getattr_name());  // (assigns its tag)
            PyErr_Clear();
            holds = type_tag(type) != 0;
            if (holds && !fixed_class(Py_TYPE(v)))
              prove(StateMemo::Proof::kExactType, v, 0, Py_TYPE(v));
            if (holds) prove(StateMemo::Proof::kTypeTag, v, type_tag(type), nullptr);
          }
          break;
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

}  // namespace
