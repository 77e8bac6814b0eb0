"""Compile one specialization: a traced call in, a :class:`Specialization` out.

Like Triton's ``compile()``: typed objects pass between the stages (capture's ``Capture`` →
Torch-MLIR's module (importer.py) → plan.py's ``Plan`` → kernels.py's cubins → guards.py's
guards) and the result is pure data, which codegen.py renders to C and build.py compiles. The
miss path that decides what to trace (dynamic dims, the state the trace read) is the front
end's (frontend/policy.py, frontend/tracing.py).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.utils._pytree as pytree

from trident import config
from trident.lower import cubins, kernels
from trident.lower.capture import Capture
from trident.errors import TridentError, environmental, transient
from trident.lower.guards import guards_for
from trident.lower.passes import reuse_buffers
from trident.ir.launch import CompiledBinary, TritonLaunch
from trident.ir.operands import Scalar
from trident.ir.plan import OpCall, SizeStep, TritonStep
from trident.ir.specialization import Specialization, StateGuard, ValueChecks


def compile_specialization(captured: Capture, args: tuple, names: list[str],
                           dynamic: dict[int, set[int]], tree: int, state: StateGuard, name: str,
                           code_fn) -> Specialization:
    """The specialization of a call traced into ``captured``.

    Args:
        args, names: the call's leaves (Note [Argument trees] in flatten.py) and their paths.
        dynamic: per leaf, the dims traced as symbolic sizes.
        tree: the key of the call's argument tree.
        state: what the trace read outside the arguments (Note [State guards] in
            lower/state/__init__.py).
        name: the function's qualified name, for messages and the signature.
        code_fn: the function whose globals name the Triton kernels the plan launches.

    Raises:
        TridentError: an op, constant or type the plan cannot call, a graph Torch-MLIR cannot
            import, a kernel Triton cannot compile for the device.
    """
    # Note [Lazy Torch-MLIR]: importing Torch-MLIR takes 0.75 s of CPU (its ml_dtypes most of
    # it), and only a compile uses it (importer.py, and plan.py that reads its module): a
    # restarted process that loads what the cache holds never imports it.
    try:
        with config.stage("import"):  # (with Torch-MLIR's own import, in a first compile)
            from trident.lower.importer import import_graph
            from trident.lower.plan import build_plan

            imported = import_graph(captured.graph_module, shape_env=captured.shape_env)
        with config.stage("plan"):
            plan = build_plan(imported, captured.out_leaves, captured.out_spec)
        checks = _value_checks(captured)  # Note [Value reads] in values.py
    except TridentError:
        raise
    except Exception as e:  # Torch-MLIR's bindings report what they cannot handle so
        error = TridentError(f"{name}: Torch-MLIR cannot import or plan the graph: "
                             f"{type(e).__name__}: {e}")
        raise (transient(error) if environmental(e) else error) from e
    binaries: list[tuple[TritonLaunch, CompiledBinary]] = []  # one per distinct launch
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if not dynamic and (all(d.type == "cpu" for d in devices) or (
            len(devices) == 1 and next(iter(devices)).type == "cuda")):
        with config.stage("buffers"):  # Note [Buffer reuse]
            reuse_buffers(plan, "CUDA" if any(d.type == "cuda" for d in devices) else "CPU")
    for i, step in enumerate(plan.steps):
        if isinstance(step, TritonStep) and step.launch.on_cuda:
            binary = next((b for known, b in binaries if known == step.launch), None)
            if binary is None:
                with config.stage("kernels"):
                    binary = cubins.compile_cuda(
                        kernels.find_kernel(step.launch.ref, code_fn), step.launch,
                        torch.cuda.get_device_capability(step.launch.device))
                binaries.append((step.launch, binary))
            plan.steps[i] = dataclasses.replace(step, binary=binary)
    with config.stage("guards"):
        guards = guards_for(args, captured.fake_args, captured.shape_env, captured.looked_up)
    return Specialization(signature(name, args, names, captured.fake_args), names, guards, plan,
                          {str(i): sorted(d) for i, d in dynamic.items()},
                          [list(a.shape) if isinstance(a, torch.Tensor) else None
                           for a in args], tree, captured.recipe, captured.catching, state,
                          checks=checks)


def _value_checks(captured: Capture) -> ValueChecks | None:
    """Note [Value reads] in values.py: the plan of the capture's value checks."""
    from trident.lower.importer import import_graph
    from trident.lower.plan import build_plan
    from trident.lower.source_lines import source_line

    if captured.checks is None:
        return None
    reads = list(captured.checks.graph.find_nodes(op="output"))[0].args[0]
    imported = import_graph(captured.checks, shape_env=captured.shape_env)
    plan = build_plan(imported, [None] * len(reads),
                      pytree.tree_flatten(tuple(range(len(reads))))[1])
    if not all(isinstance(o, Scalar) for o in plan.outputs) or any(
            not isinstance(s, (OpCall, SizeStep)) for s in plan.steps):
        raise TridentError("a value read whose checks are not ATen ops and scalars")
    return ValueChecks(plan, captured.check_values, tuple(source_line(n) for n in reads))


def signature(name: str, args: tuple, names: list[str], fake_args: tuple | None) -> str:
    """``f(x: float32[4, ?] cpu, n=2)``: a ``?`` for each symbolic size of the trace; the
    parameters and buffers of ``self`` (a module) are counted, not listed."""
    parts, owned = [], 0
    for i, (leaf, a) in enumerate(zip(names, args)):
        if i == 0:  # the tree's key
            continue
        if leaf.startswith("self.") and (isinstance(a, torch.Tensor) or a is None):
            owned += 1
            continue
        if isinstance(a, torch.Tensor):
            traced = fake_args[i].shape if fake_args else a.shape
            shape = ["?" if isinstance(n, torch.SymInt) else n for n in traced]
            parts.append(f"{leaf}: {str(a.dtype).replace('torch.', '')}"
                         f"[{', '.join(map(str, shape))}] {a.device}")
        else:
            parts.append(f"{leaf}={a!r}")
    if owned:
        parts.insert(0, f"self: {owned} parameters and buffers")
    return f"{name}({', '.join(parts)})"
