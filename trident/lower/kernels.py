"""Kernels: resolve a Triton launch at capture time and compile it for the target.

Capture (``resolve_launch``) peels ``@triton.autotune`` and ``@triton.heuristics`` down to the
``JITFunction``, binds the arguments to its parameters, fixes the config (autotuned on the GPU
with scratch tensors of the call's shapes, as Triton's own first call would; without a GPU, the
first config), evaluates the grid, and decides the alignment Triton's specialization will see
for each pointer (Note [Pointer alignment]).

Compile (``cubins.compile_cuda``) reproduces what ``JITFunction.run`` does on triton 3.6 (its binder,
``_pack_args`` and ``triton.compile``) for a given ``GPUTarget``, without needing a GPU: the
result is the cubin and the launch facts the generated C needs.

CPU tensors cannot run compiled kernels: ``interpreted_launcher`` runs the kernel through
Triton's interpreter (``triton.runtime.interpreter.InterpretedFunction``), called back from the
SCM and counted in ``stats.interpreted_launches``.

Note [Pointer alignment]: Triton compiles pointers whose address is divisible by 16 differently
(``tt.divisibility``). A tensor argument of the traced function is guarded on exactly that.
A view of it (``x[1:]``) is aligned when its root is and its extra byte offset is a multiple of
16; a fresh allocation is aligned (PyTorch's CPU and CUDA allocators align to at least 64 bytes).
Where the root is not aligned the kernel is compiled without the attribute, which is correct for
any address.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import threading
from typing import Any, Callable

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from trident.errors import TridentError, with_article
from trident.lower import state
from trident.lower.guards import guardable
from trident.ir.launch import (ConstexprParam, KernelRef, PreHook, ScalarParam, TensorParam,
                                 TritonLaunch)


def _triton():
    import triton  # noqa: F401  (imported lazily: capture of torch-only code never needs it)
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    return JITFunction, Autotuner, Heuristics


def _as_jit_function(fn):
    """``fn``, or for an ``InterpretedFunction`` (what ``@triton.jit`` makes under
    ``TRITON_INTERPRET=1``, triton 3.6) the ``JITFunction`` of the same Python function and
    options, made once: Trident compiles and interprets launches itself, as without the
    variable (Note [Interpreted kernels])."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, InterpretedFunction):
        return fn
    twin = fn.__dict__.get("_trident_jit_function")
    if twin is None:
        accepted = inspect.signature(JITFunction.__init__).parameters
        twin = JITFunction(fn.fn, **{k: v for k, v in fn.kwargs.items() if k in accepted})
        fn.__dict__["_trident_jit_function"] = twin
    return twin


# Note [Interpreted kernels]: ``TRITON_INTERPRET=1`` makes every ``@triton.jit`` an
# ``InterpretedFunction``, which Triton's interpreter runs on any tensors. Trident serves their
# launches as it serves a ``JITFunction``'s (``_as_jit_function``): through the interpreter
# callback on CPU tensors, compiled on CUDA ones. Its eager fallback leaves them to Triton, which
# is what eager PyTorch with that variable runs.


# Note [Pre-hooks]: an autotune config's ``pre_hook`` is Python that Triton runs before every
# launch of that config (``Autotuner.run``, triton 3.6). A CPU launch is a Python callback anyway
# (the interpreter), so it runs the hook first, with the arguments by name and the config's
# values, as Triton passes them. The hook is found again through the autotuner's global name in
# the kernel's module (an autotuner held elsewhere runs eagerly). A CUDA launch is C: such
# kernels run eagerly there.


_OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                 "launch_cooperative_grid", "launch_pdl")


