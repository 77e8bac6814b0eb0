"""Plan: walk the Torch-MLIR ``func.func`` into a host launch plan.

A plan is a list of steps in program order. A step calls one operator through PyTorch's
dispatcher with a boxed stack of operands: ``trident.ir.operands``' dataclasses (``Arg``, ``Val``,
``Int``, ``IntList``...), stored as JSON with the specialization in the cache and rendered again
when the module is rebuilt.

Note [Symbolic sizes]: a specialization with dynamic dims is traced with those dims as
``SymInt``s (capture.py). Torch-MLIR imports ``x.size(2)`` as ``torch.aten.size.int`` and the
arithmetic on it as ``torch.aten.mul.int`` and friends; those become ``SizeStep``s that the
generated C computes from the call's argument sizes (``a[i].sizes[d]``), with no dispatcher
call. ``torch.symbolic_int`` and ``torch.bind_symbolic_shape`` only describe shapes: the guards
hold those facts (guards.py), so the plan skips them.

In-place ops (``add_``, ``copy_``) stay in place: the imported graph keeps them in program order,
and running its steps in that order makes the same writes as eager PyTorch.

Note [Scalar operands]: a Python scalar in a tensor slot (``t.mul_(0.1)``, ``torch.where(c, x,
0.0)``) reaches eager's kernel as a *wrapped number*: a 0-dim CPU tensor of the scalar's full
precision (double, int64, bool) that type promotion ranks below every other tensor (PyTorch
2.11-2.13, ``c10::TensorImpl::is_wrapped_number``). Torch-MLIR imports it as
``torch.prim.NumToTensor``. The ``.Scalar`` overload is not the same call (``mul_.Scalar``
rounds the scalar to a bf16 tensor's dtype first, so products differ), and the
dispatcher cannot make a wrapped number, so the plan passes a plain 0-dim tensor
(``aten::scalar_tensor``) to the op eager called, with a dtype that changes neither the
promoted dtype nor the value the kernel reads: the scalar's full precision when it cannot win
promotion (``bf16_tensor * 0.1``), else the promoted dtype itself (``int_tensor * 0.1`` is
float32, as eager's result), which the kernel would have cast it to. A case where neither holds
(a 0-dim bf16 tensor times 0.1) is not compiled (``_scalar_dtype``). Torch-MLIR itself imports
``add``/``sub``/``mul``/``div.Tensor`` with a scalar as their ``.Scalar`` overloads, which ATen
implements as the ``.Tensor`` overload with a wrapped number: the same call.

Note [Views in C]: eager PyTorch makes every view (``x.view``, ``x.t()``, ``x[:, 1]``) through
the dispatcher, and a decode step of a Llama-sized model makes hundreds. The plan marks the
view ops whose geometry is plain arithmetic (``_C_VIEWS``:
``view``, ``_unsafe_view``, ``t``, ``transpose``, ``permute``, ``unsqueeze``, ``squeeze``,
``slice``, ``select``, ``expand``, ``as_strided``; ``reshape`` and ``narrow`` reach the graph as
``view``/``_unsafe_view`` and ``slice``): the generated C computes their sizes, strides and
storage offset from their input's (``trident/runtime/trident_views.h``, symbolic sizes
included) and makes a tensor only where one is needed, at the first step that reads the view:

- a Triton launch reads only its pointer (storage data + offset), no tensor;
- a functional ATen op with a kernel of its own (no argument written or aliased, Note [Buffer
  reuse]'s ``_is_functional``; not composite, or one of ``_FRESH_COMPOSITES``) gets ATen's own
  view kernel's result
  (``alias_with_sizes_and_strides``: the base's storage and version counter) made without the
  dispatcher;
- a result the caller gets, an op that writes or keeps its argument, a composite op (``type_as``
  may return its argument itself), a Python op, or a view op computed by the dispatcher gets
  what eager makes: ``aten::as_strided`` of the view's base
  through the dispatcher (``ADInplaceOrView``: same ``_base``, version counter, sizes, strides
  and offset as eager's chain of views);
- ``_unsafe_view`` (not a view in autograd's sense) gets the alias that ATen's kernel makes,
  with its own version counter, at its own step.

Where ATen would raise (an index out of range, a shape that cannot be viewed, only possible with
symbolic sizes) the C arithmetic says so and the step calls the op itself, which raises eager's
exception. A view keeps its base alive as long as the view is used (``_assign_releases``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch_mlir import ir

from trident.lower import collectives
from trident.ir import operands
from trident.errors import TridentError
from torch_mlir.extras.fx_importer import OPTIONAL_TORCH_DTYPE_TO_INT, TORCH_DTYPE_TO_INT

from trident.ir.facts import MAX_OUTS, dtype_codes
from trident.lower.importer import TRITON_LAUNCH, Imported, location
from trident.ir.plan import (SIZE_OPS as _INT_OPS, OpCall, Plan, SizeStep, Step, TritonStep, View,
                             floats_taken)
from trident.lower.passes import is_composite, is_functional, op_schema, uses
from trident.ir.operands import (Arg, Bool, Bools, Device, Drop, Float, Floats, Int, IntList, Ints,
                                 Item, List, NoneConst, OptTensors, Operand, Scalar, Str, Tensors,
                                 Val)

_FULL_PRECISION = {"bool": torch.bool, "int": torch.int64, "float": torch.float64}
# The dtypes of the tensors whose rank and dtype the plan reasons about (a view computed in C,
# Note [Scalar operands]' promotion); a tensor of another dtype (float8, uint16) is neither.
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)


def _scalar_kind(value: Operand) -> str:
    """"bool", "int" or "float": a constant's kind; an op's scalar return is a size (an int)."""
    return value.KIND if isinstance(value, (Bool, Int, Float)) else "int"


def _scalar_dtype(value: Operand, tensors: list[tuple[int, torch.dtype]],
                  result: tuple[int, torch.dtype] | None, where: str) -> torch.dtype:
    """Note [Scalar operands]: the dtype of a plain 0-dim tensor that an op given the other
    ``tensors`` (rank, dtype) treats as eager treats the wrapped number ``value``.

    Raises:
        TridentError: no dtype keeps both the promoted dtype and the value (a float that a
            0-dim float16/bfloat16 operand's dtype cannot hold exactly).
    """
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    def promoted(*extra):
        metas = [torch.empty((1,) * rank, dtype=dtype, device="meta") for rank, dtype in tensors]
        return elementwise_dtypes(*metas, *extra,
                                  type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]

    kind = _scalar_kind(value)
    full = _FULL_PRECISION[kind]
    eager = promoted({"bool": True, "int": 1, "float": 1.0}[kind])
    if result is not None and result[1] not in (torch.bool, eager):
        return full  # the op does not promote to its result (in place, fill, masked_fill)
    for dtype in (full, eager):
        if promoted(torch.empty((), dtype=dtype, device="meta")) != eager:
            continue
        exact = dtype is full or not isinstance(value, Float) or dtype not in (
            torch.float16, torch.bfloat16) or torch.tensor(value.v, dtype=dtype).item() \
            == value.v
        if exact:
            return dtype
    raise TridentError(f"{where}: a Python {kind} whose wrapped-number semantics no plain "
                       f"tensor reproduces next to {[str(d) for _, d in tensors]}")


@dataclasses.dataclass(frozen=True)
class _NumToTensor:
    """While walking: a Python scalar in a tensor slot (Note [Scalar operands]), made into a
    tensor by the step that reads it (``_Walker.materialize``)."""

    v: Operand


@dataclasses.dataclass(frozen=True)
class _Unsupported:
    """While walking: a value no step may read (``what`` says why)."""

    what: str


class _Walker:
    def __init__(self, func: ir.Operation, imported: Imported):
        self.func = func
        self.launches = imported.launches  # the Triton launches of the import
        self.types = imported.types
        # MLIR value (hashed by SSA identity) -> its operand
        self.env: dict[Any, Operand | _NumToTensor | _Unsupported] = {}
        self.steps: list[Step] = []
        self.num_values = 0
        self.num_lists = 0
        self.num_scalars = 0

    def tensor(self, value: ir.Value) -> tuple[int, torch.dtype] | None:
        """``(rank, dtype)`` of a tensor value of one of ``_DTYPES``, else None."""
        t = self.types.tensor(value)
        return t if t is not None and t[1] in _DTYPES else None

    def operand(self, value: ir.Value, where: str) -> Operand | _NumToTensor:
        try:
            operand = self.env[value]
        except KeyError:
            raise TridentError(f"{where}: operand {value.get_name()} has no plan value") from None
        if isinstance(operand, _Unsupported):
            raise TridentError(f"{where}: {operand.what}")
        return operand

    def new_value(self, kind: type[Val | Scalar | List]) -> Val | Scalar | List:
        if kind is Val:
            self.num_values += 1
            return Val(self.num_values - 1)
        if kind is Scalar:
            self.num_scalars += 1
            return Scalar(self.num_scalars - 1)
        self.num_lists += 1
        return List(self.num_lists - 1)

    def walk(self, out_leaves: list, out_spec: pytree.TreeSpec) -> Plan:
        block = self.func.regions[0].blocks[0]
        for i, arg in enumerate(block.arguments):
            self.env[arg] = Arg(i) if arg.type not in self.types.scalars else self.new_value(
                Scalar) if arg.type == self.types.int else _Unsupported(
                    "a float or bool argument as a value")  # (Note [Float leaves]: a read)
            if arg.type == self.types.int:  # Note [Symbolic ints] in guards.py: read in C
                self.steps.append(SizeStep([Arg(i)], [self.env[arg]], "?", "", "value"))
        outputs = None
        for op in block.operations:
            name = op.operation.name
            if name == "torch.operator" and (named := ir.StringAttr(op.attributes["name"]).value) \
                    in _INT_OPS:  # fmod.int: not in Torch-MLIR's dialect
                name = named
            where, text = location(op)
            if name.startswith("torch.constant."):
                self.env[op.result] = self.constant(op.operation, name)
            elif name == "torch.prim.ListConstruct":
                self.env[op.result] = self.list_construct(op, where)
            elif name == "torch.prim.ListUnpack":
                src = self.operand(op.operands[0], where)
                for j, r in enumerate(op.results):
                    self.env[r] = Item(src.i, j)
            elif name == "torch.vtensor.literal":
                self.env[op.result] = self.literal(op, where, text)
            elif name == "torch.symbolic_int":
                self.env[op.result] = _Unsupported("a shape symbol as a value")
            elif name == "torch.bind_symbolic_shape":
                continue
            elif name in _INT_OPS or (name == "torch.aten.size.int" and isinstance(
                    self.env.get(op.operands[0]), Arg)):
                self.int_step(op, name, where, text)
            elif name == "torch.aten.Int.bool" and isinstance(self.env.get(op.operands[0]),
                                                              Bool):
                # Torch-MLIR passes a Python bool to a Scalar slot (fill(x, True), False + x)
                # through TorchScript's Int.bool, which no dispatcher holds; eager's op gets
                # the bool itself (bool + bool tensor stays bool)
                self.env[op.result] = self.operand(op.operands[0], where)
            elif name == "torch.prim.NumToTensor.Scalar":
                self.env[op.result] = _NumToTensor(self.operand(op.operands[0], where))
            elif name == "func.return":
                outputs = [self.operand(v, where) for v in op.operands]
            elif name == "torch.operator" and ir.StringAttr(
                    op.attributes["name"]).value == TRITON_LAUNCH:
                launch = self.launches[ir.IntegerAttr(op.attributes["launch"]).value]
                args = [self.operand(v, where) for v in op.operands]
                self.steps.append(TritonStep(args, [], where, text, launch))
            elif name.startswith("torch.aten.") or name == "torch.operator":
                self.call(op, name, where, text)
            else:
                raise TridentError(f"{where}: unsupported op {name} ({text})")
        assert outputs is not None
        return self.finish(outputs, out_leaves, out_spec)

    def constant(self, op: ir.Operation, name: str) -> Operand:
        kind = name[len("torch.constant."):]
        if kind == "none":
            return NoneConst()
        attr = op.attributes["value"]
        if kind == "int":
            return Int(ir.IntegerAttr(attr).value)
        if kind == "float":
            return Float(ir.FloatAttr(attr).value)
        if kind == "bool":
            return Bool(bool(ir.BoolAttr(attr).value))
        if kind == "str":
            return Str(ir.StringAttr(attr).value)
        if kind == "device":
            device = torch.device(ir.StringAttr(attr).value)
            return Device(0 if device.type == "cpu" else 1,
                          -1 if device.index is None else device.index)
        raise TridentError(f"unsupported constant {name}")

    def literal(self, op, where: str, text: str) -> Val:
        """A one-element or empty tensor constant, made on the CPU as eager PyTorch made it:
        ``aten::scalar_tensor`` for 0-dim, ``aten::full`` otherwise, ``aten::empty`` for no
        elements."""
        attr = op.attributes["value"]
        try:
            dense = ir.DenseElementsAttr(attr)
        except ValueError:  # a dense resource: a large constant
            dense = None
        made = self.tensor(op.result)
        dtype = made[1] if made and made[1] in _LITERAL_DTYPES else None
        shape = list(ir.RankedTensorType(attr.type).shape)
        if dtype is not None and 0 in shape:  # torch.tensor([])
            result = self.new_value(Val)
            self.steps.append(OpCall([
                Ints(tuple(shape)), Int(dtype_codes()[dtype]), NoneConst(), _CPU, NoneConst(),
                NoneConst()], [result], where, text, "aten::empty", "memory_format"))
            return result
        if dense is None or dtype is None or not dense.is_splat:
            raise TridentError(f"{where}: unsupported tensor constant ({text})")
        item = dense.get_splat_value()
        value = (bool(ir.IntegerAttr(item).value) if dtype is torch.bool else
                 ir.FloatAttr(item).value if dtype.is_floating_point else
                 ir.IntegerAttr(item).value)
        common = [Int(dtype_codes()[dtype]), NoneConst(), _CPU, NoneConst()]
        result = self.new_value(Val)
        if shape:
            self.steps.append(OpCall([Ints(tuple(shape)), operands.constant(value)] + common,
                                     [result], where, text, "aten::full", ""))
        else:
            self.steps.append(OpCall([operands.constant(value)] + common, [result], where, text,
                                     "aten::scalar_tensor", ""))
        return result

    def int_step(self, op, name: str, where: str, text: str) -> None:
        """Note [Symbolic sizes]: integer arithmetic, computed in C."""
        args = [self.operand(v, where) for v in op.operands]
        for a in args[1:] if name == "torch.aten.size.int" else args:
            if not isinstance(a, (Int, Scalar)):
                raise TridentError(f"{where}: {name} of a {type(a).__name__} ({text})")
        if name == "torch.aten.size.int" and not (isinstance(args[1], Int) and args[1].v >= 0):
            raise TridentError(f"{where}: size of a dim that is not a constant >= 0 ({text})")
        result = self.new_value(Scalar)
        self.env[op.result] = result
        op_name = "size" if name == "torch.aten.size.int" else _INT_OPS[name]
        self.steps.append(SizeStep(args, [result], where, text, op_name))

    def list_construct(self, op, where: str) -> Operand:
        items = [self.operand(v, where) for v in op.operands]
        t, types = op.result.type, self.types
        scalar = {types.int_list: (Ints, Int), types.float_list: (Floats, Float),
                  types.bool_list: (Bools, Bool)}.get(t)
        if scalar == (Ints, Int) and all(isinstance(item, (Int, Scalar)) for item in items) \
                and any(isinstance(item, Scalar) for item in items):
            return IntList(tuple(items))
        if scalar:
            if any(type(item) is not scalar[1] for item in items):
                raise TridentError(f"{where}: {t} with non-constant items")
            return scalar[0](tuple(item.v for item in items))
        if t == types.tensor_list:
            return Tensors(tuple(self.materialize(item) for item in items))
        if t == types.optional_tensor_list:
            return OptTensors(tuple(self.materialize(item) for item in items))
        raise TridentError(f"{where}: unsupported list type {t}")

    def materialize(self, operand: Operand | _NumToTensor,
                    dtype: torch.dtype | None = None) -> Operand:
        """A NumToTensor operand becomes an ``aten::scalar_tensor`` of ``dtype`` (default: the
        scalar's full precision); Note [Scalar operands]."""
        if not isinstance(operand, _NumToTensor):
            return operand
        value = operand.v
        dtype = dtype or _FULL_PRECISION[_scalar_kind(value)]
        result = self.new_value(Val)
        self.steps.append(OpCall([
            value, Int(dtype_codes()[dtype]), NoneConst(), _CPU, NoneConst()], [result], "?",
            "", "aten::scalar_tensor", ""))
        return result

    def call(self, op, name: str, where: str, text: str) -> None:
        if name == "torch.operator":
            qualified = ir.StringAttr(op.attributes["name"]).value
            qualified = qualified.removeprefix("torch.")  # "torch.aten.foo" for unknown aten ops
            ns, rest = qualified.split(".", 1)
        else:
            ns, rest = "aten", name[len("torch.aten."):]
        opname, _, overload = rest.partition(".")
        args = [self.operand(v, where) for v in op.operands]
        op_qual = f"{ns}::{opname}"
        schema = op_schema(op_qual, overload)  # (a size in a tensor slot: t.add_(x.size(0)))
        for i, arg in enumerate(schema.arguments[:len(args)] if schema else ()):
            if isinstance(args[i], Scalar) and isinstance(arg.type, torch.TensorType):
                args[i] = _NumToTensor(args[i])  # a wrapped number (Note [Scalar operands])
        if any(isinstance(a, _NumToTensor) for a in args):
            tensors = [self.tensor(v) for v in op.operands]
            results = [self.tensor(r) for r in op.results]
            args = [a if not isinstance(a, _NumToTensor) else self.materialize(a, _scalar_dtype(
                a.v, [t for j, t in enumerate(tensors) if t and j != i],
                results[0] if results else None, f"{where}: {op_qual}.{overload} ({text})"))
                for i, a in enumerate(args)]
        try:
            torch._C._dispatch_find_schema_or_throw(op_qual, overload)
        except RuntimeError:
            schema = None  # e.g. a TorchScript-only operator such as aten::Float.Tensor
        if schema is None:
            raise TridentError(f"{where}: operator {op_qual}.{overload} is not registered with "
                               f"PyTorch's dispatcher ({text})")
        for i, arg in enumerate(schema.arguments[:len(args)]):
            if ns == "_c10d_functional" and arg.name == "group_name":
                collectives.check_group(getattr(args[i], "v", None),
                                        f"{where}: {op_qual} ({text})")
            # ScalarType arguments are ints in the schema; ATen names them dtype/out_dtype
            if arg.name in ("dtype", "out_dtype") and isinstance(args[i], Int):
                args[i] = Int(_torch_dtype_code(args[i].v))
            # a factory (no tensor operand) with dtype=None made the dtype that was the default
            # while traced, which the function may have set itself (torch.set_default_dtype)
            elif (arg.name == "dtype" and isinstance(args[i], NoneConst) and len(op.results) == 1
                  and not any(self.tensor(v) for v in op.operands)
                  and (made := self.tensor(op.results[0]))):
                args[i] = Int(dtype_codes()[made[1]])
        results = []
        for r in op.results:
            if self.types.tensor(r) is not None:
                value = self.new_value(Val)
            elif r.type == self.types.tensor_list:
                value = self.new_value(List)
            elif r.type in self.types.scalars:
                value = self.new_value(Scalar)
            else:  # e.g. !torch.none for an undefined tensor: dropped, an error if read
                value = Drop()
                self.env[r] = _Unsupported(f"{op_qual} returns {r.type}, which Trident does "
                                           f"not support ({text})")
                results.append(value)
                continue
            self.env[r] = value
            results.append(value)
        step = OpCall(args, results, where, text, op_qual, overload)
        if (op_qual, overload) in _C_VIEWS and isinstance(args[0], (Arg, Val, Item)) and (
                rank := self.tensor(op.operands[0])) and (
                made := self.tensor(op.results[0])) and max(rank[0], made[0]) <= 16 \
                and all(isinstance(a, (Int, Ints, IntList, Scalar, NoneConst, Bool))
                        for a in args[1:]):
            step.view = View(rank[0], eager=False,  # Note [Views in C]
                             alias=op_qual == "aten::_unsafe_view")
        self.steps.append(step)

    def finish(self, outputs: list[Operand], out_leaves: list,
               out_spec: pytree.TreeSpec) -> Plan:
        flat: list[Operand] = []
        tensors = iter(outputs)
        for leaf in out_leaves:
            flat.append(next(tensors) if leaf is None else operands.constant(leaf[1]))
        if len(flat) > MAX_OUTS:
            raise TridentError(f"the function returns {len(flat)} values; the native path "
                               f"returns at most {MAX_OUTS}")
        floats_taken(self.steps)
        _assign_releases(self.steps, flat)
        return Plan(self.steps, flat, out_spec, self.num_values, self.num_lists, self.num_scalars)


def _assign_releases(steps: list[Step], outputs: list[Operand]) -> None:
    """Release each owned value right after its last use; outputs keep theirs to the end. A
    view computed in C (Note [Views in C]) keeps its input alive while the view is used."""
    last: dict[Val | List, int] = {}
    for index, step in enumerate(steps):
        for result in step.results:
            if isinstance(result, (Val, List)):
                last[result] = index  # unused results die at once
        for a in step.args:
            for use in uses(a):
                last[use] = index
    at_end = {use for out in outputs for use in uses(out)}
    for step in reversed(steps):  # a view's base lives as long as the view
        if isinstance(step, OpCall) and step.view is not None and not step.view.alias:
            view = step.results[0]
            for use in uses(step.args[0]):
                last[use] = max(last[use], last[view])
                if view in at_end:
                    at_end.add(use)
    _mark_eager_views(steps, outputs)
    for use, index in last.items():
        if use not in at_end:
            steps[index].release.append(use)


# Note [Views in C]: the view ops whose geometry the generated C computes
_C_VIEWS = {("aten::view", ""), ("aten::_unsafe_view", ""), ("aten::t", ""),
            ("aten::transpose", "int"), ("aten::permute", ""), ("aten::unsqueeze", ""),
            ("aten::squeeze", ""), ("aten::squeeze", "dim"), ("aten::squeeze", "dims"),
            ("aten::slice", "Tensor"), ("aten::select", "int"), ("aten::expand", ""),
            ("aten::as_strided", "")}


# Composite ops whose C++ bodies always return a new tensor, never an argument or a view of one
# (ATen 2.11-2.13: linear is addmm/matmul (+ add); matmul is dot/mv/mm/bmm, viewed back into
# shape only when it made the result itself; attention's backends and softmax's return new
# tensors): a view they read needs no view tracking.
_FRESH_COMPOSITES = {"aten::linear", "aten::matmul", "aten::scaled_dot_product_attention",
                     "aten::softmax.int", "aten::log_softmax.int"}


def _mark_eager_views(steps: list[Step], outputs: list[Operand]) -> None:
    """Note [Views in C]: a view's tensor is made as eager makes it where the caller gets it or
    a step reads it that is not a functional ATen op with a kernel of its own or a composite op
    that always makes a new tensor (``type_as`` may return its argument itself), nor a CUDA
    Triton launch (which reads its pointer)."""
    views = {step.results[0]: step for step in steps
             if isinstance(step, OpCall) and step.view is not None and not step.view.alias}
    readers = [(None, out) for out in outputs]
    readers += [(step, a) for step in steps
                if not (isinstance(step, OpCall) and step.view is not None) for a in step.args]
    for step, operand in readers:
        if isinstance(step, TritonStep) and step.launch.on_cuda:
            continue
        schema = op_schema(step.op, step.overload) if isinstance(step, OpCall) else None
        if schema is not None and step.op.startswith("aten::") and is_functional(schema) and (
                step.qualified_name in _FRESH_COMPOSITES
                or not is_composite(step.op, step.overload)):
            continue
        for use in uses(operand):
            if use in views:
                views[use].view = dataclasses.replace(views[use].view, eager=True)


# Ops whose results share storage with an argument without saying so in their schema.

def build_plan(imported: Imported, out_leaves: list, out_spec: pytree.TreeSpec) -> Plan:
    """Walk ``@main`` of an imported module into a :class:`Plan`.

    Raises:
        TridentError: an op, constant or type the runtime cannot call, naming the source line.
    """
    func = imported.module.body.operations[0]
    return _Walker(func, imported).walk(out_leaves, out_spec)


_CPU = Device(0, -1)
_LITERAL_DTYPES = [d for d in _DTYPES if not d.is_complex]


def _torch_dtype_code(mlir_code: int) -> int:
    """Torch-MLIR's importer numbers dtypes its own way (complex32 9, complex64 10); PyTorch's
    dispatcher reads c10::ScalarType codes (complex64 9, complex128 10)."""
    for dtype, code in {**TORCH_DTYPE_TO_INT, **OPTIONAL_TORCH_DTYPE_TO_INT}.items():
        if code == mlir_code:
            return dtype_codes()[dtype]
    raise TridentError(f"unknown Torch-MLIR dtype code {mlir_code}")
