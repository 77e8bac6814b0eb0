"""Reads through an object whose own contents a check already holds (an argument's tree, a
value read whole): what its class holds along its MRO (Note [Instance lookups]), and the items
of a container the function iterates or indexes by a key computed at run time (Note [Items
reached by iteration])."""

from __future__ import annotations

import collections
import types

import torch

from trident import frames
from trident.errors import TridentError
from trident.ir.trees import _BY_ID
from trident.lower.state.bytecode import EACH
from trident.lower.state.chain import (_MISSING, _STOP, Read, _resolve_calls, _resolve_root,
                                       _root_of, _step)

# Note [Items reached by iteration]: ``for l in cache.layers: x = x + l.keys`` reads ``keys``
# of an object that no constant step names, and so does ``cache.layers[i].keys``: its class
# gaining a property ``keys`` (or ``l.K``, a class attribute, changing) went unseen, and hits
# returned the trace's value. The bytecode scan (``_items_reached`` in bytecode.py) continues
# the chain of a container with the step ``EACH`` (any of its items) wherever an item of it is
# reached: a loop's targets (``for``, a comprehension's or generator expression's code, through
# ``enumerate``, ``zip``, ``reversed``, ``sorted``, ``list``, ``tuple``, ``iter``, a dict's
# ``items()``, ``values()``, ``keys()``), an item by a key computed at run time, a slice's
# items. The container is held whole (its argument tree, or its chain read whole): its items by
# identity, their exact classes, their own attributes. What no such check holds is what each
# item's class holds, so :func:`object_reads` makes, for every item the container holds at the
# trace, the reads of an argument's object (Note [Instance lookups], a class attribute's
# chain). A container whose items Trident cannot list (a user class's ``__iter__``, a
# generator, a value a property serves) read through an attribute of its items makes the call
# run eagerly, and so do more than ``_EACH_BOUND`` objects walked; the items of a call's result
# (``for p in m.parameters()``) are a call's result, which no chain names (as ``m.get().k``).
_EACH_BOUND = 4096
_CALLS = ("call0", "call1", "call2")
_PLAIN = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)
_MODULE_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict,
                      torch.nn.ParameterList, torch.nn.ParameterDict)


def object_reads(value, steps: tuple, fn, budget: list) -> list[Read]:
    """The chains of ``steps`` read from ``value``, an object whose own contents a check holds
    (an argument's, an item of a container read whole): Note [Instance lookups], a class
    attribute's chain (:func:`_param_read`), and through ``EACH`` the reads of every item
    (Note [Items reached by iteration]). ``budget``: ``[objects left to walk]``.

    Raises:
        TridentError: items that Trident cannot list, or too many, are read through."""
    value, steps = _through_items(value, steps)
    if value is _MISSING or not steps:
        return []
    n = steps.index(EACH) if EACH in steps else len(steps)
    head = steps[:n]
    out = _lookup_reads(value, head) if head else []
    read = _param_read(value, head, fn) if head else None
    if read is not None:
        out.append(read)
    if n < len(steps) and not any(s[0] in _CALLS for s in head):
        out += each_reads(_walk(value, head), steps[n + 1:], fn, budget)
    return out


def each_reads(container, rest: tuple, fn, budget: list) -> list[Read]:
    """The reads of ``rest`` through every item of ``container`` (Note [Items reached by
    iteration]); none where ``rest`` reads no attribute.

    Raises:
        TridentError: as :func:`object_reads`."""
    if not any(s[0] in ("attr", "eager") for s in rest):
        return []
    items = _items(container)
    if items is None:
        what = "a value a property or __getattr__ serves" if container is _STOP else \
            f"a {type(container).__qualname__}"
        raise TridentError(f"the function reads an attribute of the items of {what}, which "
                           "Trident cannot list: state no guard follows")
    out: list = []
    kinds: set = set()  # the types whose items' reads depend on the type alone
    for item in items:
        if isinstance(item, (torch.Tensor, *_PLAIN)):
            if type(item) in kinds:
                continue
            kinds.add(type(item))
        else:
            budget[0] -= 1
            if budget[0] < 0:
                raise TridentError(f"the function reads the items of containers through more "
                                   f"than {_EACH_BOUND} objects: Trident does not guard them")
        out += object_reads(item, rest, fn, budget)
    return out