def _scratch_like(t: torch.Tensor) -> torch.Tensor:
    """A real tensor with ``t``'s metadata (for autotuning on fake tensors), drawn from a
    private generator: the user's random state is not Trident's to advance (Note [Global side
    effects] in capture.py). The generator keeps the seed a new one has (c10's default seed,
    torch 2.11-2.13): a ``manual_seed`` call from here, a launch frame that the recording walks
    through (Note [Launch frames] in frames.py), would be taken for the function's."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    if out.is_floating_point():
        out.normal_(generator=torch.Generator(device=t.device))
    else:
        out.zero_()
    return out


def resolve_launch(kernel, grid, args: tuple, kwargs: dict, alignment: Callable,
                   pre_hooks: list | None = None) -> tuple:
    """Resolve ``kernel[grid](*args, **kwargs)`` at capture time.

    Args:
        alignment: ``fake tensor -> bool``, Note [Pointer alignment].
        pre_hooks: where given (real arguments), each autotune config ``pre_hook`` of the
            launch is appended to it, bound to its arguments; else the launch names the config
            (Note [Pre-hooks]).

    Returns:
        ``(jit_function, TritonLaunch, tensor_args)`` where ``tensor_args`` maps parameter name to the
        (fake) tensor passed for it.

    Raises:
        TridentError: an argument Trident cannot pass to a kernel (tensor descriptors, tensors
            of several devices), or an autotune pre-hook Trident cannot replay.
    """
    JITFunction, Autotuner, Heuristics = _triton()
    kwargs = dict(kwargs)
    options: dict[str, Any] = {k: kwargs.pop(k) for k in list(kwargs) if k in _OPTION_NAMES}
    fn = _as_jit_function(kernel)
    pre_hook = None
    if not isinstance(fn, JITFunction):
        # Note [Symbolic launches]: heuristics and autotuning choose constexprs and configs
        # from the values they see, so those values are fixed (guarded) first.
        args, kwargs = _specialized(args), _specialized(kwargs)
    while not isinstance(fn, JITFunction):
        if isinstance(fn, Heuristics):
            for name, heuristic in fn.values.items():
                kwargs[name] = heuristic({**dict(zip(fn.arg_names, args)), **kwargs})
        elif isinstance(fn, Autotuner):
            config = _pick_config(fn, grid, args, kwargs)
            if config.pre_hook is not None:  # Note [Pre-hooks]
                if pre_hooks is None:
                    pre_hook = _pre_hook_ref(fn, config)
                else:
                    nargs = {**dict(zip(fn.arg_names, args)), **kwargs, **config.all_kwargs()}
                    pre_hooks.append(functools.partial(config.pre_hook, nargs))
            kwargs.update(config.kwargs)
            for name in _OPTION_NAMES:
                value = getattr(config, name, None)
                if value is not None:
                    options[name] = value
        else:
            raise TridentError(f"unsupported Triton kernel wrapper {type(fn).__name__}")
        fn = _as_jit_function(fn.fn)
    names = [p.name for p in fn.params]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    for p in fn.params:
        if p.name not in bound:
            if not p.has_default:
                raise TridentError(f"{fn.__name__}: missing argument {p.name!r}")
            bound[p.name] = p.default
    params, tensors, devices = [], {}, set()
    for p in fn.params:
        value = bound[p.name]
        if isinstance(value, torch.Tensor):
            tensors[p.name] = value
            devices.add(str(value.device))
            params.append(TensorParam(p.name, str(value.dtype), bool(alignment(value))))
        elif p.is_constexpr:
            if isinstance(value, torch.SymInt):  # guards the value
                value = int(guardable(value, f"{fn.__name__}'s constexpr {p.name}"))
            params.append(ConstexprParam(p.name, _plain(value, fn, p)))
        elif isinstance(value, torch.SymInt) and not is_concrete_int(value):
            params.append(ScalarParam(p.name, _triton_int_class(value, fn, p), value))
        elif value is None or isinstance(value, (bool, int, float, torch.SymInt)):
            params.append(ScalarParam(p.name, int(value) if isinstance(value, torch.SymInt)
                                      else value))
        else:
            raise TridentError(f"{fn.__name__}: argument {p.name!r} is "
                               f"{with_article(type(value).__name__)}; Trident passes tensors, "
                               "ints, floats, bools and None to kernels")
    if len(devices) > 1:
        raise TridentError(f"{fn.__name__}: tensor arguments on several devices {sorted(devices)}")
    device = devices.pop() if devices else "cpu"
    if pre_hook is not None and device != "cpu":
        raise TridentError(f"{fn.__name__}: an autotune pre_hook before a launch on {device} "
                           "is not supported (it runs Python before every launch)")
    if device != "cpu":
        check_used_globals(fn)
    if callable(grid):
        grid = grid(bound)
    grid = [_grid_dim(g, fn) for g in tuple(grid)] + [1] * (3 - len(tuple(grid)))
    ref = KernelRef.of(fn)
    launch = TritonLaunch(fn.__name__, ref, tuple(params), tuple(grid), options, device,
                          pre_hook)
    return fn, launch, tensors


def check_used_globals(fn) -> None:
    """What triton 3.6's ``JITFunction.run`` checks before a compiled launch (runtime/jit.py):
    the globals the kernel's code reads (``used_global_vals``: deep copies taken when its
    ``cache_key`` is first computed, at the first launch in the process) still equal their
    values. A launch on a GPU does as Triton does; the interpreter (CPU tensors) checks nothing.

    Raises:
        RuntimeError: Triton's own, ``Global variable NAME has changed since we compiled this
            kernel, from OLD to NEW``; the eager call that follows raises it too."""
    fn.cache_key  # noqa: B018 (takes the copies, once, as Triton's first launch does)
    absent = object()
    for (name, _), (value, scope) in getattr(fn, "used_global_vals", {}).items():
        if (now := scope.get(name, absent)) != value:
            raise RuntimeError(f"Global variable {name} has changed since we compiled this "
                               f"kernel, from {value} to {now}")


# Note [Symbolic launches]: in a trace with dynamic dims (Note [Symbolic sizes] in plan.py) a
# kernel's int argument or grid may be an expression over argument sizes (``n_rows =
# x.shape[0]``, ``triton.cdiv(n, BLOCK)``). The SCM computes it in C at each call, and the kernel
# is compiled once for the traced value's specialization class. triton 3.6's binder compiles an
# int differently when it equals 1 (a constexpr), when it is divisible by 16 (``tt.divisibility``)
# and by its type (i32 in [-2**31, 2**31), else i64/u64), so the trace asks the ShapeEnv each of
# those questions: the answers become guards (Note [Symbolic guards]) and a call whose value falls
# in another class misses. Constexprs, and every argument of an autotuned or heuristics kernel,
# are fixed to their value instead.


def _triton_int_class(value: "torch.SymInt", fn, p) -> int:
    """The traced value of a symbolic int argument, its Triton specialization class guarded."""
    if not (bool(value >= -2 ** 31) and bool(value < 2 ** 31)):
        raise TridentError(f"{fn.__name__}: argument {p.name!r} = {value} needs 64 bits; "
                           "symbolic kernel arguments are 32-bit")
    if not bool(value == 1):
        bool(value % 16 == 0)
    return int(value.node.hint)


def _grid_dim(g, fn):
    if isinstance(g, torch.SymInt) and not is_concrete_int(g):
        if not (bool(g >= 0) and bool(g < 2 ** 31)):
            raise TridentError(f"{fn.__name__}: grid dim {g} out of [0, 2**31)")
        return g
    return int(g)


def _specialized(values):
    """``values`` (a tuple or dict) with each SymInt replaced by its guarded value."""
    fix = lambda v: int(v) if isinstance(v, torch.SymInt) else v  # noqa: E731
    if isinstance(values, dict):
        return {k: fix(v) for k, v in values.items()}
    return tuple(fix(v) for v in values)


def _plain(value, fn, p):
    """A constexpr as JSON (``_constexpr`` makes the object again)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    JITFunction, _, _ = _triton()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, tl.dtype):  # OUT=tl.float16
        return {"triton_dtype": value.name}
    if isinstance(value, (JITFunction, InterpretedFunction)):  # ACT=a @triton.jit function
        return {"triton_function": KernelRef.of(value).to_json()}
    raise TridentError(f"{fn.__name__}: constexpr {p.name!r} is "
                       f"{with_article(type(value).__name__)}")


