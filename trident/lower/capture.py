"""Capture: trace a call into an ATen-level FX graph with flat tensor outputs.

The function runs once under ``make_fx`` on fake tensors with the call's shapes, dtypes and
strides. Python scalars (int, float, bool, None) are specialized by value, so they appear in the
graph as constants and in the guards as values. Outputs are flattened with ``torch.utils._pytree``;
tensor leaves become graph outputs and every other leaf (None, int, float, bool) is kept as a
constant of the output structure (``Capture.out_leaves``).

Each node records the user's source line: a ``TorchFunctionMode`` sets FX's current stack trace
(``torch.fx.traceback``) to the innermost user frame before every torch call, and Torch-MLIR's
importer turns it into the op's location.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import traceback
import types
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.fx.experimental._config
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
from torch.multiprocessing.reductions import StorageWeakRef

from trident import config, frames
from trident.lower import (decompositions, float_leaves, kernel_checks, rng, tensor_attributes,
                           trace_writes, values)
from trident.lower.literals import build_literal
from trident.lower.global_state import _changed, _global_state, _restore_global_state
from trident.lower.state import pause
from trident.lower.source_lines import _SourceLines, module_calls_as_now, source_line
from trident.errors import TridentError, environmental, transient
from trident.ir.launch import ScalarParam
from trident.ir.plan import plain_spec


@dataclasses.dataclass
class Capture:
    """One traced call.

    Attributes:
        graph_module: ATen-level graph; placeholders are the call's positional arguments,
            outputs the tensor leaves of the result, in order.
        out_spec: the result's structure (torch's pytree): tuples, lists and ``None`` around
            the leaves (``ir.plan.plain_spec``).
        out_leaves: per leaf of the result, ``None`` for a tensor (the next graph output) or
            ``("const", value)`` for a non-tensor leaf.
    """

    graph_module: fx.GraphModule
    out_spec: pytree.TreeSpec
    out_leaves: list
    # A trace with dynamic dims (Note [Symbolic sizes] in plan.py): the fake arguments (their
    # sizes and strides are SymInts over the ShapeEnv's symbols) and the ShapeEnv, which holds
    # the symbols' ranges and what the trace assumed about them.
    fake_args: tuple | None = None
    shape_env: Any = None
    # Note [Argument trees] in flatten.py: how the runtime rebuilds a result that is more than
    # tensors and scalars in tuples and lists (then ``out_spec`` is a flat tuple)
    recipe: Any = None
    # Note [Errors inside try]: "file.py:LINE" of a `try` whose `except` was active around a
    # torch call of the function, or ""
    catching: str = ""
    looked_up: frozenset = frozenset()  # Note [Python attributes of tensors]: leaves probed
    # Note [Value reads] in values.py: the graph of the value checks, and each read's value
    checks: fx.GraphModule | None = None
    check_values: tuple = ()
    # Note [Questions about read values] in values.py: the trace took a Python number from a
    # tensor (``.item()``, ``.tolist()``), which the function's Python held as a SymInt,
    # SymFloat or SymBool
    scalar_reads: bool = False


# What a trace returns as graph outputs: tensors, and scalars that ops computed (``x.item()``,
# a size under dynamic dims), which the plan returns as its scalar values.
_GRAPH_OUTPUTS = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)


def _fake_args(args: tuple, dynamic: dict[int, set[int]], ones: dict | None = None,
               alike: dict | None = None):
    """Fake tensors whose ``dynamic`` dims ({arg: {dim}}) are fresh symbols (sizes >= 2: 0 and
    1 stay static, as in torch.compile), the other dims static; an int argument in ``dynamic``
    a symbol of its own (Note [Symbolic ints] in guards.py; 0 and 1 stay constants).
    ``ones`` ({arg: {dim}}): symbols of range >= 1 at any size, 1 included (a batch: Note
    [Batch dims] in frontend/batch.py; a length: Note [Lengths of written state] in
    frontend/ints.py; an int leaf: ``{0}``); the trace runs size-oblivious (``trace``).
    ``alike`` ({(arg, dim): key}; an int's dim is ``None``): the symbolic dims of one key share
    one symbol per size (Note [Symbols of like layers] in frontend/ints.py)."""
    from torch._dynamo.source import LocalSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)
    import sympy
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    ones, alike, shape_env = ones or {}, alike or {}, ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    fakes, shared = [], _SharedSymbols(shape_env, alike)
    for i, a in enumerate(args):
        if type(a) is int and i in dynamic and (a not in (0, 1) or i in ones):  # Note
            fakes.append(shared.make(i, {None: a}, lambda how: shape_env.create_symintnode(
                shape_env.create_symbol(a, LocalSource(f"value_{i}"), how[None], positive=None,
                                        do_not_specialize_zero_one=i in ones), hint=a)))
            continue  # (Note [Symbolic ints])
        if type(a) is float and i in dynamic:  # Note [Float leaves] in frontend/policy.py
            fakes.append(float_leaves.symbol(shape_env, a, i))
            continue
        if not isinstance(a, torch.Tensor):
            fakes.append(a)
            continue
        dims = dynamic.get(i, set())
        symbols = {d: a.shape[d] for d in range(a.dim())
                   if d in dims and (a.shape[d] >= 2 or d in ones.get(i, ()))}
        # a size 1 in ``ones`` is a symbol too, which torch makes in its size-oblivious mode
        with torch.fx.experimental._config.patch(backed_size_oblivious=i in ones):
            fakes.append(shared.make(i, symbols, lambda how: mode.from_tensor(
                a, symbolic_context=StatelessSymbolicContext(dynamic_sizes=[
                    how.get(d, DimDynamic.STATIC) for d in range(a.dim())]))))
        for d, size in enumerate(fakes[-1].shape if i in ones else ()):  # (ranges [0, oo])
            if isinstance(size, torch.SymInt) and isinstance(size.node._expr, sympy.Symbol):
                shape_env.var_to_range[size.node._expr] = ValueRanges(2 - (d in ones[i]), int_oo)
                if d not in ones[i]:
                    shape_env.size_like.discard(size.node._expr)
    return tuple(fakes), shape_env


class _SharedSymbols:
    """Note [Symbols of like layers] (frontend/ints.py): one symbol per key and size of the
    dims ``alike`` names. torch's duck sizing (``DimDynamic.DUCK``) reuses the ShapeEnv's
    symbol of a size (its ``val_to_var``, torch 2.11-2.13); here that table is one per key,
    put in place while an argument's symbols are made."""

    def __init__(self, shape_env, alike: dict):
        self.shape_env, self.alike, self.tables = shape_env, alike, {}

    def make(self, i: int, sizes: dict, make: Callable):
        """``make(how)`` (``how``: {dim: DimDynamic}; an int's dim is None) for argument
        ``i``'s symbolic ``sizes`` ({dim: size}), its result (a fake tensor or a SymInt): DUCK
        where a key's table gives or takes the symbol, DYNAMIC (a fresh symbol) elsewhere, and
        where a dim of another key has the same size (one table at a time)."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        keys = {d: self.alike[(i, d)] for d in sizes if (i, d) in self.alike}
        table, how, owner = {}, {d: DimDynamic.DYNAMIC for d in sizes}, {}
        for d, key in keys.items():
            if owner.setdefault(sizes[d], key) == key:
                how[d] = DimDynamic.DUCK
                if sizes[d] in self.tables.get(key, {}):
                    table[sizes[d]] = self.tables[key][sizes[d]]
        if DimDynamic.DUCK not in how.values():
            return make(how)
        kept, self.shape_env.val_to_var = self.shape_env.val_to_var, table
        try:
            made = make(how)
        finally:
            self.shape_env.val_to_var = kept
        for d in (d for d, h in how.items() if h is DimDynamic.DUCK):
            size = made if d is None else made.shape[d]
            if isinstance(size, torch.SymInt) and size.node._expr.is_Symbol:
                self.tables.setdefault(keys[d], {}).setdefault(sizes[d], size.node._expr)
        return made


class _TritonLaunches:
    """While tracing, ``kernel[grid](...)`` records a ``triton_kernel_wrapper_mutation`` node.

    The trace's thread routes ``kernel[grid]`` here (``kernels.launch_hook``); the launch is
    resolved by ``kernels.resolve_launch`` and stored in PyTorch's kernel side table, where the
    importer finds it.
    """

    def __init__(self, real_args: tuple, mode: _SourceLines):
        self.mode = mode
        self.aligned_inputs = [isinstance(a, torch.Tensor) and a.data_ptr() % 16 == 0
                               for a in real_args]
        self.input_storages: dict = {}

    def bind_inputs(self, fake_args: tuple) -> None:
        self.fake_args = fake_args
        self.sources = None  # Note [Symbolic launches]: where each symbol is read
        for fake, aligned in zip(fake_args, self.aligned_inputs):
            if isinstance(fake, torch.Tensor):
                self.input_storages[StorageWeakRef(fake.untyped_storage())] = (
                    fake.storage_offset(), aligned)

    def aligned(self, t: torch.Tensor) -> bool:
        """Note [Pointer alignment] in kernels.py."""
        root = self.input_storages.get(StorageWeakRef(t.untyped_storage()))
        if root is None:
            return t.storage_offset() * t.element_size() % 16 == 0
        offset, aligned = root
        return aligned and (t.storage_offset() - offset) * t.element_size() % 16 == 0

    def launch(self, kernel, grid, args, kwargs) -> None:
        # Trident's and Triton's own reads (alignment, autotuning, size expressions) are not
        # the function's
        user, self.mode.in_user_code = self.mode.in_user_code, False
        try:
            self._launch(kernel, grid, args, kwargs)
        finally:
            self.mode.in_user_code = user

    def _launch(self, kernel, grid, args, kwargs) -> None:
        from torch._higher_order_ops.triton_kernel_wrap import (kernel_side_table,
                                                                triton_kernel_wrapper_mutation)

        from trident.lower.guards import size_expr, size_sources
        from trident.lower.kernels import resolve_launch

        if any(isinstance(v, (torch.SymFloat, torch.SymBool)) for v in (*args, *kwargs.values())):
            raise TridentError("a Triton launch with a float or bool computed from a dynamic dim "
                               "is not supported")
        jit_fn, launch, tensors = resolve_launch(kernel, grid, args, kwargs, self.aligned)
        # Note [Symbolic launches] in kernels.py: expressions over dynamic dims, computed in C
        symbolic = any(isinstance(p, ScalarParam) and p.size is not None for p in launch.params)
        if (symbolic or any(isinstance(g, torch.SymInt) for g in launch.grid)) \
                and self.sources is None:
            self.sources = size_sources(self.fake_args)  # once per trace
        traced_grid = tuple(g.node.hint if isinstance(g, torch.SymInt) else g for g in launch.grid)
        launch = dataclasses.replace(
            launch, params=tuple(
                dataclasses.replace(p, size=size_expr(p.size, self.sources))
                if isinstance(p, ScalarParam) and p.size is not None else p
                for p in launch.params),
            grid=tuple(size_expr(g, self.sources) if isinstance(g, torch.SymInt) else g
                       for g in launch.grid))
        self.mode.tag(sys._getframe(1))
        triton_kernel_wrapper_mutation(
            kernel_idx=kernel_side_table.add_kernel(jit_fn),
            constant_args_idx=kernel_side_table.add_constant_args(
                {"__trident_launch__": launch}),
            grid=[traced_grid], tma_descriptor_metadata={}, kwargs=tensors)

    def __enter__(self):
        from trident.lower.kernels import launch_hook

        self._hook = launch_hook(lambda kernel, grid, original: (
            lambda *args, **kwargs: self.launch(kernel, grid, args, kwargs)))
        self._hook.__enter__()
        return self

    def __exit__(self, *exc):
        self._hook.__exit__(*exc)


# Note [Fake CUDA guard]: on a CUDA build of torch where no device is available (a CPU-only
# host with the default Linux wheel), ``FakeTensorMode.__enter__`` installs a no-op CUDA device
# guard (``torch._C._ensureCUDADeviceGuardSet``) that the calling thread owns (a
# ``thread_local`` of c10) in c10's process-wide registry, once: when that thread exits, the
# next trace in another thread calls into the freed guard and the process crashes (torch
# 2.11+cu130: a thread's compile after another thread's). So before the first trace off the
# main thread, a daemon thread that waits for the rest of the process makes the first
# registration, which then lives as long as the process; a trace on the main thread registers
# the main thread's (it outlives the others), and a later registration changes nothing.
_GUARD_OWNER: list = []


def _own_fake_cuda_guard() -> None:
    """Note [Fake CUDA guard]."""
    if _GUARD_OWNER or threading.current_thread() is threading.main_thread() \
            or not torch.cuda._is_compiled() or torch.cuda.is_available():
        return
    ready = threading.Event()

    def owner():
        torch._C._ensureCUDADeviceGuardSet()
        ready.set()
        threading.Event().wait()  # (the guard is this thread's: it never exits)

    thread = threading.Thread(target=owner, name="trident-cuda-guard", daemon=True)
    thread.start()
    ready.wait()
    _GUARD_OWNER.append(thread)


def trace(fn: Callable, args: tuple, dynamic: dict[int, set[int]] | None = None,
          outputs: Callable | None = None, name: str | None = None,
          changed_rng: Callable[[], bool] | None = None, ones: dict | None = None,
          alike: dict | None = None, explore: bool = False) -> Capture | None:
    """Trace ``fn(*args)`` into a :class:`Capture` (``explore``: run it on fake tensors with no
    graph, and return None: Note [Writes probe] in frontend/tracing.py).

    ``dynamic``: {argument index: dims} traced as symbolic sizes (Note [Symbolic sizes]).
    ``outputs``: ``result -> (flat leaves, recipe or None)`` (``outputs.flatten_output``); by
    default results are tensors and scalars in tuples and lists. ``name``: the function's
    name in messages. ``ones``: dims of range >= 1, ``alike``: dims that share symbols
    (``_fake_args``). ``changed_rng``: whether the trace's own thread set a generator's state
    (``state.Recording.changed_rng``, which sees this thread's calls only); without it the
    states before and after decide.

    Raises:
        TridentError: the function cannot be traced (data-dependent control flow, tensors that
            are not arguments, outputs other than tensors, tuples, lists, None and scalars).
    """
    _own_fake_cuda_guard()
    name = name or getattr(fn, "__qualname__", repr(fn))
    holder: dict[str, Any] = {}
    mode = _SourceLines(pause)
    launches = _TritonLaunches(args, mode)
    reads = values.ValueReads(args, mode)  # Note [Value reads]

    def flat_forward(*flat_args):
        launches.bind_inputs(flat_args)
        reads.bind(flat_args)
        mode.rng = rng.generator_states() if changed_rng is None else None
        holder["fakes"] = tensor_attributes.watch(mode, flat_args, args)
        mode.inference = torch.is_inference_mode_enabled()  # Note [Inference mode inside]
        mode.in_user_code = True
        if hook is not None:  # Note [Unrecorded ops]: the function's own run is recorded
            sys.setprofile(hook)
        try:
            result = trace_writes.run_in_own_context(fn, flat_args)  # Note [Context variables]
        finally:
            mode.in_user_code = False
            if hook is not None:
                pause()
        if isinstance(result, types.CoroutineType):  # (dropped unawaited, it would warn
            result.close()  # "never awaited", which eager's call does not)
            raise TridentError(f"{name} returns a coroutine (an async def): its body runs "
                               "when awaited, after the call")
        recipe = None
        if outputs is not None:
            leaves, recipe = outputs(result)
        if recipe is None:
            leaves, spec = pytree.tree_flatten(result)
        else:
            spec = pytree.tree_flatten(tuple(leaves))[1]
        holder["spec"] = spec
        holder["leaves"] = leaves
        holder["recipe"] = recipe
        holder["requires_grad"] = any(isinstance(leaf, torch.Tensor) and leaf.requires_grad
                                      for leaf in leaves)
        return tuple(leaf for leaf in leaves if isinstance(leaf, _GRAPH_OUTPUTS))

    # Note [Unrecorded ops]: all but the function's own run is torch's and Trident's
    hook = pause()
    try:
        fake_args, shape_env = _fake_args(args, dynamic, ones, alike) if dynamic else (None, None)
        state = _global_state()
        grad = decompositions.INPUTS_REQUIRE_GRAD.set(any(
            isinstance(a, torch.Tensor) and a.requires_grad and not a.is_inference()
            for a in args))
        try:
            with fx_traceback.preserve_node_meta(), mode, launches, reads, \
                    decompositions.eager_decompositions(bool(dynamic)), rng.hooks(), \
                    config.trace_logs_to_trident(), module_calls_as_now(), \
                    torch.fx.experimental._config.patch(backed_size_oblivious=bool(ones)):
                # Fake mode either way: fake arguments with symbolic dims carry their own
                # FakeTensorMode and ShapeEnv, and Python scalars stay constants.
                if explore:  # (no proxies: torch's FakeTensorMode alone, as make_fx's)
                    from torch._subclasses.fake_tensor import FakeTensorMode

                    with FakeTensorMode(allow_non_fake_inputs=True) as fakes:
                        flat_forward(*(fakes.from_tensor(a) if isinstance(a, torch.Tensor)
                                       else a for a in args))
                else:
                    gm = make_fx(flat_forward, tracing_mode="fake", _allow_non_fake_inputs=True,
                                 _disable_torch_fn_metadata_mode=True)(*(fake_args or args))
                # (its TorchFunctionMode would call a patched torch function by its name:
                # Note [Patched torch functions] in source_lines.py)
        except TridentError as e:
            from trident.lower.guards import at_sources
            at_sources(e, fake_args)  # Note [Dims of a failed size expression] (dynamic.py)
            raise
        except Exception as e:  # make_fx reports unsupported Python as many exception types
            where = _innermost_user_line(e)
            what = (" (Python control flow or a Python number that depends on a tensor's values:"
                    f" a trace sees shapes, not values; no value check: {reads.why_not})"
                    if type(e).__name__ == "GuardOnDataDependentSymNode" else "")
            error = TridentError(f"cannot trace {name}{where}{what}: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            raise (transient(error) if _transient(e) else error) from e
        finally:
            decompositions.INPUTS_REQUIRE_GRAD.reset(grad)

        mode.refuse()  # Note [Python attributes of tensors] (caught by user code)
        changed = _changed(state, _global_state())
        if changed_rng is not None:  # this thread's calls decide the generators' (other threads
            moved = any(k in changed for k in ("rng", "cuda"))  # draw meanwhile)
            changed = [k for k in changed if k not in ("rng", "cuda")]
            if changed_rng() and moved:
                changed.append("rng")
            elif changed_rng():  # set and put back
                mode.rng_set = True
        if changed:  # Note [Global side effects] (global_state.py)
            _restore_global_state(state, changed)
            raise TridentError(f"{name} changes global torch state "
                               f"({', '.join(changed)}), which a compiled call would not replay")
        if mode.rng_set:  # Note [Global side effects]
            raise TridentError(f"{name} calls torch with the random generator in another state "
                               "that it puts back before returning (through a torch.Generator's "
                               "own methods), which a compiled call would not replay")
        if explore:
            return None
        if holder["requires_grad"]:
            raise TridentError(f"{name} returns a tensor that requires grad (made with "
                               "requires_grad=True or under torch.enable_grad()); Trident serves "
                               "inference")
        out_leaves = []
        for leaf in holder["leaves"]:
            if isinstance(leaf, _GRAPH_OUTPUTS):  # a tensor, or a scalar an op returned (.item())
                out_leaves.append(None)
            elif leaf is None or type(leaf) in (int, float, bool):
                out_leaves.append(("const", leaf))
            else:
                raise TridentError(f"{name} returns a {type(leaf).__name__}; expected "
                                   "tensors, tuples and lists of them, None, int, float or bool")
        out_spec = holder["spec"]
        if not plain_spec(out_spec):
            raise TridentError(f"{name} returns a {out_spec.type.__name__}; "
                               "expected tensors in tuples and lists")
        for node in list(gm.graph.nodes):
            # A small tensor the function makes from Python data (``y[i] = 0.5``,
            # ``torch.tensor(3)``, an index list ``x[[1, 2]]``: make_fx lifts it and copies it
            # with lift_fresh_copy) is baked into the plan. Any other tensor that is not an
            # argument (a global, a closure) is live state and must become an argument.
            if node.op != "get_attr":
                continue
            attr = getattr(gm, node.target)
            if not isinstance(attr, torch.Tensor):  # a while_loop body, a torch.Generator, ...
                where, text = source_line(node)
                raise TridentError(f"{name} uses a {type(attr).__name__} ({where}: {text}), which "
                                   "Trident does not compile (control-flow ops and generators run "
                                   "eagerly)")
            literal = attr.numel() <= _LITERAL_ELEMENTS and all(
                u.target is torch.ops.aten.lift_fresh_copy.default for u in node.users)
            if not literal:
                where, text = source_line(node)
                raise TridentError(f"{name} reads a tensor that is not an argument "
                                   f"({where}: {text}); pass it as an argument")
            if attr.numel() > 1 or attr.device.type != "cpu":
                if attr.dtype.is_complex or attr.is_quantized:
                    raise TridentError(f"{name} makes a {attr.dtype} tensor from Python data, "
                                       "which Trident does not compile")
                build_literal(gm.graph, node, attr)
        kernel_checks.check(gm, name)  # Note [Checks the fake kernels skip]
        scalar_reads = values.has_scalar_reads(gm)  # Note [Questions about read values]
        checks = values.checks_graph(gm, reads.reads)  # Note [Value reads]
        gm.recompile()
        return Capture(gm, out_spec, out_leaves, fake_args, shape_env, holder["recipe"],
                       mode.catching, tensor_attributes.looked_up(mode, holder["fakes"]),
                       checks, tuple(v for _, v in reads.reads), scalar_reads)
    finally:
        if hook is not None:
            sys.setprofile(hook)


# Literals of up to this many elements are baked into the plan (each element is a step).
_LITERAL_ELEMENTS = 64


def _transient(e: BaseException) -> bool:
    """Whether the trace's exception ``e`` says nothing lasting of the code and the call
    (``errors.transient``): the environment's (memory, the OS, the recursion limit), or raised
    by user code itself (its last frame is the user's)."""
    if environmental(e) or isinstance(e, torch.OutOfMemoryError):
        return True
    tb = traceback.extract_tb(e.__traceback__)
    return bool(tb) and frames.user_line_file(tb[-1].filename)


def _innermost_user_line(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    for frame in reversed(tb):
        if frames.user_line_file(frame.filename):
            return f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} ({frame.line})"
    return ""
