"""The plan: a specialization's launch sequence (Note [Symbolic sizes], Note [Views in C] and
Note [Buffer reuse] in lower/plan.py and lower/passes.py say how it is made)."""

from __future__ import annotations

import dataclasses

from trident.ir import operands
from trident.ir.operands import Operand


@dataclasses.dataclass(frozen=True)
class View:
    """Note [Views in C]: a view step whose geometry the generated C computes."""

    rank: int  # the input's rank
    eager: bool  # its tensor, once needed, is made as eager makes it (aten::as_strided)
    alias: bool  # an _unsafe_view, made at its step


@dataclasses.dataclass
class Step:
    """One operator call: ``results = op(*args)``."""

    op: str  # "aten::mul"
    overload: str  # "Scalar"; "" for the default overload
    args: list[Operand]
    results: list[Operand]  # per return: Val, List or Scalar, or Drop
    where: str  # "model.py:12"
    text: str  # the user's source line
    release: list[Operand] = dataclasses.field(default_factory=list)  # Val, List: dead after
    # Triton launches (op == "triton"): kernels.Launch as a dict, plus "binary" once compiled
    # for CUDA (cubins.compile_cuda). args are then the tensor arguments in parameter order.
    launch: dict | None = None
    # Note [Buffer reuse]: the ``.out`` overload that writes this step's result into a buffer
    # kept from the previous call, instead of allocating ("" when the step allocates).
    out_overload: str = ""
    view: View | None = None  # Note [Views in C]; None for other steps

    @property
    def qualified_name(self) -> str:
        return f"{self.op}.{self.overload}" if self.overload else self.op

    def to_json(self) -> dict:
        return {"op": self.op, "overload": self.overload,
                "args": [a.to_json() for a in self.args],
                "results": [r.to_json() for r in self.results], "where": self.where,
                "text": self.text, "release": [r.to_json() for r in self.release],
                "launch": self.launch, "out_overload": self.out_overload,
                "view": dataclasses.asdict(self.view) if self.view else None}

    @classmethod
    def from_json(cls, data: dict) -> "Step":
        """Raises ValueError, KeyError or TypeError for data ``to_json`` did not write."""
        view = data["view"]
        return cls(data["op"], data["overload"], [operands.from_json(a) for a in data["args"]],
                   [operands.from_json(r) for r in data["results"]], data["where"],
                   data["text"], [operands.from_json(r) for r in data["release"]],
                   data["launch"], data["out_overload"], View(**view) if view else None)


@dataclasses.dataclass
class Plan:
    """A specialization's launch sequence.

    Attributes:
        steps: operator calls in program order.
        outputs: flat output operands (tensors, and constants for non-tensor leaves).
        out_spec: the output structure (Note [Output spec] in runtime/args.cpp).
        num_values / num_lists / num_scalars: how many tensor, tensor-list and scalar values
            (an op's int, float or bool returns) the steps produce.
    """

    steps: list[Step]
    outputs: list[Operand]
    out_spec: str
    num_values: int
    num_lists: int
    num_scalars: int = 0

    def to_json(self) -> dict:
        return {"steps": [s.to_json() for s in self.steps],
                "outputs": [o.to_json() for o in self.outputs], "out_spec": self.out_spec,
                "num_values": self.num_values, "num_lists": self.num_lists,
                "num_scalars": self.num_scalars}

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        """Raises ValueError, KeyError or TypeError for data ``to_json`` did not write."""
        return cls([Step.from_json(s) for s in data["steps"]],
                   [operands.from_json(o) for o in data["outputs"]], data["out_spec"],
                   data["num_values"], data["num_lists"], data["num_scalars"])
