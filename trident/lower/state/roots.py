"""Where a read's chain starts (Note [State guards]): a path from a module that every process
evaluates the same way where there is one, the object itself (this process only) where there
is none. The forwards of the modules a trace called (Note [Module forwards]), the roots of
objects no module names (Note [Reached roots]), and the library registries that hold user
functions (Note [Library registries])."""

from __future__ import annotations

import sys
import types

import torch

from trident import frames
from trident.lower.state.callables import _functions_in
from trident.lower.state.chain import Read, _resolve_root, _root_of, _values_along


# Note [Module forwards]: ``Module.__call__`` (torch's code: no chains) finds ``forward`` through
# the module's class. A user class's forward that ran is read as every method that ran is; a
# library class's (``nn.Linear``, transformers' ``LlamaRMSNorm``) was read by nothing, so a
# forward patched on the class after the trace (as kernel libraries patch models) was never run
# by a hit. So the class of every module the trace called has its ``forward`` read by its path
# (``torch.nn.modules.linear.Linear.forward``). A class that no module's path names (made by a
# factory: ``kernels``' ``_create_func_module.<locals>.Func``, whose instance transformers
# binds as ``modeling_llama.apply_rotary_pos_emb``) is read through an instance that its
# module holds (``modeling_llama.apply_rotary_pos_emb.__class__.forward``: the same in every
# process), or else by the class itself: that specialization serves this process only (Note
# [Process-only state] in frontend/install.py), never a patched class's old forward. Not a
# ``torch.fx.GraphModule``'s class (one per instance, ``GraphModule.__new__.<locals>``): its
# generated forward is hashed into the key of the graph that calls it (Note [Function key]
# in identity.py), and reading it by the class would keep every graph of the backend door
# with a submodule in its process.


# What Python finds through a module's class when it is called: ``__call__`` (a type slot:
# ``nn.Module.__call__`` patched is what every later call runs), the ``_call_impl`` that
# torch's ``__call__`` calls through the module, and ``forward``.
_MODULE_CALL_NAMES = ("__call__", "_call_impl", "forward")


def forward_reads(classes) -> list[Read]:
    """Note [Module forwards]: a read of ``__call__``, ``_call_impl`` and ``forward`` on each
    module class in ``classes``."""
    reads = []
    for cls in classes:
        root, steps = _root_of(cls)
        if root[0] == "object" and issubclass(cls, torch.fx.GraphModule):
            continue
        module = sys.modules.get(getattr(cls, "__module__", None) or "")
        if root[0] == "object" and module is not None:
            held = sorted(k for k, v in list(vars(module).items())
                          if type(v) is cls and isinstance(k, str))
            if held:
                root, steps = ("module", module.__name__), (("attr", held[0]),
                                                            ("attr", "__class__"))
        reads += [Read(root, steps + (("attr", name),)) for name in _MODULE_CALL_NAMES]
    return reads


# Note [Reached roots]: a chain rooted at an object of this process (Note [Object roots] in
# chain.py) holds in no other process: a specialization whose state reads one is never found
# again by a new process. So such a root is named, where it can be, by a path from a module
# (or the jitted function) that another process evaluates the same way: the chain by which the
# reads reached the object (the ``__new__`` of a ``namedtuple``, whose ``__module__`` names no
# module, read as ``torch._guards.ShapeGuard.__new__``; the function a decorator wraps, read
# as a cell of the wrapper's closure), a method of a user class such a chain reached, by its
# name there (a ``typing.NamedTuple``'s ``__new__``, exec'd code: ``m.Pair.__new__``, whose
# ``__defaults__`` hold the fields' defaults), or, for the globals dict of exec'd code, the
# ``__globals__`` of a function of that code that such a path reaches. The new path is kept
# only where it evaluates to the very object now; what it reads is then guarded along that
# path (a library's class and function by identity, Note [Library state] in library_steps.py). An
# object that no such path reaches keeps its root: the specialization serves this process
# only (its digest names the process, tree.py's ``_root_words``).


def reach(reached: dict, read: Read, n: int, value) -> None:
    """Note [Reached roots]: ``value``, the ``n``-th value along ``read``, is reached by that
    chain (and a user class's methods by their names in it)."""
    if read.root[0] == "object" or id(value) in reached:
        return
    reached[id(value)] = (read.root, read.steps[:n])
    if isinstance(value, type) and frames.user_class(value):
        for name, v in list(vars(value).items()):
            if isinstance(v, (types.FunctionType, staticmethod)):
                f = v.__func__ if isinstance(v, staticmethod) else v
                reached.setdefault(id(f), (read.root, read.steps[:n] + (("attr", name),)))


def reached_root(read: Read, reached: dict, functions: dict, fn) -> Read:
    """Note [Reached roots]: ``read`` from a path of ``reached`` where its root is an object
    that one reaches."""
    if read.root[0] != "object":
        return read
    obj = _resolve_root(read.root, fn)
    paths = [reached.get(id(obj))]
    if type(obj) is dict:
        paths += [(p[0], p[1] + (("attr", "__globals__"),)) for f in functions.values()
                  if f.__globals__ is obj for p in [reached.get(id(f))] if p is not None]
    for path in paths:
        if path is None:
            continue
        at = Read(path[0], path[1], True)
        values = list(_values_along(at, fn))
        if len(values) == len(path[1]) + 1 and values[-1] is obj:
            return Read(path[0], path[1] + read.steps, read.whole)
    return read


# Note [Library registries]: library code may find a user function by a key in a registry of
# its own: transformers' ``AttentionInterface.register("mine", f)`` with
# ``config._attn_implementation = "mine"`` (a ``GeneralInterface``'s class-wide
# ``_global_mapping``). No chain of user code names that function, and the library's reads are
# not chains (Note [Library state] in library_steps.py): registering another function under the key
# after the trace was run by no hit, which ran the old one. So where a user function ran that
# no chain names, the class-wide mapping of every such registry is read whole (each function
# by identity: one registered again under its key is another); the function is then the
# registry's, and its code and defaults are read by its own path.


def registries() -> list[type]:
    """The registry classes of loaded libraries (Note [Library registries]): transformers'
    ``GeneralInterface`` and its subclasses that hold their own ``_global_mapping``."""
    base = getattr(sys.modules.get("transformers.utils.generic"), "GeneralInterface", None)
    found, todo = [], [base] if isinstance(base, type) else []
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if type(vars(cls).get("_global_mapping")) is dict:
            found.append(cls)
    return found


def registry_reads(codes: list, functions: dict) -> list[Read]:
    """Note [Library registries]: whole reads of the registries that hold a function of one
    of ``codes`` (user code that ran and that no chain names); each such function goes into
    ``functions`` (code -> function: its code and defaults are read as any that ran)."""
    reads = []
    for cls in registries():
        root, steps = _root_of(cls)
        held = [f for v in list(vars(cls)["_global_mapping"].values())
                for f in _functions_in(v) if f.__code__ in codes]
        if root[0] == "module" and held:
            reads.append(Read(root, steps + (("attr", "_global_mapping"),), True))
            functions.update((f.__code__, f) for f in held)
    return reads
