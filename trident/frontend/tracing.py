"""Tracing a call into a Specialization: the function run on fake leaves (Note [Argument trees]),
what it read outside its arguments recorded as state (Note [State guards]), the trace handed to
``lower.compiler``. Which dims are symbolic, and whether to compile at all, is policy.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from trident import config
from trident.errors import TridentError
from trident.frontend import batch, ints
from trident.frontend.install import _Call
from trident.ir.specialization import Specialization, StateGuard
from trident.ir.trees import ID, OBJECT, int_constants
from trident.lower import compiler, float_leaves, orders, state
from trident.lower.capture import trace
from trident.lower.state.tensor_methods import tensor_method_reads
from trident.lower.state.wholes import held_class_reads
from trident.lower.substitute import substituted
from trident.lower.outputs import flatten_output

_recompiles = config.logger("recompiles")


def _refused(why: str) -> TridentError:
    error = TridentError(why)
    error.any_sizes = True  # (policy.py: a trace of other sizes is refused alike)
    return error
_guards_log = config.logger("guards")
_NO_PAUSE = contextlib.nullcontext()  # (its ``as``: None)


# Note [Own code unrecorded]: as torch's dispatch of an op (Note [Unrecorded ops] in
# lower/source_lines.py), Trident's own code around a trace runs with the state recording's
# hook set aside (``state.paused``; ``state.resumed`` gives it back to ``capture.trace``, which
# sets it for the function's own run): the check for writes before the trace, the substitution
# of the trace's leaves into the arguments and its undoing (``substituted``, but around the
# function's call), and the analyses of what the trace recorded (``reads_of``,
# ``check_questions``: bytecode flow over every code object the function ran). No Trident
# frame is the function's (``under_fn`` in recording.py), so the hook kept nothing there, but
# it ran for each of their calls and C calls, and the analyses ran about ten times slower
# under it: an 8-layer tiny Llama's exact prefill trace gave the hook 508,000 events, 18,000
# without them (docs/benchmarks.md, "cold49"). The order probe's trace (Note [Dict orders] in
# lower/orders.py) keeps the hook over the substitution, whose C calls on its watches the
# probe counts.


# Note [Writes probe]: an automatic first compile of a call whose run stores lengths or
# capacities (Notes [Lengths of written state] and [Capacities of written state] in ints.py: a
# transformers static cache's prefill) is compiled from a symbolic trace, and the exact trace
# that found those writes was thrown away: 2.4 s of CPU of a cold 16-layer tiny Llama's 13.4
# (docs/benchmarks.md, "cold50"). The writes are facts of the run, not of its graph, so such a
# compile runs the function once first on fake tensors of the call's sizes with no graph
# (``capture.trace``'s ``explore``: torch's FakeTensorMode alone, no make_fx proxies, none of
# the analyses after a trace), under the state recording as a trace is (a library write or a
# user write at entry refuses it before it lands: Note [Library code that writes its state]),
# and reads the writes' facts from that run. Where they store lengths the symbolic trace runs
# first and the exact trace only where that fails; elsewhere (no such writes, or the run
# failed, refused or gave a warning) the exact trace runs first as before, and decides. A call
# whose tree holds no object but modules (``_holds_objects``: a plain function, a backend
# graph's tensors) is not probed: its first trace is exact. The
# same traces run in the same order where the symbolic compile fails, so the failure flags are
# those of the exact trace first (restored where the exact trace fails too); where it succeeds,
# ``Stats.traces`` counts one trace fewer. The probe is not a trace: its seconds count in
# ``trace`` and in ``writes probe`` (Note [Compile stages] in config.py).

class Tracer:
    """The JitFunction methods that trace and compile one call's signature."""

    __slots__ = ()

    def _trace(self, call: _Call, dynamic: dict[int, set[int]], recording=None,
               lengths: dict[int, set[int]] | None = None, probe=None, explore: bool = False):
        """Trace the function on fake leaves put in place of the call's (Note [Argument
        trees]); the result's structure becomes the capture's output recipe. ``recording``
        (state.record's, active): this thread's generator calls decide whether the function
        set the random state, not another thread's draws meanwhile. ``lengths``: the dims an
        exact trace of ``call`` showed to be lengths (Note [Lengths of written state]).
        ``probe``: the order probe's (Note [Dict orders] in lower/orders.py). ``explore``:
        no graph, the writes' facts alone (Note [Writes probe]); returns None."""
        rebuilt: dict[int, int] = {}  # tuples made around the fake leaves: their nodes
        writes: list = []  # Note [Attribute writes] in lower/writes.py
        state.check_writes_before_trace(self._code_fn, call.args, call.kwargs)  # eager writes once

        def run(*leaves):
            writes.clear()
            with state.paused() if probe is None else _NO_PAUSE as hook, \
                    substituted(call.tree, call.values, leaves, rebuilt, writes, probe) as roots, \
                    state.resumed(hook):  # Note [Own code unrecorded]: the function's run
                return self._binding.call(self._fn, roots)  # (the probe's sees both)

        ones, alike = self._ones(call, dynamic, lengths), self._alike(call, dynamic)
        with state.resumed(getattr(recording, "hook", None)):  # (``_traced``)
            captured = trace(run, call.leaves, dynamic, name=self.__qualname__,
                             outputs=lambda result: flatten_output(result, call.tree,
                                                                   call.values, rebuilt, writes),
                             changed_rng=recording.changed_rng if recording is not None and
                             recording.active else None, ones=ones, alike=alike,
                             explore=explore)
        # Note [Batch dims] in batch.py: the int (and float: Note [Float leaves] in policy.py)
        # attributes the specialization writes
        self._written_ints = frozenset(
            f"{call.tree.nodes[node].path}.{name}" for node, name, value, _ in writes
            if type(value) in (int, float) or isinstance(value, (torch.SymInt, torch.SymFloat)))
        # Note [Lengths of written state] in ints.py: of an exact trace; the symbolic stores
        self._written_lengths = {} if dynamic else ints.written_lengths(call, writes)
        self._stored_lengths = ints.stored_lengths(call, writes, self._written_lengths)
        self._capacities = frozenset() if dynamic else ints.capacities(call, writes)
        self._written_dims = ints.symbolic_writes(call.tree, writes, self._written_dims)
        return captured

    def _ones(self, call: _Call, dynamic: dict[int, set[int]],
              lengths: dict[int, set[int]] | None) -> dict[int, set[int]]:
        """The dims of an automatic trace with ``dynamic`` dims that are symbols of range >= 1
        (``_fake_args`` in lower/capture.py): its batch (Note [Batch dims] in batch.py) and
        its lengths of one (Note [Lengths of written state] in ints.py)."""
        if self._dynamic is not None or not dynamic:
            return {}
        ones = batch.ones(call, dynamic)
        for i, d in ints.one_lengths(call, dynamic, self._written_dims, lengths or {}).items():
            ones[i] = ones.get(i, set()) | d
        return ones

    def _alike(self, call: _Call, dynamic: dict[int, set[int]]) -> dict[tuple, tuple]:
        """Note [Symbols of like layers] in ints.py: the dims of an automatic trace with
        ``dynamic`` dims that share symbols (none where ``dynamic=`` asked for dims)."""
        return ints.like_layers(call, dynamic) if self._dynamic is None else {}

    def _order_probe(self, call: _Call, dynamic: dict[int, set[int]], recording,
                     captured, lengths: dict[int, set[int]] | None = None) -> frozenset:
        """Note [Dict orders] (lower/orders.py): the paths of the call's candidate dicts whose
        order a trace with each watched (``orders.OrderWatch``) did not ask for, where that
        trace is ``captured`` again; else nothing."""
        watched = orders.watched(call.tree)
        if not watched or call.tree.key in self._process_trees:  # (Note [Classes of one name])
            return frozenset()
        kept = self._written_ints, self._written_lengths, self._written_dims, \
            self._stored_lengths, self._capacities
        probe = orders.Probe(watched)
        recording.probe = probe
        try:
            with config.stage("order probe"):
                again = self._trace(call, dynamic, recording, lengths, probe)
        except TridentError:
            again = None
        finally:
            recording.probe = None
        same = again is not None and self._written_ints == kept[0] and \
            orders.same_capture(captured, again) and orders.slot_loaded(recording) is None
        self._written_ints, self._written_lengths, self._written_dims, \
            self._stored_lengths, self._capacities = kept
        return probe.free(call.tree) if same else frozenset()

    def _probed(self, call: _Call) -> bool:
        """Note [Writes probe]: whether ``call``, run once on fake leaves with no graph, under
        the recording as a trace is, stores lengths or capacities (``_stores_lengths``); False
        where that run failed, refused or gave a warning (the exact trace then runs first)."""
        with config.stage("trace"), config.stage("writes probe"), \
                state.record(None if self._constant_self else self._code_fn) as recording, \
                state.paused() as recording.hook:  # Note [Own code unrecorded]
            try:
                with state.given_warnings(not self._constant_self) as given:
                    self._trace(call, {}, recording, explore=True)
            except TridentError:
                return False
            return not given and recording.refused is None and self._stores_lengths()

    def _stores_lengths(self) -> bool:
        """Whether the last exact trace (or writes probe) stored lengths or capacities that
        a symbolic trace makes symbols (Notes [Lengths of written state] and [Capacities of
        written state] in ints.py)."""
        return bool(self._written_lengths or (
            self._capacities - self._int_leaves and not self._capacities_failed))

    def _traced(self, call: _Call, dynamic: dict[int, set[int]],
                lengths: dict[int, set[int]] | None = None):
        """``(captured, state reads, order-free dict paths)`` of ``call`` traced with
        ``dynamic`` dims (``_compile``)."""
        self._counters.traces += 1
        # under the call's grad mode, which is guarded; what it reads outside the arguments
        # becomes the specialization's state (Note [State guards])
        with config.stage("trace"), \
                state.record(None if self._constant_self else self._code_fn) as recording, \
                state.paused() as recording.hook:  # Note [Own code unrecorded]
            try:
                with state.given_warnings(not self._constant_self) as given:  # Note
                    # [Warnings a trace gives] (a backend graph runs no user code)
                    captured = self._trace(call, dynamic, recording, lengths)
                    free = self._order_probe(call, dynamic, recording, captured, lengths)
            except TridentError as e:
                if recording.refused is None or str(e) == recording.refused:
                    raise
                raise _refused(recording.refused) from e  # (user code caught it: Note
                # [Writes at entry] in lower/state/writes.py)
            state.raise_given(given)
            state.raise_asked(recording.asked)  # Note [Questions asked in the trace]
            if not self._constant_self:  # Note [Questions about symbolic values]
                state.check_questions(recording, bool(dynamic) or  # (lower/state/tensor_reads.py)
                                      captured.scalar_reads)  # Note [Questions about read values]
            if isinstance(self._fn, torch.nn.Module):  # Note [Calls of a jitted module] (uses.py):
                recording.module_call = True  # its Module.__call__ read torch's global hooks
                recording.module_classes.setdefault(id(type(self._fn)), type(self._fn))  # and
                # its class's __call__ (Note [Module forwards] in lower/state/roots.py)
            if self._constant_self:  # a backend graph (backend.py): Dynamo guards what its
                # frame reads, but not the tensor methods the graph's code calls (Note [Tensor
                # methods and operators] in lower/state/tensor_methods.py)
                found = tensor_method_reads([self._code_fn.__code__])
            else:  # Note [Classes of held objects] in lower/state/wholes.py
                found = state.reads_of(recording, self._code_fn) + \
                    held_class_reads(call.tree.nodes, call.values, True)
            reads = [r.to_json() for r in found]
            reads += [r.to_json() for r in _partials_of(call)]
        return captured, reads, free

    def _compile(self, call: _Call, dynamic: dict[int, set[int]],
                 again=None, lengths: dict[int, set[int]] | None = None) -> Specialization:
        """A specialization of ``call``'s signature, with the leaf dims ``dynamic`` (leaf index
        -> dims) symbolic; ``again``: called with ``call`` after an exact trace whose writes
        store lengths (Note [Lengths of written state] in ints.py), its specialization (a
        symbolic one) replaces the trace's, None keeps it; ``lengths``: the dims ``again``
        makes symbolic as lengths (their sizes 1 too: ``_ones``).

        Raises:
            TridentError: the trace or the compile failed (an unsupported op or construct)."""
        if again is not None and not dynamic and _holds_objects(call) and self._probed(call):
            failed = self._dynamic_failed, self._capacities_failed  # Note [Writes probe]
            spec = again(call)
            if spec is not None:
                return spec
            try:  # the exact trace, as where it ran first and ``again`` failed after it
                return self._compile(call, dynamic, lengths=lengths)
            except TridentError:
                self._dynamic_failed, self._capacities_failed = failed  # (never tried then)
                raise
        while True:  # Note [Float leaves] in policy.py: one read is guarded by value from now on
            captured, reads, free = self._traced(call, dynamic, lengths)
            read = float_leaves.floats_read(captured.graph_module, captured.fake_args,
                                            captured.shape_env) if dynamic else set()
            if not read:
                break
            self._read_floats = self._read_floats | {call.names[i] for i in read}
            dynamic = {i: d for i, d in dynamic.items() if i not in read}
        if again is not None and not dynamic and self._stores_lengths():
            written = self._written_ints
            spec = again(call)
            if spec is not None:
                return spec
            self._written_ints = written  # (the exact trace's)
        args, names = call.leaves, call.names
        with config.stage("state"):
            spec_state = StateGuard(tuple(reads), self._state_tree(reads).digest)
        call = orders.in_orders(call, free)  # Note [Dict orders]: the tree the trace found
        args = call.leaves
        spec = dataclasses.replace(compiler.compile_specialization(
            captured, args, names, dynamic, call.tree.key, spec_state, self.__qualname__,
            self._code_fn), tree_ints=int_constants(call.tree),  # Note [Stored int constants]
            free_orders=tuple(sorted(free)))
        self._counters.compiles += 1
        if self._dynamic is None:  # Note [Batch dims]: written ints are int leaves from now on
            self._int_leaves = self._int_leaves | self._written_ints
        _guards_log.info("%s: guards of %s:\n  %s", self.__qualname__, spec.signature,
                         "\n  ".join(g.words(names) for g in spec.guards))
        return spec


