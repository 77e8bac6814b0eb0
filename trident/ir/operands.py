"""Operands: what a step of a plan (plan.py) reads and makes, as small frozen dataclasses.

Each kind is one class; codegen dispatches on the class (``match``), never on a string key. A
plan is stored as JSON with its specialization (the cache, tests/golden/): an operand is written
``{"k": KIND, <field>: <value>, ...}`` (``to_json``) and read back by ``from_json``, which
raises ``ValueError`` for a kind or a field this Trident does not know (a damaged cache entry).

    Arg(i=0)                the call's argument leaf 0 (a tensor, borrowed)
    Val(i=3)                tensor value 3, made by an earlier step (owned)
    List(i=4)               tensor-list value 4, an op's ``Tensor[]`` return (owned)
    Item(list=4, i=1)       element 1 of tensor-list value 4 (borrowed)
    Scalar(i=2)             scalar value 2, an op's int/float/bool return (a size)
    Drop()                  a return the plan does not keep (an undefined tensor)
    Int(v) Float(v) Bool(v) Str(v) NoneConst()   constants
    Device(type, index)     a device constant: type 0 CPU, 1 CUDA; index -1 for none
    Ints(v) Floats(v) Bools(v)   constant lists
    IntList(v)              ints some of which are computed (Note [Symbolic sizes] in plan.py):
                            ``Int`` and ``Scalar`` items
    Tensors(v) OptTensors(v)   tensor lists (``Tensor[]``, ``Tensor?[]``) of tensor operands
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

_KINDS: dict[str, type[Operand]] = {}


@dataclasses.dataclass(frozen=True)
class Operand:
    """Base class: ``KIND`` is the ``"k"`` of its JSON."""

    KIND: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _KINDS[cls.KIND] = cls

    def to_json(self) -> dict:
        out: dict = {"k": self.KIND}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out[field.name] = [v.to_json() if isinstance(v, Operand) else v for v in value] \
                if isinstance(value, tuple) else value
        return out


def from_json(data: dict) -> Operand:
    """The operand ``data`` (``Operand.to_json``'s) describes.

    Raises:
        ValueError: an unknown kind, or fields that are not the kind's.
    """
    if not isinstance(data, dict) or data.get("k") not in _KINDS:
        raise ValueError(f"not a stored operand: {data!r}")
    cls = _KINDS[data["k"]]
    fields = {k: v for k, v in data.items() if k != "k"}
    if set(fields) != {f.name for f in dataclasses.fields(cls)}:
        raise ValueError(f"not a stored {cls.__name__} operand: {data!r}")
    return cls(**{k: tuple(from_json(x) if isinstance(x, dict) else x for x in v)
                  if isinstance(v, list) else v for k, v in fields.items()})


@dataclasses.dataclass(frozen=True)
class Arg(Operand):
    KIND = "arg"
    i: int


@dataclasses.dataclass(frozen=True)
class Val(Operand):
    KIND = "val"
    i: int


@dataclasses.dataclass(frozen=True)
class List(Operand):
    KIND = "list"
    i: int


@dataclasses.dataclass(frozen=True)
class Item(Operand):
    KIND = "item"
    list: int
    i: int


@dataclasses.dataclass(frozen=True)
class Scalar(Operand):
    KIND = "scalar"
    i: int


@dataclasses.dataclass(frozen=True)
class Drop(Operand):
    KIND = "drop"


@dataclasses.dataclass(frozen=True)
class Int(Operand):
    KIND = "int"
    v: int


@dataclasses.dataclass(frozen=True)
class Float(Operand):
    KIND = "float"
    v: float


@dataclasses.dataclass(frozen=True)
class Bool(Operand):
    KIND = "bool"
    v: bool


@dataclasses.dataclass(frozen=True)
class Str(Operand):
    KIND = "str"
    v: str


@dataclasses.dataclass(frozen=True)
class NoneConst(Operand):
    KIND = "none"


@dataclasses.dataclass(frozen=True)
class Device(Operand):
    KIND = "device"
    type: int
    index: int


@dataclasses.dataclass(frozen=True)
class Ints(Operand):
    KIND = "ints"
    v: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Floats(Operand):
    KIND = "floats"
    v: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Bools(Operand):
    KIND = "bools"
    v: tuple[bool, ...]


@dataclasses.dataclass(frozen=True)
class IntList(Operand):
    KIND = "int_list"
    v: tuple[Operand, ...]


@dataclasses.dataclass(frozen=True)
class Tensors(Operand):
    KIND = "tensors"
    v: tuple[Operand, ...]


@dataclasses.dataclass(frozen=True)
class OptTensors(Operand):
    KIND = "opt_tensors"
    v: tuple[Operand, ...]


def constant(value) -> Operand:
    """The constant operand of a Python None, bool, int or float."""
    if value is None:
        return NoneConst()
    return {bool: Bool, int: Int, float: Float}[type(value)](value)
