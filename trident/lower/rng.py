"""Random state as steps of the plan.

Note [Random state steps]: eager PyTorch draws random numbers from one default generator per
device, which a function may seed (``torch.manual_seed``), save (``torch.get_rng_state``) and
restore (``torch.set_rng_state``) around its draws: OpInfo's ``wrapper_set_seed``
(``freeze_rng_state`` + ``torch.manual_seed(42)``), ``torch.random.fork_rng``. Those are Python
functions over ``torch._C.Generator`` objects, which no dispatcher and no mode sees: a trace
would run them once, on the real generators, and the plan would not. While tracing, ``hooks``
puts them in the graph instead, as the runtime's operators (runtime/operators.cpp):

========================================  ==============================================
``torch.manual_seed(s)``                  ``trident::manual_seed(s)``: every CUDA device's
                                          generator, then the CPU's
``torch.get_rng_state()``                 ``trident::get_rng_state(cpu)``
``torch.set_rng_state(t)``                ``trident::set_rng_state(t, cpu)``
``torch.cuda.manual_seed(s)``             ``trident::manual_seed(s, cuda)`` (the current device)
``torch.cuda.manual_seed_all(s)``         ``trident::manual_seed(s, cuda:i)`` for each device
``torch.cuda.get_rng_state(d)``           ``trident::get_rng_state(cuda:d)``
``torch.cuda.set_rng_state(t, d)``        ``trident::set_rng_state(t, cuda:d)``
========================================  ==============================================

so the plan seeds, saves and restores the default generators where the function did, on every
call: the random ops in between draw what eager draws, and the caller's generators end in the
state eager leaves (``fork_rng`` and ``get_rng_state_all`` are made of these). The functions are
replaced on the ``torch``, ``torch.random``, ``torch.cuda`` and ``torch.cuda.random`` modules
only while a trace runs, and act only in the tracing thread (elsewhere they are torch's own).

Run eagerly instead (the trace raises ``TridentError``): ``torch.seed()``,
``torch.initial_seed()`` and their CUDA twins (a seed from the OS, a value no guard keeps); any
of the others than ``torch.get_rng_state`` and ``torch.set_rng_state`` while CUDA is available
but not initialized (torch seeds CUDA lazily, in a queue it runs at initialization) or while an
MPS, XPU or MTIA device or a custom backend is present (whose generators ``torch.manual_seed``
seeds too). A specialization with these steps is installed from
the cache only where the same holds (``installable``). A call of a ``torch.Generator``'s own
methods (``torch.default_generator.manual_seed(0)``) runs for real in the trace; the trace sees
the state change and the function runs eagerly (Note [Global side effects] in global_state.py), and
one that reads (``initial_seed()``) runs eagerly (``_impure_name`` in state/recording.py).
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from trident.errors import TridentError
from trident.ir.operands import Device
from trident.ir.plan import OpCall

OPS = ("trident::manual_seed", "trident::get_rng_state", "trident::set_rng_state")
_CPU_NAMES = ("manual_seed", "get_rng_state", "set_rng_state", "seed", "initial_seed")
_CUDA_NAMES = _CPU_NAMES + ("manual_seed_all", "seed_all")
_UNKEPT = ("seed", "seed_all", "initial_seed")  # no guard keeps what they return or set
_CPU_ONLY = {("cpu", "get_rng_state"), ("cpu", "set_rng_state")}  # compiled wherever

_LOCAL = threading.local()
_LOCK = threading.Lock()
_ACTIVE: list = []  # traces running in any thread while the functions are replaced
_ORIGINALS: dict = {}  # (module, name) -> torch's function


def why_eager() -> str | None:
    """Why this process cannot compile the random state calls (Note [Random state steps]), or
    None."""
    if torch.cuda.is_available() and not torch.cuda.is_initialized():
        return "CUDA is available but not initialized (torch seeds CUDA lazily)"
    for name in ("mps", "xpu", "mtia"):
        module = getattr(torch, name, None)
        if module is not None and getattr(module, "device_count", lambda: 0)() > 0:
            return f"an {name} device is present, whose generators torch.manual_seed seeds too"
    if hasattr(torch, torch._C._get_privateuse1_backend_name()):
        return "a custom device backend is present, whose generators torch.manual_seed seeds too"
    return None


def installable(plan) -> bool:
    """Whether a stored plan's random state steps can run in this process (Note [Random state
    steps]): those that seed, or act on a CUDA generator, only where ``why_eager`` is None."""
    return why_eager() is None or not any(
        isinstance(step, OpCall) and (step.op == "trident::manual_seed" or (
            step.op in OPS and isinstance(step.args[-1], Device) and step.args[-1].type == 1))
        for step in plan.steps)


@contextlib.contextmanager
def hooks():
    """While active, the random state functions called in this thread are steps of the trace
    (Note [Random state steps])."""
    import torch._dynamo  # noqa: F401 - it wraps torch.manual_seed once, when imported
    import torch.cuda.random

    from trident import runtime

    runtime.operators()
    with _LOCK:
        if not _ACTIVE:
            for modules, names, device in (((torch.random, torch), _CPU_NAMES, "cpu"),
                                           ((torch.cuda.random, torch.cuda), _CUDA_NAMES, "cuda")):
                for module in modules:
                    for name in names:
                        original = _ORIGINALS[(module, name)] = getattr(module, name)
                        setattr(module, name, _replacement(original, device, name))
        _ACTIVE.append(None)
    previous, _LOCAL.why = getattr(_LOCAL, "why", None), why_eager() or ""
    try:
        yield
    finally:
        _LOCAL.why = previous
        with _LOCK:
            _ACTIVE.pop()
            if not _ACTIVE:
                for (module, name), original in _ORIGINALS.items():
                    setattr(module, name, original)
                _ORIGINALS.clear()


def _replacement(original, device: str, name: str):
    @functools.wraps(original)
    def call(*args, **kwargs):
        why = getattr(_LOCAL, "why", None)
        if why is None:  # not tracing in this thread
            return original(*args, **kwargs)
        if device == "cuda" and not torch.cuda.is_available():
            return original(*args, **kwargs)  # eager's error, or nothing (a seed is ignored)
        spelled = f"torch{'.cuda' if device == 'cuda' else ''}.{name}()"
        if name in _UNKEPT:
            raise TridentError(f"{spelled} returns or sets a seed that no guard keeps")
        if why and (device, name) not in _CPU_ONLY:
            raise TridentError(f"{spelled} is not compiled: {why}")
        return _STEPS[device, name](*args, **kwargs)
    return call


@contextlib.contextmanager
def _traced():
    """``freeze_rng_state`` reads and restores the state under ``no_dispatch()``, so that modes
    do not see it; the call is still the function's, so the trace's modes are let in."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    for key in ("PythonTLSSnapshot", "PreDispatch"):
        keys = keys | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                         torch._C._dispatch_tls_local_exclude_set() - keys):
        yield


