"""Passes over a built plan: which steps may run again eagerly after a failure (Note [Errors
inside try] in source_lines.py), buffer reuse (Note [Buffer reuse]), which arguments the
sequence writes and whether a CUDA graph may replay it (Note [CUDA graphs] in
frontend/graphs.py)."""

from __future__ import annotations

import torch

from trident.ir import operands
from trident.ir.guards import Aliased
from trident.ir.operands import Item, List, Operand, OptTensors, Tensors, Val
from trident.ir.plan import OpCall, Plan, SizeStep, Step, TritonStep


DATA_DEPENDENT_SIZES = {"aten::nonzero", "aten::masked_select", "aten::unique_dim",
                         "aten::_unique2", "aten::unique_consecutive", "aten::nonzero_static"}


def uses(operand: Operand):
    """The owned values an operand reads: ``Val``, and the ``List`` an ``Item`` borrows from."""
    if isinstance(operand, Val):
        yield operand
    elif isinstance(operand, Item):
        yield List(operand.list)
    elif isinstance(operand, (Tensors, OptTensors)):
        for item in operand.v:
            yield from uses(item)


def op_schema(op: str, overload: str):
    try:
        return torch._C._get_schema(op, overload)
    except RuntimeError:
        return None


_UNANNOTATED_ALIASES = {"aten::_unsafe_view", "aten::_reshape_alias", "aten::lift_fresh",
                        "aten::lift"}
# Ops whose output size depends on the data: an earlier call's buffer may be the wrong size.
def is_functional(schema) -> bool:
    """No argument is written and no return aliases an argument."""
    if schema.name in _UNANNOTATED_ALIASES or "view" in schema.name:
        return False
    if any(a.alias_info is not None for a in schema.arguments):
        return False
    return all(r.alias_info is None for r in schema.returns)


def is_composite(op: str, overload: str) -> bool:
    """A CompositeImplicitAutograd op: its C++ body calls other ops (Note [Composite ops])."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        f"{op}.{overload}" if overload else op, torch._C.DispatchKey.CompositeImplicitAutograd)


def rerun_eagerly(steps: list[Step]) -> list[bool]:
    """Note [Errors inside try] in source_lines.py: per step of ``steps`` (a plan's, in the order
    they run), whether a call that fails there may run again eagerly: nothing the steps before it
    did is visible to the caller (no write to a tensor, no random draw, no Triton launch or
    Python custom op, which may write or keep a tensor). Writes into a reused buffer (Note
    [Buffer reuse]) are the plan's own."""
    clean, out = True, []
    for step in steps:
        out.append(clean)
        clean = clean and not _visible_effect(step)
    return out


def _visible_effect(step: Step) -> bool:
    if isinstance(step, SizeStep):
        return False
    schema = op_schema(step.op, step.overload) if isinstance(step, OpCall) and \
        step.op.startswith("aten::") else None
    if schema is None or any(a.alias_info is not None and a.alias_info.is_write
                             for a in schema.arguments):
        return True
    packet = getattr(torch.ops.aten, step.op[len("aten::"):], None)
    overload = getattr(packet, step.overload or "default", None)
    return overload is None or torch.Tag.nondeterministic_seeded in overload.tags


def _out_overload(op: str, overload: str, backend: str) -> str:
    """The ``.out`` overload of a functional op with one return: same arguments, then ``out``,
    with a kernel of its own for ``backend`` (``"CPU"``, ``"CUDA"``). An ``.out`` overload that
    torchgen made from the functional op (``relu.out``, ``mul.Scalar_out``: "autogen" in
    native_functions.yaml, registered for CompositeExplicitAutograd only, torch 2.11-2.13) calls
    the functional op and copies its result into ``out``: an allocation and a copy more, not less."""
    schema = op_schema(op, overload)
    if (schema is None or len(schema.returns) != 1 or not is_functional(schema)
            or op in DATA_DEPENDENT_SIZES or is_composite(op, overload)):
        return ""  # a composite op's .out decomposes its own way (Note [Composite ops])
    signature = [(a.name, str(a.type)) for a in schema.arguments]
    for candidate in torch._C._jit_get_schemas_for_operator(op):
        args = [(a.name, str(a.type)) for a in candidate.arguments]
        if (args[:-1] == signature and args[-1] == ("out", "Tensor")
                and candidate.overload_name.endswith("out")):
            try:
                torch._C._dispatch_find_schema_or_throw(op, candidate.overload_name)
            except RuntimeError:
                continue
            if torch._C._dispatch_has_kernel_for_dispatch_key(
                    f"{op}.{candidate.overload_name}", backend):
                return candidate.overload_name
    return ""


