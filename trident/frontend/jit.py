"""``@trident.jit``: the Python side of a compiled function (everything off the hit path).

A ``JitFunction`` *is* a native ``Dispatcher`` (runtime.cpp): calling it enters C directly. The
methods here run only when the installed Specialization Cache Module reports a miss, on the first
call of a process (to load the cached module), or for keyword arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
import threading
import time
import types
import warnings
import weakref
from pathlib import Path
from typing import Callable

import torch

from trident import build, config, frames, interrupts, runtime
from trident.frontend import cache, graphs
from trident.codegen import render as codegen
from trident.lower import compiler, kernels, passes, rng, state
from trident.frontend.cache import FunctionCache
from trident.identity import function_key
from trident.lower.capture import trace
from trident.errors import EagerCall, TridentError
from trident.lower.flatten import flatten_call, flatten_output, substituted
from trident.ir.trees import TENSOR, ArgTree, Binding
from trident.ir.guards import (MAX_ARGS, OTHER, Size, SizeRelation, arg_facts, explain_failure,
                               failures, first_failure)
from trident.lower.guards import guards_for
from trident.lower.importer import import_graph
from trident.ir.specialization import Specialization

_recompiles = config.logger("recompiles")
_code_log = config.logger("code")
_guards_log = config.logger("guards")

# One compile at a time per process: make_fx's tracing state and cffi's build (which changes the
# process's working directory) are not thread-safe. Reentrant: tracing may call another
# @trident.jit function, which may miss too.
_COMPILE_LOCK = threading.RLock()
# Note [Specialization limit]: compiles in this process per function cache folder, by every
# JitFunction over that function (two trident.jit objects over one function, a method jitted
# on two instances), as torch.compile's recompile limit counts per code object.
_FUNCTION_COMPILES: dict[Path, int] = {}


@dataclasses.dataclass
class Stats:
    """Counters of one ``@trident.jit`` function (per process).

    Attributes:
        hits: calls served by the native hit path.
        misses: calls no specialization's guards accepted (each compiles or falls back).
        compiles: specializations traced and compiled in this process.
        fallbacks: calls run by eager PyTorch (unsupported input or code, autograd, limit).
        traces: times the function was traced (``compiles`` plus failed attempts).
        interpreted_launches: Triton launches on CPU tensors, run through Triton's interpreter
            by a callback from the SCM (the only Python on a hit).
        graph_captures: CUDA graphs captured (Note [CUDA graphs] in trident/graphs.py).
        graph_replays: hits served by replaying a CUDA graph (counted in the SCM).
        miss_reasons: for recent misses and fallbacks (the last 32), the first guard or
            argument path each specialization failed, e.g. ``"x.size(0) == 4 expected, got 8
            (specialization 0)"``, or why a call ran eagerly (``"eager: ..."``).
    """

    hits: int = 0
    misses: int = 0
    compiles: int = 0
    fallbacks: int = 0
    traces: int = 0
    interpreted_launches: int = 0
    graph_captures: int = 0
    graph_replays: int = 0
    miss_reasons: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Call:
    """One call as the miss path sees it: the user's ``args``/``kwargs``, its argument tree,
    the leaves the SCM reads (``leaves[0]`` is the tree's key) and every node's value."""

    args: tuple
    kwargs: dict
    tree: ArgTree
    leaves: tuple
    values: list

    @property
    def names(self) -> list[str]:
        return self.tree.leaf_paths


class JitFunctionMixin:
    """Python methods of a JitFunction; the native base class supplies ``__call__``."""

    __slots__ = ()  # instance state lives in the Dispatcher's __dict__

    _constant_self = False  # backend.py: a GraphModule's forward, keyed by its code

    @property
    def __trident_code__(self) -> Callable:
        """The function this compiles: what identity.py keys and names it by, not its counters
        and graphs."""
        return self._code_fn

    def _setup(self, fn: Callable, max_specializations: int | None, fallback: bool,
               cuda_graphs: bool | None, dynamic, cuda_graph_sizes: int | None = None) -> None:
        if isinstance(fn, torch.nn.Module):
            self._code_fn = type(fn).forward
            functools.update_wrapper(self, type(fn).forward, updated=())
            self.__qualname__ = type(fn).__qualname__
        elif isinstance(fn, types.MethodType) and not self._constant_self:
            self._code_fn = fn.__func__
            functools.update_wrapper(self, fn, updated=())
        else:  # a function, or a method whose self is Trident's own (backend.py)
            self._code_fn = fn
            functools.update_wrapper(self, fn)
        self._fn = fn
        self._binding = self._make_binding()
        self._trees: dict[int, ArgTree] = {}  # every tree a call had in this process, by key
        self._max_specializations = max_specializations or config.max_specializations()
        self._fallback = fallback
        self._cuda_graphs = config.cuda_graphs() if cuda_graphs is None else cuda_graphs
        self._dynamic = dynamic
        self._graph_states = graphs.GraphStates(  # Note [CUDA graphs]
            self._cuda_graphs, cuda_graph_sizes or config.cuda_graph_sizes())
        self._counters = Stats()
        self._specs: list[Specialization] = []
        # Note [Eager decisions]: (tree key, guards, why) of signatures that failed to compile;
        # per tree, why its last eager call ran eagerly and a test that a call still does
        self._eager_signatures: list[tuple[int, list, str]] = []
        self._eager_trees: dict[int, tuple[str, Callable[[tuple], bool]]] = {}
        self._cache: FunctionCache | None = None
        self._defaults_bound: tuple = ()  # (__defaults__, __kwdefaults__) the binding has
        self._state: state.StateTree | None = None  # what the installed specializations read
        self._load_reason = "first call"
        self._dynamic_failed = False
        self._rendered: dict[str, codegen.Rendered] = {}  # by Specialization.key, installed ones
        self._modules: dict[str, types.ModuleType] = {}  # their modules, in guard order
        self._module_names: dict[str, str] = {}  # by Specialization.key (Note [Pruning])
        self._callback_ids: dict[tuple[str, int], int] = {}
        self._warned_reasons: set[str] = set()
        self._left_out = None  # Note [Specialization limit]: (cache, stored specs not installed)

    # ---- public -----------------------------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """A snapshot of this function's counters."""
        return dataclasses.replace(self._counters, hits=self.hits,
                                   graph_replays=self._graph_replays(),
                                   miss_reasons=list(self._counters.miss_reasons))

    @property
    def specializations(self) -> list[str]:
        """The signature of each installed specialization, in guard order."""
        return [s.signature for s in self._specs]

    def explain(self, *args, **kwargs) -> str:
        """Which specialization a call with ``args`` and ``kwargs`` would run, or why each one
        rejects it: the first argument path whose structure differs from the one it was
        compiled for, or its failing guards (the first four, in guard order).

        Raises:
            TypeError: the arguments do not bind to the function's parameters.
            TridentError: an argument Trident cannot flatten (its path and type named)."""
        call = self._flatten(args, kwargs)
        self._ensure_loaded()
        lines = []
        for i, spec in enumerate(self._specs):
            why = self._why_not(spec, call, every=True)
            if why is None:
                return f"specialization {i} ({spec.signature}) accepts these arguments"
            lines.append(f"specialization {i} ({spec.signature}): {why}")
        eager = _eager_decision(call, self._eager_signatures)
        if eager is not None:
            lines.append(f"runs eagerly: {eager[0]}")
        return "\n".join(lines) or "no specializations yet"

    def _why_not(self, spec: Specialization, call: _Call, every: bool = False) -> str | None:
        """Why ``spec`` rejects ``call``: the first argument path whose structure differs, or
        its first failing guard (``every``: up to four, ``guards.failures``; None: it accepts
        the call)."""
        if spec.tree != call.tree.key:
            tree = self._trees.get(spec.tree)
            return tree.first_difference(call.tree) if tree else "another argument structure"
        failed = failures(spec.guards, call.leaves) if every else \
            [g for g in [first_failure(spec.guards, call.leaves)] if g is not None]
        return "; ".join(explain_failure(g, call.leaves, spec.arg_names)
                         for g in failed) or None

    def _select(self, *args, **kwargs) -> int:
        """The specialization the native dispatcher runs for this call, or -1 (for tests)."""
        self._ensure_loaded()
        try:
            call = self._flatten(args, kwargs)
        except TridentError:  # an argument no tree can hold: the call runs eagerly
            return -1
        return self._installed_match(call)

    def source(self) -> str:
        """The C source of the installed specializations' modules, in guard order (one module
        per specialization: Note [Incremental modules] in build.py)."""
        self._ensure_loaded()
        return "\n".join(self._render(s).source for s in self._specs)

    def mlir(self, *args, **kwargs) -> str:
        """The Torch-MLIR module (``torch`` dialect) Trident builds for a call."""
        call = self._flatten(args, kwargs)
        module = import_graph(self._trace(call, {}).graph_module)
        return module.operation.get_asm(enable_debug_info=True)

    # ---- called from the native dispatcher ---------------------------------------------------

    def _slow_path(self, args: tuple, kwargs: dict | None):
        """Called from the native dispatcher before a module is installed, and when no
        installed argument tree or no specialization's guards accept the call."""
        kwargs = kwargs or {}
        if self._cache is None or self._state_failure() >= 0 or not self._defaults_unchanged():
            self._ensure_loaded()  # (first, so that reassigned defaults bind this call)
        try:
            call = self._flatten(args, kwargs)
        except TypeError:
            return self._fn(*args, **kwargs)  # raises the TypeError eager raises
        except TridentError as e:
            self._counters.misses += 1
            return self._eager(args, kwargs, str(e))
        if self._installed_match(call) >= 0:  # a cached specialization, or a new tree's call
            return self._capture_path(call)  # a hit (that may warm up or capture its graph)
        return self._on_miss(call)

    def _tree_miss(self, args: tuple, kwargs: dict | None, leaves: tuple):
        """Called from the native dispatcher when an installed argument tree accepts the call
        and no installed specialization's guards do (or none is installed), with the leaves
        the tree read: a call of a tree that ran eagerly runs eagerly again while the fact that
        decided it holds (Note [Eager decisions]), and so does one past the specialization
        limit; any other call takes the whole miss path."""
        known = self._eager_trees.get(leaves[0])
        if known is not None and self._defaults_unchanged() and known[1](leaves):
            self._counters.misses += 1
            return self._eager(args, kwargs, known[0])
        # Note [Specialization limit]: past the limit, a call of an installed tree that no
        # stored specialization fits runs eagerly on the leaves C read, without flattening its
        # arguments again in Python (a Hugging Face model's tree: ~5 ms, five eager forwards)
        tree = self._trees.get(leaves[0])
        if (tree is None or self._cache is None or not self._at_limit()
                or not self._defaults_unchanged() or self._state_failure() >= 0
                or self._stored_fit(tree.key, leaves) is not None):
            return self._slow_path(args, kwargs)
        self._counters.misses += 1
        why = self._eager_reason(_Call(args, kwargs or {}, tree, leaves, []))
        return self._eager(args, kwargs, why) if why else self._past_limit(args, kwargs)

    def _flatten(self, args: tuple, kwargs: dict) -> _Call:
        tree, leaves, values = flatten_call(self._binding, args, kwargs)
        if tree.key not in self._trees:
            self._trees[tree.key] = tree
            if any(s.tree == tree.key for s in self._specs):  # stored before this process
                self._set_trees()  # knew the tree: the dispatcher evaluates it from now on
        return _Call(args, kwargs, self._trees[tree.key], tuple(leaves), values)

    def _installed_match(self, call: _Call) -> int:
        """The specialization the native guards pick for ``call``, or -1."""
        if not any(s.tree == call.tree.key for s in self._specs):
            return -1
        return self._match(*call.leaves)

    def _set_trees(self) -> None:
        """Install the argument trees the installed specializations use, then those of calls
        that ran eagerly (Note [Eager decisions]), and the specializations' output recipes
        (Note [Argument trees])."""
        keys = list(dict.fromkeys([s.tree for s in self._specs if s.tree in self._trees] +
                                  [k for k in self._eager_trees if k in self._trees]))
        recipes = tuple(tuple(s.recipe.ops) if s.recipe else None for s in self._specs)
        self._set_call_trees(self._binding_program, tuple(self._trees[k].program() for k in keys),
                             recipes)

    def _make_binding(self) -> Binding:
        """Note [Argument trees]: a module binds like its forward, with the module as ``self``;
        a bound method like its function, with its ``__self__``; both are read on every call.
        Made again when the function's defaults are reassigned (Note [Global guards])."""
        fn = self._fn
        if isinstance(fn, torch.nn.Module):
            return Binding.of(fn.forward, fn, has_self=True)
        if isinstance(fn, types.MethodType) and not self._constant_self:
            return Binding.of(fn, fn.__self__, has_self=True)
        return Binding.of(fn)

    @property
    def _binding_program(self) -> tuple:
        return (self._binding.program(), self._binding.self_obj, self._binding.has_self)

    def _finish(self, call: _Call, index: int, out):
        """The result of specialization ``index`` from the SCM's outputs ``out`` (Python's
        twin of the end of Dispatcher_call, through the same native recipe code)."""
        recipe = self._specs[index].recipe
        if recipe is None:
            return out
        return runtime.load().build_result(tuple(recipe.ops), out, tuple(call.values))

    # ---- miss path --------------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        """First use in this process, or after what a specialization read changed (Note [State
        guards] in state.py): install the module of the stored specializations that the
        current state allows."""
        if self._cache is not None and self._state_failure() < 0 and self._defaults_unchanged():
            return
        if self._cache is not None:  # for the miss reason of the call that finds no specs
            self._load_reason = f"{self._state_change()} since the last call"
        self._install(())
        self._set_state(None)
        self._state = None
        self._specs = []
        if self._cache is not None:  # defaults may have been reassigned
            self._binding = self._make_binding()
            self._trees.clear()
            self._eager_trees.clear()
        self._defaults_bound = _defaults_of(self._code_fn)
        self._cache = FunctionCache(self._code_fn, function_key(self._code_fn))
        known = {(k, json.dumps([g.to_json() for g in guards])) for k, guards, _ in
                 self._eager_signatures}
        stored = self._cache.load_eager() if self._fallback else []  # fallback=False raises
        for key, guards, why in stored:  # Note [Stored eager decisions]
            if (key, json.dumps([g.to_json() for g in guards])) not in known:
                self._eager_signatures.append(
                    (key, guards, f"{why} (as an earlier process found: `python3 -m "
                                  "trident clear NAME` forgets it)"))
        with cache.in_use(self._cache.directory):  # Note [Cache size]: not evicted meanwhile
            self._specs = self._stored_specs()[-self._max_specializations:]
            if self._specs:
                try:
                    self._install_module(self._specs)
                except TridentError as e:  # their modules cannot be built now (a build lock
                    _recompiles.info("%s: stored specializations not installed: %s",  # held on)
                                     self.__qualname__, e)
                    self._install(())
                    self._specs = []
                    self._set_trees()
                    return
                cache.touch(self._cache.directory)
                if self._cache.vanished or not self._cache.spec_dir.is_dir():
                    warnings.warn(f"trident: {self.__qualname__}: its cache entry "
                                  f"{self._cache.directory} was deleted while this process "
                                  "loaded it; the specializations read serve this process "
                                  "(their modules built again where deleted)",
                                  stacklevel=_user_stacklevel())
            else:
                self._set_trees()  # none: no tree holds a binding made with the old defaults

    def _stored_specs(self) -> list[Specialization]:
        """The cache's specializations of this function that the current state allows
        (Note [State guards]); with ``dynamic=False`` only static ones, even where another jit
        of the same code stored symbolic ones."""
        digests: dict[str, str | None] = {}

        def allowed(spec: Specialization) -> bool:
            text = json.dumps(spec.state["reads"])
            if text not in digests:
                try:
                    digests[text] = self._state_tree(spec.state["reads"]).digest
                except (TridentError, ValueError, TypeError, KeyError, IndexError):
                    digests[text] = None  # a chain that no longer evaluates
            return digests[text] == spec.state["digest"]

        return [s for s in self._cache.load_specs()
                if (self._dynamic is not False or not s.symbolic) and allowed(s)
                and rng.installable(s.plan)]

    def _state_tree(self, reads: list) -> state.StateTree:
        return state.build([state.Read.from_json(r) for r in reads], self._code_fn)

    def _state_change(self) -> str:
        """What changed in the state the installed module read: ``"Knobs.factor changed"``."""
        failed = self._state_failure()
        if failed >= 0 and self._state is not None:
            node = self._state.nodes[failed]
            path = node.path or "a global"
            if node.check == TENSOR and node.expect._version != node.length:
                return (f"{path} was written in place (its version counter is "
                        f"{node.expect._version}, was {node.length})")
            return f"{path} changed"
        return "the function's defaults were reassigned"

    def _defaults_unchanged(self) -> bool:
        """The binding was made with the function's current defaults (Note [Argument trees])."""
        now = _defaults_of(self._code_fn)
        return len(now) == len(self._defaults_bound) and all(
            a is b for a, b in zip(now, self._defaults_bound))

    def _on_miss(self, call: _Call):
        stats = self._counters
        stats.misses += 1
        why = self._eager_reason(call)
        if why is not None:
            return self._eager(call.args, call.kwargs, why)
        # a fitting specialization on disk that the module left out is installed again rather
        # than compiled again (Note [Specialization limit])
        stored = self._stored_fit(call.tree.key, call.leaves)
        if stored is None and self._at_limit():
            return self._past_limit(call.args, call.kwargs)  # no reason text: eager's cost
        reason = self._miss_reason(call)
        stats.miss_reasons = (stats.miss_reasons + [reason])[-32:]
        _recompiles.info("%s: miss: %s", self.__qualname__, reason)
        # Note [Specialization limit]: the limit bounds compiles in this process (as
        # torch.compile's recompile limit does) and the size of the module: the newest stored
        # specializations are installed, a stored one that fits a miss replaces the oldest
        # installed, and a cache that earlier processes filled never turns a new signature eager
        # for good. Past the limit a miss costs about an eager call: the stored specializations
        # the module left out are read from disk once per installed module, not per call.
        # tracing and cffi's build (it changes the working directory) are not thread-safe;
        # Note [Interrupted imports]: a Ctrl-C during the compile's imports waits for its end
        with _COMPILE_LOCK, interrupts.imports_uninterrupted():
            # a thread that waited here may find its signature compiled by the one before it
            # (through this JitFunction or another one over the same function, which stored
            # it), or the limit reached by the threads before it
            if self._installed_match(call) < 0:
                stored = stored or self._stored_fit(call.tree.key, call.leaves)
                if stored is None and self._at_limit():
                    return self._past_limit(call.args, call.kwargs)
                spec = None
                try:
                    spec = stored or self._compile_dynamic_or_static(call)
                    with cache.in_use(self._cache.directory):  # Note [Cache size]
                        # The new specialization goes last, after those stored by other
                        # processes (read again: they may have stored some meanwhile).
                        specs = [s for s in self._stored_specs() if s.key != spec.key]
                        keep = self._max_specializations - 1
                        specs = specs[max(0, len(specs) - keep):] + [spec]
                        self._install_module(specs)
                        # only a specialization that built and installed is stored
                        saved = stored is None and self._cache.save_spec(
                            spec, keep=2 * self._max_specializations)
                        if saved:
                            self._prune(spec)
                except TridentError as e:
                    if not self._fallback:
                        raise
                    failed = (call.tree.key, self._failed_guards(call, str(e)), str(e))
                    self._eager_signatures.append(failed)
                    if spec is None and getattr(e, "static_trace", False):
                        self._cache.save_eager(*failed)  # Note [Stored eager decisions]
                    self._eager_reason(call)  # decided for this tree: flattened in C from now
                    return self._eager(call.args, call.kwargs, str(e))
                if saved:
                    cache.evict(self._cache.directory)  # Note [Cache size]
        if self._installed_match(call) < 0:
            raise TridentError(f"internal error: the new specialization of {self.__qualname__} "
                               "does not accept the call it was traced from")
        return self._capture_path(call, hit=False)

    # ---- CUDA graphs (Note [CUDA graphs]) --------------------------------------------------

    def _stored_fit(self, tree: str, leaves: tuple) -> Specialization | None:
        """Note [Specialization limit]: a stored specialization the installed module left out
        whose tree (its key) and guards accept a call's ``leaves``. Under the limit the cache
        is read again (another process may have stored one); at the limit, once per installed
        module (``self._left_out``)."""
        left_out = self._left_out
        if left_out is None or left_out[0] is not self._cache or not self._at_limit():
            installed = {s.key for s in self._specs}
            left_out = self._left_out = (self._cache, [s for s in self._stored_specs()
                                                       if s.key not in installed])
        return next((s for s in left_out[1] if s.tree == tree
                     and first_failure(s.guards, leaves) is None), None)

    def _at_limit(self) -> bool:
        """Note [Specialization limit]: this process compiled ``max_specializations`` of this
        function, through any JitFunction over it (``_FUNCTION_COMPILES``)."""
        return _FUNCTION_COMPILES.get(self._cache.directory, 0) >= self._max_specializations

    def _stored_modules(self) -> set[str]:
        """The names of the modules of the stored specializations, which a new process may
        load (Note [Pruning] in build.py keeps them)."""
        names = set()
        for spec in self._cache.load_specs():
            if spec.key not in self._module_names:
                self._module_names[spec.key] = build.module_name(self._render(spec).source)
            names.add(self._module_names[spec.key])
        return names

    def _prune(self, spec: Specialization) -> None:
        """Note [Pruning] in build.py: after ``spec`` is stored, delete the modules of
        specializations the cache no longer stores, built before ``spec``'s."""
        try:
            built = Path(self._modules[spec.key].__file__).stat().st_mtime_ns
        except OSError:  # pruned by another process meanwhile: so it prunes
            return
        keep = self._stored_modules() | {m.__name__ for m in self._modules.values()}
        build.prune(self._cache.directory, keep, built)

    def _render(self, spec: Specialization) -> codegen.Rendered:
        """``spec``'s module source; rendered once while installed."""
        rendered = self._rendered.get(spec.key)
        return rendered if rendered is not None else codegen.render(spec, self.__qualname__)

    def _past_limit(self, args: tuple, kwargs: dict | None):
        return self._eager(args, kwargs, f"reached its limit of "
                           f"{self._max_specializations} compiled specializations; further new "
                           "signatures run eagerly")

    def _capture_path(self, call: _Call | tuple, kwargs: dict | None = None, hit: bool = True):
        """Called from the native dispatcher (with the call's ``args`` and ``kwargs``) when the
        specialization that accepts them has no CUDA graph yet but may have one: its first run
        in this process runs step by step (the warm-up); the next one captures the graph and
        replays it."""
        if not isinstance(call, _Call):
            call = self._flatten(call, kwargs or {})
        index = self._installed_match(call)
        if index < 0:  # a global changed under us: the ordinary miss path
            return self._slow_path(call.args, call.kwargs)
        args = call.leaves
        spec = self._specs[index]
        self._set_graph(index, graphs.OFF)  # the launch sequence, while this call decides
        moved = self._graph_states.next_call(spec, args)
        if moved is not None:
            start = time.perf_counter()
            try:
                captured = graphs.capture(self._run, spec, args, moved, passes.graph_device(spec),
                                          self._graph_states.pool(spec))
            except Exception as e:  # an op that cannot be captured (one that synchronizes)
                captured = f"capture failed: {type(e).__name__}: {e}"
            self._graph_states.done(spec, args, captured)
            if isinstance(captured, str):
                _recompiles.info("%s: no CUDA graph for %s: %s", self.__qualname__,
                                 spec.signature, captured)
            else:
                self._counters.graph_captures += 1
                _recompiles.info("%s: captured a CUDA graph of %s in %.1f ms (copied-in "
                                 "arguments: %s)", self.__qualname__, spec.signature,
                                 (time.perf_counter() - start) * 1e3,
                                 [call.names[i] for i in sorted(captured.statics)] or "none")
                self._install_graph(index, spec)
                out = self._finish(call, index, self._run(*args))  # replays the graph
                self.hits += hit
                return out
        try:
            out = self._finish(call, index, self._run(*args))
        except EagerCall as e:  # Note [Errors inside try] in capture.py
            return self._eager_path(call.args, call.kwargs, e)
        self.hits += hit
        self._install_graph(index, spec)  # after a warm-up: capture at the next call
        if spec.symbolic and self._cuda_graphs:
            self._graph_seen(index, *args)  # Note [Graphs per size]: this size's first call
        return out

    def _eager_path(self, args: tuple, kwargs: dict | None, error: Exception):
        """Called from the native dispatcher (and the miss path) when a step of a specialization
        failed before anything the call did was visible: the call runs eagerly, which raises
        eager's exception or takes the ``except`` branch as eager does (Note [Errors inside
        try] in capture.py)."""
        return self._eager(args, kwargs, f"{error} (a step failed before the call changed "
                           "anything: eager raises or recovers as it does)")

    def _install_graph(self, index: int, spec: Specialization) -> None:
        """Set ``spec``'s graph slot in the dispatcher (after a call, a capture or a rebuild)."""
        self._set_graph(index, *self._graph_states.slot(spec))

    # Note [Eager decisions]: a call runs eagerly, whatever is compiled, when a fact of its
    # leaves or of torch's state says so (a tensor that requires grad under grad mode, autocast
    # on, a leaf the native guards cannot read, more leaves than they read) or when its
    # signature failed to compile. Deciding that by flattening the call in Python and reading
    # every leaf's facts cost 105 us per call for one tensor and 27 ms for a 16-layer
    # transformers model (5,186 tree nodes) on the 2-core CPU machine. So the tree of a call
    # that ran eagerly is installed in the dispatcher like a specialization's: a later call of
    # that tree reaches Python with the leaves the native tree read (``_tree_miss``), and the
    # fact that decided the last eager call of the tree is tested on them, on its one leaf. It
    # is read again at every call, so it is never stale: a tensor that stops requiring grad, or
    # autocast turned off, fails the test and the call takes the whole miss path (flattened in
    # Python), which compiles it, or records the fact that now makes it eager. Each test holds
    # only of values Python flattens as leaves too (a tensor, or a value of the decided leaf's
    # own type): the native tree also accepts a call whose own tree differs (a tensor passed
    # twice, a list where a tensor was), which the whole miss path flattens as its own.

    # Note [Stored eager decisions]: a signature whose trace or compile failed (a
    # data-dependent branch, Python state the function assigns, an op the plan cannot call) is
    # decided by what the keys cover: the function key the code, the globals it names and the
    # versions, the tree key the arguments' structure, the guards the leaves. So the decision
    # is stored in the function's folder (``eager/``) and a later process runs that signature
    # eagerly without tracing it (a Hugging Face prefill, whose static cache assigns its
    # tensors lazily, would otherwise trace in every process). What the keys do not cover (a
    # global that a helper in another module reads) may have changed since; then the call runs
    # eagerly where it could compile: a stored decision only ever makes a call eager, never
    # serves a result, and its warning says it came from the cache. Only a static trace's
    # failure is stored: not a build that failed (the compiler, a full disk: the machine's),
    # nor dims that ``dynamic=`` asked for (that JitFunction's options). A JitFunction with
    # ``fallback=False`` reads no stored decision: it traces, and raises the error.

    def _failed_guards(self, call: _Call, why: str) -> list:
        """The guards of the signature whose compile failed for ``why`` (Note [Eager
        decisions]): the call's own, or, when the same tree failed for the same reason at other
        sizes before, all but its sizes and strides, so that no later size traces again (a
        transformers ``DynamicCache`` grows every step and assigns its tensors to Python
        attributes: one failed trace per generated token before)."""
        guards = guards_for(call.leaves)
        for key, failed, reason in self._eager_signatures:
            if key == call.tree.key and reason == why and \
                    first_failure(_sizeless(failed), call.leaves) is None:
                return _sizeless(guards)
        return guards

    def _eager_reason(self, call: _Call) -> str | None:
        """Why ``call`` runs eagerly whatever is compiled (Note [Eager decisions]), or None."""
        known = self._eager_trees.get(call.tree.key)
        if known is not None and known[1](call.leaves):
            return known[0]
        decision = _eager_decision(call, self._eager_signatures)
        if decision is None:
            self._eager_trees.pop(call.tree.key, None)
            return None
        self._eager_trees[call.tree.key] = decision
        if known is None:
            self._set_trees()  # later calls of this tree are flattened in C
        return decision[0]

    def _miss_reason(self, call: _Call) -> str:
        """``"x.size(0) == 4 expected, got 8 (specialization 0)"`` per specialization: the
        failing guard or argument path, not the (possibly long) signature."""
        if not self._specs:
            return self._load_reason
        # specializations of argument structures no call of this process had (stored by
        # another front door or process) are not named one by one
        reasons = [f"{self._why_not(spec, call) or 'all guards hold'} (specialization {i})"
                   for i, spec in enumerate(self._specs) if spec.tree in self._trees]
        return "; ".join(reasons) or "a new argument structure"

    def _eager(self, args: tuple, kwargs: dict | None, why: str, warn: bool = True):
        """Run the call eagerly: counted, logged, and warned once per reason (never a silent
        fallback), at the user's line."""
        self._counters.fallbacks += 1
        self._counters.miss_reasons = (self._counters.miss_reasons + [f"eager: {why}"])[-32:]
        _recompiles.info("%s: eager: %s", self.__qualname__, why)
        if warn and why not in self._warned_reasons:
            self._warned_reasons.add(why)
            warnings.warn(f"trident: {self.__qualname__} runs eagerly: {why}",
                          stacklevel=_user_stacklevel())
        with kernels.cpu_launches_interpreted():
            return self._fn(*args, **(kwargs or {}))

    def _dynamic_dims(self, call: _Call) -> dict[int, set[int]]:
        """Note [Automatic dynamic]: the dims of ``args`` to trace as symbolic sizes.

        Asked for: every dim (``dynamic=True``), the dims named per argument
        (``dynamic={"kv_cache": [2]}``), dims marked with ``torch._dynamo.mark_dynamic``.
        Automatic: a call that misses a specialization only because some sizes changed makes
        those dims dynamic, with the dims that specialization already had, as torch.compile's
        automatic dynamic shapes do. ``dynamic=False`` (and automatic mode after a failed dynamic
        compile, such as an op whose C++ reads a symbolic size as an int) specializes on every
        size. Argument names are leaf paths (``x``, ``past_key_values.layers[0].keys``)."""
        args, names = call.leaves, call.names
        tensors = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        dims = {i: set(getattr(a, "_dynamo_dynamic_indices", ())) for i, a in tensors.items()}
        if self._dynamic is True:
            dims = {i: set(range(a.dim())) for i, a in tensors.items()}
        elif isinstance(self._dynamic, dict):
            for i, a in tensors.items():
                asked = set(self._dynamic.get(names[i], ()))
                if any(d >= a.dim() for d in asked):
                    raise TridentError(f"trident.jit: dynamic dims {sorted(asked)} of "
                                       f"{names[i]}, which has {a.dim()} dims")
                dims[i] |= asked
        for spec in self._specs:  # automatic: what differs from a spec alike in all but sizes
            alike = _sizeless(spec.guards)
            if spec.shapes is None or spec.tree != call.tree.key or \
                    first_failure(alike, args) is not None:
                continue
            for i, a in tensors.items():
                dims[i] |= set(spec.dynamic.get(str(i), ()))
                dims[i] |= {d for d, n in enumerate(a.shape) if n != spec.shapes[i][d]}
        return {i: d for i, d in dims.items() if d}

    def _compile_dynamic_or_static(self, call: _Call) -> Specialization:
        automatic = self._dynamic is None
        dynamic = {} if self._dynamic is False or (automatic and self._dynamic_failed) else \
            self._dynamic_dims(call)
        if dynamic:
            try:
                return self._compile(call, dynamic)
            except TridentError as e:
                # automatic: one failed attempt per function, not per new size; dims the user
                # asked for are tried again at the next new signature
                _recompiles.info("%s: dynamic dims %s not compiled (%s); specializing on the "
                                 "sizes%s", self.__qualname__, dynamic, e,
                                 " from now on" if automatic else "")
                self._dynamic_failed = True
        try:
            return self._compile(call, {})
        except TridentError as e:  # decided by the call and the code, not by jit's options
            e.static_trace = True
            raise

    def _trace(self, call: _Call, dynamic: dict[int, set[int]], recording=None):
        """Trace the function on fake leaves put in place of the call's (Note [Argument
        trees]); the result's structure becomes the capture's output recipe. ``recording``
        (state.record's, active): this thread's generator calls decide whether the function
        set the random state, not another thread's draws meanwhile."""
        rebuilt: dict[int, int] = {}  # tuples made around the fake leaves: their nodes
        state.check_writes_before_trace(self._code_fn)  # so that eager writes once

        def run(*leaves):
            with substituted(call.tree, call.values, leaves, rebuilt) as roots:
                return self._binding.call(self._fn, roots)

        return trace(run, call.leaves, dynamic, name=self.__qualname__,
                     outputs=lambda result: flatten_output(result, call.tree, call.values,
                                                           rebuilt),
                     changed_rng=recording.changed_rng if recording is not None and
                     recording.active else None)

    def _compile(self, call: _Call, dynamic: dict[int, set[int]]) -> Specialization:
        self._counters.traces += 1
        start = time.perf_counter()
        args, names = call.leaves, call.names
        # a compile that takes over 2 s shows its stages on a terminal (config.progress)
        with config.progress(f"trident: {self.__qualname__}", 2) as bar:
            bar.set_postfix_str("tracing")
            # under the call's grad mode, which is guarded; what it reads outside the
            # arguments becomes the specialization's state (Note [State guards])
            with state.record(None if self._constant_self else self._code_fn) as recording:
                captured = self._trace(call, dynamic, recording)
            reads = [] if self._constant_self else [  # (backend.py: Dynamo guards its graphs)
                r.to_json() for r in state.reads_of(recording, self._code_fn)]
            spec_state = {"reads": reads, "digest": self._state_tree(reads).digest}
            bar.update()
            _recompiles.info("%s: trace %.2f s", self.__qualname__, time.perf_counter() - start)
            spec = compiler.compile_specialization(
                captured, args, names, dynamic, call.tree.key, spec_state, self.__qualname__,
                self._code_fn, bar)
            self._counters.compiles += 1
            _FUNCTION_COMPILES[self._cache.directory] = \
                _FUNCTION_COMPILES.get(self._cache.directory, 0) + 1
            _guards_log.info("%s: guards of %s:\n  %s", self.__qualname__, spec.signature,
                             "\n  ".join(g.words(names) for g in spec.guards))
            _recompiles.info("%s: compiled specialization %s in %.2f s", self.__qualname__,
                             spec.signature, time.perf_counter() - start)
            return spec

    def _count_interpreted(self) -> None:
        self._counters.interpreted_launches += 1

    def _install_module(self, specs: list[Specialization]) -> None:
        """Install ``specs``, in guard order: each one's module is built only where no earlier
        compile built it (Note [Incremental modules] in build.py)."""
        if isinstance(self, _EagerDispatcher):  # no runtime: explain() and source() say why
            raise TridentError(self._no_runtime)
        rendered = {s.key: self._render(s) for s in specs}
        for key, r in rendered.items():
            if key not in self._rendered:
                _code_log.info("%s", r.source)
        self._rendered = rendered
        self._modules = {s.key: self._load_module(s) for s in specs}
        self._specs = specs
        self._left_out = None
        self._reset_graphs(len(specs))
        for index, spec in enumerate(specs):
            self._install_graph(index, spec)
        self._set_trees()
        reads = list({json.dumps(r): r for s in specs for r in s.state["reads"]}.values())
        self._state = self._state_tree(reads)  # the union of what they read, as it is now
        self._set_state(self._state.program())
        self._install(tuple((m.lib.scm_call_address(), m.lib.scm_match_address())
                            for m in self._modules.values()))

    def _load_module(self, spec: Specialization):
        """``spec``'s module, built (or found in the cache), its operators looked up, its
        cubins and Python callbacks handed over."""
        rendered = self._rendered[spec.key]
        module = build.build(rendered.source, self._cache.directory)
        rt = runtime.load()
        rc = module.lib.scm_init(rt.api_address())
        if rc < 0:
            raise TridentError(f"{self.__qualname__}: the module was built for another version "
                               "of the runtime's ABI (trident_rt.h)")
        if rc > 0:
            raise TridentError(f"{self.__qualname__}: the runtime lacks an operator the module "
                               f"calls (op table entry {rc - 1})")
        for index, cubin in enumerate(rendered.cubins):
            if module.lib.scm_set_cubin(index, cubin, len(cubin)):
                raise TridentError(f"{self.__qualname__}: cannot hand cubin {index} over to "
                                   "its module (out of memory)")
        for slot, step_index in enumerate(rendered.callbacks):
            key = (spec.key, step_index)
            if key not in self._callback_ids:
                launch = spec.plan.steps[step_index].launch
                launcher = kernels.interpreted_launcher(
                    kernels.find_kernel(launch["ref"], self._code_fn),
                    kernels.Launch(**{k: v for k, v in launch.items() if k != "binary"}),
                    _weakly(self._count_interpreted))
                self._callback_ids[key] = rt.register_callback(launcher)
            module.lib.scm_set_callback(slot, self._callback_ids[key])
        return module


