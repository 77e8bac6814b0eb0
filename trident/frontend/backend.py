"""``torch.compile(fn, backend="trident")``: Dynamo's graphs served by Specialization Cache Modules.

Registered through the ``torch_dynamo_backends`` entry point (setup.py), so no ``import trident``
is needed. Dynamo keeps its own guards and graph breaks; each graph it hands over becomes a
``@trident.jit`` function of the graph's inputs, whose SCM replaces Inductor's wrapper and launch
path. Symbolic sizes (``dynamic=True``) reach the SCM as ints: a graph input that Dynamo made a
``SymInt`` (an int it saw change, as a cache's length, or under ``dynamic=True``) is a symbolic
int of the graph's specializations from its first call (Note [Int leaves] in policy.py), so a
new value is a hit, not a recompile; Dynamo's other inputs are specialized by value.

Note [Graph dims]: likewise a tensor dim that Dynamo made symbolic (its example input's size a
``SymInt``) is symbolic in the graph's specializations from its first call, as a dim marked
with ``torch._dynamo.mark_dynamic`` is (Note [Automatic dynamic] in dynamic.py). Dynamo passes
such a size both in the tensor and as a ``SymInt`` input (a prefill's ``input_ids.shape[1]``,
``s27``); traced with the tensor's dim static, the graph tied the int to the static size (``s27
>= 498``), and the next prompt length missed on that guard and compiled the graph once more,
with the dim symbolic only then.

Dynamo's record of the sizes it saw, which the door feeds so that its later graphs are
symbolic where a server's calls change: Notes [Door batch dims] and [Tied dims] in
frame_state.py.

Note [Graphs of constants]: Dynamo specializes a size 1 even where it made the dim symbolic
(a symbol's range starts at 2), so a batch of one after the symbolic graphs makes a prefill and
a decode step graph of its own: the symbolic graph's nodes with the constant 1 where the batch
symbol was. A graph whose nodes are an earlier graph's of the same frame, op by op and argument
by argument, but for ints where the earlier one has symbolic-int inputs, is served by that
graph's JitFunction: its inputs are the new graph's by source, and each such symbol is passed
as its constant. The earlier graph run with those ints computes what the new one computes, so
the answer is the new graph's; whether a specialization of it holds the call is its guards'
(a batch of one is in the range of a batch dim traced size-oblivious: Note [Batch dims] in
batch.py). Graphs that read a submodule or an attribute of their GraphModule are not compared.

User Triton kernels appear in Dynamo's graph as ``triton_kernel_wrapper_mutation`` nodes; they
are rewritten to ordinary launches of the same kernel, which Trident's capture then records like
a launch written in the user's function.

Calls that need autograd (an input that requires grad, with grad mode on) run Dynamo's graph
eagerly, so gradients are PyTorch's own; ``stats(fn).fallbacks`` counts them.

Note [Backend graphs]: the user holds what ``torch.compile`` returned, never the JitFunction of
each graph, which Dynamo calls from its own bytecode. So the backend keeps a weak reference to
each one, with the code object of the frame Dynamo compiled it from and the source of each
graph input (Dynamo's ``GraphArg.source``: ``L['x']``, ``L['self']._modules['lin']...``).
``graphs(fn)`` finds the graphs of ``fn``'s frames (its code, and the resume functions Dynamo
makes after a graph break, named after it); ``stats(fn)`` sums their counters; ``explain(fn,
*args)`` reads each graph's inputs from the call's arguments by those sources, as Dynamo's
guards read them, and asks the graph's ``explain``. The references are weak: ``graphs`` lists
a graph while its JitFunction lives (Dynamo's cache holds it; ``torch._dynamo.reset()`` drops
it). A graph's counters outlive it: when it is freed they are added to its frame's record
(``_DROPPED``, one per frame code and ``self``), which ``stats`` sums with the live graphs', so
stats read after a reset still say what ran.

Note [Backend hit cost]: a call through this door is Dynamo's part, then the graph's hit.
Dynamo's: its guard tree (for a transformers decode step, every module's and the config's
attributes and a ``TENSOR_MATCH`` per tensor), its frame's bytecode (each graph input loaded by
its source: parameters are graph inputs under ``inline_inbuilt_nn_modules``, 198 for a 16-layer
Llama) and the result rebuilt from the graph's outputs. The graph's hit is a Trident hit of a
flat list of leaves (no module tree to check), so beside its ops it costs less than
``trident.jit``'s hit of the same step. Its SCM's guards check per input some of what
``TENSOR_MATCH`` checks too (dtype, device, dim) and what Dynamo does not guard: the 16-byte
alignment Triton specializes on, one tensor in two positions, the exact size of a dim Dynamo
made symbolic where the specialization is static, the global state Trident's steps read. They
are kept: the part Dynamo duplicates is about 1% of the door (16 µs of 1.7 ms for that Llama
on the CPU, ``benchmarks/bench_doors.py``), and dropping it would make the SCM's soundness
depend on which guards each torch version's Dynamo installs and on no other caller.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import re
import types
import weakref

import torch
import torch.fx as fx

from trident import config
from trident.errors import TridentError
from trident.frontend import frame_state
from trident.frontend.choices import python_choices
from trident.frontend.entries import compiled_from, frame_module, graph_origin
from trident.frontend.graph_names import NamedInputs, user_name
from trident.frontend.jit import Stats, jit_function_class

# Note [Backend graphs]: every graph compiled in this process, oldest first
_GRAPHS: list[weakref.ref] = []


@dataclasses.dataclass
class _Dropped:
    """The counters of the freed graphs of one frame (Note [Backend graphs])."""

    _frame_code: types.CodeType | None
    _frame_self: weakref.ref | None
    stats: Stats


_DROPPED: dict[tuple[int, int], _Dropped] = {}  # by id of (frame code, weak ref to self)


def _drop(graph) -> None:
    """``__del__`` of a graph's JitFunction: its counters go to its frame's record."""
    try:
        code, owner, s = graph._frame_code, graph._frame_self, graph.stats
        record = _DROPPED.setdefault((id(code), id(owner)), _Dropped(code, owner, Stats()))
        _add(record.stats, s, "dropped")
    except Exception:  # set up only in part, or the interpreter's shutdown (globals are None)
        return


def _add(total: Stats, s: Stats, name: str) -> None:
    for field in dataclasses.fields(Stats):
        if field.name != "miss_reasons":
            setattr(total, field.name, getattr(total, field.name) + getattr(s, field.name))
    total.miss_reasons = (total.miss_reasons + [f"{name}: {r}" if name else r
                                                for r in s.miss_reasons])[-32:]


@functools.cache
def _graph_class() -> type:
    """``JitFunction`` whose counters outlive it (Note [Backend graphs]) and that names its
    inputs as the user's (Note [Names of graph inputs] in graph_names.py)."""
    return type("JitFunction", (NamedInputs, jit_function_class()), {"__module__": "trident",
                                                                      "__del__": _drop})


