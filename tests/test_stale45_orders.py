"""Issue 28, session 45: orders and attributes read through a class, each tested as a kind:
every call is compared with eager (``torch.equal``), with exact compile, hit and fallback counts
and the one warning where calls run eagerly."""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import counts, said


# ---- Note [Dict orders] (lower/orders.py): dict's slot wrappers through the class --------------
# The order probe holds a candidate dict's items reversed; ``dict.__iter__(d)`` (a slot wrapper,
# no C call the recording sees) of a 3-key dict's middle key reads the same there, so the dict
# was judged free of order and another order's call was served the first one's answer. Code that
# loads one of dict's order slot wrappers now keeps every order checked. A dict read through a
# global is checked in order, however it is read.

_ABC = (("ab", "cd", "ef"), ("ef", "cd", "ab"), ("cd", "ef", "ab"), ("ab", "cd", "ef"))
_SLOT_ALIAS = dict.__iter__


def _scales(order) -> dict:
    return {k: float(len(k) + ord(k[0])) for k in order}


def _middle_key(keys) -> torch.Tensor:
    return torch.tensor(float(ord(list(keys)[1][0])))


ORDER_READS = {
    "dict.__iter__": lambda x, d: x * _middle_key(dict.__iter__(d)),
    "type(d).__iter__": lambda x, d: x * _middle_key(type(d).__iter__(d)),
    "dict.keys": lambda x, d: x * _middle_key(dict.keys(d)),
    "dict.values": lambda x, d: x * list(dict.values(d))[1],
    "dict.items": lambda x, d: x * list(dict.items(d))[1][1],
    "dict.__reversed__": lambda x, d: x * _middle_key(dict.__reversed__(d)),
    "dict.__repr__": lambda x, d: x * float(dict.__repr__(d).index("'cd'")),
    "dict.__or__": lambda x, d: x * _middle_key(dict.__or__(d, {})),
    "a global bound to dict.__iter__": lambda x, d: x * _middle_key(_SLOT_ALIAS(d)),
    "a local bound to dict.__iter__": lambda x, d: (lambda it: x * _middle_key(it(d)))(
        dict.__iter__),
}
_GLOBAL_MASKS: dict = {}