def _constexpr(value, jit_fn):
    """The object a constexpr's JSON (``_plain``) stands for; ``@triton.jit`` functions are
    found from the kernel's own module first."""
    import triton.language as tl

    if isinstance(value, str) and value.startswith("torch."):
        return getattr(torch, value[len("torch."):])
    if isinstance(value, dict) and "triton_dtype" in value:
        return tl.dtype(value["triton_dtype"])
    if isinstance(value, dict) and "triton_function" in value:
        return find_kernel(KernelRef(**value["triton_function"]), jit_fn.fn)
    return value


def _pre_hook_ref(autotuner, config) -> PreHook:
    """Note [Pre-hooks]: where ``config`` of ``autotuner`` can be found in another process."""
    inner = autotuner
    while not isinstance(inner, _triton()[0]):
        inner = _as_jit_function(inner.fn)
    module = inner.fn.__module__
    names = [name for name, value in vars(importlib.import_module(module)).items()
             if value is autotuner]
    if len(names) != 1:
        raise TridentError(f"{autotuner.base_fn.__name__}: an autotune pre_hook runs only where "
                           f"the autotuner is a global of {module}")
    return PreHook(module, names[0], autotuner.configs.index(config))


def _find_pre_hook(ref: PreHook) -> Callable:
    autotuner = getattr(importlib.import_module(ref.module), ref.name, None)
    configs = getattr(autotuner, "configs", None) or ()
    if ref.config >= len(configs) or configs[ref.config].pre_hook is None:
        raise TridentError(f"cannot find the autotune pre_hook {ref.module}.{ref.name}"
                           f".configs[{ref.config}]")
    return configs[ref.config]