def _seed(seed) -> int:
    seed = int(seed)
    if not -2 ** 63 <= seed < 2 ** 64:
        raise TridentError(f"seed {seed} is out of range")  # eager raises its own error
    return seed - 2 ** 64 if seed >= 2 ** 63 else seed  # the same 64 bits


def _cuda_device(device) -> torch.device:
    """torch.cuda.random's reading of a ``device`` argument (no index: the current device)."""
    if isinstance(device, str):
        device = torch.device(device)
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    return torch.device("cuda", device.index) if device.index is not None else torch.device("cuda")


def _state(state):
    if not isinstance(state, torch.Tensor):
        raise TridentError(f"a random state that is a {type(state).__name__}")  # eager: TypeError
    return state


def _manual_seed(seed):
    with _traced():
        torch.ops.trident.manual_seed(_seed(seed))
    return torch.default_generator


def _get_rng_state():
    with _traced():
        return torch.ops.trident.get_rng_state(torch.device("cpu"))


def _set_rng_state(new_state):
    with _traced():
        torch.ops.trident.set_rng_state(_state(new_state), torch.device("cpu"))


def _cuda_manual_seed(seed):
    with _traced():
        torch.ops.trident.manual_seed(_seed(seed), torch.device("cuda"))


def _cuda_manual_seed_all(seed):
    seed = _seed(seed)
    with _traced():
        for i in range(torch.cuda.device_count()):
            torch.ops.trident.manual_seed(seed, torch.device("cuda", i))


def _cuda_get_rng_state(device="cuda"):
    with _traced():
        return torch.ops.trident.get_rng_state(_cuda_device(device))


def _cuda_set_rng_state(new_state, device="cuda"):
    with _traced():
        torch.ops.trident.set_rng_state(_state(new_state), _cuda_device(device))


_STEPS = {("cpu", "manual_seed"): _manual_seed, ("cpu", "get_rng_state"): _get_rng_state,
          ("cpu", "set_rng_state"): _set_rng_state, ("cuda", "manual_seed"): _cuda_manual_seed,
          ("cuda", "manual_seed_all"): _cuda_manual_seed_all,
          ("cuda", "get_rng_state"): _cuda_get_rng_state,
          ("cuda", "set_rng_state"): _cuda_set_rng_state}


def generator_states() -> bytes:
    """The CPU and (once initialized) CUDA generators' states, read outside the trace's modes
    (from the generators: while tracing, ``torch.get_rng_state`` is a step, Note [Random state
    steps])."""
    with _disable_current_modes():
        states = [torch.default_generator.get_state()]
        if torch.cuda.is_initialized():
            states += [g.get_state() for g in torch.cuda.default_generators]
        return b"".join(bytes(s.numpy()) for s in states)
