// graph_slots.cpp: a Dispatcher's CUDA graph slots, one per installed specialization (Note [CUDA
// graphs] in trident/frontend/graphs.py): what Python sets in them and reads of them. The replay
// itself is the SCM's (trt_graph_replay in trident_cuda.h).

#include "runtime_internal.h"

#include <cstdlib>
#include <cstring>

namespace {

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

// _reset_graphs(n, previous=()): n empty CUDA graph slots (a new SCM is being installed).
// previous[i], where given and >= 0, is the old slot of the specialization that new slot i
// holds: Note [Sizes seen across installs].
PyObject* Dispatcher_reset_graphs(Dispatcher* self, PyObject* args) {
  Py_ssize_t n;
  PyObject* previous = nullptr;
  if (!PyArg_ParseTuple(args, "n|O!", &n, &PyTuple_Type, &previous)) return nullptr;
  if (n < 0) return PyErr_Format(PyExc_ValueError, "n < 0");
  trt_graph* slots = static_cast<trt_graph*>(std::calloc(n ? n : 1, sizeof(trt_graph)));
  if (!slots) return PyErr_NoMemory();
  Py_ssize_t kept = previous ? PyTuple_GET_SIZE(previous) : 0;
  for (Py_ssize_t i = 0; i < kept && i < n; ++i) {
    Py_ssize_t old = PyLong_AsSsize_t(PyTuple_GET_ITEM(previous, i));
    if (old == -1 && PyErr_Occurred()) {
      std::free(slots);
      return nullptr;
    }
    if (old < 0 || old >= self->num_graphs) continue;
    slots[i].nseen = self->graphs[old].nseen;
    std::memcpy(slots[i].seen, self->graphs[old].seen, sizeof(slots[i].seen));
  }
  free_graphs(self);
  self->graphs = slots;
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

}  // namespace
