"""Import: a captured FX graph into Torch-MLIR's ``torch`` dialect.

Torch-MLIR's ``FxImporter`` does the work (ATen ops become ``torch.aten.*`` ops on
``!torch.vtensor`` values, constants become ``torch.constant.*``, unregistered ops
``torch.operator``). Each op's location is the user's source line recorded at capture (Note
[Source lines] in source_lines.py).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch.fx as fx
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_dialect
from torch_mlir.extras.fx_importer import ContextCache, FxImporter, GraphNodeImporter
import torch

from trident import config
from trident.ir.launch import TensorParam, TritonLaunch
from trident.lower.source_lines import source_line, source_place


TRITON_LAUNCH = "trident.triton_launch"


# Note [Views stay views]: Torch-MLIR (20261001) rewrites ``aten.as_strided`` into
# ``aten.index`` with constant indices before import (``fx_as_strided.rewrite_as_strided``: its
# IR has no storage, so it keeps the values, not the aliasing), and refuses to import
# as_strided itself. Trident calls ATen, where a view is a view: the importer sees as_strided
# nodes under a stand-in target (a copy of the OpOverload, equal to it in all but identity) and
# imports them as ``torch.aten.as_strided``.
_AS_STRIDED = torch.ops.aten.as_strided.default


class Types:
    """The types of an imported module's values, as the plan reads them: each ``!torch.vtensor``
    type the importer made, with the rank and dtype it made it from (Torch-MLIR's Python
    bindings have no accessors for its dialect's types), and the list and scalar types as MLIR
    types, compared by equality."""

    def __init__(self, context: ir.Context):
        # a vtensor type's (rank, dtype); dtype None for a sparse tensor's
        self.tensors: dict[ir.Type, tuple[int, torch.dtype | None]] = {}
        parse = functools.partial(ir.Type.parse, context=context)
        self.tensor_list = parse("!torch.list<vtensor>")
        self.optional_tensor_list = parse("!torch.list<optional<vtensor>>")
        self.int_list, self.float_list, self.bool_list = (
            parse(f"!torch.list<{t}>") for t in ("int", "float", "bool"))
        self.int = parse("!torch.int")  # (an int argument traced as a symbol)
        self.scalars = {self.int} | {parse(f"!torch.{t}") for t in ("float", "bool")}

    def tensor(self, value: ir.Value) -> tuple[int, torch.dtype | None] | None:
        """``(rank, dtype)`` of a ``!torch.vtensor`` value; None for a value of another type."""
        return self.tensors.get(value.type)


class Imported(NamedTuple):
    """An imported graph: the MLIR module, the Triton launches its ``trident.triton_launch``
    ops name by index (their ``launch`` attribute), and its values' types."""

    module: ir.Module
    launches: list[TritonLaunch]
    types: Types


class _SourceLocations(ContextCache):
    """Note [Source lines] in source_lines.py: a node's location is its user line as data,
    ``loc("y = x + 1"("/path/file.py":12:0))``; a node without one (the graph's inputs and
    output among them) keeps the previous node's location, as Torch-MLIR does. ``launches``: the Triton launches imported so far; ``types``: the
    vtensor types made so far (``Types``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.launches: list[TritonLaunch] = []
        self.types = Types(self._c)

    def get_vtensor_type(self, shape, dtype, *, val=None, mutable=False) -> ir.Type:
        t = super().get_vtensor_type(shape, dtype, val=val, mutable=mutable)
        if not mutable:
            dense = val is None or val.layout == torch.strided
            self.types.tensors[t] = (len(shape), dtype if dense else None)
        return t

    def create_vtensor_type(self, dtype, size) -> ir.Type:
        t = super().create_vtensor_type(dtype, size)
        self.types.tensors[t] = (len(size), dtype)
        return t

    def get_node_location(self, node: fx.Node) -> ir.Location | None:
        place = source_place(node)
        if place is None:
            return None
        return ir.Location.name(source_line(node)[1], context=self._c,
                                childLoc=ir.Location.file(*place, 0, context=self._c))


def location(op: ir.Operation) -> tuple[str, str]:
    """``("file.py:12", "y = x + 1")`` of an op that ``_SourceLocations`` placed, or
    ``("?", "")``."""
    loc = op.location
    if not isinstance(loc, ir.NameLoc) or not isinstance(loc.child_loc, ir.FileLineColLoc):
        return "?", ""
    return f"{Path(loc.child_loc.filename).name}:{loc.child_loc.start_line}", loc.name_str


class NodeImporter(GraphNodeImporter):
    """Torch-MLIR's node importer with Trident's ``_import_hop_<name>`` methods."""

    # Note [Fixed operands of symbolic ops]: a builtin op on symbolic ints (``operator.mul``
    # of Note [Value reads]' checks) may take a node whose value the trace fixed, a plain int
    # (a size the call's guards hold: the batch of a trace where only the lengths are
    # symbols). Torch-MLIR (20261001) reads every node operand's type as a SymInt's
    # (``meta["val"].node.pytype``) and raised AttributeError, which failed the symbolic
    # compile and, with it, automatic dynamic for the rest of the function's life: a Hugging
    # Face model with a padded batch after a static cache compiled every new length at exact
    # sizes, to the limit. Such an operand is imported as its constant, as the trace saw it.
    def _import_symbolic_torch_op(self, loc, node: fx.Node, target) -> None:
        args = node.args
        node.args = tuple(a.meta["val"] if isinstance(a, fx.Node) and type(
            a.meta.get("val")) in (int, float, bool) else a for a in args)
        try:
            super()._import_symbolic_torch_op(loc, node, target)
        finally:
            node.args = args

    def _import_hop_triton_kernel_wrapper_mutation(self, loc: ir.Location, node: fx.Node,
                                                   hop) -> None:
        """A Triton launch becomes ``torch.operator "trident.triton_launch"(%tensors...)``.

        The operands are the tensor arguments in parameter order; attributes name the kernel
        (``kernel``) and the resolved launch (``launch``: its index in ``Imported.launches``).
        The op has no results: the kernel writes through its pointers, and later ops read the
        same tensor values.
        """
        launch = kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"]).get(
            "__trident_launch__")
        if launch is None:
            raise NotImplementedError("Triton launches are imported from Trident's capture only")
        tensors = node.kwargs["kwargs"]
        operands = [self._import_argument(loc, tensors[p.name])
                    for p in launch.params if isinstance(p, TensorParam)]
        launches = self._cc.launches
        with loc:
            ir.Operation.create("torch.operator", results=[], operands=operands, attributes={
                "name": ir.StringAttr.get(TRITON_LAUNCH),
                "kernel": ir.StringAttr.get(launch.kernel),
                "launch": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), len(launches)),
            })
        launches.append(launch)


def import_graph(gm: fx.GraphModule, func_name: str = "main", shape_env=None) -> Imported:
    """Import ``gm`` as ``func.func @<func_name>`` in a new MLIR module.

    ``shape_env``: the ``ShapeEnv`` of a trace with dynamic dims. Its symbols become
    ``torch.symbolic_int`` ops with their ranges, and each tensor's shape is bound to them with
    ``torch.bind_symbolic_shape`` (Torch-MLIR does this for ``ExportedProgram``s from their
    ``range_constraints``; a graph module carries its ranges in the ShapeEnv).

    Raises:
        NotImplementedError: from Torch-MLIR, for a node it cannot import.
    """
    imported = _import(gm, func_name, shape_env, symbolic=shape_env is not None)
    config.logger("mlir").info("%s", imported.module.operation.get_asm(enable_debug_info=True))
    return imported


def _import(gm: fx.GraphModule, func_name: str, shape_env, symbolic: bool) -> Imported:
    stand_ins = [n for n in gm.graph.nodes if n.target is _AS_STRIDED]
    for node in stand_ins:
        node.target = copy.copy(_AS_STRIDED)
    try:
        return _import_graph(gm, func_name, shape_env, symbolic)
    finally:
        for node in stand_ins:
            node.target = _AS_STRIDED


def _import_graph(gm: fx.GraphModule, func_name: str, shape_env, symbolic: bool) -> Imported:
    context = ir.Context()
    torch_dialect.register_dialect(context)
    importer = FxImporter(context=context, graph_node_importer_cls=NodeImporter)
    importer._cc = _SourceLocations(context, py_attr_tracker=importer._py_attr_tracker)
    if shape_env is None:
        importer.import_graph_module(gm, func_name=func_name)
        return Imported(importer.module, importer._cc.launches, importer._cc.types)
    ranges = {s: r for s, r in shape_env.var_to_range.items() if not r.is_bool}
    importer._cc.set_symbolic_guards(SimpleNamespace(range_constraints=ranges))
    try:
        importer.import_stateless_graph(gm.graph, func_name=func_name,
                                        import_symbolic_shape_expressions=symbolic)
    except NotImplementedError as e:
        if not symbolic:
            raise
        # Torch-MLIR (20261001) cannot bind shapes such as FloorDiv(s0, 2); the shapes are
        # descriptive only (the guards hold the facts), so import them as plain `?` dims.
        config.logger("mlir").info("shape expressions not imported: %s", e)
        return _import(gm, func_name, shape_env, symbolic=False)
    return Imported(importer.module, importer._cc.launches, importer._cc.types)