def _launch(kernel_idx, constant_args_idx, grid, tma_descriptor_metadata, kwargs):
    """A Dynamo-recorded Triton launch, made again as ``kernel[grid](**args)``."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    if tma_descriptor_metadata:
        raise TridentError("Triton tensor descriptors are not supported yet")
    kernel = kernel_side_table.get_kernel(kernel_idx)
    args = {**kernel_side_table.get_constant_args(constant_args_idx), **kwargs}
    if len(grid) == 1:
        kernel[tuple(grid[0])](**args)
        return
    # Dynamo evaluated a grid callable once per autotune config (torch 2.11's
    # triton_kernel_wrap does the same): pick the one of the config the autotuner chooses.
    configs = getattr(kernel, "configs", None)
    if configs is None or len(configs) != len(grid):
        raise TridentError(f"{len(grid)} grids for a kernel with "
                           f"{len(configs or ())} autotune configs")

    def grid_of_config(meta):
        for tuned, g in zip(configs, grid):
            if all(meta.get(k) == v for k, v in tuned.kwargs.items()):
                return tuple(g)
        raise TridentError(f"no grid recorded for the autotune config {meta}")

    kernel[grid_of_config](**args)


def _route_triton_launches(gm: fx.GraphModule) -> fx.GraphModule:
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is triton_kernel_wrapper_mutation:
            node.target = _launch
            changed = True
    if changed:
        gm.recompile()
    return gm


def trident_backend(gm: fx.GraphModule, example_inputs: list, **options):
    """Compile one Dynamo graph. ``options`` go to ``trident.jit`` (``max_specializations``).

    Raises:
        torch._dynamo.exc.TensorifyScalarRestartAnalysis: Dynamo is to trace the frame again
            with dims recorded dynamic (Note [Tied dims] in frame_state.py)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    try:
        tx = InstructionTranslator.current_tx()
        code = tx.f_code
    except (AssertionError, AttributeError, IndexError):  # called outside Dynamo
        tx = code = None
    if tx is not None:
        try:
            frame_state.untie(tx, gm, example_inputs)
        except (AttributeError, KeyError, TypeError) as e:  # Dynamo's private state moved
            config.logger("recompiles").info("tied dims not recorded for Dynamo: %r", e)
    gm = python_choices(_route_triton_launches(gm))  # Note [Size choices in graphs]
    if hasattr(gm, "real_recompile"):  # a _LazyGraphModule: generate forward's code now
        gm.real_recompile()
    for earlier in (r() for r in reversed(_GRAPHS)):  # Note [Graphs of constants]
        inputs = _as_constants_of(gm, earlier._gm, earlier._input_sources) if earlier is not \
            None and code is not None and earlier._frame_code is code else None
        if inputs is not None:
            return _served_by(earlier, *inputs)
    # The cache key of the bound GraphModule.forward is its generated code: the graph itself.
    # The GraphModule is Trident's own (Dynamo passes parameters as graph inputs): its state is
    # not an argument tree to read on every call.
    fn = _graph_class()()
    fn._constant_self = True
    fn._setup(gm.forward, options.get("max_specializations"), True, None, None)
    fn._gm = gm

    fn._frame_code = code
    owner = frame_module(tx.f_locals) if tx is not None else None  # self, or a wrapper's args[0]
    if tx is not None:
        try:
            frame_state.record_batch_dims(tx, gm, example_inputs)
            frame_state.record_stored_dims(tx)
        except Exception as e:  # Dynamo's private frame state moved: only more graphs follow
            config.logger("recompiles").info("batch dims not recorded for Dynamo: %r", e)
    try:
        fn._frame_self = weakref.ref(owner) if owner is not None else None
    except TypeError:  # a self without weak references
        fn._frame_self = None
    fn._input_sources = [frame_state.source(n) for n in gm.graph.nodes if n.op == "placeholder"]
    # Dynamo's symbolic ints: symbolic in every specialization of this graph (Note [Int leaves])
    params = list(inspect.signature(gm.forward).parameters)
    fn._user_names = dict(zip(params, map(user_name, fn._input_sources)))
    fn._int_leaves = frozenset(name for name, example in zip(params, example_inputs)
                               if isinstance(example, torch.SymInt))
    # Note [Graph dims]: Dynamo's symbolic tensor dims, symbolic from the graph's first call
    fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    fn._graph_dims = {name: frozenset(d for d, n in enumerate(fake.shape)
                                      if isinstance(n, torch.SymInt))
                      for name, fake in zip(params, fakes) if isinstance(fake, torch.Tensor)}
    fn._graph_dims = {name: dims for name, dims in fn._graph_dims.items() if dims}
    gm.meta["trident_origin"] = origin = graph_origin(  # Note [Graph origins] in entries.py
        gm, code, tx.f_locals if tx is not None else None, getattr(tx, "f_globals", None))
    fn._graph_of = origin["graph_of"]
    origin["inputs"] = {k: v for k, v in fn._user_names.items() if v and v != k}  # for list:
    origin["symbolic_ints"] = sorted(fn._int_leaves)  # Note [Names of graph inputs]
    _GRAPHS[:] = [r for r in _GRAPHS if r() is not None] + [weakref.ref(fn)]
    return fn


