// Trident's native runtime, built once per (torch, Python) pair by trident/runtime/__init__.py.
//
// It owns the two things plain C cannot do:
//   * the `Dispatcher` type: the object a user calls. Its tp_call reads the arguments into
//     `trt_arg`s and enters the installed SCM; on a hit no Python code runs (Note [Hit path]);
//   * the `trt_api` services an SCM calls: boxed calls into PyTorch's dispatcher, tensor handles,
//     the current CUDA stream, Python callbacks for Triton's interpreter.
//
// Note [Hit path]: user call -> Dispatcher.tp_call -> scm_call (guards, launch sequence) -> wrap
// outputs -> return. Python is entered only when the SCM reports TRT_MISS (`_tree_miss`, or
// `_slow_path` when no installed tree accepts the call) or for a kernel that the SCM runs
// through a registered callback (counted by the SCM's owner).
//
// The runtime is one translation unit: this file includes its parts, each one job, which share
// runtime_internal.h and one unnamed namespace (so a part is not compiled alone; __init__.py
// says why).

#include "runtime_internal.h"

#include "shim.cpp"         // the trt_api services, the pending error (Note [No exception
                            // crosses the ABI])
#include "unboxed.cpp"      // Note [Unboxed calls]
#include "views.cpp"        // views computed in C (Note [Views in C] in trident/lower/plan.py)
#include "collectives.cpp"  // the synchronous all-reduce, the process group fact
#include "args.cpp"         // reading arguments and the environment, building results
#include "trees.cpp"        // Note [Argument trees]: binding, node reads and checks, programs
#include "watchers.cpp"     // Python 3.12's dict and type watchers, for the memos below
#include "tree_eval.cpp"    // evaluating trees, Note [Unchanged subtrees]
#include "state_memo.cpp"   // a state tree's memo, Note [Quiet state]
#include "tree_memo.cpp"    // an argument tree's memo, Note [Quiet table]
#include "recipes.cpp"      // output recipes
#include "dispatcher.cpp"   // the Dispatcher: its lifetime and its hit path
#include "graph_slots.cpp"  // its CUDA graph slots (Note [CUDA graphs])
#include "dispatcher_methods.cpp"  // its methods, and its type
#include "operators.cpp"    // the trident:: operators (Note [Random state steps], Note [Bool
                            // results])
#include "module.cpp"       // the trident_rt module and its init