def _pick_config(autotuner, grid, args: tuple, kwargs: dict):
    """The autotuner's config for this call: benchmarked on the GPU, else its first config."""
    if len(autotuner.configs) == 1:
        return autotuner.configs[0]
    fakes = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    if not fakes or not all(t.is_cuda for t in fakes) or not torch.cuda.is_available():
        return autotuner.configs[0]
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    # (Triton's benchmarking and its compile's cache writes are the autotuner's, not the
    # function's: the state recording does not see them, Note [Launch frames] in frames.py)
    with unset_fake_temporarily(), disable_proxy_modes_tracing(), state.unrecorded():
        real_args = tuple(_scratch_like(a) if isinstance(a, torch.Tensor) else a for a in args)
        real_kwargs = {k: _scratch_like(v) if isinstance(v, torch.Tensor) else v
                       for k, v in kwargs.items()}
        autotuner.run(*real_args, grid=grid, warmup=False, **real_kwargs)
        torch.cuda.synchronize()
    return autotuner.best_config


def find_kernel(ref: KernelRef, scope: Callable | None = None):
    """The ``JITFunction`` a stored launch names: from ``scope``'s globals and closure (the
    jitted function's own), else by importing ``ref.module``."""
    JITFunction, _, _ = _triton()

    def candidates():
        if scope is not None:
            yield from scope.__globals__.values()
            for cell in scope.__closure__ or ():
                try:
                    yield cell.cell_contents
                except ValueError:
                    pass
        module = importlib.import_module(ref.module)
        obj = module
        for part in ref.qualname.split("."):
            obj = getattr(obj, part, None)
        yield obj

    for obj in candidates():
        for _ in range(8):  # Autotuner(Heuristics(JITFunction)) and the like
            obj = _as_jit_function(obj)
            if obj is None or isinstance(obj, JITFunction) or not _has_fn(obj):
                break
            obj = obj.fn
        if isinstance(obj, JITFunction) and ref.names(obj):  # Note [Kernels of one name]
            return obj
    raise TridentError(f"cannot find Triton kernel {ref.module}.{ref.qualname}")


def _has_fn(obj) -> bool:
    """``hasattr(obj, "fn")`` (a kernel wrapper), for any global: an object whose
    ``__getattr__`` raises another error than AttributeError has none."""
    try:
        return hasattr(obj, "fn")
    except Exception:  # noqa: BLE001 (the object's own error for a name it lacks)
        return False


def interpreted_launcher(jit_fn, launch: TritonLaunch, on_launch: Callable[[], None]) -> Callable:
    """A callback that runs the launch through Triton's interpreter on CPU tensors.

    The SCM calls it with the launch's tensor and scalar arguments in parameter order, then
    the grid's three dims (the constexprs are fixed here).
    """
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = InterpretedFunction(jit_fn.fn)
    runtime_names = [p.name for p in launch.params if not isinstance(p, ConstexprParam)]
    constexprs = {p.name: _constexpr(p.value, jit_fn) for p in launch.params
                  if isinstance(p, ConstexprParam)}
    options = {k: v for k, v in launch.options.items() if k in ("num_warps", "num_stages")}
    config = _find_pre_hook(launch.pre_hook) if launch.pre_hook else None

    def run(*values):  # the runtime arguments, then the three grid dims
        on_launch()
        if config is not None:  # Note [Pre-hooks]
            config.pre_hook({**dict(zip(runtime_names, values[:-3])), **constexprs,
                             **config.all_kwargs()})
        with _helpers_interpreted():
            interpreted[tuple(values[-3:])](**dict(zip(runtime_names, values[:-3])),
                                            **constexprs, **options)

    return run