def _as_constants_of(gm: fx.GraphModule, earlier: fx.GraphModule,
                     sources: list) -> tuple[list, list | None] | None:
    """Note [Graphs of constants]: per input of ``earlier`` (whose inputs' ``sources`` were
    recorded as it was compiled: Dynamo drops them then), the index of ``gm``'s input of the
    same source or the int its symbol is in ``gm``, and the indices of the outputs of
    ``earlier`` that ``gm`` has (None: all; ``gm`` lacks those that are such symbols, as a
    cache's batch size the prefill writes); None where ``gm`` is not ``earlier`` with ints for
    some of its symbolic-int inputs."""
    ours = {frame_state.source(n): i for i, n in enumerate(n for n in gm.graph.nodes
                                                 if n.op == "placeholder")}
    theirs = [n for n in earlier.graph.nodes if n.op == "placeholder"]
    if None in ours or len(ours) != sum(n.op == "placeholder" for n in gm.graph.nodes):
        return None  # an input of no source, or two of one
    pairs, ints, bound = {}, set(), {}  # earlier's node -> gm's; symbols gm has as ints
    for n, source in zip(theirs, sources):
        if source in ours:
            pairs[n] = ours[source]
        elif isinstance(n.meta.get("example_value"), torch.SymInt):
            ints.add(n)
        else:
            return None
    if len(pairs) != len(ours):
        return None
    placeholders = [m for m in gm.graph.nodes if m.op == "placeholder"]
    mapped = {n: placeholders[pairs[n]] for n in pairs}

    def same(a, b) -> bool:
        if isinstance(a, fx.Node):
            if a in ints and type(b) is int:
                return bound.setdefault(a, b) == b
            return isinstance(b, fx.Node) and mapped.get(a) is b
        if isinstance(a, (tuple, list)):  # fx's immutable_list and immutable_dict included
            return isinstance(b, tuple if isinstance(a, tuple) else list) and \
                len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k])
                                                                       for k in a)
        if isinstance(a, slice):
            return type(b) is slice and same((a.start, a.stop, a.step), (b.start, b.stop, b.step))
        if type(a) is not type(b) or isinstance(a, torch.Tensor):
            return a is b
        return repr(a) == repr(b) if isinstance(a, float) else bool(a == b)

    rest = [[n for n in g.graph.nodes if n.op != "placeholder"] for g in (earlier, gm)]
    if len(rest[0]) != len(rest[1]):
        return None
    kept = None  # the earlier graph's outputs the new one has, where it returns such a symbol
    for a, b in zip(*rest):
        args, before = a.args, dict(bound)
        if a.op == b.op == "output" and isinstance(args[0], tuple) and not same(args, b.args):
            bound.clear()
            bound.update(before)
            kept = [i for i, x in enumerate(args[0]) if not (isinstance(x, fx.Node) and x in ints)]
            args = (tuple(args[0][i] for i in kept),)
        if a.op in ("get_attr", "call_module") or (a.op, a.target) != (b.op, b.target) or \
                not same(args, b.args) or not same(a.kwargs, b.kwargs):
            return None
        mapped[a] = b
    values = {n.meta["example_value"].node.expr: v for n, v in bound.items()}
    inputs = []
    for n, source in zip(theirs, sources):
        if n in pairs:
            inputs.append(pairs[n])
            continue
        value = n.meta["example_value"].node.expr.subs(values)
        size = re.fullmatch(r"(.*)\.size\(\)\[(\d+)\]", source or "")
        if value.is_Integer:
            inputs.append(_Constant(int(value)))
        elif size and size[1] in ours:  # a symbol the graph never reads: a size of an input
            inputs.append(_Size(ours[size[1]], int(size[2])))
        else:
            return None
    return inputs, kept


