"""A specialization: the guards that select it and the plan it runs. Stored as JSON in the cache."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json

from trident.ir.trees import OutputRecipe
from trident.ir import operands
from trident.ir.guards import DeviceIndex, DeviceType, Dim, Guard
from trident.ir.plan import OpCall, Plan


@dataclasses.dataclass(frozen=True)
class StateGuard:
    """Note [State guards] (lower/state/__init__.py): what a trace read outside the arguments.
    ``reads``: each chain in its stored form (``Read.to_json``, lower/state/chain.py);
    ``digest``: the hash of their values, which the chains must evaluate to for the
    specialization to serve a call."""

    reads: tuple = ()
    digest: str = ""

    def to_json(self) -> dict:
        return {"reads": list(self.reads), "digest": self.digest}

    @classmethod
    def from_json(cls, data: dict) -> "StateGuard":
        return cls(tuple(data["reads"]), str(data["digest"]))


@dataclasses.dataclass(frozen=True)
class ValueChecks:
    """Note [Value reads] (lower/values.py): the Python numbers a trace took from the call's
    tensors. ``plan``: the steps that compute them from the arguments, its outputs the
    numbers; ``values``: what each was in the trace (an int or bool), which the call's must
    equal; ``lines``: per value, the user's ``("file.py:12", "text")`` that read it."""

    plan: Plan
    values: tuple
    lines: tuple = ()

    def to_json(self) -> dict:
        return {"plan": self.plan.to_json(), "values": list(self.values),
                "lines": [list(w) for w in self.lines]}

    @classmethod
    def from_json(cls, data: dict) -> "ValueChecks":
        values = tuple(data["values"])
        if not all(type(v) in (int, bool) for v in values):
            raise ValueError(f"not stored values: {values!r}")
        return cls(Plan.from_json(data["plan"]), values,
                   tuple(tuple(map(str, w)) for w in data["lines"]))


