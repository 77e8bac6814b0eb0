"""The plan: a specialization's launch sequence (Note [Symbolic sizes], Note [Views in C] and
Note [Buffer reuse] in lower/plan.py and lower/passes.py say how it is made)."""

from __future__ import annotations

import dataclasses
import json

import torch.utils._pytree as pytree

from trident.errors import TridentError
from trident.ir import operands
from trident.ir.launch import CompiledBinary, TritonLaunch
from trident.ir.operands import Operand


@dataclasses.dataclass(frozen=True)
class View:
    """Note [Views in C]: a view step whose geometry the generated C computes."""

    rank: int  # the input's rank
    eager: bool  # its tensor, once needed, is made as eager makes it (aten::as_strided)
    alias: bool  # an _unsafe_view, made at its step


@dataclasses.dataclass
class Step:
    """One step of a launch sequence: ``results = <call>(*args)``. Each kind is one class
    (``OpCall``, ``SizeStep``, ``TritonStep``); codegen and the passes dispatch on the class.

    Attributes:
        args: what the call reads.
        results: per return: ``Val``, ``List`` or ``Scalar``, or ``Drop``.
        where: the user's ``"model.py:12"``; text: the user's source line.
        release: ``Val``, ``List``: owned values dead after this step.
    """

    args: list[Operand]
    results: list[Operand]
    where: str
    text: str
    release: list[Operand] = dataclasses.field(default_factory=list, kw_only=True)

    def _json(self, op: str, overload: str, launch: dict | None = None, out_overload: str = "",
              view: View | None = None) -> dict:
        return {"op": op, "overload": overload,
                "args": [a.to_json() for a in self.args],
                "results": [r.to_json() for r in self.results], "where": self.where,
                "text": self.text, "release": [r.to_json() for r in self.release],
                "launch": launch, "out_overload": out_overload,
                "view": dataclasses.asdict(view) if view else None}

    def to_json(self) -> dict:
        raise NotImplementedError

    @staticmethod
    def from_json(data: dict) -> "Step":
        """Raises ValueError, KeyError or TypeError for data ``to_json`` did not write."""
        args = [operands.from_json(a) for a in data["args"]]
        results = [operands.from_json(r) for r in data["results"]]
        common = (args, results, data["where"], data["text"])
        release = [operands.from_json(r) for r in data["release"]]
        if data["op"] == _TRITON:
            launch = dict(data["launch"])
            binary = launch.pop("binary", None)
            return TritonStep(*common, TritonLaunch.from_json(launch),
                              CompiledBinary.from_json(binary) if binary else None,
                              release=release)
        if data["op"] == _SIZE:
            return SizeStep(*common, data["overload"], release=release)
        view = data["view"]
        return OpCall(*common, data["op"], data["overload"], data["out_overload"],
                      View(**view) if view else None, release=release)


# The cache's JSON names the kind of a step that calls no operator by its "op" (a step that
# calls one has "namespace::name").
_TRITON, _SIZE = "triton", "int"


@dataclasses.dataclass
class OpCall(Step):
    """A call of an operator through PyTorch's dispatcher: ``op`` (``"aten::mul"``) and its
    ``overload`` (``"Scalar"``; ``""`` for the default overload)."""

    op: str
    overload: str
    # Note [Buffer reuse]: the ``.out`` overload that writes this step's result into a buffer
    # kept from the previous call, instead of allocating ("" when the step allocates).
    out_overload: str = ""
    view: View | None = None  # Note [Views in C]; None for other calls

    @property
    def qualified_name(self) -> str:
        return f"{self.op}.{self.overload}" if self.overload else self.op

    def to_json(self) -> dict:
        return self._json(self.op, self.overload, None, self.out_overload, self.view)


# Size steps' ops by Torch-MLIR's op names (Note [Symbolic sizes] in lower/plan.py; checked:
# Note [Checked size steps] in codegen/render.py). Python's ``%`` on ints is ``aten.fmod.int``
# (Torch-MLIR's fx_importer), Python's sign: ``"remainder"``; ``/`` is ``aten.div.int``, a float.
SIZE_OPS = {"torch.aten.mul.int": "mul", "torch.aten.add.int": "add", "torch.aten.neg.int": "neg",
            "torch.aten.sub.int": "sub", "torch.aten.floordiv.int": "floordiv",
            "torch.aten.remainder.int": "remainder", "torch.aten.fmod.int": "remainder",
            "torch.aten.div.int": "truediv"}


