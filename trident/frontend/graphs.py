"""CUDA graphs: a CUDA specialization's launch sequence, captured once, replayed after its guards.

The graph controller's job: per specialization, the warm-up, capture and replay state
(``GraphStates``), the capture itself (``capture``), and the JitFunction methods that run a
call through them and set the dispatcher's graph slots (``GraphControl``).

Note [CUDA graphs]: on a hit, a CUDA specialization's cost is its host work: one boxed dispatcher
call or driver launch per step (docs/benchmarks.md). Replaying a CUDA graph of the same sequence
costs one ``cuGraphLaunch``. So each specialization whose sequence can be captured is:

1. run normally on its first call in the process (the warm-up: cuBLAS handles, cubins loaded);
2. captured on its second call (``torch.cuda.graph``, a private memory pool), then replayed by
   the SCM (``trt_graph_replay`` in runtime/trident_cuda.h) on every hit whose guards hold.

A graph bakes in the addresses it reads and writes, so the SCM checks them before replaying:

- a tensor argument at the same address in both calls is read *by pointer*: a replay needs the
  call's argument at that address (weights, KV caches, static input buffers);
- one whose address changed is *copied in*: the graph reads a buffer of its own, and a replay
  first copies the argument there (same stream; all of a replay's copies in one launch of a
  copy kernel, ``trt_copy_buffers`` in runtime/trident_cuda.h). A by-pointer argument later
  seen at a new address makes that call run the launch sequence and asks for a new capture, at
  most ``RECAPTURES`` times per specialization. A recapture copies the moved argument in rather
  than reading it by pointer: a ``generate`` has a new KV cache at every call, and a capture of
  the whole forward per ``generate`` costs more than copying the cache in and back on each token
  (docs/benchmarks.md, Hugging Face models).
- a copied-in argument that the function may write (passed to a Triton launch, or to an ATen
  op's mutable ``Tensor(a!)`` argument, directly or through a view) is copied back after the
  replay, so the caller's tensor holds what eager PyTorch would have written. A call where a
  copied-in argument overlaps another argument and either may be written runs the launch
  sequence (a copy would hide the write).
- each output is handed out or copied out so that a caller may keep results across calls as
  with eager PyTorch (Note [Graph outputs]).

Replays stay on the stream of the first replay (another stream runs the launch sequence: the
graph's buffers are not shared across streams). Not captured, so always run step by step:
specializations with a CPU tensor argument (but a host scalar, copied in from the host at each
replay: Note [Host scalars] in ir/specialization.py), a tensor passed twice, an op that draws random
numbers (``torch.cuda.CUDAGraph.replay`` advances the Philox offset; a raw ``cuGraphLaunch`` would
repeat the numbers), an output that is an argument or shares storage with one or with another
output, a non-dense output, or a capture that fails (an op that synchronizes, as ``.item()``).
``TRIDENT_CUDA_GRAPHS=0`` or ``trident.jit(cuda_graphs=False)`` turns graphs off.

Note [Graph outputs]: a replay writes its outputs into the graph's static outputs. Copying each
into a new tensor (an allocation and a ``cuMemcpyAsync``) would cost more host time than the
replay of a small graph, so a graph hands out the static output itself (a new tensor of its
storage, ``trt_api.graph_output``) while nothing else holds it:
before each replay the SCM checks that no tensor but the graph's own holds the storage of an
output it handed out (``output_in_use``: the storage's use count, c10::StorageImpl's refcount).
A result still alive there (kept by the caller, or a view of it) would be overwritten, so that
call asks for a new capture at once, whose outputs are copied out (Note [Hand out after a
move]): each call's result is then a tensor of its own, as in eager PyTorch, whatever the
caller keeps. A view (whose base holds the storage too) is copied out from the start, and a
storage held elsewhere for any other reason costs a capture. A symbolic specialization's
graphs of several sizes share one memory pool, and a graph captured after another may have
its static outputs in the memory of that one's dead intermediates, which the earlier graph's
replays write: so only a graph captured while no other graph of its specialization lives
(``GraphStates.pool`` is None: a static specialization's every graph, a symbolic one's first
size) hands out; a later one copies out. Its memory never holds the first's static outputs
(allocated since that capture and kept by it), so its replays leave a handed-out result alone,
and the first's replays may write a later one's static outputs only between that one's
copies out. A Hugging Face decode step's specialization is symbolic (its batch dim): its one
graph hands out the logits, where a copy out cost an allocation and a ``cuMemcpyAsync`` per
token.

Note [Hand out after a move]: a specialization copies out only once a caller was seen keeping
a result it handed out (``GraphStates.copy_out``), not after any recapture. A recapture made
because a by-pointer argument moved (a ``generate`` makes a new KV cache per call: its second
call recaptures with the cache copied in) hands out as the first capture does: ``generate``
drops each step's logits before the next step, and each replay still checks that no handed-out
output is held (``output_in_use``), so a caller that keeps one gets the copy-out recapture as
above. Whether a recapture follows a kept result is read from the graph it replaces (its handed-
out outputs' holders, ``Captured.kept``), not from why the SCM asked: a call that reaches the
capture through the miss path asks for no reason at all. So the SCM asks for that recapture
at the call that finds the output held, while it is held, and counts it against the same
``RECAPTURES``. (It used to run that call step by step and capture at the next one: a
``generate`` whose prefill makes the KV cache (transformers 5.17's lazily initialized
``StaticCache``: the cache's tensors are the prefill's outputs) finds them held by the last
``generate``'s result, which is dropped by the next call, so the recapture handed out again and
every other ``generate`` recaptured, without bound: 4.05 against 2.71-2.98 ms per token for a
Llama-3.2-1B-like on an H100, docs/benchmarks.md.)

Note [Stored outputs]: an output that the function stores into an object of the call (a
lazily initialized ``StaticCache``'s tensors, set by its first forward: Note [Attribute writes]
in lower/writes.py) is copied out from the first capture. The caller's object holds it past
the call, so a graph that handed it out would find it held at its next replay and recapture
(Note [Hand out after a move]): in transformers 5.17, each ``generate`` makes a new cache in
its prefill and the caller holds the last one's result, so the prefill's graph, captured at the
second ``generate``, was captured again at the third (~86 ms on an H100, docs/benchmarks.md).
That costs an allocation and a copy per stored output at each of its replays.

Note [Graphs per size]: a symbolic (dynamic) specialization serves many sizes with one launch
sequence, but a graph bakes in the sizes it was captured at. So such a specialization keeps a
graph per concrete size, as serving engines keep one per batch-size bucket: each descriptor
starts with its size key (every tensor argument's sizes, strides and storage offset, where the
symbols are read from), the SCM replays the graph whose key the call has (``trt_graph_fits``),
and a call of a size no graph has runs step by step the first time that size is seen in the
process (the slot remembers it in a hash table, ``trt_graph_seen_before``; a first call that
Python ran, as a compile's, is entered with ``_graph_seen``) and asks Python to capture it
(``TRT_GRAPH_CAPTURE``) the second time: a size seen once (a prompt length) costs no capture.
A specialization keeps at most ``cuda_graph_sizes`` graphs (``trident.jit``,
``TRIDENT_CUDA_GRAPH_SIZES``, default 64); past that, and after a capture of it failed, new
sizes run step by step without asking Python.
Its graphs share one memory pool: their replays are serial on one stream, and each graph's
static outputs stay allocated, so a graph only ever reuses another's dead intermediates.

Note [Sizes seen across installs]: installing a specialization gives the dispatcher new graph
slots (``_reset_graphs``), and the sizes each slot saw once (``trt_graph.seen``) move to the
same specialization's new slot: they were lost there, so a size seen before another
specialization compiled counted as unseen again. A ``generate``'s prefill is seen once per
``generate``: the first one's, entered by its compile, was forgotten when the decode step
compiled in the same ``generate``, so the second ``generate``'s prefill ran step by step and
the third captured it, and with the decode step's recapture for the second ``generate``'s new
cache, the first two timed ``generate``s of ``bench_hf`` each captured a graph (docs/
benchmarks.md, fourteenth session). Both captures now fall in the second ``generate``.

Facts used: ``torch.cuda.CUDAGraph.raw_cuda_graph_exec()`` (torch >= 2.9) gives the
``cudaGraphExec_t``, the same handle as the driver's ``CUgraphExec``; ``CUDAGraph.replay`` in
PyTorch 2.11 is the RNG prologue followed by ``cudaGraphLaunch`` on the current stream.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import time

import torch

from trident import config, runtime
from trident.errors import EagerCall, with_article
from trident.ir import operands
from trident.ir.facts import dtype_codes
from trident.lower import passes
from trident.runtime import ABI

_recompiles = config.logger("recompiles")

RECAPTURES = 2  # per specialization, all its sizes together
# trt_graph.state, an input's mode and trt_tag, as trident_rt.h defines them
OFF, PENDING, READY = ABI["TRT_GRAPH_OFF"], ABI["TRT_GRAPH_PENDING"], ABI["TRT_GRAPH_READY"]
BY_POINTER, COPY_IN, HOST_IN = (ABI["TRT_GRAPH_BY_POINTER"], ABI["TRT_GRAPH_COPY_IN"],
                                ABI["TRT_GRAPH_HOST_IN"])
_TAGS = {k: ABI[f"TRT_{k.upper()}"] for k in ("none", "tensor", "int", "float", "bool")}


@dataclasses.dataclass
class Captured:
    """A specialization's graph (of one size, for a symbolic specialization) and everything its
    replays read: the graph (and its memory pool), the copy-in buffers, the static outputs, and
    the descriptor the SCM replays from."""

    graph: torch.cuda.CUDAGraph
    statics: dict[int, torch.Tensor]
    outputs: list
    pointers: dict[int, int]  # by-pointer argument -> the address the graph reads
    desc: list[int]
    handed: tuple = ()  # the static outputs replays hand out (Note [Graph outputs])
    seconds: tuple = ()  # host time of recording the launch sequence, of instantiating

    def kept(self) -> bool:
        """Whether a caller holds an output this graph handed out (Note [Hand out after a
        move]): a tensor or view of its storage other than the graph's own."""
        return any(not _alone(t) for t in self.handed)

    @functools.cached_property
    def packed(self) -> bytes:
        return struct.pack(f"<{len(self.desc)}q", *self.desc)


