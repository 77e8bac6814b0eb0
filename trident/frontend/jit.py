"""``@trident.jit``: the public API of a compiled function, and the JitFunction class it makes.

A ``JitFunction`` *is* a native ``Dispatcher`` (runtime/dispatcher.cpp): calling it enters C
directly. Its Python methods run only when the installed Specialization Cache Module reports a
miss, on the first call of a process (to load the cached module), or for keyword arguments. This
file holds
``jit()``, ``Stats``, the class's assembly and its public methods (``stats``, ``explain``,
``source``, ``mlir``); the methods the dispatcher calls come from the miss policy (policy.py),
the tracer (tracing.py), the installer (install.py) and the graph controller (graphs.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import warnings
from typing import Callable

import torch

from trident import config, runtime
from trident.codegen import render as codegen
from trident.errors import TridentError
from trident.frontend import graphs
from trident.frontend.cache import FunctionCache
from trident.frontend.graphs import GraphControl
from trident.frontend.install import Installer, _int_leaves_of
from trident.frontend.eager import _eager_decision
from trident.frontend.policy import MissPolicy
from trident.frontend.tracing import Tracer
from trident.ir.specialization import Specialization
from trident.ir.trees import ArgTree
from trident.lower import state


@dataclasses.dataclass
class Stats:
    """Counters of one ``@trident.jit`` function (per process).

    Attributes:
        hits: calls served by the native hit path, and calls that waited for another
            thread's compile and then ran the specialization it installed (Note [Miss
            counts] in policy.py).
        misses: every other call that bound to the parameters (``hits + misses`` is the
            calls): one no specialization's guards accepted (it compiles; or installs one
            stored for the same code by an earlier process or another ``trident.jit`` object
            of the function, counted in neither ``compiles`` nor ``fallbacks``; or runs
            eagerly), or
            one whose specialization's step failed before it changed anything (it runs
            eagerly: Note [Errors inside try] in trident/lower/source_lines.py).
        compiles: specializations traced and compiled in this process.
        fallbacks: misses run by eager PyTorch (unsupported input or code, autograd, limit).
        traces: times the function was traced (``compiles`` plus failed attempts).
        interpreted_launches: Triton launches on CPU tensors, run through Triton's interpreter
            by a callback from the SCM (the only Python on a hit).
        graph_captures: CUDA graphs captured (Note [CUDA graphs] in trident/frontend/graphs.py).
        graph_replays: hits served by replaying a CUDA graph (counted in the SCM).
        miss_reasons: one entry per miss, the last ``min(misses, 32)`` in call order (Note
            [Miss counts] in policy.py): for one that compiled, the first guard or argument
            path each specialization failed, e.g. ``"x.size(0) == 4 expected, got 8
            (specialization 0)"`` (``"first call"`` for the first); for one that ran eagerly,
            why (``"eager: ..."``).
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