def _sizeless(guards: list) -> list:
    """``guards`` but those of sizes and strides (``Size``, ``Stride``, ``SizeRelation``): what a
    call of other sizes must still hold to be alike (Note [Automatic dynamic], Note [Eager
    decisions])."""
    return [g for g in guards if not isinstance(g, (Size, SizeRelation))]


def _eager_decision(call: _Call, signatures: list[tuple[int, list, str]]
                    ) -> tuple[str, Callable[[tuple], bool]] | None:
    """Why ``call`` runs eagerly whatever is compiled, and a test that another call of the
    same argument tree still does for the same reason (Note [Eager decisions]); None when it
    may be compiled. ``signatures``: (tree key, guards, why) of signatures that failed to
    compile."""
    args, names = call.leaves, call.names
    if len(args) > MAX_ARGS:
        return (f"{len(args) - 1} argument leaves; the native path reads at most "
                f"{MAX_ARGS - 1}",
                lambda leaves: True)  # a tree's leaves are as many at every call
    if _eager_mode_on():
        return ("autocast, a torch.func transform or a TorchFunctionMode "
                "(torch.set_default_device, ...) is on: Trident does not compile under "
                "them", lambda leaves: _eager_mode_on())
    grad = torch.is_grad_enabled()
    for i, a in enumerate(args):
        f = arg_facts(a)
        if f.get("dual"):
            return (f"{names[i]} is a forward-mode AD dual tensor: its tangent is computed "
                    "eagerly", lambda leaves: bool(arg_facts(leaves[i]).get("dual")))
        if f["kind"] == OTHER:
            return (f"argument {names[i]} is a {type(a).__name__} that the native guards do "
                    "not read (expected a strided CPU/CUDA tensor, int, float, bool or "
                    "None)", lambda leaves: type(leaves[i]) is type(a) and
                    arg_facts(leaves[i])["kind"] == OTHER)
        if f.get("requires_grad") and grad:
            return (f"{names[i]} requires grad: Trident serves inference; autograd runs "
                    "eagerly", lambda leaves: torch.is_grad_enabled() and
                    isinstance(leaves[i], torch.Tensor) and leaves[i].requires_grad)
    for key, guards, why in signatures:
        if key == call.tree.key and first_failure(guards, args) is None:
            return why, lambda leaves: first_failure(guards, leaves) is None
    return None