@dataclasses.dataclass(frozen=True)
class NoGraph:
    """Why a capture gave no graph: the specialization (of that size) runs step by step."""

    why: str


def size_key(spec, args: tuple) -> tuple:
    """Which of a specialization's graphs a call needs: () for a static specialization (its
    guards fix every size); for a symbolic one, each tensor argument's sizes, strides and
    storage offset, the places its symbols are read from (Note [Size expressions] in
    sizes.py), and ``(i, value)`` for each int argument whose value the launch sequence reads
    (a symbolic int, Note [Symbolic ints] in lower/guards.py, reaches the graph as a value:
    ``x[:n]``; one only guarded needs no graph of its own), in the order the SCM compares them
    (``trt_graph_fits``)."""
    if not spec.symbolic:
        return ()
    ints = _value_ints(spec)
    return tuple((i, tuple(a.shape), a.stride(), a.storage_offset())
                 if isinstance(a, torch.Tensor) else (i, a)
                 for i, a in enumerate(args) if isinstance(a, torch.Tensor) or i in ints)


def _value_ints(spec) -> frozenset[int]:
    """The int arguments whose values the launch sequence reads (a ``SizeStep`` ``"value"``)."""
    return frozenset(step.args[0].i for step in spec.plan.steps
                     if getattr(step, "op", None) == "value" and isinstance(step.args[0],
                                                                             operands.Arg))


