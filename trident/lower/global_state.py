"""Process-wide torch state that a trace may set (Note [Global side effects]).

Note [Global side effects]: process-wide torch state a function may set (the CPU random
generator's state, the CUDA generators' seeds once CUDA is initialized, the default dtype,
grad mode, threads, deterministic algorithms, and the settings of ``_SETTINGS``). A trace runs
such a setter once (the trace is not a call: random ops on fake tensors draw nothing), and the
plan would not replay it, so a function that changes any of these runs eagerly (the state is
put back first, so that the eager call makes the change itself, once), and so does one that
calls torch while the random generators are in another state than at its entry, though it puts
them back before it returns (``_SourceLines`` compares). ``torch.manual_seed``,
``torch.get_rng_state``, ``torch.set_rng_state`` and their CUDA twins are steps of the plan
instead and leave the generators alone while tracing (Note [Random state steps] in rng.py);
what remains here is a generator's own methods (``torch.default_generator.manual_seed(0)``).
Under jit the state recording (``state.record``, per thread) says whether the function's own
thread called such a method: another thread's draws move the generators during a trace too, and
are not the function's.

The settings (``_SETTINGS``) were missed: ``torch.set_printoptions``, ``set_flush_denormal``,
``set_warn_always``, anomaly mode and the backends' flags (``torch.backends.cudnn.benchmark =
True``, ``torch.backends.mkldnn.enabled``) set in the function were set by the trace once and by
no hit (the next ``print(t)`` used the options eager had not set; a denormal was kept where
eager's flush made it 0), and a set ``float32_matmul_precision``, which the specialization's
environment guards, made every call miss and compile again, to the limit. Each is read by its
getter before and after the trace and put back by its setter; flush-denormal has no getter: it
is read from what a multiplication of a float32 denormal answers (on this thread, which the
setting is).
"""

from __future__ import annotations

import torch


def _flushes_denormals() -> bool:
    one = torch.tensor([1e-40], dtype=torch.float32, device="cpu")  # (a denormal)
    return one.mul_(1.0).item() == 0.0


_PRINT_OPTIONS = ("precision", "threshold", "edgeitems", "linewidth", "sci_mode")


def _print_options() -> tuple:
    options = torch._tensor_str.PRINT_OPTS
    return tuple(getattr(options, k) for k in _PRINT_OPTIONS)


def _set_print_options(values: tuple) -> None:
    for k, v in zip(_PRINT_OPTIONS, values):
        setattr(torch._tensor_str.PRINT_OPTS, k, v)


def _c_flag(name: str) -> tuple | None:
    """``torch._C``'s getter and setter of a backends flag, where this build has both."""
    get, put = getattr(torch._C, f"_get_{name}", None), getattr(torch._C, f"_set_{name}", None)
    return (get, put) if get is not None and put is not None else None


_RAISES = "the getter raises"  # a setting's value where torch refuses to answer

# name -> (getter, setter): Note [Global side effects]
_SETTINGS = {
    "print options": (_print_options, _set_print_options),
    "flush denormal": (_flushes_denormals, torch.set_flush_denormal),
    "warn always": (torch.is_warn_always_enabled, torch.set_warn_always),
    "anomaly mode": (lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                     lambda v: torch.set_anomaly_enabled(*v)),
    **{name: flag for name, flag in ((n, _c_flag(n)) for n in (
        "float32_matmul_precision", "cudnn_enabled", "cudnn_benchmark", "cudnn_deterministic",
        "mkldnn_enabled", "mkldnn_deterministic",  # (not the tf32 flags' legacy getters, which
        # may warn once the new fp32_precision settings are used)
        "nnpack_enabled", "deterministic_fill_uninitialized_memory",
        "cpu_allow_fp16_reduced_precision_reduction")) if flag is not None},
}


def _global_state() -> dict:
    """Note [Global side effects]."""
    state = {"rng": torch.random.get_rng_state(), "dtype": torch.get_default_dtype(),
             "grad": torch.is_grad_enabled(), "threads": torch.get_num_threads(),
             "deterministic": torch.are_deterministic_algorithms_enabled()}
    for name, (get, _) in _SETTINGS.items():
        try:
            state[name] = get()
        except RuntimeError:  # Note [Flags that raise] in runtime/args.cpp: torch's getter
            state[name] = _RAISES  # refuses to answer in this state; a value of its own
    if torch.cuda.is_initialized():
        state["cuda"] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    return state


def _restore_global_state(state: dict, changed: list[str] = ()) -> None:
    torch.random.set_rng_state(state["rng"])
    torch.set_default_dtype(state["dtype"])
    torch.set_grad_enabled(state["grad"])
    torch.set_num_threads(state["threads"])
    torch.use_deterministic_algorithms(state["deterministic"])
    for name in changed:  # (a setter of its own: only where the function changed it)
        if name in _SETTINGS and state[name] is not _RAISES:  # (no setter makes that state)
            _SETTINGS[name][1](state[name])
    for i, cuda in enumerate(state.get("cuda", ())):
        torch.cuda.set_rng_state(cuda, i)


def _changed(before: dict, after: dict) -> list[str]:
    return [k for k in before if not (torch.equal(before[k], after[k])
                                      if isinstance(before[k], torch.Tensor) else
                                      before[k] == after.get(k) if k != "cuda" else
                                      all(map(torch.equal, before[k], after[k])))]
