"""A traced result's structure: the recipe by which the runtime rebuilds it from the SCM's flat
outputs (Note [Argument trees] in flatten.py: tuples, lists, dicts, namedtuples, struct
sequences, dataclasses, ``ModelOutput``, and objects of the call itself by reference).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from trident.errors import TridentError, with_article
from trident.ir.trees import (BASE_DICT, BASE_OBJECT, BASE_ODICT, DICT, ID, OBJECT, R_AGAIN,
                              R_BUILT, R_CONST, R_DICT, R_INPUT, R_LIST, R_NAMEDTUPLE, R_OBJECT,
                              R_STRUCTSEQ, R_TUPLE, R_VALUE, R_WRITE, SEQ, _SCALARS, ArgTree, OutputRecipe)
from trident.lower.flatten import _is_namedtuple, _is_structseq, _type_name


def _rebuildable(t: type) -> bool:
    """Instances of ``t`` hold all their state in ``__dict__`` (and, for ``dict`` and
    ``OrderedDict`` subclasses, their items), so the runtime can make one with the base type's
    ``tp_new`` and fill it in: dataclasses, ``ModelOutput``, a ``DynamicCache`` made by the
    function. Classes with ``__slots__`` or another built-in base are not."""
    if isinstance(t, type) and issubclass(t, torch.nn.Module):
        return False
    for c in t.__mro__[:-1]:
        if c in (dict, OrderedDict):
            continue
        if not (c.__flags__ & (1 << 9)):  # Py_TPFLAGS_HEAPTYPE: a built-in base
            return False
        if set(c.__dict__.get("__slots__", ())) - {"__dict__", "__weakref__"} or \
                "__new__" in c.__dict__:
            return False
    return "__dict__" in dir(t)


def flatten_output(result: Any, tree: ArgTree | None, values: list | None,
                   rebuilt: dict | None = None, writes: list = ()):
    """(flat outputs, recipe or None): ``recipe`` is None when the result is tensors, scalars
    and None in tuples and lists, which the SCM's output spec builds itself. ``writes``:
    ``(node, name, value, tensor attributes)`` of the attributes the function set
    (``substitute.substituted``; Note [Attribute writes] in writes.py), replayed after the
    result is built: their values are flat outputs too.

    Raises:
        TridentError: a result Trident cannot rebuild (its path and type named)."""
    objects = {id(v): i for i, v in enumerate(values or ())
               if tree and tree.nodes[i].check in (OBJECT, DICT, SEQ, ID)}
    objects.update(rebuilt or {})
    made: dict[int, int] = {}  # id of a container or object of the result -> its op
    making: set[int] = set()
    flat: list = []
    ops: list = []
    simple = [True]
    flat_index: dict[int, int] = {}  # id of a tensor -> its flat output

    def walk(v, path: str) -> None:
        t = type(v)
        if isinstance(v, torch.Tensor) and id(v) in flat_index:
            simple[0] = False
            ops.append((R_AGAIN, flat_index[id(v)]))
        elif isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)) \
                or t in _SCALARS:  # (a Sym scalar: an op's result while traced, .item())
            if isinstance(v, torch.Tensor):
                flat_index[id(v)] = len(flat)
            flat.append(v)
            ops.append((R_VALUE,))
        elif id(v) in objects:
            simple[0] = False
            ops.append((R_INPUT, objects[id(v)]))
        elif id(v) in made:  # the same container or object twice: one object, as in eager
            simple[0] = False
            ops.append((R_BUILT, made[id(v)]))
        elif id(v) in making:
            raise TridentError(f"the result {path} contains itself")
        else:
            making.add(id(v))
            op = len(ops)
            walk_new(v, path)
            making.discard(id(v))
            if type(v) not in _SCALARS and not isinstance(v, (str, torch.dtype, torch.device)):
                made[id(v)] = op

    def walk_new(v, path: str) -> None:
        t = type(v)
        if t in (tuple, list):
            ops.append((R_TUPLE if t is tuple else R_LIST, len(v)))
            for i, item in enumerate(v):
                walk(item, f"{path}[{i}]")
        elif _is_namedtuple(t) or _is_structseq(t):
            simple[0] = False
            ops.append((R_NAMEDTUPLE if _is_namedtuple(t) else R_STRUCTSEQ, t, len(v)))
            for i, item in enumerate(v):
                walk(item, f"{path}[{i}]")
        elif t is dict and all(type(k) is str for k in v):
            simple[0] = False
            ops.append((R_DICT, tuple(v)))
            for k, item in v.items():
                walk(item, f"{path}[{k!r}]")
        elif t in (str, torch.dtype, torch.device):
            simple[0] = False
            ops.append((R_CONST, v))
        elif _rebuildable(t) and all(type(k) is str for k in (v if isinstance(v, dict) else ())):
            simple[0] = False
            base = BASE_ODICT if isinstance(v, OrderedDict) else \
                BASE_DICT if isinstance(v, dict) else BASE_OBJECT
            if isinstance(v, (list, tuple, set)):
                raise TridentError(f"the {path} is {with_article(_type_name(t))}, which Trident "
                                   "cannot rebuild")
            attrs = tuple(vars(v))
            items = tuple(v) if base != BASE_OBJECT else ()
            ops.append((R_OBJECT, t, base, attrs, items))
            for k in attrs:
                walk(vars(v)[k], f"{path}.{k}")
            for k in items:
                walk(v[k], f"{path}[{k!r}]")
        else:
            raise TridentError(f"the {path} is {with_article(_type_name(t))}, which Trident cannot "
                               "rebuild (expected tensors, scalars, None, str, tuples, lists, "
                               "dicts, namedtuples, torch.return_types, torch.Size, "
                               "dataclasses, or an object of the call)")

    walk(result, "result")
    for node, name, value, attrs in writes:
        simple[0] = False
        ops.append((R_WRITE, node, name, attrs))
        walk(value, f"{tree.nodes[node].path}.{name}")
    return flat, (None if simple[0] else OutputRecipe(ops))