def _key_words(key: tuple) -> list[int]:
    """The key's words as trt_graph's descriptor holds them (an int: index, -1, value)."""
    return [w for entry in key for w in (
        (entry[0], -1, entry[1]) if len(entry) == 2 else
        (entry[0], len(entry[1]), *entry[1], *entry[2], entry[3]))]


def pointers(args: tuple) -> dict[int, int]:
    return {i: a.data_ptr() for i, a in enumerate(args) if type(a) in (torch.Tensor,
                                                                       torch.nn.Parameter)}


def _span(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past its last element (strides are >= 0)."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: one memcpy of ``_span(t)`` bytes copies every element."""
    return _dense_geometry(tuple(t.shape), t.stride())


@functools.lru_cache(maxsize=4096)
def _dense_geometry(shape: tuple, stride: tuple) -> bool:
    """torch's own test, once per geometry: a call of it builds a namedtuple class (torch
    2.11), which a capture's every copied-in argument and output would pay."""
    import torch._prims_common as prims  # the name changed across torch 2.11-2.13

    check = getattr(prims, "is_non_overlapping_and_dense", None) or \
        prims.is_non_overlapping_and_dense_or_false
    return bool(check(torch.empty_strided(shape, stride, device="meta")))


def _storage_ptr(t: torch.Tensor) -> int:
    """The address of ``t``'s storage, without a Python storage object (which its storage may
    keep alive, holding a reference: Note [Graph outputs])."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _alone(t: torch.Tensor) -> bool:
    """Whether ``t`` is the only holder of its storage (Note [Graph outputs])."""
    return t._base is None and runtime.load().storage_holders(t) == 1


class GraphStates:
    """Note [CUDA graphs]: the graph state machine of one JitFunction's specializations, by
    specialization key. A specialization that may have a graph runs step by step on its first
    call in the process (the warm-up: ``next_call`` remembers where its arguments are), is
    captured on its next (``next_call`` says which arguments to copy in; ``done`` keeps the
    graph, or why there is none), and replays from then on; a moved by-pointer argument asks
    for a new capture, at most ``RECAPTURES`` times. A symbolic specialization keeps a graph
    per size, at most ``sizes`` of them, each captured on its size's second call (Note [Graphs
    per size]). The dispatcher's graph slots (``trt_graph``) are set from ``slot``."""

    def __init__(self, enabled: bool, sizes: int):
        self.enabled = enabled
        self.sizes = sizes
        self.seen: dict[str, dict[int, int]] = {}  # the warm-up's argument addresses
        self.graphs: dict[str, dict[tuple, Captured | NoGraph]] = {}  # by size
        self.recaptures: dict[str, int] = {}  # captures left after a moved argument
        self.copy_out: set[str] = set()  # a handed-out result was kept: Note [Hand out after a move]

    def slot(self, spec) -> tuple:
        """``spec``'s slot after an install or a call, as the dispatcher's ``_set_graph`` takes
        it: (state, recaptures, descriptors, open)."""
        if not self.enabled or passes.graph_device(spec) is None:
            return (OFF,)
        kept = self.graphs.get(spec.key, {})
        captured = tuple(c.packed for c in kept.values() if isinstance(c, Captured))
        recaptures = self.recaptures.get(spec.key, RECAPTURES)
        if spec.symbolic and self.takes_sizes(spec):  # the SCM asks at a size's second call
            return (READY, recaptures, captured, True)
        if not kept and not spec.symbolic:
            return (PENDING,)
        return (READY, recaptures, captured, False) if captured else (OFF,)

    def takes_sizes(self, spec) -> bool:
        """Whether symbolic ``spec`` captures graphs of more sizes: under the bound, and no
        capture of it failed (Note [Graphs per size])."""
        kept = self.graphs.get(spec.key, {})
        return len(kept) < self.sizes and not any(isinstance(c, NoGraph) for c in kept.values())

    def pool(self, spec):
        """The memory pool of ``spec``'s graphs of other sizes, which a new one shares."""
        kept = [c for c in self.graphs.get(spec.key, {}).values() if isinstance(c, Captured)]
        return kept[0].graph.pool() if kept else None

    def next_call(self, spec, args: tuple) -> set[int] | None:
        """For a call ``spec`` accepts that no graph replayed: None to run it step by step (the
        warm-up, or no graph applies), else the arguments to copy in while capturing it now:
        those whose address changed since the warm-up (any size's, for a symbolic one)."""
        if self.slot(spec)[0] == OFF:
            return None
        previous = self.graphs.get(spec.key, {}).pop(size_key(spec, args), None)
        if isinstance(previous, Captured):  # a by-pointer argument moved: copy it in
            self.recaptures[spec.key] = self.recaptures.get(spec.key, RECAPTURES) - 1
            if previous.kept():  # Note [Hand out after a move]
                self.copy_out.add(spec.key)
            return set(previous.statics) | {i for i, p in pointers(args).items()
                                            if previous.pointers.get(i, p) != p}
        seen = self.seen.get(spec.key)
        if seen is None:
            self.seen[spec.key] = pointers(args)
            return None
        return {i for i, p in pointers(args).items() if seen.get(i) != p}

    def hands_out(self, spec) -> bool:
        """Whether ``spec``'s next capture hands out its static outputs (Note [Graph outputs],
        Note [Hand out after a move]): none of ``spec``'s handed-out results was seen kept, and
        no other graph of ``spec`` lives in the memory pool the capture takes."""
        return spec.key not in self.copy_out and self.pool(spec) is None

    def done(self, spec, args: tuple, captured: Captured | NoGraph) -> None:
        """Keep what a capture of ``args``' size gave: the graph, or why there is none."""
        self.graphs.setdefault(spec.key, {})[size_key(spec, args)] = captured


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _captured(graph: torch.cuda.CUDAGraph, pool, fn, seconds: list):
    """``fn()`` captured into ``graph`` on a side stream, as ``torch.cuda.graph`` captures it,
    without its ``synchronize`` and ``empty_cache`` (torch 2.11), which a capture of each of a
    symbolic specialization's sizes need not pay (Note [Graphs per size]): the side stream
    waits for the current one, and the allocator keeps its cached blocks. ``seconds`` gets the
    host time of recording ``fn()`` and of ``capture_end`` (which instantiates the graph)."""
    device = torch.cuda.current_device()
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(*(() if pool is None else (pool,)))
        start = time.perf_counter()
        try:
            return fn()
        finally:
            seconds.append(time.perf_counter() - start)
            graph.capture_end()
            seconds.append(time.perf_counter() - start - seconds[0])