def _items(value) -> list | None:
    """What a loop over ``value``, or a key computed at run time, may reach of it (a dict's
    keys and values), or None where Trident cannot list it without running Python code."""
    if value is _MISSING or isinstance(value, (torch.Tensor, range, *_PLAIN)):  # (absent:
        # the container's own check holds it so)
        return []  # (a tensor's items are tensors the trace made)
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)) and \
            type(value).__iter__ in (list.__iter__, tuple.__iter__, set.__iter__,
                                     frozenset.__iter__, collections.deque.__iter__):
        return list(value)
    if isinstance(value, (dict, types.MappingProxyType)):
        if isinstance(value, types.MappingProxyType):
            return [*value.keys(), *value.values()]
        return [*dict.keys(value), *dict.values(value)]
    if isinstance(value, _MODULE_CONTAINERS):
        own = vars(value)
        return [v for k in ("_modules", "_parameters") for h in [own.get(k) or {}]
                for v in (*h.keys(), *h.values())]
    return None


def _walk(value, steps: tuple):
    """The value at the end of ``steps`` from ``value`` (its own attributes, an nn.Module's
    submodules, its class's plain attributes, items), as Python finds it, ``_MISSING``
    (absent) or ``_STOP`` (served by Python code)."""
    for step in steps:
        if step[0] == "attr":
            try:
                own = object.__getattribute__(value, "__dict__")
            except Exception:
                own = None
            held = _instance_value(value, own, step[1])
            value = held if held is not _MISSING else _step(value, step)
        elif step[0] in ("item", "get"):
            value = _step(value, step)
        else:
            return _STOP
        if value is _MISSING or value is _STOP:
            return value
    return value


def _end_of(read: Read, fn):
    """The value at the end of ``read`` now, ``_MISSING`` (absent) or ``_STOP`` (served by
    Python code)."""
    obj = _resolve_root(read.root, fn)
    for step in read.steps:
        obj = _step(obj, step)
    return obj


# A tensor's attributes that are its own state (its argument guards' or the trace's), not
# methods a user may patch on torch.Tensor.
_TENSOR_STATE = frozenset({"data", "grad", "requires_grad", "is_leaf", "grad_fn", "_version",
                           "_base", "names", "shape", "dtype", "device", "layout", "ndim"})


def _instance_value(value, d, name: str):
    """``value``'s own attribute ``name`` (its ``__dict__``'s, or an nn.Module's submodule,
    parameter or buffer, which its argument tree reads), or ``_MISSING``."""
    if not isinstance(d, dict):
        return _MISSING
    if name in d:
        return d[name]
    if isinstance(value, torch.nn.Module):
        return next((h[name] for h in map(d.get, ("_modules", "_parameters", "_buffers"))
                     if isinstance(h, dict) and name in h), _MISSING)
    return _MISSING


def _through_items(value, steps: tuple) -> tuple:
    """(value, the steps after) of an argument read through its items first (``kw["o"].k``,
    ``args[0].k``, ``d.get("o").k``): the items of a plain dict, list or tuple are the
    argument tree's (checked by identity); what is read through them, a class's attribute
    above all, is the chains' (:func:`_lookup_reads`, :func:`_param_read`)."""
    while steps and type(value) in (dict, list, tuple):
        if steps[0][0] == "item":
            key, steps = steps[0][1], steps[1:]
        elif type(value) is dict and steps[:1] == (("attr", "get"),) and \
                len(steps) > 1 and steps[1][0] == "call1":
            key, steps = steps[1][1], steps[2:]
        else:
            break
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING, ()
    return value, steps