@dataclasses.dataclass
class SizeStep(Step):
    """Note [Symbolic sizes] (lower/plan.py): integer arithmetic on sizes that the generated C
    computes: ``op`` is ``"size"`` (``args``: an ``Arg`` and a dim), ``"value"`` (``args``: an
    int ``Arg`` traced as a symbol, Note [Symbolic ints] in lower/guards.py) or one of Python's
    int operators ``"mul"``, ``"add"``, ``"sub"``, ``"floordiv"``, ``"remainder"``, ``"neg"``,
    ``"truediv"`` (a float: ``n / 2``)."""

    op: str

    def to_json(self) -> dict:
        return self._json(_SIZE, self.op)


def floats_taken(steps: list[Step]) -> None:
    """Raises TridentError where a step takes a float that a true division of sizes computed
    (a plan reads a size step's result as an int: Note [Scalar operands] in lower/plan.py):
    such a float is only returned or written (Note [Attribute writes] in lower/writes.py)."""
    floats = {r.i for s in steps if isinstance(s, SizeStep) and s.op == "truediv"
              for r in s.results}
    for s in steps:
        if any(isinstance(a, operands.Scalar) and a.i in floats for a in s.args):
            raise TridentError(f"{s.where}: a float computed from symbolic sizes or ints "
                               f"({s.text}) is taken by an op")


@dataclasses.dataclass
class TritonStep(Step):
    """A Triton launch; ``args`` are its tensor arguments in parameter order. ``binary``: the
    launch compiled for its CUDA device (``lower.cubins.compile_cuda``); None for a launch on
    CPU tensors, which Triton's interpreter runs."""

    launch: TritonLaunch
    binary: CompiledBinary | None = None

    def to_json(self) -> dict:
        launch = self.launch.to_json()
        if self.binary is not None:
            launch["binary"] = self.binary.to_json()
        return self._json(_TRITON, self.launch.kernel, launch)


@dataclasses.dataclass
class Plan:
    """A specialization's launch sequence.

    Attributes:
        steps: operator calls in program order.
        outputs: flat output operands (tensors, and constants for non-tensor leaves).
        out_spec: the result's structure: tuples, lists and ``None`` around the flat outputs
            (torch's pytree; codegen prints it for the runtime, Note [Output spec] in
            runtime/args.cpp). JSON as ``treespec_dumps`` writes it.
        num_values / num_lists / num_scalars: how many tensor, tensor-list and scalar values
            (an op's int, float or bool returns) the steps produce.
    """

    steps: list[Step]
    outputs: list[Operand]
    out_spec: pytree.TreeSpec
    num_values: int
    num_lists: int
    num_scalars: int = 0

    def to_json(self) -> dict:
        return {"steps": [s.to_json() for s in self.steps],
                "outputs": [o.to_json() for o in self.outputs],
                "out_spec": json.loads(pytree.treespec_dumps(self.out_spec)),
                "num_values": self.num_values, "num_lists": self.num_lists,
                "num_scalars": self.num_scalars}

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        """Raises ValueError, KeyError or TypeError for data ``to_json`` did not write."""
        return cls([Step.from_json(s) for s in data["steps"]],
                   [operands.from_json(o) for o in data["outputs"]],
                   _spec_from_json(data["out_spec"]),
                   data["num_values"], data["num_lists"], data["num_scalars"])


def spec_children(spec: pytree.TreeSpec) -> list[pytree.TreeSpec]:
    """The specs of ``spec``'s children (``TreeSpec.child``; ``children_specs`` where torch
    has no ``child``)."""
    if hasattr(spec, "child"):
        return [spec.child(i) for i in range(spec.num_children)]
    return spec.children_specs


def plain_spec(spec: pytree.TreeSpec) -> bool:
    """Whether ``spec`` is tuples, lists and ``None`` around leaves: the structures the runtime
    builds (Note [Output spec] in runtime/args.cpp)."""
    return spec.is_leaf() or (spec.type in (tuple, list, type(None))
                              and all(plain_spec(c) for c in spec_children(spec)))


def _spec_from_json(data) -> pytree.TreeSpec:
    """Raises ValueError for data that is not a plain spec as ``treespec_dumps`` writes it."""
    try:
        spec = pytree.treespec_loads(json.dumps(data))
    except NotImplementedError as e:  # a type torch's pytree cannot read back
        raise ValueError(str(e)) from e
    if not plain_spec(spec):
        raise ValueError(f"not an output structure the runtime builds: {spec}")
    return spec