def capture(run, spec, args: tuple, moved: set[int], device: int,
            pool=None, hand_out: bool = False) -> Captured | NoGraph:
    """Capture ``run(*args)`` (the SCM's launch sequence for ``spec``) into a CUDA graph.

    ``moved``: tensor arguments whose address changed since the last call: copied in.
    ``pool``: the memory pool of the specialization's graphs of other sizes (replays of one
    slot are serial on one stream, and each graph's static outputs stay allocated).
    ``hand_out``: replays hand out the static outputs (Note [Graph outputs]) rather than copy
    them out.
    Returns the captured graph, or why the specialization runs without one.
    """
    written = passes.written_args(spec.plan)
    host = spec.host_scalars  # Note [Host scalars]: always copied in, from the host
    moved = set(moved) - host
    for i in moved:
        if not _dense(args[i]):
            return NoGraph(f"argument {i} changed address and is not dense")
    statics = {i: torch.empty_strided(args[i].shape, args[i].stride(), dtype=args[i].dtype,
                                      device=args[i].device) for i in moved}
    statics.update({i: torch.empty((), dtype=args[i].dtype, device=torch.device("cuda", device))
                    for i in host})
    for i, buffer in statics.items():
        buffer.copy_(args[i])
    capture_args = tuple(statics.get(i, a) for i, a in enumerate(args))
    graph, seconds = torch.cuda.CUDAGraph(), []
    with torch.cuda.device(device):
        result = _captured(graph, pool, lambda: run(*capture_args), seconds)
    outputs = spec.plan.out_spec.flatten_up_to(result)  # in the SCM's order

    stored = spec.recipe.stored() if spec.recipe else frozenset()  # Note [Stored outputs]
    storages = {_storage_ptr(a) for a in capture_args if isinstance(a, torch.Tensor)}
    desc_out: list[int] = []
    handed = []
    for k, (o, value) in enumerate(zip(spec.plan.outputs, outputs)):
        if isinstance(value, torch.Tensor):
            storage = _storage_ptr(value)
            if not isinstance(o, operands.Val) or storage in storages:
                return NoGraph(f"output {k} is or shares memory with an argument or another "
                               "output")
            if not _dense(value) or value.device != torch.device("cuda", device):
                return NoGraph(f"output {k} is not a dense tensor on cuda:{device}")
            storages.add(storage)
            hand = hand_out and k not in stored and _alone(value)
            if hand:
                handed.append(value)  # the Captured holds it
            desc_out += [_TAGS["tensor"], value.data_ptr(), value.numel() * value.element_size(),
                         id(value) if hand else 0,
                         dtype_codes()[value.dtype], value.dim(), *value.shape, *value.stride()]
        elif value is None:
            desc_out += [_TAGS["none"], 0]
        elif isinstance(value, bool):
            desc_out += [_TAGS["bool"], int(value)]
        elif isinstance(value, int):
            desc_out += [_TAGS["int"], value]
        elif isinstance(value, float):
            desc_out += [_TAGS["float"], struct.unpack("<q", struct.pack("<d", value))[0]]
        else:
            return NoGraph(f"output {k} is {with_article(type(value).__name__)}")

    desc_in: list[int] = []
    tensor_args = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    for i in tensor_args:
        a = capture_args[i]
        mode = HOST_IN if i in host else COPY_IN if i in statics else BY_POINTER
        desc_in += [i, mode, a.data_ptr(), _span(args[i]), int(i in written)]
    key = _key_words(size_key(spec, args))
    desc = [graph.raw_cuda_graph_exec(), device, len(tensor_args), len(outputs), len(key), *key]
    return Captured(graph, statics, outputs,
                    {i: args[i].data_ptr() for i in tensor_args if i not in statics},
                    desc + desc_in + desc_out, tuple(handed), tuple(seconds))


