// watchers.cpp: Python 3.12's dict and type watchers (PEP 699), which tell the memos of
// argument trees (Note [Unchanged subtrees] in tree_eval.cpp) and of state trees (Note [Watched
// state] in state_memo.cpp) that a dict or a class they proved unchanged may have changed.
// Only on 3.12 (TRT_DICT_WATCHERS, runtime_internal.h); elsewhere this part is empty.

#include "runtime_internal.h"

#include <algorithm>
#include <unordered_map>

namespace {

#ifdef TRT_DICT_WATCHERS
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

// Note [Watched state]: state memo `m` watches dict `d`. false: not watched (no watcher slot).
bool watch_state_dict(StateMemo* m, PyObject* d) { return watch(d, {nullptr, 0, m}); }

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

// `memo` watches nothing any more (with the GIL: its destructor's).
void unwatch_memo(TreeMemo& memo) {
  for (PyObject* d : memo.watching)
    unwatch(d, [&memo](const Watcher& w) { return w.memo == &memo && !w.state; });
  memo.watching.clear();
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
#endif  // TRT_DICT_WATCHERS

}  // namespace
