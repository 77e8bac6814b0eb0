"""The specialization limit (Note [Specialization limit]): how many compiles a function may
make in a process, and what a call past it does. A mixin of the miss policy (policy.py)."""

from __future__ import annotations

import types

from trident.frontend.install import _Call
from trident.frontend.values import failed_check
from trident.identity import function_key
from trident.ir.guards import first_failure
from trident.ir.specialization import Specialization
from trident.serials import object_serial

# Note [Specialization limit]: compiles in this process per function code object and owner
# (in its cache area, TRIDENT_CACHE_DIR), by every JitFunction over that pair, as
# torch.compile's recompile limit counts per code object. The owner: a bound method's or a
# module's instance, else the function itself; so two trident.jit objects over one function
# share the count, and two models of one class (each jitted as ``trident.jit(m.forward)``: a
# sweep that builds a model per configuration) do not. Not per cache folder: the folder's key
# holds the values of the globals the function names (Note [Function key] in identity.py), so
# a global rebound at every call (a step counter) would open a new folder, and compile, at
# every call, without end. Past the limit, a folder of no specializations is left when the
# function's key names another one (``_folder_moved``): a value seen before hits again.
# The default is 16 (``TRIDENT_MAX_SPECIALIZATIONS``), 8 before: one process serving a tiny
# Llama through ``generate`` with a static and the default cache, batches of 1 and 2, padded
# and not, and a one-token prompt compiled 10 distinct argument structures, every one needed
# (docs/benchmarks.md, "Session of 2026-12-07 (tenth), cold45"). What it bounds per function
# and owner: that many compiles in a process, that many modules installed (loaded) at once,
# 2x as many specializations stored in its cache folder, and on CUDA that many graph memory
# pools, each of at most ``cuda_graph_sizes`` graphs (Note [Graphs per size] in graphs.py).
_FUNCTION_COMPILES: dict[tuple, int] = {}


class SpecializationLimit:
    """The limit's part of ``MissPolicy`` (its state: ``_cache``, ``_specs``, ``_counters``,
    ``_max_specializations``, ``_left_out``, ``_eager_trees``, set by ``JitFunction``)."""

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
                     and first_failure(s.guards, leaves) is None
                     and failed_check(s, leaves) is None), None)  # Note [Value checks]

    def _at_limit(self) -> bool:
        """Note [Specialization limit]: this process compiled ``max_specializations`` of this
        function for its owner, through any JitFunction over them (``_FUNCTION_COMPILES``)."""
        return _FUNCTION_COMPILES.get(self._limit_key(), 0) >= self._max_specializations

    def _folder_moved(self) -> bool:
        """Note [Specialization limit]: whether the function's key now names another cache
        folder than the one loaded, where none of its specializations watches the state (a
        global rebound after the limit was reached: the folder of its new value has none, and
        an earlier value's folder may hold one). Hashes the function (Note [Function key]):
        asked only on calls past the limit, which run eagerly otherwise."""
        return self._cache is not None and not self._specs and not self._pending and \
            not self._cache.directory.name.endswith("-" + function_key(self._code_fn))

    def _limit_key(self) -> tuple:
        """Note [Specialization limit]: what the limit counts per: the function's cache area,
        its code object (or the callable, where it has none) and its owner's serial (Note
        [Identity serials] in serials.py)."""
        fn = self._fn  # a module, a bound method (its self) or a function: alive while we are
        if self._limit_serial is None:
            self._limit_serial = object_serial(fn.__self__ if type(fn) is types.MethodType else fn)
        code = getattr(self._code_fn, "__code__", self._code_fn)
        return (self._cache.directory.parent, code, self._limit_serial)

    def _eager_past_limit(self, call: _Call) -> None:
        """Note [Specialization limit]: past the limit, the tree of a call that runs eagerly for
        it is flattened in C from then on, as an eager decision's (Note [Eager decisions]) that
        holds while no stored specialization fits: its next calls take ``_tree_miss``, at
        about eager's cost, not a Python walk of the whole argument tree each (a Hugging Face
        model's: 7x its eager forward on the CPU). At most 8 such trees per function, so that
        a miss does not walk ever more trees in C."""
        key = call.tree.key
        limit = self._limit_reason()
        if key in self._eager_trees or key not in self._trees or \
                sum(why == limit for why, _ in self._eager_trees.values()) >= 8:
            return
        self._eager_trees[key] = (limit, lambda leaves: self._at_limit() and self._stored_fit(
            key, leaves) is None and not self._folder_moved())
        self._set_trees()

    def _limit_reason(self) -> str:
        own = self._counters.compiles
        total = max(own, _FUNCTION_COMPILES.get(self._limit_key(), 0))
        return (f"reached its limit of {self._max_specializations} compiled specializations in "
                f"this process ({own} by this trident.jit object, {total - own} by others over "
                "the same function; those installed from the cache do not count); further new "
                "signatures run eagerly (max_specializations= or TRIDENT_MAX_SPECIALIZATIONS "
                "raises the limit)")

    def _past_limit(self, args: tuple, kwargs: dict | None):
        return self._eager(args, kwargs, self._limit_reason())