@dataclasses.dataclass
class Specialization:
    """Attributes:
        signature: human-readable argument summary, e.g. ``f(x: float32[4, 8] cpu, n=3)``.
        arg_names: the user's parameter names for the positional arguments.
        guards: Note [Guard order].
        plan: the launch sequence.
        dynamic: {argument index (as a string): dims traced as symbolic sizes}.
        shapes: each argument's shape in the call it was traced from (None: not a tensor);
            automatic dynamic dims compare a missing call's shapes with these.
        tree: the key of the argument tree its leaves come from (leaf 0; Note [Argument
            trees] in flatten.py).
        recipe: how the runtime rebuilds the result from the flat outputs, or None when the
            SCM's output spec does.
        catching: "file.py:LINE" of a ``try`` whose ``except`` was active around a torch call
            of the trace, or "" (Note [Errors inside try] in source_lines.py).
        state: what the trace read outside the arguments (``StateGuard``).
        tree_ints: Note [Stored int constants] (frontend/policy.py): ``{node index:
            description}`` of the int constants of its argument tree.
        free_orders: the paths of the dicts its argument tree checks in any order (Note
            [Dict orders] in lower/orders.py).
        checks: the values it took from the call's tensors (Note [Value reads] in
            lower/values.py), or None.
    """

    signature: str
    arg_names: list[str]
    guards: list[Guard]
    plan: Plan
    dynamic: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    shapes: list | None = None
    tree: int = 0
    recipe: OutputRecipe | None = None
    catching: str = ""
    state: StateGuard = dataclasses.field(default_factory=StateGuard)
    tree_ints: dict[str, str] = dataclasses.field(default_factory=dict)
    free_orders: tuple = ()
    checks: ValueChecks | None = None

    def to_json(self) -> dict:
        out = {"signature": self.signature, "arg_names": self.arg_names,
               "guards": [g.to_json() for g in self.guards],
               "plan": self.plan.to_json(), "dynamic": self.dynamic, "shapes": self.shapes,
               "tree": self.tree, "recipe": self.recipe.to_json() if self.recipe else None,
               "catching": self.catching, "state": self.state.to_json()}
        if self.tree_ints:  # (absent where there are none: such a spec's key is as before)
            out["tree_ints"] = self.tree_ints
        if self.free_orders:  # (absent alike)
            out["free_orders"] = list(self.free_orders)
        if self.checks is not None:  # (absent alike)
            out["checks"] = self.checks.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Specialization":
        recipe = data.get("recipe")
        return cls(data["signature"], data["arg_names"], [Guard.from_json(g) for g in data["guards"]],
                   Plan.from_json(data["plan"]), data.get("dynamic", {}), data.get("shapes"),
                   data["tree"], OutputRecipe.from_json(recipe) if recipe else None,
                   data.get("catching", ""),
                   StateGuard.from_json(data["state"]), dict(data.get("tree_ints", {})),
                   tuple(data.get("free_orders", ())),
                   ValueChecks.from_json(data["checks"]) if data.get("checks") else None)

    @property
    def symbolic(self) -> bool:
        """Traced with symbolic sizes: its sizes and strides are guarded by size relations
        (Note [Symbolic guards] in guards.py), not by value."""
        return bool(self.dynamic)

    @property
    def cuda_device(self) -> int | None:
        """The CUDA device index of a specialization whose tensor arguments are all on that
        device, else None (CPU tensors, several devices, no tensor); its host scalars aside."""
        host = self.host_scalars
        own = [g for g in self.guards if getattr(g, "arg", None) not in host]
        types = {g.value for g in own if isinstance(g, DeviceType)}
        indices = {g.value for g in own if isinstance(g, DeviceIndex)}
        return next(iter(indices)) if types == {1} and len(indices) == 1 else None

    @functools.cached_property
    def host_scalars(self) -> frozenset[int]:
        """Note [Host scalars]: a 0-dim CPU tensor argument that the launch sequence only copies
        to a CUDA device (``aten::_to_copy(arg, device=cuda)``, the first argument of each such
        step, and read nowhere else: not an output, not a size read on the host) is a host
        scalar of a CUDA specialization. transformers 5.17's ``StaticLayer`` starts with
        ``cumulative_length = torch.tensor(0)`` on the CPU and moves it to the cache's device
        in the forward that initializes the cache (its ``lazy_initialization``), so every
        prefill with a fresh static cache has one per layer. Such an argument no longer makes
        the specialization a CPU one: its sequence runs on the CUDA target, and its CUDA graph
        reads the scalar from a device buffer of its own, which each replay fills from the
        argument's host memory first (``TRT_GRAPH_HOST_IN``, frontend/graphs.py)."""
        cpu0 = {g.arg for g in self.guards if isinstance(g, DeviceType) and g.value == 0}
        cpu0 &= {g.arg for g in self.guards if isinstance(g, Dim) and g.value == 0}
        if not cpu0:
            return frozenset()
        copied: set[int] = set()
        elsewhere: set[int] = set()

        def args_in(o) -> set[int]:
            if isinstance(o, operands.Arg):
                return {o.i}
            if isinstance(o, (operands.Tensors, operands.OptTensors, operands.IntList)):
                return set().union(*(args_in(x) for x in o.v))
            return set()

        for step in self.plan.steps:
            first = step.args[0] if step.args else None
            to_cuda = (isinstance(step, OpCall) and step.op == "aten::_to_copy" and
                       isinstance(first, operands.Arg) and
                       any(isinstance(o, operands.Device) and o.type == 1 for o in step.args))
            for k, o in enumerate(step.args):
                (copied if to_cuda and k == 0 else elsewhere).update(args_in(o))
        for o in self.plan.outputs:
            elsewhere |= args_in(o)
        return frozenset(cpu0 & copied - elsewhere)

    @functools.cached_property
    def key(self) -> str:  # computed once: a miss compares it for every stored specialization
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
