"""Import: a captured FX graph into Torch-MLIR's ``torch`` dialect.

Torch-MLIR's ``FxImporter`` does the work (ATen ops become ``torch.aten.*`` ops on
``!torch.vtensor`` values, constants become ``torch.constant.*``, unregistered ops
``torch.operator``). Each op's location is the user's source line recorded at capture.
"""

from __future__ import annotations

import torch.fx as fx
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_dialect
from torch_mlir.extras.fx_importer import FxImporter, GraphNodeImporter

from . import config


class NodeImporter(GraphNodeImporter):
    """Torch-MLIR's node importer; Trident adds ``_import_hop_<name>`` methods here."""


def import_graph(gm: fx.GraphModule, func_name: str = "main") -> ir.Module:
    """Import ``gm`` as ``func.func @<func_name>`` in a new MLIR module.

    Raises:
        NotImplementedError: from Torch-MLIR, for a node it cannot import.
    """
    context = ir.Context()
    torch_dialect.register_dialect(context)
    importer = FxImporter(context=context, graph_node_importer_cls=NodeImporter)
    importer.import_graph_module(gm, func_name=func_name)
    module = importer.module
    config.logger("mlir").info("%s", module.operation.get_asm(enable_debug_info=True))
    return module
