"""A specialization: the guards that select it and the plan it runs. Stored as JSON in the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from .guards import Guard
from .plan import Plan


@dataclasses.dataclass
class Specialization:
    """Attributes:
        signature: human-readable argument summary, e.g. ``f(x: float32[4, 8] cpu, n=3)``.
        arg_names: the user's parameter names for the positional arguments.
        guards: Note [Guard order].
        plan: the launch sequence.
    """

    signature: str
    arg_names: list[str]
    guards: list[Guard]
    plan: Plan

    def to_json(self) -> dict:
        return {"signature": self.signature, "arg_names": self.arg_names,
                "guards": [dataclasses.asdict(g) for g in self.guards],
                "plan": self.plan.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> "Specialization":
        return cls(data["signature"], data["arg_names"], [Guard(**g) for g in data["guards"]],
                   Plan.from_json(data["plan"]))

    @property
    def key(self) -> str:
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
