"""Tensors a traced function makes from Python data on a device (``build_literal``), made anew
at each call; split from capture.py, which calls it after the trace."""

from __future__ import annotations

import torch
import torch.fx as fx


def build_literal(graph: fx.Graph, constant: fx.Node, value: torch.Tensor) -> None:
    """A tensor made from Python data that plan.py does not bake (one CPU element or none): of
    several elements, or on a device (``torch.tensor([], device=key_states.device)`` in
    transformers' ``DynamicLayer``; make_fx holds the device's copy). Each ``lift_fresh_copy``
    of it becomes ops that make it anew on its device: ``aten::empty``, or ``aten::scalar_tensor``
    of each element, ``aten::stack``, ``aten::_unsafe_view`` (no ``_base``: as eager's copy)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    aten = torch.ops.aten
    fake = FakeTensorMode()  # the values the importer reads types from
    made_kw = {"dtype": value.dtype, "device": value.device}
    for copy in list(constant.users):
        nodes: list[fx.Node] = []

        def add(target, args, example, kwargs=None):
            nodes.append(graph.call_function(target, args, kwargs))
            nodes[-1].meta["val"] = fake.from_tensor(example.clone())
            nodes[-1].meta["custom"] = copy.meta.get("custom")  # Note [Source lines]

        with graph.inserting_before(copy):
            if value.numel() == 0:
                add(aten.empty.memory_format, (list(value.shape),), value, made_kw)
            for v in value.flatten().tolist():
                add(aten.scalar_tensor.default, (v,), value.flatten()[0], made_kw)
            if value.dim() != 0 and value.numel():
                add(aten.stack.default, (list(nodes),), value.flatten())
            if value.dim() > 1 and value.numel():  # not a view in autograd's sense: no _base
                add(aten._unsafe_view.default, (nodes[-1], list(value.shape)), value.contiguous())
        copy.replace_all_uses_with(nodes[-1])
        graph.erase_node(copy)
    graph.erase_node(constant)
