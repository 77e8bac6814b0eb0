"""Installing specializations into a JitFunction's native Dispatcher.

The installer's job: a call's argument tree and binding (flattened in Python, the trees handed
to the dispatcher), the stored specializations the current state allows, and their modules
(modules.py makes and loads them) handed to the dispatcher in guard order. What a miss does is
policy.py's; the CUDA graph slots are graphs.py's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
import types
import warnings

import torch

from trident import config, frames
from trident.errors import TridentError
from trident.frontend import cache
from trident.frontend.cache import FunctionCache
from trident.frontend.modules import Modules
from trident.identity import PROCESS, key_of, key_parts, same_object
from trident.ir.guards import Attributes, first_failure
from trident.ir.specialization import Specialization
from trident.ir.trees import ID, TENSOR, ArgTree, Binding
from trident.lower import orders, rng, state, uses
from trident.lower.flatten import flatten_call

_recompiles = config.logger("recompiles")
_cache_log = config.logger("cache")


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


class Installer(Modules):
    """The JitFunction methods that flatten calls and install specializations; the state they
    keep lives in the Dispatcher's ``__dict__`` (``JitFunctionMixin._setup``)."""

    __slots__ = ()

    # jit_function_class: why the runtime could not be loaded (every call runs eagerly), or None
    _no_runtime: str | None = None

    # ---- argument trees (Note [Argument trees]) ---------------------------------------------

    def _flatten(self, args: tuple, kwargs: dict) -> _Call:
        return self._known_call(self._flattened(args, kwargs, self._int_leaves))

    def _flattened(self, args: tuple, kwargs: dict, int_leaves: frozenset) -> _Call:
        tree, leaves, values = flatten_call(self._binding, args, kwargs, int_leaves)
        return orders.learned(_Call(args, kwargs, tree, tuple(leaves), values),
                              self._free_orders, self._specs + self._pending)

    # Note [Classes of one name]: a tree's description names a class by its module and
    # qualified name, the same in every process (a new process finds the stored
    # specializations of a Hugging Face model, whose classes it made again, by that key). Two
    # live classes of one name in one process (a notebook cell run again, a class a factory
    # makes per call) are still two classes: their instances' trees describe alike, and the
    # tree this process knew under that key checks the other class (exactly, in C), so the new
    # class's call would be served by the old class's specializations (its attributes, its
    # forward). So a call whose tree has the key of a known tree but other classes at its nodes
    # (an object's exact class, a class checked by identity) takes another key, made from the
    # key, this process and how many classes of that name came before: the first class of a
    # name in a process keeps the stored key, each later one gets its own, in this process only
    # (its specializations are kept in memory, not stored: Note [Process-only state]).

    def _known_call(self, call: _Call) -> _Call:
        """``call`` with the tree this process knows under its key (installed in the
        dispatcher where a specialization uses it), or under a key of its own where the known
        tree checks other classes (Note [Classes of one name])."""
        call = self._keyed(call)
        tree = call.tree
        if tree.key not in self._trees:
            self._trees[tree.key] = tree
            if any(s.tree == tree.key for s in self._specs):  # stored before this process
                self._set_trees()  # knew the tree: the dispatcher evaluates it from now on
        return _Call(call.args, call.kwargs, self._trees[tree.key], call.leaves, call.values)

    def _keyed(self, call: _Call) -> _Call:
        """``call`` with its tree under a key of its own where the first tree of its key in
        this process checks other classes (Note [Classes of one name])."""
        tree, leaves = call.tree, call.leaves
        for generation in range(1, 1 << 16):
            known = self._first_trees.setdefault(tree.key, tree)  # (kept past _trees.clear())
            if _same_classes(known, tree):
                break
            salted = int.from_bytes(hashlib.sha256(
                f"{call.tree.key}|{PROCESS}|{generation}".encode()).digest()[:8], "little") >> 2
            tree = dataclasses.replace(tree, key=salted)
            leaves = (salted,) + leaves[1:]
            self._process_trees.add(salted)
        return _Call(call.args, call.kwargs, tree, leaves, call.values)

    def _installed_match(self, call: _Call) -> int:
        """The specialization the native guards pick for ``call``, or -1."""
        if not any(s.tree == call.tree.key for s in self._specs):
            return -1
        return self._match(*call.leaves)

    def _set_trees(self) -> None:
        """Install the argument trees of the installed specializations, then of eager calls
        (Note [Eager decisions]), and the output recipes (Note [Argument trees])."""
        recipes = tuple(tuple(s.recipe.ops) if s.recipe else None for s in self._specs)
        self._set_call_trees(self._binding_program,
                             tuple(self._trees[k].program() for k in self._tree_keys()), recipes)

    def _tree_keys(self) -> list:  # the argument trees the dispatcher evaluates, in order
        return list(dict.fromkeys([s.tree for s in self._specs if s.tree in self._trees] +
                                  [k for k in self._eager_trees if k in self._trees]))

    def tree_passes(self) -> dict:
        """Note [Unchanged subtrees], for benchmarks: per argument tree root (its path, or the
        call's ``**kwargs``), how many of its checks took the quiet pass, the unchanged pass,
        and a walk: ``{path: (quiet, unchanged, walked)}``, summed over the trees."""
        out: dict = {}
        for key, roots in zip(self._tree_keys(), self._tree_passes()):
            nodes = self._trees[key].nodes
            for node, *passes in roots:
                path = nodes[node].path or "**kwargs"
                out[path] = tuple(a + b for a, b in zip(out.get(path, (0, 0, 0)), passes))
        return out

    def _make_binding(self) -> Binding:
        """Note [Argument trees]: a module binds like its forward, with the module as ``self``;
        a bound method like its function, with its ``__self__``; both are read on every call.
        Made again when the function's defaults are reassigned (``_defaults_unchanged``)."""
        fn = self._fn
        if isinstance(fn, torch.nn.Module):
            binding, called = Binding.of(fn.forward, fn, has_self=True), fn.forward
        elif isinstance(fn, types.MethodType) and not self._constant_self:
            binding, called = Binding.of(fn, fn.__self__, has_self=True), fn
        else:
            binding, called = Binding.of(fn), fn
        # Note [Parameter reads]: the trees hold what the function reads of its arguments
        reads = uses.parameter_uses(called, binding.has_self, [p[0] for p in binding.params])
        if isinstance(fn, torch.nn.Module):  # Note [Calls of a jitted module] in uses.py
            reads[0] = uses.module_call_uses(reads[0])
        return dataclasses.replace(binding, uses=tuple(reads))

    @property
    def _binding_program(self) -> tuple:
        return (self._binding.program(), self._binding.self_obj, self._binding.has_self)

    # ---- the stored specializations ---------------------------------------------------------

    def _ensure_loaded(self, moved: bool = False) -> None:
        """First use in this process, after what a specialization read changed (Note [State
        guards] in lower/state/), or ``moved`` (``_folder_moved`` in policy.py): read the stored
        specializations the current state allows, installed when a call needs them (Note
        [Installing on demand])."""
        if not moved and self._cache is not None and self._state_failure() < 0 and \
                self._defaults_unchanged():
            return
        if self._cache is not None:  # for the miss reason of the call that finds no specs
            self._load_reason = f"{self._state_change()} since the last call"
        self._install(())
        self._set_state(None)
        self._state = None
        self._specs, self._pending = [], []
        if self._cache is not None:  # defaults may have been reassigned
            self._binding = self._make_binding()
            self._trees.clear()
            self._eager_trees.clear()
            self._unflattenable.clear()
        self._defaults_bound = _defaults_of(self._code_fn)
        parts = key_parts(self._code_fn)  # Note [Key parts] in identity.py
        self._cache = FunctionCache(self._code_fn, key_of(parts), parts)
        known = {(k, json.dumps([g.to_json() for g in guards])) for k, guards, _ in
                 self._eager_signatures}
        stored = self._cache.load_eager() if self._fallback else []  # fallback=False raises
        for key, guards, why in stored:  # Note [Stored eager decisions] in cache.py
            if (key, json.dumps([g.to_json() for g in guards])) not in known:
                self._eager_signatures.append(
                    (key, guards, f"{why} (as an earlier process found: `python3 -m "
                                  "trident clear NAME` forgets it)"))
        with cache.in_use(self._cache.directory):  # Note [Cache size]: not evicted meanwhile
            pending = self._stored_order = self._stored_specs()[-self._max_specializations:]
            if not pending:
                self._set_trees()  # none: no tree holds a binding made with the old defaults
                apart = _cache_log.isEnabledFor(logging.INFO) and self._cache.keys_apart()
                if apart:
                    _cache_log.info("%s: nothing stored under its key; its other folders: %s",
                                    self.__qualname__, ", ".join(apart))
            else:  # Note [Installing on demand]: none installed yet
                try:
                    self._install_module([], pending)
                except TridentError as e:  # no runtime
                    _recompiles.info("%s: stored specializations not installed: %s",
                                     self.__qualname__, e)
                    self._set_trees()
                    return
                cache.touch(self._cache.directory)
            self._warn_vanished()  # (none read: the entry went between listing and reading)

    def _warn_vanished(self) -> None:
        """Once per load: the function's cache entry was deleted while this process read its
        specializations or loaded their modules."""
        c = self._cache
        if not c.told and (c.vanished or (c.from_disk and not c.spec_dir.is_dir())):
            c.told = True
            warnings.warn(f"trident: {self.__qualname__}: its cache entry {c.directory} was "
                          "deleted while this process loaded it; the specializations read "
                          "serve this process (their modules built again where deleted)",
                          stacklevel=_user_stacklevel())

    # Note [Installing on demand]: a new process's first call used to render, load and
    # initialise the module of every stored specialization (``max_specializations`` of them),
    # which made it grow with their number (3.5 ms each on the CPU machine: 146 ms with 30,
    # where one took 38 ms). ``_ensure_loaded`` now reads them (their state guards, their int
    # leaves) and keeps them ``_pending``, their state guards checked as an installed one's
    # are (a change makes the next call read them again); a call installs those whose tree
    # and guards accept it (``first_failure``, as ``_stored_fit``), in their stored order
    # with the installed ones, and is a hit as before. A call that none of them accepts, and
    # whatever lists or explains the specializations, install all that are pending first, so
    # that a miss and its reason are what they were. Where two accept one call (a static one
    # and a symbolic one of its tree), the one that serves it may be the other one than with
    # all installed: each is exact for the calls its guards accept.

    def _install_pending(self, leaves: tuple | None = None) -> bool:
        """Note [Installing on demand]: install the pending specializations whose argument tree
        and guards accept a call's ``leaves`` (all where None) with the installed ones, in
        their stored order; whether it installed any."""
        take = [s for s in self._pending if leaves is None or (
            s.tree == leaves[0] and first_failure(s.guards, leaves) is None)]
        if not take:
            return False
        taken = {s.key for s in take}
        rest = [s for s in self._pending if s.key not in taken]
        order = {s.key: i for i, s in enumerate(self._stored_order)}
        specs = sorted(self._specs + take, key=lambda s: order.get(s.key, len(order)))
        with cache.in_use(self._cache.directory):  # Note [Cache size]
            try:
                self._install_module(specs, rest)
            except TridentError as e:  # their modules cannot be built now (a build lock held
                _recompiles.info("%s: stored specializations not installed: %s",  # on)
                                 self.__qualname__, e)
                self._install(())
                self._specs, self._pending = [], []
                self._set_trees()
                return True
        self._warn_vanished()  # (a module's load finds its folder deleted: cache.py)
        return True

    def _stored_specs(self) -> list[Specialization]:
        """The cache's specializations of this function that the current state allows
        (Note [State guards]); with ``dynamic=False`` only static ones, even where another jit
        of the same code stored symbolic ones."""
        digests: dict[str, str | None] = {}
        why: list[str] = []  # why a stored one's state is not this process's

        def allowed(spec: Specialization) -> bool:
            text = json.dumps(spec.state.reads)
            if text not in digests:
                try:
                    digests[text] = self._state_tree(spec.state.reads).digest
                except (TridentError, ValueError, TypeError, KeyError, IndexError) as e:
                    digests[text] = None  # a chain that no longer evaluates
                    why.append(str(e))
            if digests[text] != spec.state.digest:
                if spec.key not in cache.COMPILED_HERE:  # (this process's: its reason says)
                    why.append("the state they read differs from this process's")
                return False
            return True

        specs = [s for s in self._cache.load_specs()
                 if (self._dynamic is not False or not s.symbolic) and allowed(s)
                 and rng.installable(s.plan)]
        # for the miss reason (policy.py): the stored specializations the state turned away
        rejected = sum(1 for w in why if w.startswith("the state they read"))
        self._state_rejected = (f"{rejected} specialization(s) that another process stored "
                                f"not installed: {'; '.join(dict.fromkeys(why))}"
                                if rejected else None)
        return specs

    def _stored_call(self, call: _Call, specs: list[Specialization]) -> _Call:
        """Note [Stored int leaves]: ``call`` flattened again with the int leaves of one of
        ``specs`` (installed or stored ones), where its tree and guards then accept the call;
        else ``call`` itself. The int leaves a process learns differ between processes (and
        grow within one), so a specialization stored before its process made an int a leaf
        keeps that int constant in its tree: a new process, whose int leaves come from the
        specializations it installed, would flatten such a call to another tree and trace it
        again although the stored specialization accepts it."""
        for paths in dict.fromkeys(_int_leaves_of(s) for s in specs):
            if paths == self._int_leaves:
                continue
            try:
                again = self._keyed(self._flattened(call.args, call.kwargs, paths))
            except (TypeError, TridentError):
                continue
            if any(s.tree == again.tree.key and _int_leaves_of(s) == paths
                   and first_failure(s.guards, again.leaves) is None for s in specs):
                return self._known_call(again)
        return call

    # Note [Process-only state]: a specialization whose state guards check an object that no
    # path from a module reaches (Note [Reached roots] in lower/state/roots.py: a class made
    # in a function's body, the globals dict of code exec'd by hand) is keyed by that object's
    # identity, which no other process shares: its digest names the process. It serves this
    # process, which keeps it in memory (``FunctionCache.keep_in_process``: installed again
    # when the state changes back, as a stored one is), and is not written to disk (logged in
    # ``trident.recompiles``): the cache would only gain an entry per process that none
    # finds again, its chains naming objects by their address.

    def _process_only(self, spec: Specialization) -> str | None:
        """Note [Process-only state]: the path of what ties ``spec`` to this process, or
        None."""
        if spec.tree in self._process_trees:  # Note [Classes of one name]
            return "a class of the name of another that this process saw first"
        try:
            return self._state_tree(spec.state.reads).process_only()
        except (TridentError, ValueError, TypeError, KeyError, IndexError):
            return None

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

    # ---- modules ----------------------------------------------------------------------------

    def _install_module(self, specs: list[Specialization],
                        pending: list[Specialization] = ()) -> None:
        """Install ``specs``, in guard order: each one's module is built only where no earlier
        compile built it (Note [Incremental modules] in build.py), and found without rendering
        where its name is recorded (Note [Stored module names] in modules.py); ``pending``:
        stored ones installed when a call needs them (Note [Installing on demand]), whose state
        guards are checked from now on as the installed ones' are.

        Raises:
            TridentError: no runtime (``explain()`` and ``source()`` say why), a module that
                does not build, or one built for another runtime ABI."""
        self._load_modules(specs)
        slots = {s.key: i for i, s in enumerate(self._specs)}  # Note [Sizes seen across installs]
        self._specs, self._pending = specs, list(pending)
        self._left_out = None
        self._reset_graphs(len(specs), tuple(slots.get(s.key, -1) for s in specs))
        self._free_orders |= {p for s in specs + self._pending for p in s.free_orders}
        if self._dynamic is None:  # Note [Int leaves]: a stored spec's (another process's too)
            self._int_leaves = self._int_leaves.union(*(_int_leaves_of(s) for s in
                                                        specs + self._pending))
        for index, spec in enumerate(specs):
            self._install_graph(index, spec)
        self._set_trees()
        by_text = {json.dumps(r): r for s in specs + self._pending for r in s.state.reads}
        if self._state is None or self._state_reads != by_text.keys() or \
                self._state_failure() >= 0:  # (the same reads, unchanged: the same tree)
            self._state = self._state_tree(list(by_text.values()))  # the union of what they
            self._set_state(self._state.program())  # read, as it is now
            self._state_reads = by_text.keys()
        attributes = {}  # Note [Attribute reads] in runtime/args.cpp
        for s in specs:
            attributes[s.key] = attributes.get(s.key, False) or any(
                isinstance(g, Attributes) for g in s.guards)
        self._install(tuple((m.lib.scm_call_address(), m.lib.scm_match_address(),
                             attributes.get(key, True)) for key, m in self._modules.items()))