class JitFunctionMixin(MissPolicy, Tracer, Installer, GraphControl):
    """Python methods of a JitFunction; the native base class supplies ``__call__``. The
    public ones are here; the native dispatcher calls ``_slow_path``, ``_tree_miss`` and
    ``_eager_path`` (policy.py) and ``_capture_path`` (graphs.py) by name."""

    __slots__ = ()  # instance state lives in the Dispatcher's __dict__

    _constant_self = False  # backend.py: a GraphModule's forward, keyed by its code

    def __getattr__(self, name: str):
        """Only for a name the JitFunction lacks. Raises AttributeError; where it wraps a module
        that has ``name`` (``trident.jit(model).generate``), the message says what to jit
        instead: a JitFunction of a module is its forward, not the module."""
        module = vars(self).get("_fn")
        if isinstance(module, torch.nn.Module) and not name.startswith("__") and \
                hasattr(module, name):
            raise AttributeError(
                f"'JitFunction' object has no attribute {name!r}: trident.jit("
                f"{type(module).__name__}) compiles the module's forward only; to keep the "
                f"module's own {name}, jit its forward: model.forward = "
                "trident.jit(model.forward) (docs/huggingface.md)")
        raise AttributeError(f"'JitFunction' object has no attribute {name!r}")

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
        # Note [Classes of one name] (install.py): the first tree of each key, the keys made
        self._first_trees: dict[int, ArgTree] = {}
        self._process_trees: set[int] = set()
        self._max_specializations = max_specializations or config.max_specializations()
        self._fallback = fallback
        self._cuda_graphs = config.cuda_graphs() if cuda_graphs is None else cuda_graphs
        self._dynamic = dynamic
        self._graph_states = graphs.GraphStates(  # Note [CUDA graphs]
            self._cuda_graphs, cuda_graph_sizes or config.cuda_graph_sizes())
        self._counters = Stats()
        self._specs: list[Specialization] = []
        self._pending: list[Specialization] = []  # Note [Installing on demand] (install.py)
        self._stored_order: list[Specialization] = []  # (their order)
        # Note [Eager decisions]: (tree key, guards, why) of signatures that failed to compile;
        # per tree, why its last eager call ran eagerly and a test that a call still does
        self._eager_signatures: list[tuple[int, list, str]] = []
        self._eager_trees: dict[int, tuple[str, Callable[[tuple], bool]]] = {}
        # Note [Unflattenable values] in lower/flatten.py: {steps: why} of values no tree holds
        self._unflattenable: dict[tuple, str] = {}
        self._cache: FunctionCache | None = None
        self._defaults_bound: tuple = ()  # (__defaults__, __kwdefaults__) the binding has
        self._state: state.StateTree | None = None  # what the installed specializations read
        self._state_reads = {}.keys()  # (its chains, as JSON: install.py)
        self._load_reason = "first call"
        self._state_rejected: str | None = None  # stored ones the state turned away (install.py)
        self._dynamic_failed = False
        self._static_dims: dict[str, frozenset[int]] = {}  # Note [Dims of a failed size
        # expression] in dynamic.py: by leaf path
        self._int_leaves: frozenset[str] = frozenset()  # Note [Int leaves] in policy.py
        self._read_floats: frozenset[str] = frozenset()  # Note [Float leaves], policy.py
        self._free_orders: frozenset[str] = frozenset()  # Note [Dict orders], lower/orders.py
        self._varied_ints: frozenset[str] = frozenset()  # Note [Ints by path] in ints.py
        self._graph_dims: dict[str, frozenset[int]] = {}  # Note [Graph dims] in backend.py
        self._int_trees: dict[int, set[int]] = {}  # tree key: the trees it generalized
        self._written_ints: frozenset[str] = frozenset()  # Note [Batch dims], the last trace's
        self._written_lengths: dict[int, set[int]] = {}  # Note [Lengths of written state]
        self._written_dims: dict[str, frozenset[int]] = {}  # (the same Note: by path)
        self._stored_lengths: dict[str, frozenset[int]] = {}  # (the same Note: exact trace)
        self._capacities: frozenset[str] = frozenset()  # Note [Capacities of written state]
        self._capacities_failed = False  # (the same Note: tried once per function)
        self._rendered: dict[str, codegen.Rendered] = {}  # installed ones rendered (modules.py)
        self._modules: dict[str, types.ModuleType] = {}  # their modules, in guard order
        self._module_names: dict[str, str] = {}  # by Specialization.key (Note [Pruning])
        self._callback_ids: dict[tuple[str, int], int] = {}
        self._warned_reasons: set[str] = set()
        self._left_out = None  # Note [Specialization limit]: (cache, stored specs not installed)
        self._limit_serial: int | None = None  # Note [Specialization limit]: its owner's

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
        self._install_pending()
        return [s.signature for s in self._specs]

    def explain(self, *args, **kwargs) -> str:
        """Which specialization a call with ``args`` and ``kwargs`` would run, or why each one
        rejects it: the first argument path whose structure differs from the one it was
        compiled for, or its failing guards (the first four, in guard order). Each
        specialization is named by its index and its signature's first 120 characters (a
        Hugging Face ``forward``'s is many hundred: ``specializations`` has them whole).

        Raises:
            TypeError: the arguments do not bind to the function's parameters.
            TridentError: an argument Trident cannot flatten (its path and type named)."""
        call = self._flatten(args, kwargs)
        self._ensure_loaded()
        self._install_pending()
        lines = []
        for i, spec in enumerate(self._specs):
            why = self._why_not(spec, self._with_leaves_of(spec, call), every=True)
            named = spec.signature if len(spec.signature) <= 120 else spec.signature[:117] + "..."
            if why is None:
                return f"specialization {i} ({named}) accepts these arguments"
            lines.append(f"specialization {i} ({named}): {why}")
        eager = _eager_decision(call, self._eager_signatures)
        if eager is not None:
            lines.append(f"runs eagerly: {eager[0]}")
        return "\n".join(lines) or "no specializations yet"

    def _with_leaves_of(self, spec, call):
        """``call`` flattened with ``spec``'s int leaves, as the miss path does (Note [Stored
        int leaves] in install.py): a stored specialization's ints are leaves in this process's
        tree (a static cache's capacity: Note [Capacities of written state] in ints.py)."""
        try:
            return self._keyed(self._flattened(call.args, call.kwargs, _int_leaves_of(spec)))
        except (TypeError, TridentError):
            return call

    def _select(self, *args, **kwargs) -> int:
        """The specialization the native dispatcher runs for this call, or -1 (for tests)."""
        self._ensure_loaded()
        self._install_pending()
        try:
            call = self._flatten(args, kwargs)
        except TridentError:  # an argument no tree can hold: the call runs eagerly
            return -1
        return self._installed_match(call)

    def source(self) -> str:
        """The C source of the installed specializations' modules, in guard order (one module
        per specialization: Note [Incremental modules] in build.py); a render it makes is
        not a compile stage (Note [Compile stages] in trident/config.py)."""
        self._ensure_loaded()
        self._install_pending()
        return "\n".join(self._render(s, stage=False).source for s in self._specs)

    def mlir(self, *args, **kwargs) -> str:
        """The Torch-MLIR module (``torch`` dialect) Trident builds for a call."""
        from trident.lower.importer import import_graph  # Note [Lazy Torch-MLIR] in compiler.py

        call = self._flatten(args, kwargs)
        module = import_graph(self._trace(call, {}).graph_module).module
        return module.operation.get_asm(enable_debug_info=True)