def _eager_mode_on() -> bool:
    """Autocast, a torch.func transform or a TorchFunctionMode is on (``env_facts``)."""
    return (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda") or
            torch._C._are_functorch_transforms_active() or
            torch._C._len_torch_function_stack() > 0)


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    """``method`` called through a weak reference to its object: a callback the runtime keeps
    for the rest of the process (``register_callback``) does not keep a JitFunction alive."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    return call


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller point at the first frame
    outside Trident and torch (``Module.__call__``, Dynamo's frames): the caller's line
    (Note [User code] in frames.py)."""
    frame, level = sys._getframe(2), 2  # 1 is the caller, who calls warnings.warn
    while frame is not None and (frames.trident_file(frame.f_code.co_filename) or
                                 frames.torch_file(frame.f_code.co_filename, resolved=True)):
        frame, level = frame.f_back, level + 1
    return level


def _defaults_of(fn) -> tuple:
    if not isinstance(fn, types.FunctionType):
        return ()
    return (fn.__defaults__, fn.__kwdefaults__)


@functools.cache
def jit_function_class() -> type:
    """``JitFunction``: the native Dispatcher with the methods above (built on first use); an
    eager stand-in, with one warning, when the runtime cannot be built or loaded (a full or
    read-only cache folder, no C++ compiler)."""
    try:
        rt = runtime.load()
    except TridentError as e:
        warnings.warn(f"trident: every @trident.jit function of this process runs eagerly: {e}",
                      stacklevel=3)
        return type("JitFunction", (JitFunctionMixin, _EagerDispatcher),
                    {"__module__": "trident", "_no_runtime": str(e)})
    return type("JitFunction", (JitFunctionMixin, rt.Dispatcher), {"__module__": "trident"})