@dataclasses.dataclass(frozen=True)
class _Constant:
    value: int


@dataclasses.dataclass(frozen=True)
class _Size:
    input: int
    dim: int


def _served_by(graph, inputs: list, kept: list | None):
    """Note [Graphs of constants]: ``graph``'s JitFunction called with a new graph's inputs,
    its outputs ``kept`` (all where None)."""
    def served(*args):
        out = graph(*[i.value if isinstance(i, _Constant) else args[i.input].shape[i.dim]
                      if isinstance(i, _Size) else args[i] for i in inputs])
        return out if kept is None else tuple(out[i] for i in kept)

    return served


def _frames(fn) -> tuple[list[tuple[types.CodeType, object]], object]:
    """The frames Dynamo may compile for ``fn`` (a function, a method, an ``nn.Module``'s
    ``forward``, or what ``torch.compile`` returned for one of them), as (code, function): each
    function along its ``__wrapped__`` chain, as a decorator's wrapper is the frame Dynamo sees
    (transformers decorates ``forward``); and the object a method or module binds as ``self``
    (None for a function).

    Raises:
        TypeError: ``fn`` is none of these."""
    given = fn
    if isinstance(fn, torch._dynamo.eval_frame.OptimizedModule):
        fn = fn._orig_mod
    owner = None
    if isinstance(fn, torch.nn.Module):
        fn, owner = type(fn).forward, fn
    frames = []
    while fn is not None:
        if owner is None and isinstance(fn, types.MethodType):
            owner = fn.__self__
        function = getattr(fn, "__func__", fn)
        if isinstance(getattr(function, "__code__", None), types.CodeType):
            frames.append((function.__code__, function))
        fn = getattr(fn, "__wrapped__", None)
    if not frames:
        raise TypeError(f"expected a function, a method or an nn.Module (or what torch.compile "
                        f"returned for one), got {type(given).__name__}")
    return frames, owner


def _of(graph, frames: list, owner) -> bool:
    """``graph`` was compiled from one of ``frames`` (or a resume function Dynamo made of one
    after a graph break), bound to ``owner`` where both have a ``self``."""
    frame = graph._frame_code
    if frame is None or not any(compiled_from(frame, c) for c, _ in frames):
        return False
    bound = graph._frame_self() if graph._frame_self is not None else None
    return owner is None or bound is None or bound is owner