_HOOK = threading.local()  # this thread's launch hook (launch_hook)
_ORIGINAL_GETITEM: list = []  # Triton's own KernelInterface.__getitem__, once replaced


@contextlib.contextmanager
def launch_hook(hook: Callable):
    """While active in this thread, ``kernel[grid]`` returns ``hook(kernel, grid, original)``
    (``original``: Triton's own ``__getitem__``).

    Triton's ``KernelInterface.__getitem__`` (the base of ``JITFunction``, ``Autotuner`` and
    ``Heuristics`` in triton 3.6) is replaced once per process by a dispatcher that reads a
    thread-local hook, so capture in one thread and an eager call in another never undo each
    other's patch; without a hook it is Triton's own.
    """
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:
        yield
        return
    if not _ORIGINAL_GETITEM:
        original = KernelInterface.__getitem__
        _ORIGINAL_GETITEM.append(original)

        def getitem(kernel, grid):
            current = getattr(_HOOK, "fn", None)
            return original(kernel, grid) if current is None else current(kernel, grid,
                                                                          original)

        KernelInterface.__getitem__ = getitem
    previous = getattr(_HOOK, "fn", None)
    _HOOK.fn = hook
    try:
        yield
    finally:
        _HOOK.fn = previous


def cpu_launches_interpreted():
    """While active, ``kernel[grid](...)`` on CPU tensors runs through Triton's interpreter.

    For the eager fallback: a function Trident serves with its CPU launches interpreted must
    run eagerly the same way, where a plain launch would fail for want of a GPU driver
    (triton 3.6: "0 active drivers"). Launches on other devices run as Triton runs them.
    """

    traced = getattr(_HOOK, "fn", None)  # Note [Nested jitted calls] in frames.py: a trace's

    def hook(kernel, grid, original):
        from torch._subclasses.fake_tensor import is_fake
        from triton.runtime.interpreter import InterpretedFunction

        if traced is not None:  # (a jitted function run eagerly inside another's trace: its
            return traced(kernel, grid, original)  # launches are the trace's)
        launch = original(kernel, grid)
        inner = kernel
        while not isinstance(inner, InterpretedFunction) and _has_fn(inner):
            inner = inner.fn
        if isinstance(inner, InterpretedFunction):  # Note [Interpreted kernels]: as eager
            return launch

        def run(*args, **kwargs):
            tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
            if not tensors or any(t.device.type != "cpu" or is_fake(t) for t in tensors):
                return launch(*args, **kwargs)
            pre_hooks: list = []
            jit_fn, resolved, named = resolve_launch(kernel, grid, args, kwargs, lambda t: True,
                                                     pre_hooks)
            values = [named[p.name] if isinstance(p, TensorParam) else p.value
                      for p in resolved.params if not isinstance(p, ConstexprParam)]
            for hook in pre_hooks:
                hook()
            interpreted_launcher(jit_fn, resolved, lambda: None)(*values, *resolved.grid)
        return run

    return launch_hook(hook)


@contextlib.contextmanager
def _helpers_interpreted():
    """Let an interpreted kernel call other ``@triton.jit`` functions.

    Under ``TRITON_INTERPRET=1`` every ``@triton.jit`` is an ``InterpretedFunction``; here only
    the launched kernel is, so while it runs, calling a ``JITFunction`` (a device helper) runs
    that helper's interpreted form, as the interpreter's own ``InterpretedFunction.__call__``
    does (triton 3.6).
    """
    from triton.runtime.interpreter import InterpretedFunction, _patch_lang
    from triton.runtime.jit import JITFunction

    original = JITFunction.__call__
    helpers: dict = {}

    def call(helper, *args, **kwargs):
        # keyed by id: hashing a JITFunction computes its cache key, which rejects the
        # interpreter's patched tl.reduce
        if id(helper) not in helpers:
            helpers[id(helper)] = InterpretedFunction(helper.fn)
        interpreted = helpers[id(helper)]
        scope = _patch_lang(helper.fn)  # what InterpretedFunction.__call__ does, undone after
        try:
            return interpreted.rewrite()(*args, **kwargs)
        finally:
            scope.restore()

    JITFunction.__call__ = call
    try:
        yield
    finally:
        JITFunction.__call__ = original

