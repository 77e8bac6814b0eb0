"""Decompositions while tracing (Note [Composite ops]): which composite ATen ops a trace keeps
whole and which decompose through their C++ bodies, as eager's would."""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from trident.lower import state


def _unfold_linear(input, weight, bias=None):
    """Note [Composite ops]: ``linear`` without a bias (its body: ``matmul(input,
    weight.t())``), and with one where the body fuses it into ``addmm`` (a 2-D input; a
    contiguous 3-D one with a contiguous 1-D bias: Qwen's q/k/v projections). Elsewhere a bias
    stays whole: the body adds it out of place for a subclass-like tensor (the trace's fake
    tensors) and in place for eager's, which promotes, broadcasts and raises otherwise (torch
    2.11-2.13; 2.13 fuses only a contiguous bias that is 1-D or squeezes to 1-D, and adds a
    0-D, 2-D, strided or expanded one after ``matmul``)."""
    if bias is None and _folds_by_requires_grad(input, weight.dim()):
        return NotImplemented  # kept whole (``_special_op_to_preserve_cia``'s answer)
    if bias is not None and not (input.dim() == 2 or (input.dim() == 3 and input.is_contiguous()
                                                      and bias.dim() == 1
                                                      and bias.is_contiguous())):
        return NotImplemented
    return _cpp_composite(torch.ops.aten.linear.default, input, weight, bias)


def _unfold_matmul(input, other):
    """Note [Composite ops]: ``matmul`` by a matrix or a vector (``mm``, ``mv``, ``dot``, or a
    fold of ``input``'s batch dims into one ``mm``, else ``bmm`` of expanded views). By a
    batched ``other`` it stays whole: ``_matmul_impl`` squeezes a batch of 1 into ``mm`` for a
    subclass-like tensor and runs ``bmm`` for eager's (other values in the last bit)."""
    if other.dim() > 2 or _folds_by_requires_grad(input, other.dim()):
        return NotImplemented
    return _cpp_composite(torch.ops.aten.matmul.default, input, other)


# Whether a tensor the traced function reads requires grad (not an inference tensor): only
# then may a view of one require grad in eager under no_grad or inference_mode (the guards fix
# both flags of every argument). Unknown outside ``trace``: assumed.
INPUTS_REQUIRE_GRAD = contextvars.ContextVar("INPUTS_REQUIRE_GRAD", default=True)


def _folds_by_requires_grad(input, other_dim: int) -> bool:
    """Note [Composite ops]: whether ATen's ``matmul`` of ``input`` by a matrix or a vector
    (``other_dim`` <= 2 dims) may pick its kernel by ``other.requires_grad``, which a trace
    cannot read: a non-empty >= 3-D ``input`` whose batch dims do not fold into one without a
    copy folds (a copy, one ``mm``) only where ``other`` requires grad, else runs ``bmm``
    (``should_fold``, LinearAlgebra.cpp, torch 2.11-2.13). Eager's views of a tensor that
    requires grad require grad under no_grad and inference_mode; the trace's fake views do not
    where a composite's body makes them (``linear``'s ``weight.t()``) or under inference_mode
    (``w.T``), so where a tensor the function reads requires grad such a product stays whole
    (a Qwen2 decode step's ``o_proj`` with a batch of 2: its input's size-1 dim has another
    stride)."""
    if input.dim() < 3 or other_dim > 2 or input.numel() == 0:
        return False
    return INPUTS_REQUIRE_GRAD.get() and any(
        input.stride(i) != input.stride(i + 1) * input.size(i + 1)
        for i in range(input.dim() - 2))


# Note [Composite ops]: composites whose C++ bodies a static trace runs where they branch only
# on sizes and strides (which the guards fix), although torch.export keeps them whole: they end
# in views and one ``mm``/``bmm``, which the plan computes in C and calls typed (a kept
# ``linear`` is several dispatcher calls at every call). A trace with symbolic sizes keeps
# them whole: torch 2.11's bodies read ``numel()`` of a symbolic 4-D operand, which fails it.
_UNFOLDED = {"linear": _unfold_linear, "matmul": _unfold_matmul}