@functools.cache
def jit_function_class() -> type:
    """``JitFunction``: the native Dispatcher with ``JitFunctionMixin``'s methods (built on first
    use); an
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


# Note [Binding]: a JitFunction binds as what it wraps does. One over a function, in a class body,
# binds ``self`` as the function would (the native Dispatcher's ``tp_descr_get``; the stand-in
# without a runtime alike); one over a bound method or a module binds nothing, as they do not:
# placed on a class (``F.c = trident.jit(C.c)``, ``Wrapper.model = trident.jit(model)``),
# ``obj.c(x)`` calls it with ``x`` alone, as eager calls the method or module (an extra
# ``obj`` made the call raise TypeError).
@functools.cache
def _unbinding_class() -> type:
    """``JitFunction`` for a bound method or a module (Note [Binding])."""
    return type("JitFunction", (jit_function_class(),), {
        "__module__": "trident", "__slots__": (), "__get__": lambda self, obj, owner=None: self})


class _EagerDispatcher:
    """The native ``Dispatcher``'s interface (runtime/dispatcher.cpp) without a runtime: every call
    runs the function eagerly and counts a fallback."""

    hits = 0

    def __get__(self, obj, owner=None):  # Note [Binding]
        return self if obj is None else types.MethodType(self, obj)

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

    def _reset_graphs(self, n: int, previous: tuple = ()) -> None:
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
            flattened into leaves (Note [Argument trees] in trident/lower/flatten.py): tensors
            and scalars in tuples, lists, dicts and namedtuples, and any object's ``__dict__``
            (a module's parameters and buffers, a transformers ``StaticCache``) are read on
            every call; an object's other attributes are guarded by value or identity.
            ``@trident.jit`` on a method in a class body binds ``self`` like a function.
        max_specializations: bound on the specializations this function compiles in a process
            (counted over every ``trident.jit`` of the same function and owner: a method's or
            module's instance) and installs at once (default 16, or ``TRIDENT_MAX_SPECIALIZATIONS``); past it
            new signatures run eagerly, with one warning (Note [Specialization limit] in
            trident/frontend/policy.py).
        fallback: when ``fn`` cannot be compiled for a signature (an unsupported op or
            construct), run it eagerly with a warning (True) or raise ``TridentError`` (False).
        cuda_graphs: replay a CUDA graph of each CUDA specialization from its second call on
            (Note [CUDA graphs] in trident/frontend/graphs.py: when it applies, what it
            costs). Default: ``TRIDENT_CUDA_GRAPHS``, on unless set to ``0``.
        cuda_graph_sizes: how many sizes of a symbolic (dynamic) specialization get a CUDA
            graph, each captured on the second call of its size (Note [Graphs per size] in
            trident/frontend/graphs.py); calls of other sizes run step by step. Default:
            ``TRIDENT_CUDA_GRAPH_SIZES``, else 64.
        dynamic: which tensor dims are symbolic sizes (Note [Automatic dynamic] in
            trident/frontend/dynamic.py; docs/dynamic-shapes.md). ``None`` (default):
            automatic, a dim becomes dynamic when a call misses only because its size
            changed. ``True``: every dim from the first call. ``False``: never. A dict
            ``{"argument name": [dims]}``: those dims from the first call, others automatic.

    Returns:
        A ``JitFunction``: call it like ``fn``; ``.stats``, ``.explain(*args)``,
        ``.source()`` and ``.mlir(*args)`` describe what it compiled.

    Raises:
        TridentError: ``fn`` is not a Python function, method or ``nn.Module`` whose
            ``forward`` is one (the cache key hashes its code); ``max_specializations`` or
            ``cuda_graph_sizes`` is not an int >= 1; ``dynamic`` is malformed.
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
    obj = (jit_function_class() if isinstance(fn, types.FunctionType) else _unbinding_class())()
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
    for name, value in (("max_specializations", max_specializations),
                        ("cuda_graph_sizes", cuda_graph_sizes)):
        if value is not None and not (type(value) is int and value >= 1):
            raise TridentError(f"trident.jit: {name} must be an int >= 1, got {value!r}")
    obj._setup(fn, max_specializations, fallback, cuda_graphs, dynamic, cuda_graph_sizes)
    return obj
