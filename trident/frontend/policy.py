"""The miss policy: what a call that no installed specialization accepts does.

It runs eagerly (Note [Eager decisions], Note [Stored eager decisions]), past the specialization
limit (Note [Specialization limit]), installs a stored specialization that fits, or compiles a
new one with the dims Note [Automatic dynamic] makes symbolic (dynamic.py); a fallback is
counted, logged, and warned once per reason. The native dispatcher enters here (``_slow_path``,
``_tree_miss``, ``_eager_path``); tracing is tracing.py's, installing install.py's.
"""

from __future__ import annotations

import os
import threading
import time
import warnings

from trident import config, interrupts
from trident.errors import CompileForbidden, TridentError
from trident.frontend import cache, ints
from trident.frontend.dynamic import DynamicDims
from trident.frontend.limit import _FUNCTION_COMPILES, SpecializationLimit
from trident.frontend.eager import _eager_decision, _sizeless
from trident.frontend.install import _Call, _int_leaves_of, _same_node, _user_stacklevel
from trident.frontend.values import failed_check
from trident.ir.guards import explain_failure, failures, first_failure
from trident.ir.specialization import Specialization
from trident.lower import flatten, kernels, orders, writes
from trident.lower.guards import guards_for

_recompiles = config.logger("recompiles")

# One compile at a time per process: make_fx's tracing state and cffi's build (which changes the
# process's working directory) are not thread-safe. Reentrant: tracing may call another
# @trident.jit function, which may miss too.
_COMPILE_LOCK = threading.RLock()
# Note [Fork during a compile]: a compile holds the lock while it changes process state (torch.fx's
# module wrappers and torch's random-state functions replaced for the trace, the working
# directory during cffi's build). A child that ``os.fork()`` (multiprocessing's default start
# method on Linux) made from another thread meanwhile inherited that state half-changed and the
# lock held by a thread it does not have: its first call of any jitted function waited forever
# where eager returns. So a fork waits for the compile in progress, as ``logging`` makes a fork
# wait for its lock: the child starts with no compile running and the lock free. (A fork from
# the compiling thread itself, a traced function's, reenters the lock.)
if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(before=_COMPILE_LOCK.acquire, after_in_parent=_COMPILE_LOCK.release,
                        after_in_child=_COMPILE_LOCK.release)