def graphs(fn=None) -> list:
    """The JitFunction of each graph that ``torch.compile(..., backend="trident")`` handed to
    Trident in this process and that still lives, oldest first (Note [Backend graphs]): of
    every compiled function, or of ``fn``'s frames (``fn``: a function, a method, an
    ``nn.Module`` or what ``torch.compile`` returned for one; the graphs after a graph break
    included). Each has ``.stats``, ``.explain(*graph_inputs)``, ``.specializations`` and
    ``.source()``, as ``trident.jit``'s functions have.

    Raises:
        TypeError: ``fn`` is not a function, method or module."""
    found = [g for g in (r() for r in _GRAPHS) if g is not None]
    if fn is None:
        return found
    frames, owner = _frames(fn)
    return [g for g in found if _of(g, frames, owner)]


def stats(fn=None) -> Stats:
    """The counters of ``graphs(fn)`` and of the graphs of ``fn``'s frames freed before
    (``torch._dynamo.reset()``: Note [Backend graphs]) summed (``trident.jit``'s ``Stats``);
    ``miss_reasons`` the last 32 of every graph's, each prefixed with its graph's index
    (``"graph 1: ..."``) or ``"dropped: "``.

    Raises:
        TypeError: ``fn`` is not a function, method or module."""
    total = Stats()
    dropped = list(_DROPPED.values())
    if fn is not None:
        frames, owner = _frames(fn)
        dropped = [d for d in dropped if _of(d, frames, owner)]
    for d in dropped:
        _add(total, d.stats, "")
    for i, g in enumerate(graphs(fn)):
        _add(total, g.stats, f"graph {i}")
    return total


def explain(fn, *args, **kwargs) -> str:
    """What each graph of ``fn`` (``graphs(fn)``) would do with a call of ``fn(*args,
    **kwargs)``: which specialization accepts the inputs Dynamo would pass it, or each one's
    failing guards (``trident.jit``'s ``explain``), one block per graph. A graph after a graph
    break, whose inputs are values of the frame at the break, is named without them. Dynamo's
    own guards decide first which graph runs (``TORCH_LOGS=recompiles`` shows them).

    Raises:
        TypeError: ``fn`` is not a function, method or module, or the arguments do not bind
            to its parameters."""
    frames, owner = _frames(fn)
    from torch._dynamo.guards import _get_closure_vars

    blocks = []
    for i, g in enumerate(graphs(fn)):
        head = f"graph {i} (of {g._graph_of})"
        function = next((f for c, f in frames if c is g._frame_code), None)
        if function is None:
            blocks.append(f"{head}: after a graph break; its inputs are values of the frame "
                          "at the break, which explain() does not compute")
            continue
        given = (*((owner,) if owner is not None else ()), *args)
        bound = inspect.signature(function, follow_wrapped=False).bind(*given, **kwargs)
        bound.apply_defaults()
        scope = {**_get_closure_vars(), "L": {**bound.arguments, **_as_wrapped(
            function, bound, given, kwargs)}, "G": function.__globals__}
        try:
            inputs = [eval(source, scope) for source in g._input_sources]  # Dynamo's text
        except Exception as e:  # a source this call's arguments do not have
            blocks.append(f"{head}: its inputs cannot be read from these arguments "
                          f"({type(e).__name__}: {e})")
            continue
        blocks.append(f"{head}:\n  " + g.explain(*inputs).replace("\n", "\n  "))
    return "\n".join(blocks) or "no graphs compiled by the trident backend for this function"


def _as_wrapped(function, bound: inspect.BoundArguments, given: tuple, kwargs: dict) -> dict:
    """For a decorator's ``wrapper(*args, **kwargs)`` frame (transformers' ``forward``), its
    ``args`` and ``kwargs`` holding each argument both ways, as the wrapped function binds it:
    Dynamo's inputs of a graph compiled from ``forward(input_ids=ids)`` are
    ``L['kwargs']['input_ids']``, of one from ``forward(ids)`` ``L['args'][0]``, and
    ``explain(model, ids)`` answers for either; {} for a frame of no such wrapper.

    Raises:
        TypeError: the arguments do not bind to the wrapped function's parameters."""
    inner = inspect.unwrap(function)
    parameters = inspect.signature(function, follow_wrapped=False).parameters
    varargs = [p.name for p in parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if inner is function or len(varargs) != 2:
        return {}
    signature = inspect.signature(inner)
    named = signature.bind(*given, **kwargs).arguments
    skip = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)  # self, before *args
               for p in parameters.values())
    positional = [n for n, p in signature.parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][skip:]
    values = tuple(named[n] for n in itertools.takewhile(named.__contains__, positional))
    return {varargs[0]: values, varargs[1]: {**{n: named[n] for n in positional if n in named},
                                             **bound.arguments[varargs[1]]}}