def _lookup_reads(value, steps: tuple) -> list[Read]:
    """Note [Instance lookups]: ``cfg.a`` of an argument, found in its ``__dict__`` (or an
    nn.Module's submodules, parameters, buffers: the argument tree's), is found there only while
    no class of its MRO holds ``a`` as a data descriptor or the like (``Cfg.a = property(...)``
    shadows it; the tree checks the class by identity, not its contents); a name that is absent
    stays absent only while no class gains it or a ``__getattr__``; and either holds only while
    the class's ``__getattribute__`` is the one the trace ran (``Cfg.__getattribute__ = ...``
    assigned later serves every name). So each such step of a user class's instance reads the
    class's ``a`` (``ABSENT``, through its MRO in C) and its ``__getattribute__`` (``ID``:
    ``object``'s slot wrapper, named the same in every process), and for an absent name its
    ``__getattr__`` too. A class with no importable name (``<locals>``) is read as the class
    itself, one of a metaclass that looks names up as ``type`` does (``abc.ABC``'s) like any
    other: neither is taken as fixed."""
    out: list = []
    for step in steps[:16]:
        if step[0] == "item" and type(value) in (dict, list, tuple):  # the argument tree's
            try:  # items (``cache.layers[0].keys``: a property the class gets later)
                value = value[step[1]]
            except (KeyError, IndexError, TypeError):
                break
            continue
        if step[0] != "attr" or not isinstance(step[1], str) or isinstance(
                value, (type, types.ModuleType, torch.Tensor, *_BY_ID)) or value is _MISSING:
            break
        cls, name = type(value), step[1]
        if not any(frames.user_class(c) for c in cls.__mro__) or any(
                name in vars(c) for c in cls.__mro__):
            break  # a library's class (fixed), or one that holds it: _param_read's
        if not _plain_lookup(type(cls)):
            break
        root, path = _root_of(cls)  # (a class with no importable name: the class itself)
        out.append(Read(root, path + (("attr", name),)))
        out.append(Read(root, path + (("attr", "__getattribute__"),)))  # assigned later
        try:  # (not through a __getattr__)
            own = object.__getattribute__(value, "__dict__")
        except Exception:
            own = None
        held = _instance_value(value, own, name)
        if held is _MISSING:
            out.append(Read(root, path + (("attr", "__getattr__"),)))
            break
        value = held
    return out


def _plain_lookup(meta: type) -> bool:
    """Whether classes of metaclass ``meta`` find attributes as ``type`` does (``abc.ABCMeta``,
    an ``nn.Module``'s ``type``): the lookup through the MRO that the reads follow in C."""
    return meta.__getattribute__ is type.__getattribute__ and not any(
        "__getattr__" in vars(m) for m in meta.__mro__)


def _param_read(value, steps: tuple, fn, _depth: int = 0) -> Read | None:
    """``self.factor`` where the parameter's class holds ``factor``, ``type(self).K``,
    ``self.__class__.K`` and a classmethod's ``cls.s``: a chain from the class the value has
    (``type(self)``, read through its MRO in C as Python does: a subclass that shadows its
    base's attribute later is seen), wherever a user class of that MRO up to the one that holds
    the attribute may hold it."""
    value, steps = _through_items(value, steps)  # (``c.layers[0].K``: the class's K)
    if value is _MISSING or not steps or steps[0][0] not in ("attr", "eager"):
        return None
    if steps[0] == ("attr", "__class__") and not isinstance(value, types.ModuleType):
        value, steps = type(value), steps[1:]
        if not steps:
            return None  # type(self) alone: the argument tree checks the exact class
        if steps[0][0] != "attr":
            return None
    if steps[0][0] == "eager":
        if isinstance(value, (type, types.ModuleType)):  # (it raised TypeError)
            # Note [Modules used whole] in wholes.py: the parameter's kind
            root, path = _root_of(value)
            _resolve_calls(root, path + steps, fn)  # raises
        cls = type(value)  # its own attributes are its argument tree's; its class's, which
        if isinstance(value, (torch.Tensor, *_BY_ID)) or not any(  # the name may be, are
                frames.user_class(c) for c in cls.__mro__):  # the class's, used whole
            return None
        return Read(*_root_of(cls), True)
    if isinstance(value, types.ModuleType):  # a module passed in (its tree checks identity)
        root, path = _root_of(value)
        return _resolve_calls(root, path + steps, fn)
    if isinstance(value, type):
        cls, name = value, steps[0][1]
    elif isinstance(value, torch.Tensor):  # (a fake tensor in the trace) its methods, which
        name = steps[0][1]  # a user may patch (torch.Tensor.add = ...)
        if name in _TENSOR_STATE or not hasattr(torch.Tensor, name):
            return None
        return _resolve_calls(("module", "torch"), (("attr", "Tensor"), steps[0]), fn)
    else:
        if isinstance(value, (types.ModuleType, *_BY_ID)) or type(value).__module__ == "builtins":
            return None
        cls, name = type(value), steps[0][1]
        d = getattr(value, "__dict__", None)
        held = _instance_value(value, d, name)
        if held is not _MISSING:  # an instance attribute: the argument tree or the chain to it
            if len(steps) > 1 and _depth < 16:  # has it; what is read through it may not be
                return _param_read(held, steps[1:], fn, _depth + 1)  # (a class's attribute)
            return None
    mro = cls.__mro__
    at = next((k for k, c in enumerate(mro) if name in c.__dict__), None)
    if at is None or not any(frames.user_class(c) for c in mro[:at + 1]):
        return None
    root, path = _root_of(cls)
    return _resolve_calls(root, path + steps, fn)