@pytest.mark.parametrize("where", ["argument", "global"])
@pytest.mark.parametrize("read", sorted(ORDER_READS))
def test_a_dicts_middle_item_read_through_its_class(read, where):
    fn = ORDER_READS[read]
    if where == "global":
        def f(x, d):
            return fn(x, _GLOBAL_MASKS)
    else:
        f = fn
    jf, x = trident.jit(f), torch.arange(2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for order in _ABC:
            d = _scales(order)
            _GLOBAL_MASKS.clear()
            _GLOBAL_MASKS.update(_scales(order))
            assert torch.equal(jf(x, d), f(x, d)), order
    assert counts(jf) == (3, 1, 0), jf.stats


# ---- Note [State guards]: an attribute read through object.__getattribute__ ----------------------
# ``object.__getattribute__(OBJ, "k")`` (``type.__getattribute__(Cls, "k")``,
# ``OBJ.__getattribute__("k")``) read the class attribute ``k`` unguarded: the chain stopped at
# ``OBJ`` (or called a method no guard evaluates), and a hit returned the old value after
# ``Cls.k`` changed. It is now the chain ``OBJ.k``, as ``getattr(OBJ, "k")``.


class _Knob:
    k = 2.0


_KNOB = _Knob()

ATTRIBUTE_READS = {
    "object.__getattribute__": lambda x: x * object.__getattribute__(_KNOB, "k"),
    "obj.__getattribute__": lambda x: x * _KNOB.__getattribute__("k"),
    "type.__getattribute__": lambda x: x * type.__getattribute__(_Knob, "k"),
    "getattr(type(obj), k)": lambda x: x * getattr(type(_KNOB), "k"),
    "type(obj).k": lambda x: x * type(_KNOB).k,
    "vars(Cls)[k]": lambda x: x * vars(_Knob)["k"],
}


@pytest.mark.parametrize("change", ["class attribute", "instance attribute"])
@pytest.mark.parametrize("read", sorted(ATTRIBUTE_READS))
def test_an_attribute_read_through_the_class(read, change):
    fn = ATTRIBUTE_READS[read]
    jf, x = trident.jit(fn), torch.ones(2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no eager fallback
            for value in (2.0, 2.0, 5.0, 5.0):
                if change == "class attribute":
                    _Knob.k = value
                else:
                    _KNOB.k = value
                assert torch.equal(jf(x), fn(x)), (value, jf.stats)
    finally:
        _Knob.k = 2.0
        _KNOB.__dict__.pop("k", None)
    hits = 3 if change == "instance attribute" and read in (
        "type.__getattribute__", "getattr(type(obj), k)", "type(obj).k", "vars(Cls)[k]") else 2
    assert counts(jf) == (4 - hits, hits, 0), jf.stats


# ---- Note [Orders of an OrderedDict] (lower/state/recording.py) ----------------------------------
# An OrderedDict is checked in its own order; ``dict.keys(od)`` and dict's other methods called
# through the class read the order of the dict it is built on, which ``pop`` then set again and
# ``move_to_end`` make differ: a hit returned the old order's answer. Such a read runs the call
# eagerly; the OrderedDict's own methods are served.

_ODICT_GLOBAL: dict = {}

OD_READS = {
    "dict.keys": lambda x, d: x * _middle_key(dict.keys(d)),
    "dict.values": lambda x, d: x * list(dict.values(d))[1],
    "dict.items": lambda x, d: x * list(dict.items(d))[1][1],
    "dict.copy": lambda x, d: x * _middle_key(dict.copy(d)),
    "dict.__reversed__": lambda x, d: x * _middle_key(dict.__reversed__(d)),
    "dict.__iter__": lambda x, d: x * _middle_key(dict.__iter__(d)),
    "dict.__repr__": lambda x, d: x * float(dict.__repr__(d).index("'cd'")),
    "its own keys": lambda x, d: x * _middle_key(d.keys()),
    "its own values": lambda x, d: x * list(d.values())[1],
}
OD_OWN = ["its own keys", "its own values"]


def _reorder(od) -> None:
    """The dict's order becomes ab, ef, cd; the OrderedDict's stays ab, cd, ef."""
    od["cd"] = od.pop("cd")
    od.move_to_end("ef")


@pytest.mark.parametrize("where", ["argument", "global"])
@pytest.mark.parametrize("read", sorted(OD_READS))
def test_an_ordered_dict_read_in_its_dicts_order(read, where):
    import collections
    fn = OD_READS[read]
    if where == "global":
        def f(x, d):
            return fn(x, _ODICT_GLOBAL["od"])
    else:
        f = fn
    od = collections.OrderedDict(_scales(("ab", "cd", "ef")))
    _ODICT_GLOBAL["od"] = od
    jf, x = trident.jit(f), torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(3):
            if k == 2:
                _reorder(od)
                assert list(od) != list(dict.__iter__(od))
            assert torch.equal(jf(x, od), f(x, od)), k
    warned = said(caught, "trident")
    if read in OD_OWN:
        assert counts(jf) == (1, 2, 0) and not warned, (jf.stats, warned)
    else:
        assert counts(jf) == (0, 0, 3), jf.stats
        assert len(warned) == 1 and f"through {read}" in warned[0], warned


# ---- Note [Library results] (lower/state/flow.py): a write to what a library getter returns -----
# ``logging.getLogger(name)`` returns the logging manager's logger: the write walk (Note [Write
# targets]) took a library function's result for a new object, so a write to one was no write
# outside, and a hit did not make it. A library function's result is now outside (but for
# torch's and the few known to make a new one: ``copy.deepcopy``), so the call runs eagerly.

def test_a_write_to_a_logger_that_a_library_getter_returns():
    import logging

    def f(x):
        logger = logging.getLogger("trident_stale45")
        logger.disabled = not logger.disabled
        return x * 2.0

    logger = logging.getLogger("trident_stale45")
    jf, x = trident.jit(f), torch.ones(2)
    states = []
    for call in (jf, f, jf, f, jf, f):
        logger.disabled = False
        call(x)
        states.append(logger.disabled)
    assert states == [True] * 6 and jf.stats.fallbacks == 3, (states, jf.stats)


@pytest.mark.parametrize("read", ["o.__getattribute__", "object.__getattribute__"])
def test_a_class_attribute_read_through_an_arguments_getattribute(read):
    """The same reads of an argument: its class's attribute (the argument tree holds the
    object's own ``__dict__``; the class attribute is the chain's)."""
    if read == "o.__getattribute__":
        def fn(x, o):
            return x * o.__getattribute__("k")
    else:
        def fn(x, o):
            return x * object.__getattribute__(o, "k")

    class Knob:
        k = 2.0

    jf, x, o = trident.jit(fn), torch.ones(2), Knob()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for value in (2.0, 2.0, 5.0, 5.0):
            Knob.k = value
            assert torch.equal(jf(x, o), fn(x, o)), value
    assert counts(jf) == (2, 2, 0), jf.stats