def reuse_buffers(plan: Plan, backend: str) -> None:
    """Note [Buffer reuse]: a functional op whose result only feeds other functional ops (not an
    output, not viewed, written or launched on) writes into the buffer its first call
    allocated, through the op's ``.out`` overload: the same kernel and output layout as the
    functional op, without an allocation per call. Buffers stay alive between calls (like a
    CUDA graph's memory). Under ``torch.inference_mode()`` steps allocate as usual (a buffer made
    there could not be written outside it, and one made outside must not be written inside).
    The caller decides where that is safe: static sizes, the tensors on the CPU or on one CUDA
    device, and no Python callback in the launch sequence (it could re-enter the same
    specialization). On CUDA the buffers are reused only on the stream that made them (codegen
    checks the current stream): kernels on one stream run in order, so a call cannot overtake
    the previous call's reads of its buffers, and a call on another stream allocates. Here: only
    plans of ATen ops, the runtime's ``trident::`` ops (C++, they keep nothing) and CUDA Triton
    launches, and no composite op (its ``.out`` overload decomposes its own way). ``backend``: the
    dispatch key of the tensors' device, ``"CPU"`` or ``"CUDA"``.
    """
    if any(not (isinstance(step, SizeStep) or (
            isinstance(step, OpCall) and step.op.startswith(("aten::", "trident::"))) or (
            isinstance(step, TritonStep) and step.launch.on_cuda)) for step in plan.steps):
        # A Python custom op (torch.library.custom_op) may keep its input (an observer) and,
        # running Python (as Triton's interpreter does on the CPU), lets another thread enter
        # this specialization and overwrite the same buffers mid-call: only plans of ATen ops
        # and driver launches reuse.
        return
    pinned = {o for o in plan.outputs if isinstance(o, Val)}
    for step in plan.steps:
        schema = op_schema(step.op, step.overload) if isinstance(step, OpCall) else None
        if schema is None or not is_functional(schema):
            for a in step.args:
                pinned.update(uses(a))
    for step in plan.steps:
        if (isinstance(step, OpCall) and len(step.results) == 1 and isinstance(step.results[0], Val)
                and step.results[0] not in pinned):
            step.out_overload = _out_overload(step.op, step.overload, backend)


def graph_device(spec) -> int | None:
    """The CUDA device whose graph could replay ``spec``'s sequence, or None when the sequence
    must run step by step (Note [CUDA graphs]: a CPU or no tensor argument, a tensor passed
    twice, an interpreted launch, an op that draws random numbers)."""
    if spec.cuda_device is None or any(isinstance(g, Aliased) and g.value
                                       for g in spec.guards):
        return None
    for step in spec.plan.steps:
        if isinstance(step, TritonStep):
            if step.binary is None:
                return None
        elif isinstance(step, OpCall) and _draws_random(step):
            return None
    return spec.cuda_device


def _draws_random(step: OpCall) -> bool:
    """PyTorch tags every op that may consume RNG state ``nondeterministic_seeded``; of those,
    attention with a ``dropout_p`` that is the constant 0 draws nothing (SDPA at inference)."""
    namespace, name = step.op.split("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        op = getattr(packet, step.overload or "default")
    except AttributeError:
        return True  # unknown: assume it does
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    names = [a.name for a in op._schema.arguments]
    if "dropout_p" in names and names.index("dropout_p") < len(step.args):
        p = step.args[names.index("dropout_p")]
        return not (isinstance(p, (operands.Float, operands.Int)) and p.v == 0)
    return True


def written_args(plan: Plan) -> set[int]:
    """Argument indices the sequence may write: passed, or a view of them, to a Triton launch
    (any pointer may be stored through) or to an ATen argument annotated ``Tensor(a!)``."""
    views: dict[tuple[str, int], set[int]] = {}  # ("val" | "list", id) -> arguments it views

    def sources(o: operands.Operand) -> set[int]:
        match o:
            case operands.Arg(i):
                return {i}
            case operands.Val(i):
                return views.get(("val", i), set())
            case operands.Item(list=i):
                return views.get(("list", i), set())
            case operands.Tensors(v) | operands.OptTensors(v):
                return set().union(*(sources(item) for item in v))
        return set()

    written: set[int] = set()
    for step in plan.steps:
        if isinstance(step, SizeStep):
            continue
        if isinstance(step, TritonStep):
            for o in step.args:
                written |= sources(o)
            continue
        schema = op_schema(step.op, step.overload)
        pairs = list(zip(schema.arguments, step.args))
        for a, o in pairs:
            if a.alias_info is not None and a.alias_info.is_write:
                written |= sources(o)
        for ret, r in zip(schema.returns, step.results):
            if ret.alias_info is None or not isinstance(r, (operands.Val, operands.List)):
                continue
            alias = ret.alias_info.before_set
            views[(r.KIND, r.i)] = set().union(*(
                sources(o) for a, o in pairs
                if a.alias_info is not None and a.alias_info.before_set & alias))
    return written