@functools.cache
def _composite_ops(symbolic: bool) -> dict:
    """Note [Composite ops]: {aten op overload: what runs in its place while tracing}.

    A CompositeImplicitAutograd op (``linalg_svdvals``, ``linear``, ``dropout``) has no kernel
    of its own: its C++ body calls other ops, and some bodies branch on the tensor they get.
    On a fake tensor ``at::linalg_svdvals`` asks for ``_linalg_svd(compute_uv=True)`` (fake
    tensors are "subclass-like", ``_may_require_fw_or_bw_grad`` in ATen), where eager passes
    False and LAPACK returns other values. So the trace keeps each functional composite op whole
    (torch.export's own rule for which ones are safe to keep: no aliasing or mutation in the
    schema, ``torch._export.utils._collect_all_valid_cia_ops_for_aten_namespace``) and the
    plan calls it, so that ATen decomposes it at call time exactly as in eager mode (but for
    ``_UNFOLDED``'s cases, whose C++ bodies run alike on fake and real tensors). The
    others (views, ``dropout``, which may return its input) decompose through their C++ bodies; those that Python decompositions would take over once the Python dispatcher is on
    (``torch._decomp``'s ``dropout`` calls ``native_dropout``) are pointed at their C++ body.
    """
    from torch._export.utils import (_collect_all_valid_cia_ops_for_aten_namespace,
                                     _special_op_to_preserve_cia)

    kept = _collect_all_valid_cia_ops_for_aten_namespace()
    ops = {op: _special_op_to_preserve_cia for op in kept}
    if not symbolic:
        ops.update((getattr(torch.ops.aten, name).default, unfold)
                   for name, unfold in _UNFOLDED.items())
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for op in (getattr(packet, name) for name in packet.overloads()):  # torch >= 2.11
            if (op not in kept and key in op.py_kernels
                    and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)):
                ops[op] = functools.partial(_cpp_composite, op)
    return ops


def _cpp_composite(op, *args, **kwargs):
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


def _product_shape(op, a, b) -> list | None:
    """Note [Kept products]: the shape of ``linear(a, b)`` or ``matmul(a, b)`` where both
    operands have 2 or more dims of one dtype and device, batches of one shape (or a 2-D
    operand) and matching inner sizes; else None (the op's own body answers, errors too)."""
    if a.dim() < 2 or b.dim() != 2 and (op != "matmul" or b.dim() < 2):
        return None
    if (a.dtype, a.device) != (b.dtype, b.device):
        return None
    if op == "linear":
        b = b.t()
    batch = a.shape[:-2] if b.dim() == 2 else b.shape[:-2] if a.dim() == 2 else None
    if batch is None and list(a.shape[:-2]) == list(b.shape[:-2]):
        batch = a.shape[:-2]
    if batch is None:
        return None
    torch._check(a.shape[-1] == b.shape[-2])
    return [*batch, a.shape[-2], b.shape[-1]]


def _kept_product(op: str, original, fake_mode, func, *args, **kwargs):
    """Note [Kept products]: the fake result of a kept ``linear`` or ``matmul``."""
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    shape = None if kwargs.keys() - {"bias"} else _product_shape(op, args[0], args[1])
    if shape is None or bias is not None and (
            bias.dim() != 1 or (bias.dtype, bias.device) != (args[0].dtype, args[0].device)):
        return original(fake_mode, func, *args, **kwargs)
    if bias is not None:
        torch._check(bias.shape[0] == shape[-1])
    with fake_mode:
        return args[0].new_empty(shape)


# Note [Kept products]: a trace with symbolic sizes keeps ``linear`` and ``matmul`` whole (Note
# [Composite ops]); ATen's body picks its kernels at call time, as in eager. The trace needs
# only the result's shape and strides, and torch's rule for them runs the body on the fake
# operands: its choice between one ``mm`` and ``bmm`` (``should_fold``: whether the batch
# dims fold without a copy, true for a batch of one) guards the batch ``!= 1``, although both
# kernels return a fresh contiguous tensor of the same shape (ATen 2.11-2.13: ``mm`` viewed,
# ``bmm`` viewed, a transposed fold made ``contiguous``; ``addmm`` for a bias). So a batch of
# one shares the specialization of other batches (Note [Batch dims] in frontend/batch.py)
# where a transformers prefill's ``lm_head`` reads the last position of a 3-D hidden state
# (strided: a batch of one folds into ``mm``, others run ``bmm``, and ATen still does so at
# call time). Operands of other kinds (1-D, broadcast batches, mixed dtypes, a bias not 1-D)
# keep torch's rule.
_KEPT_PRODUCTS = ("linear", "matmul")