def _same_classes(known: ArgTree, tree: ArgTree) -> bool:
    """Whether two trees of one description check the same classes (Note [Classes of one
    name]): an object's exact class, a class checked by identity; and alike objects where they
    check one by identity (Note [Objects of one name] in identity.py)."""
    return all(map(_same_node, known.nodes, tree.nodes, tree.description))


def _same_node(a, b, words: str) -> bool:
    """Whether two nodes of one description (``words``) check the same class, or alike objects
    by identity (``_same_classes``)."""
    if isinstance(a.expect, type) or isinstance(b.expect, type):
        return a.expect is b.expect
    return a.check != ID or same_object(a.expect, b.expect, "bound to the object at" in words)


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller point at the first frame
    outside Trident and torch (``Module.__call__``, Dynamo's frames): the caller's line
    (Note [User code] in frames.py)."""
    frame, level = sys._getframe(2), 2  # 1 is the caller, who calls warnings.warn
    while frame is not None and not frames.user_line_file(frame.f_code.co_filename,
                                                          resolved=True):
        frame, level = frame.f_back, level + 1
    return level


def _int_leaves_of(spec: Specialization) -> frozenset[str]:
    """The paths of the int attributes ``spec`` was traced with as leaves (Note [Int leaves]
    in policy.py): its symbolic ints."""
    return frozenset(spec.arg_names[int(i)] for i in spec.dynamic
                     if spec.shapes is not None and spec.shapes[int(i)] is None)


def _defaults_of(fn) -> tuple:
    if not isinstance(fn, types.FunctionType):
        return ()
    return (fn.__defaults__, fn.__kwdefaults__)