def _holds_objects(call: _Call) -> bool:
    """Note [Writes probe]: whether ``call``'s tree holds an object other than a module, whose
    attributes a run may store state in (a cache; a module's buffers are not lengths)."""
    return any(n.check == OBJECT and not isinstance(v, torch.nn.Module)
               for n, v in zip(call.tree.nodes, call.values))


# Note [Partials in arguments] (lower/partials.py): a ``functools.partial`` that the call's
# argument tree checks by identity (one of a user function, of a lambda, holding a tensor:
# those the tree cannot check as a value) is also a state read of its own, used whole (an
# object root: ``func``, ``args`` and ``keywords`` read at every call, as a global partial's
# are: ``_use`` in lower/state/tree.py); such a specialization serves its process only (Note
# [Process-only state] in install.py), as its argument tree's words already did.

def _partials_of(call: _Call) -> list:
    """Note [Partials in arguments]: a whole-value state read of each partial ``call``'s
    tree holds."""
    from trident.lower.state.chain import Read, _object_root

    partials = {id(v): v for n, v in zip(call.tree.nodes, call.values)
                if n.check == ID and isinstance(v, functools.partial)}
    return [Read(_object_root(p), (("attr", name),), True) for p in partials.values()
            for name in ("func", "args", "keywords")]