# Note [Kept attention]: ``scaled_dot_product_attention`` is kept whole (torch.export's rule,
# Note [Composite ops]); ATen picks its kernel at call time, as in eager. Its fake result comes
# from running its C++ body on the fake operands, and torch 2.11's body checks explicitly
# whether the mask's batch and the query's are 1 (2.13's does not): a guard ``!= 1`` on the
# batch symbol, so a batch of one missed the decode step traced for other batches (Note
# [Batch dims] in frontend/batch.py). So while tracing with symbolic sizes, where the query's
# dim 0 is a symbol that no other size or stride of the operands reads, the body runs twice:
# once with that batch a fresh unbacked size of range >= 2 (a check that its range decides
# adds no guard; any other check of it raises, and the body runs as ever), once with a batch
# of 1. Where both give a result of the same other sizes and strides, none of which reads the
# batch, the result is that layout at the call's batch: the kernel eager picks at any batch
# lays its result out alike (on the CPU, ``_scaled_dot_product_flash_attention_for_cpu`` at
# every batch). Anywhere else the body runs on the operands as ever, guards and all.
def _kept_attention(original, fake_mode, func, *args, **kwargs):
    """Note [Kept attention]: the fake result of a kept ``scaled_dot_product_attention``."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    env = fake_mode.shape_env
    query = args[0] if args else None
    if (env is None or not isinstance(query, torch.Tensor) or not query.dim()
            or not isinstance(query.shape[0], torch.SymInt)
            or any(isinstance(a, torch.Tensor) for a in kwargs.values())):
        return original(fake_mode, func, *args, **kwargs)
    batch = query.shape[0]
    symbol = env.simplify(batch.node.expr)

    def reads(x, symbol) -> bool:
        return isinstance(x, torch.SymInt) and symbol in env.simplify(x.node.expr).free_symbols

    def batched(a) -> bool:
        return statically_known_true(a.shape[0] == batch)

    # torch 2.13 deprecates size_hint (a FutureWarning) for guarding_hint_or_throw; 2.11 lacks it
    hint = getattr(env, "guarding_hint_or_throw", None) or env.size_hint
    operands = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    for a in operands.values():  # the batches the body compares with the query's (as eager)
        if a.dim() and isinstance(a.shape[0], torch.SymInt) and not batched(a) and \
                hint(a.shape[0].node.expr) == hint(batch.node.expr):
            torch._check(a.shape[0] == batch)
    if any(not a.dim() or any(reads(x, symbol) for x in (*a.shape[1:], *a.stride()))
           or (reads(a.shape[0], symbol) and not batched(a)) for a in operands.values()):
        return original(fake_mode, func, *args, **kwargs)

    def at_batch(n):
        with fake_mode:
            return [a.new_empty_strided((n, *a.shape[1:]), a.stride())
                    if i in operands and batched(a) else a for i, a in enumerate(args)]

    try:
        with env.ignore_fresh_unbacked_symbols():
            wide = env.create_unbacked_symint()
            env.var_to_range[wide.node.expr] = ValueRanges(2, int_oo)
            many = original(fake_mode, func, *at_batch(wide), **kwargs)
    except Exception:  # a check its range does not decide: the body's own guards, as ever
        return original(fake_mode, func, *args, **kwargs)
    one = original(fake_mode, func, *at_batch(1), **kwargs)
    alike = (many.dim() == one.dim() and many.dim() and (many.dtype, many.device) == (
        one.dtype, one.device) and statically_known_true(many.shape[0] == wide)
        and one.shape[0] == 1 and not any(reads(x, wide.node.expr) for x in (
            *many.shape[1:], *many.stride()))
        and all(statically_known_true(a == b) for a, b in zip(
            (*many.shape[1:], *many.stride()), (*one.shape[1:], *one.stride()))))
    if not alike:
        return original(fake_mode, func, *args, **kwargs)
    with fake_mode:
        return torch.empty_strided((batch, *many.shape[1:]), many.stride(), dtype=many.dtype,
                                   device=many.device)


# Note [Clamped slice ends]: a symbolic slice end that the trace cannot compare with the size
# it slices, as transformers' SDPA prefill cuts an empty static cache to the prompt
# (``key[:, :, :q_length]``, the cache's length an int leaf: Note [Int leaves] in
# frontend/policy.py), is clamped to the size (``sym_min(end, size)``, eager's own rule) where
# it is known non-negative, and ``sym_max(end + size, 0)`` where known negative. torch 2.13's
# fake rule for ``slice`` does so; torch 2.11's gives the slice a new unbacked size instead,
# which the next op that branches on it (``scaled_dot_product_attention``'s ``Eq(u0, 0)``)
# cannot trace: the dims went static for good and a serving sweep compiled once per length.
# Under a size-oblivious trace (Note [Batch dims] in frontend/batch.py) the guard that the
# code itself added (``kv_length > q_length``) does not decide the comparison either, on both
# versions. So while tracing with symbolic sizes the rule's index helper clamps the indices
# it leaves undecided, on torch versions whose helper does not.
def _clamped_slice_index(original, size, index):
    """Note [Clamped slice ends]: ``original(size, index)``, or the clamped index where it
    decides nothing."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    decided = original(size, index)
    if decided is not None:
        return decided
    if guard_or_false(index >= 0):
        return torch.sym_min(index, size)
    if guard_or_false(index < 0):
        return torch.sym_max(index + size, 0)
    return None