class MissPolicy(SpecializationLimit, DynamicDims):
    """The JitFunction methods that decide what a miss does."""

    __slots__ = ()

    # ---- called from the native dispatcher ---------------------------------------------------

    def _slow_path(self, args: tuple, kwargs: dict | None):
        """Called from the native dispatcher before a module is installed, and when no
        installed argument tree or no specialization's guards accept the call."""
        kwargs = kwargs or {}
        if self._cache is None or self._state_failure() >= 0 or not self._defaults_unchanged():
            self._ensure_loaded()  # (first, so that reassigned defaults bind this call)
        for steps, why in self._unflattenable.items():  # Note [Unflattenable values]
            if flatten.reaches(self._binding, args, kwargs, steps):
                return self._eager(args, kwargs, why)
        try:
            call = self._flatten(args, kwargs)
        except TypeError:
            return self._fn(*args, **kwargs)  # raises the TypeError eager raises
        except TridentError as e:
            if getattr(e, "steps", None):  # in flatten.py
                self._unflattenable[e.steps] = str(e)
            return self._eager(args, kwargs, str(e))
        if self._pending:  # Note [Installing on demand] in install.py: those that fit, or all
            self._install_pending(call.leaves)
            if self._installed_match(call) < 0:
                self._install_pending()
        if self._installed_match(call) >= 0:  # a cached specialization, or a new tree's call
            return self._capture_path(call)  # a hit (that may warm up or capture its graph)
        again = self._with_int_leaves(call)
        if again is not call and self._installed_match(again) >= 0:
            call.leaves, call.values = (), []  # (Note [Finalizers of written values])
            return self._capture_path(again)
        if self._dynamic is None and self._stored_fit(again.tree.key, again.leaves) is None:
            stored = self._stored_call(again, self._specs + self._left_out[1])
            if stored is not again and self._installed_match(stored) >= 0:
                for other in (call, again):  # (Note [Finalizers of written values])
                    other.leaves, other.values = (), []
                return self._capture_path(stored)  # Note [Stored int leaves] in install.py
            again = stored
        if again is not call:  # Note [Finalizers of written values]: ``again`` alone holds them
            call.leaves, call.values = (), []
        return self._on_miss(again)

    # Note [Int leaves]: an int attribute of an object the call reaches (a cache's
    # ``max_cache_len``, a model's ``_previous_max_cache_length``, a layer's ``batch_size``) is a
    # constant of the argument tree: the tree's key holds its value, and another value is
    # another tree. Under automatic dynamic (``dynamic=None``), a call whose tree differs from a
    # known one only in such ints makes them leaves of the tree (``_int_leaves``, by path) from
    # then on, as Dynamo's automatic dynamic makes an int that changed a symbol: the call is
    # flattened again, and ``_dynamic_dims`` traces those leaves as symbols (Note [Symbolic
    # ints] in lower/guards.py), so that only what the trace reads of them is guarded. A
    # serving loop that builds a cache per request, sized by the prompt and
    # ``max_new_tokens``, then compiles once for every size. A leaf that the graph takes as a
    # value (``torch.zeros(n)``, ``x[:n]``) is read in C as a size is. What another argument
    # structure takes from those that changed: Note [Ints by path] in ints.py.
    #
    # Note [Float leaves]: a float attribute is a constant of the tree as an int is, and was
    # nothing more: a float the function writes from a size or a counter (``b.f = n / 2``)
    # made every new value a new tree, and kept an int beside it from becoming a leaf. Now a
    # float that differs between trees, or that a specialization writes, is a leaf as an int
    # is, and a trace under automatic dynamic takes it as a SymFloat of its own
    # (``lower/float_leaves.py``, finite values only) that records any operation on it. A
    # trace that never read it (an operation, a conversion C code asks for, a guard on its
    # symbol, its placeholder taken by an op, returned or written) leaves it unguarded; one
    # that read it (a branch, ``x * b.f``, ``b.g = b.f``) is traced again with it a plain
    # float, guarded by value (``FloatBits``), as is every later trace (``_read_floats``): a
    # float a decision or a baked constant depends on is never stale. A quotient of sizes or
    # ints (``n / 2``) is a size step of its own in C (``truediv``, Note [Checked size steps]
    # in codegen/render.py), written or returned, never taken by an op (``floats_taken``).

    def _with_int_leaves(self, call: _Call) -> _Call:
        """``call`` flattened again with the int attributes in which its tree differs from a
        known tree made leaves (Note [Int leaves]), or ``call`` itself."""
        if self._dynamic is not None or any(s.tree == call.tree.key for s in self._specs):
            return call
        paths: set[str] = set()
        alike = set()
        for key, tree in self._trees.items():
            if key != call.tree.key and len(tree.nodes) == len(call.tree.nodes):
                differ = ints.int_differences(tree, call)
                if differ:
                    paths |= differ
                    alike.add(key)
        if not alike and (self._int_leaves or self._written_ints):  # Note [Ints by path] in ints.py
            mine = ints.int_paths(call.tree, call.values, self._int_leaves)
            for key, tree in self._trees.items():
                theirs = ints.int_paths(tree, None, self._int_leaves)
                differ = {p for p in mine.keys() & theirs.keys() if mine[p] != theirs[p]
                          or mine[p] is None}
                if key != call.tree.key and differ:
                    paths |= {p for p in differ if mine[p] is not None}
                    alike.add(key)
        if not alike:  # Note [Tensors by path] in ints.py
            alike = {s.tree for s in self._specs if s.tree != call.tree.key and s.tree in
                     self._trees and ints.related(s, call)}
        again = call
        self._varied_ints = self._varied_ints | paths
        if paths - self._int_leaves:
            self._int_leaves = self._int_leaves | paths
            again = self._flatten(call.args, call.kwargs)
        if alike:
            self._int_trees.setdefault(again.tree.key, set()).update(alike)
        return again

    def _tree_miss(self, args: tuple, kwargs: dict | None, held: list):
        """Called from the native dispatcher when an installed argument tree accepts the call
        and no installed specialization's guards do (or none is installed), with the leaves
        the tree read (``held``, a list it empties: the call then holds no reference to them
        of its own, Note [Finalizers of written values] in lower/writes.py): a call of a tree
        that ran eagerly runs eagerly again while the fact that decided it holds (Note [Eager
        decisions]), and so does one past the specialization limit; any other call takes the
        whole miss path."""
        leaves = tuple(held)
        held.clear()
        if self._pending and self._state_failure() < 0 and self._install_pending(leaves):
            del leaves
            return self._slow_path(args, kwargs)  # Note [Installing on demand] in install.py
        known = self._eager_trees.get(leaves[0])
        if known is not None and self._defaults_unchanged() and known[1](leaves):
            del leaves
            return self._eager(args, kwargs, known[0])
        # Note [Specialization limit]: past the limit, a call of an installed tree that no
        # stored specialization fits runs eagerly on the leaves C read, without flattening its
        # arguments again in Python
        tree = self._trees.get(leaves[0])
        if (tree is None or self._cache is None or not self._at_limit()
                or not self._defaults_unchanged() or self._state_failure() >= 0
                or self._stored_fit(tree.key, leaves) is not None or self._folder_moved()):
            del leaves
            return self._slow_path(args, kwargs)
        why = self._eager_reason(_Call(args, kwargs or {}, tree, leaves, []))
        del leaves
        return self._eager(args, kwargs, why) if why else self._past_limit(args, kwargs)

    def _eager_path(self, args: tuple, kwargs: dict | None, error: Exception,
                    missed: bool = False):
        """Called from the native dispatcher (and the miss path: ``missed``, the miss already
        counted) when a step of a specialization failed before anything the call did was
        visible: the call runs eagerly, which raises eager's exception or takes the ``except``
        branch as eager does (Note [Errors inside try] in source_lines.py)."""
        return self._eager(args, kwargs, f"{error} (a step failed before the call changed "
                           "anything: eager raises or recovers as it does)", miss=not missed)

    def _finalized_write(self, args: tuple, kwargs: dict | None, target, name: str,
                         call: _Call | None = None):
        """Called from the native dispatcher (and ``_capture_path``, with its ``call``) before
        a hit's launch sequence where the value that a replayed write of ``target.name`` would
        drop may have a finalizer (Note [Finalizers of written values] in lower/writes.py):
        ``(False, None)`` where none of its own finalizes it (the hit goes on), else ``(True,
        the call's eager result)``, run with no reference of the call's own to that value."""
        why = writes.finalized(vars(target).get(name))
        if why is None:
            return False, None
        if call is not None:
            call.leaves, call.values = (), []
        return True, self._eager(args, kwargs, f"the function's write to .{name} of a "
                                 f"{type(target).__qualname__} drops a value that {why} "
                                 "finalizes: eager runs it at the write, a specialization "
                                 "at its end")

    # ---- the miss path ----------------------------------------------------------------------

    def _on_miss(self, call: _Call):  # counted once (Note [Miss counts]): by _eager, or here
        why = self._eager_reason(call)
        if why is not None:
            return self._eager_of(call, why)
        # a fitting specialization on disk that the module left out is installed again rather
        # than compiled again (Note [Specialization limit])
        stored = self._stored_fit(call.tree.key, call.leaves)
        if stored is None and self._at_limit():
            if self._folder_moved():  # another state's folder may hold one
                self._ensure_loaded(moved=True)
                return self._slow_path(call.args, call.kwargs)
            self._eager_past_limit(call)
            return self._past_limit(call.args, call.kwargs)  # no reason text: eager's cost
        reason = self._miss_reason(call)
        _recompiles.info("%s: miss: %s", self.__qualname__, reason)
        misses = self._counters.misses
        try:
            return self._compile_miss(call, stored, reason)
        except CompileForbidden as e:  # why no stored specialization accepted the call
            if self._counters.misses == misses:
                self._count_miss(reason)
            raise CompileForbidden(f"{self.__qualname__}: {e}; the miss: {reason}") from None
        except BaseException:  # a compile that raised (fallback=False, Ctrl-C)
            if self._counters.misses == misses:
                self._count_miss(reason)
            raise

    def _compile_miss(self, call: _Call, stored: Specialization | None, reason: str):
        # Note [Specialization limit]: the limit bounds compiles in this process (as
        # torch.compile's recompile limit does) and the size of the module: the most recently
        # used stored specializations are installed (Note [Stored int leaves] in install.py), a
        # stored one that fits a miss replaces the oldest installed, and a cache that earlier
        # processes filled never turns a new signature eager for good. Past the limit a miss
        # costs about an eager call: the stored specializations the module left out are read
        # from disk once per installed module, not per call.
        # tracing and cffi's build (it changes the working directory) are not thread-safe;
        # Note [Interrupted imports]: a Ctrl-C during the compile's imports waits for its end
        before = [s.key for s in self._specs]  # Note [Miss counts]: a thread that waits
        with _COMPILE_LOCK, interrupts.imports_uninterrupted(), \
                config.progress(self.__qualname__), config.frozen_heap():  # (config.py)
            # a thread that waited here may find its signature compiled by the one before it
            # (through this JitFunction or another one over the same function, which stored
            # it), or the limit reached by the threads before it
            served = [s.key for s in self._specs] != before and \
                self._installed_match(call) >= 0  # installed while it waited: a hit
            if not served and self._installed_match(call) < 0:
                stored = stored or self._stored_fit(call.tree.key, call.leaves)
                if stored is None and self._at_limit():
                    return self._past_limit(call.args, call.kwargs)
                spec, start = None, time.perf_counter()
                try:
                    spec = stored or self._compile_dynamic_or_static(call)
                    if spec.tree != call.tree.key and tuple(spec.arg_names) != \
                            tuple(call.names):  # Note [Capacities of written state] (ints.py):
                        call = self._known_call(self._flattened(  # its int leaves
                            call.args, call.kwargs, _int_leaves_of(spec)))
                    if spec.tree != call.tree.key:  # Note [Dict orders]: as its trace found
                        call = self._known_call(orders.in_orders(call,
                                                                 frozenset(spec.free_orders)))
                    if stored is None:  # counted toward the limit (Note [Specialization limit])
                        cache.COMPILED_HERE.add(spec.key)
                        _FUNCTION_COMPILES[self._limit_key()] = \
                            _FUNCTION_COMPILES.get(self._limit_key(), 0) + 1
                    with cache.in_use(self._cache.directory):  # Note [Cache size]
                        # The new specialization goes last, after those stored by other
                        # processes (read again: they may have stored some meanwhile).
                        specs = [s for s in self._stored_specs() if s.key != spec.key]
                        keep = self._max_specializations - 1
                        specs = specs[max(0, len(specs) - keep):] + [spec]
                        self._install_module(specs)
                        # Note [Progress]: after its stages' lines (render and C build too)
                        _recompiles.info("%s: %s specialization %s in %.2f s", self.__qualname__,
                                         "installed the stored" if stored else "compiled",
                                         spec.signature, time.perf_counter() - start)
                        # only a specialization that built and installed is stored
                        # Note [Process-only state] in install.py
                        only = self._process_only(spec) if stored is None else None
                        if only is not None:
                            _recompiles.info("%s: specialization %s kept in this process, not "
                                             "stored: its state guards check %s, an object "
                                             "of this process only, by identity",
                                             self.__qualname__, spec.signature, only)
                            self._cache.keep_in_process(spec)
                        saved = stored is None and only is None and self._cache.save_spec(
                            spec, keep=2 * self._max_specializations)
                        if saved:
                            if spec.key in self._rendered:  # Note [Stored module names]
                                self._record_module(spec, self._modules[spec.key].__name__,
                                                    self._rendered[spec.key])
                            self._prune(spec)
                            if spec.tree in self._trees:  # Note [Stored trees] in ir/trees.py
                                self._cache.save_tree(self._trees[spec.tree].words(), spec.tree,
                                                      keep=2 * self._max_specializations)
                        elif stored is not None:  # the most recently used, for a new process
                            self._cache.renew(stored)
                except TridentError as e:
                    if not self._fallback or isinstance(e, CompileForbidden):
                        raise
                    failed = (call.tree.key, self._failed_guards(call, str(e)), str(e))
                    self._eager_signatures.append(failed)
                    if spec is None and getattr(e, "static_trace", False) and not \
                            getattr(e, "transient", False):
                        self._cache.save_eager(*failed)  # Note [Stored eager decisions] in cache.py
                    self._eager_reason(call)  # decided for this tree: flattened in C from now
                    why, e = str(e), _let_go(e)
                    return self._eager_of(call, why)
                if saved:
                    cache.evict(self._cache.directory)  # Note [Cache size]
        if served:  # Note [Miss counts]: run after the lock, as the native hit path would
            return self._capture_path(call, hit=True)
        if self._installed_match(call) < 0:
            if any(s.tree == call.tree.key and first_failure(s.guards, call.leaves) is None
                   for s in self._specs):  # Note [Checked size steps] in codegen/render.py
                return self._eager(call.args, call.kwargs, "a size relation int64 cannot decide")
            raise TridentError(f"internal error: the new specialization of {self.__qualname__} "
                               "does not accept the call it was traced from")
        self._count_miss(reason)
        return self._capture_path(call, hit=False)

    # ---- eager calls ------------------------------------------------------------------------

    def _failed_guards(self, call: _Call, why: str) -> list:
        """The guards of the signature whose compile failed for ``why`` (Note [Eager
        decisions]): the call's own, or, when the same tree (or one that differed from it in
        int constants only: Note [Int leaves]) failed for the same reason at other sizes or
        ints before, all but its sizes, strides and ints, so that no later size traces again
        (a cache that grows every step and assigns its tensors to Python state no
        specialization replays, Note [Attribute writes] in lower/writes.py: each generated
        token would trace, and fail, again)."""
        guards = guards_for(call.leaves)
        alike = self._int_trees.get(call.tree.key, ())  # Note [Int leaves]
        for key, failed, reason in self._eager_signatures:
            if reason == why and (key in alike or key == call.tree.key and
                                  first_failure(_sizeless(failed), call.leaves) is None):
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

    def _why_not(self, spec: Specialization, call: _Call, every: bool = False) -> str | None:
        """Why ``spec`` rejects ``call``: the first argument path whose structure differs (from
        its tree as a call of this process had it, or as stored: Note [Stored trees] in
        ir/trees.py), or its first failing guard (``every``: up to four, ``guards.failures``;
        None: it accepts the call)."""
        if spec.tree != call.tree.key:
            tree = self._trees.get(spec.tree) or self._cache.load_tree(spec.tree)
            if not tree:
                return "another argument structure"
            return _other_object(tree, call.tree) or tree.first_difference(call.tree, call.leaves)
        failed = failures(spec.guards, call.leaves) if every else \
            [g for g in [first_failure(spec.guards, call.leaves)] if g is not None]
        return "; ".join(explain_failure(g, call.leaves, spec.arg_names)
                         for g in failed) or failed_check(spec, call.leaves)

    def _miss_reason(self, call: _Call) -> str:
        """``"x.size(0) == 4 expected, got 8 (specialization 0)"`` per specialization: the
        failing guard or argument path, not the (possibly long) signature."""
        stored = f"; {self._state_rejected}" if self._state_rejected else ""
        if not self._specs:
            return self._load_reason + stored
        # Note [Stored int constants]: a specialization of an argument structure no call of
        # this process had (stored by another front door or process) is named where the
        # call's tree is its tree but for int constants (``Specialization.tree_ints``: a
        # cache's length, a layer count), which are named with both values, as a tree of this
        # process is (``ArgTree.first_difference``); others are not named one by one
        reasons = [f"{why} (specialization {i})" for i, spec in enumerate(self._specs)
                   if (why := self._why_not(spec, call) or "all guards hold"
                       if spec.tree in self._trees else
                       call.tree.int_difference(spec.tree_ints, spec.tree))]
        n = len(self._specs)  # (of an earlier process or door, whose trees this one lacks)
        return ("; ".join(reasons) or f"a new argument structure (none of its {n} "
                f"specialization{'s' * (n != 1)} has it)") + stored

    # Note [Miss counts]: a miss is a call the native hit path did not serve: no specialization
    # accepted it (it compiles, installs a stored one, or runs eagerly), or a step of the one
    # that did failed before the call changed anything (Note [Errors inside try]). Each is
    # counted once, by ``_count_miss``, with one entry in ``miss_reasons``: the failing guard
    # (or "first call") of a miss that compiled, "eager: why" of one that ran eagerly. So
    # ``hits + misses`` is the calls that bound to the parameters, and ``miss_reasons`` holds
    # the last ``min(misses, 32)``, in call order. A call that waited for another thread's
    # compile (one compile at a time) and is then accepted by a specialization that thread
    # installed is a hit, not a miss: it is served by that specialization through Python's
    # twin of the hit path (``_capture_path``), as the native path would have served it had it
    # come a moment later; so with threads, ``misses`` counts the calls that compiled,
    # installed a stored specialization or ran eagerly, not the calls that waited.

    def _count_miss(self, reason: str) -> None:
        """Note [Miss counts]."""
        self._counters.misses += 1
        self._counters.miss_reasons = (self._counters.miss_reasons + [reason])[-32:]

    def _eager_of(self, call: _Call, why: str):
        """``_eager`` of ``call``, whose flattened leaves and values it lets go first: the
        function runs holding no reference to them of Trident's (Note [Finalizers of written
        values] in lower/writes.py: a finalizer that a write runs then runs at the write)."""
        args, kwargs = call.args, call.kwargs
        call.leaves, call.values = (), []
        return self._eager(args, kwargs, why)

    def _eager(self, args: tuple, kwargs: dict | None, why: str, warn: bool = True,
               miss: bool = True):
        """Run the call eagerly: counted (``miss``: as a miss too, Note [Miss counts]), logged,
        and warned once per reason (never a silent fallback), at the user's line."""
        self._counters.fallbacks += 1
        if miss:
            self._count_miss(f"eager: {why}")
        _recompiles.info("%s: eager: %s", self.__qualname__, why)
        if warn and why not in self._warned_reasons:
            self._warned_reasons.add(why)
            warnings.warn(f"trident: {self.__qualname__} runs eagerly: {why}",
                          stacklevel=_user_stacklevel())
        with kernels.cpu_launches_interpreted():
            return self._fn(*args, **(kwargs or {}))


def _let_go(error: BaseException | None) -> None:
    """Drops the tracebacks of ``error`` and of the errors it chains to (the failed trace's
    frames, which hold the call's values: Note [Finalizers of written values])."""
    seen = 0
    while error is not None and seen < 16:
        error.__traceback__ = None
        error, seen = error.__cause__ or error.__context__, seen + 1


def _other_object(tree, call_tree) -> str | None:
    """Where a call's tree of the description of ``tree`` (an ArgTree of this process) checks
    another class or object of the same name (Note [Classes of one name] in install.py), or
    None."""
    if not hasattr(tree, "nodes") or tree.description != call_tree.description:
        return None
    for a, b, words in zip(tree.nodes, call_tree.nodes, call_tree.description):
        if not _same_node(a, b, words):
            return f"{b.path or 'keyword arguments'}: another object of the same name"
    return None