class _EagerDispatcher:
    """The native ``Dispatcher``'s interface (runtime.cpp) without a runtime: every call runs
    the function eagerly and counts a fallback."""

    hits = 0
    _no_runtime = ""

    def __call__(self, *args, **kwargs):  # jit_function_class() has warned once
        return self._eager(args, kwargs, self._no_runtime, warn=False)

    def _install(self, entries: tuple) -> None:
        pass

    def _set_state(self, program) -> None:
        pass

    def _state_failure(self) -> int:
        return -1

    def _set_call_trees(self, binding: tuple, trees: tuple, recipes: tuple) -> None:
        pass

    def _match(self, *args) -> int:
        return -1

    def _reset_graphs(self, n: int) -> None:
        pass

    def _set_graph(self, *args) -> None:
        pass

    def _graph_replays(self) -> int:
        return 0

    def _graph_seen(self, *args) -> bool:
        return False


def jit(fn: Callable | None = None, *, max_specializations: int | None = None,
        fallback: bool = True, cuda_graphs: bool | None = None,
        dynamic: bool | dict[str, list[int]] | None = None, cuda_graph_sizes: int | None = None):
    """Compile ``fn`` into a Specialization Cache Module on its first call.

    Usable as ``@trident.jit`` or ``@trident.jit(max_specializations=4)``.

    Args:
        fn: a function that calls torch ops and Triton kernels (launched natively on CUDA
            tensors, through Triton's interpreter on CPU tensors), a bound method
            (``model.forward``) or an ``nn.Module`` (its ``__call__``, hooks included). Its
            arguments are bound as Python binds them (positional, keyword, defaults) and
            flattened into leaves (Note [Argument trees] in trident/flatten.py): tensors and
            scalars in tuples, lists, dicts and namedtuples, and any object's ``__dict__``
            (a module's parameters and buffers, a transformers ``StaticCache``) are read on
            every call; an object's other attributes are guarded by value or identity.
            ``@trident.jit`` on a method in a class body binds ``self`` like a function.
        max_specializations: bound on the specializations this function compiles in a process
            (counted over every ``trident.jit`` of the same function, which share its cache
            entry) and installs at once (default 8, or ``TRIDENT_MAX_SPECIALIZATIONS``); past it
            new signatures run eagerly, with one warning (Note [Specialization limit]).
        fallback: when ``fn`` cannot be compiled for a signature (an unsupported op or
            construct), run it eagerly with a warning (True) or raise ``TridentError`` (False).
        cuda_graphs: replay a CUDA graph of each CUDA specialization from its second call on
            (Note [CUDA graphs] in trident/graphs.py: when it applies, what it costs). Default:
            ``TRIDENT_CUDA_GRAPHS``, on unless set to ``0``.
        cuda_graph_sizes: how many sizes of a symbolic (dynamic) specialization get a CUDA
            graph, each captured on the second call of its size (Note [Graphs per size] in
            trident/graphs.py); calls of other sizes run step by step. Default:
            ``TRIDENT_CUDA_GRAPH_SIZES``, else 64.
        dynamic: which tensor dims are symbolic sizes (Note [Automatic dynamic] in
            ``JitFunction._dynamic_dims``; docs/dynamic-shapes.md). ``None`` (default):
            automatic, a dim becomes dynamic when a call misses only because its size
            changed. ``True``: every dim from the first call. ``False``: never. A dict
            ``{"argument name": [dims]}``: those dims from the first call, others automatic.

    Returns:
        A ``JitFunction``: call it like ``fn``; ``.stats``, ``.explain(*args)``,
        ``.source()`` and ``.mlir(*args)`` describe what it compiled.

    Raises:
        TridentError: ``fn`` is not a Python function, method or ``nn.Module`` whose
            ``forward`` is one (the cache key hashes its code).
    """
    if fn is None:
        return functools.partial(jit, max_specializations=max_specializations,
                                 fallback=fallback, cuda_graphs=cuda_graphs, dynamic=dynamic,
                                 cuda_graph_sizes=cuda_graph_sizes)
    if not (isinstance(fn, torch.nn.Module) and isinstance(
            getattr(type(fn), "forward", None), types.FunctionType)) and not (
            isinstance(fn, (types.FunctionType, types.MethodType)) and
            isinstance(getattr(fn, "__func__", fn), types.FunctionType)):
        raise TridentError(f"trident.jit expects a Python function, a method or an "
                           f"nn.Module, got {type(fn).__name__}")
    obj = jit_function_class()()
    if not (dynamic is None or isinstance(dynamic, (bool, dict))):
        raise TridentError(f"trident.jit: dynamic must be None, a bool, or a dict of argument "
                           f"name to dims, got {type(dynamic).__name__}")
    if isinstance(dynamic, dict):
        params = inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn).parameters
        for name, dims in dynamic.items():
            if name not in params:
                raise TridentError(f"trident.jit: dynamic names {name!r}, which is not a "
                                   f"parameter of {fn.__qualname__} ({', '.join(params)})")
            if not (isinstance(dims, (list, tuple, set)) and
                    all(type(d) is int and d >= 0 for d in dims)):
                raise TridentError(f"trident.jit: dynamic[{name!r}] must be a list of dims "
                                   f"(ints >= 0), got {dims!r}")
    if cuda_graph_sizes is not None and not (type(cuda_graph_sizes) is int
                                             and cuda_graph_sizes >= 1):
        raise TridentError(f"trident.jit: cuda_graph_sizes must be an int >= 1, got "
                           f"{cuda_graph_sizes!r}")
    obj._setup(fn, max_specializations, fallback, cuda_graphs, dynamic, cuda_graph_sizes)
    return obj