# Note [Fake results and flags]: FakeTensorMode keeps a process-wide cache of ops' fake results
# (``FakeTensorMode.cache``), keyed by the op and its arguments' metadata, the default dtype and
# device and inference mode, not by torch's global flags (torch 2.11-2.13). A kept composite
# whose C++ body picks a kernel by those flags lays its result out by the kernel it picked:
# ``scaled_dot_product_attention`` on the CPU returns the flash kernel's layout (the query's)
# and the math kernel's (contiguous). So a trace under ``sdpa_kernel([SDPBackend.MATH])``, after
# one with flash enabled, got the flash layout from the cache, left out the copy that a
# ``.transpose(1, 2).contiguous()`` makes of the math result, and its plan's ``view`` failed on
# the real one (a Hugging Face generate under the context raised TridentError where eager ran).
# Torch's global flags (the guards' ``trt_env.flags``) that differ from the last trace's clear
# that cache first.
_TRACED_FLAGS: list = [None]  # trt_env.flags of the last trace in this process


def _fake_cache_for_flags() -> None:
    """Note [Fake results and flags]: clear FakeTensorMode's cache of fake results where torch's
    global flags are not those of the last trace."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trident.ir.facts import _global_flags

    flags = _global_flags()
    if flags != _TRACED_FLAGS[0]:
        FakeTensorMode.cache_clear()
        _TRACED_FLAGS[0] = flags


@contextlib.contextmanager
def eager_decompositions(symbolic: bool):
    """Note [Composite ops]: while tracing, composite ops decompose as eager's would. Setting
    the overrides up and taking them down is torch's own Python (thousands of calls): it runs
    outside the state recording's profile hook (``state.unrecorded``), which reads no state
    there."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.export.exported_program import _override_composite_implicit_decomp

    stack = contextlib.ExitStack()
    with state.unrecorded():
        _fake_cache_for_flags()
        stack.enter_context(_override_composite_implicit_decomp(_composite_ops(symbolic)))
        stack.enter_context(enable_python_dispatcher())
        if symbolic:  # Note [Kept products] (the override's exit removes these rules)
            from torch._subclasses.fake_impls import op_implementations_dict as rules

            for name in _KEPT_PRODUCTS:
                op = getattr(torch.ops.aten, name).default
                if op in rules:
                    rules[op] = functools.partial(_kept_product, name, rules[op])
            attention = torch.ops.aten.scaled_dot_product_attention.default
            if attention in rules:  # Note [Kept attention]
                rules[attention] = functools.partial(_kept_attention, rules[attention])
            from torch._subclasses import fake_impls  # Note [Clamped slice ends]

            index = getattr(fake_impls, "_compute_slice_index", None)
            if index is not None:
                fake_impls._compute_slice_index = functools.partial(_clamped_slice_index, index)
                stack.callback(setattr, fake_impls, "_compute_slice_index", index)
    try:
        yield
    finally:
        with state.unrecorded():
            stack.close()