class GraphControl:
    """The JitFunction methods that run an installed specialization from Python through its CUDA
    graph states (Note [CUDA graphs]) and set the dispatcher's graph slots."""

    __slots__ = ()

    def _capture_path(self, call, kwargs: dict | None = None, hit: bool = True):
        """Called from the native dispatcher (with the call's ``args`` tuple and ``kwargs``)
        when the specialization that accepts them has no CUDA graph yet but may have one, and
        from the miss path (with its ``_Call``): its first run in this process runs step by
        step (the warm-up); the next one captures the graph and replays it."""
        if isinstance(call, tuple):
            call = self._flatten(call, kwargs or {})
        index = self._installed_match(call)
        if index < 0:  # a global changed under us: the ordinary miss path
            return self._slow_path(call.args, call.kwargs)
        spec = self._specs[index]
        for node, name in spec.recipe.writes() if spec.recipe is not None else ():
            # Note [Finalizers of written values] (lower/writes.py), as the native hit
            ran, out = self._finalized_write(call.args, call.kwargs, call.values[node], name, call)
            if ran:
                return out
        args = call.leaves
        self._set_graph(index, OFF)  # the launch sequence, while this call decides
        moved = self._graph_states.next_call(spec, args)
        if moved is not None:
            start = time.perf_counter()
            try:
                captured = capture(functools.partial(self._capture_run, index), spec, args,
                                   moved, passes.graph_device(spec),
                                   self._graph_states.pool(spec),
                                   hand_out=self._graph_states.hands_out(spec))
            except Exception as e:  # an op that cannot be captured (one that synchronizes)
                captured = NoGraph(f"capture failed: {type(e).__name__}: {e}")
            self._graph_states.done(spec, args, captured)
            if isinstance(captured, NoGraph):
                _recompiles.info("%s: no CUDA graph for %s: %s", self.__qualname__,
                                 spec.signature, captured.why)
            else:
                self._counters.graph_captures += 1
                _recompiles.info("%s: captured a CUDA graph of %s in %.1f ms (recording "
                                 "%.1f ms, instantiating %.1f ms; copied-in arguments: %s)",
                                 self.__qualname__, spec.signature,
                                 (time.perf_counter() - start) * 1e3,
                                 *(t * 1e3 for t in captured.seconds),
                                 [call.names[i] for i in sorted(captured.statics)] or "none")
                self._install_graph(index, spec)
                out = self._finish(call, index, self._run(*args))  # replays the graph
                self.hits += hit
                return out
        try:
            out = self._finish(call, index, self._run(*args))
        except EagerCall as e:  # Note [Errors inside try] in source_lines.py
            return self._eager_path(call.args, call.kwargs, e, missed=not hit)
        self.hits += hit
        self._install_graph(index, spec)  # after a warm-up: capture at the next call
        if spec.symbolic and self._cuda_graphs:
            self._graph_seen(index, *args)  # Note [Graphs per size]: this size's first call
        return out

    def _finish(self, call, index: int, out):
        """The result of specialization ``index`` from the SCM's outputs ``out`` for ``call``
        (a ``_Call``): Python's twin of the end of Dispatcher_call, through the same native
        recipe code."""
        recipe = self._specs[index].recipe
        if recipe is None:
            return out
        return runtime.load().build_result(tuple(recipe.ops), out, tuple(call.values))

    def _install_graph(self, index: int, spec) -> None:
        """Set ``spec``'s graph slot in the dispatcher (after a call, a capture or a rebuild)."""
        self._set_graph(index, *self._graph_states.slot(spec))
