"""Serial numbers for objects that have nothing to hash but their identity (Note [Identity
serials])."""

from __future__ import annotations

import collections
import itertools
import weakref
from typing import Any

# Note [Identity serials]: an object that has nothing to hash but its identity (a C object
# without attributes, slots or a repr of its own, a lock whose repr shows its address) is named
# by a serial number of this process, never by its address: an address is reused by the next
# object once this one dies, and a function key or a tree's words that named the address would
# then take the new object for the old. One table serves the whole package: these words, and
# the ("object", token) roots of state chains (Note [Object roots] in lower/state/chain.py),
# which name an object by its serial and find it again by it (``serial_object``). A serial is
# never reused. The table keeps a weak reference (its object's death drops the entry) or, for
# an object that takes none (a dict, a plain ``object()``), the object itself, so that its
# address stays its own while a serial names it. Those strong references are bounded: the
# _STRONG_BOUND objects named most recently are kept (least recently named dropped first), so
# a process that names endless new dicts (a globals dict per exec'd cell) holds at most that
# many. A dropped object never gets a stale answer: named again, it gets a new serial (a new
# key: a miss), and a chain rooted at its old serial no longer evaluates, so a specialization
# stored with it is not installed (install.py) while one installed keeps the object in its own
# state tree. Names with a serial hold PROCESS too: no other process has them.
_HELD: dict[int, tuple[bool, Any]] = {}  # serial -> (weak, a weak reference or the object)
_SERIALS: dict[int, int] = {}  # id of an object the table names -> its serial
_STRONG: "collections.OrderedDict[int, None]" = collections.OrderedDict()  # serials held
_STRONG_BOUND = 1024  # strongly, least recently named first
_NEXT_SERIAL = itertools.count()


def serial_object(serial: int) -> Any:
    """Note [Identity serials]: the object ``serial`` names, or None where it died or was
    dropped from the table."""
    held = _HELD.get(serial)
    return None if held is None else held[1]() if held[0] else held[1]


def _forget(serial: int, key: int) -> None:
    _HELD.pop(serial, None)
    _STRONG.pop(serial, None)
    if _SERIALS.get(key) == serial:
        del _SERIALS[key]


def object_serial(obj: Any) -> int:
    """Note [Identity serials]: ``obj``'s serial number in this process."""
    key = id(obj)
    serial = _SERIALS.get(key)
    if serial is not None and serial_object(serial) is obj:
        if serial in _STRONG:
            _STRONG.move_to_end(serial)
        return serial
    serial = next(_NEXT_SERIAL)
    try:
        _HELD[serial] = (True, weakref.ref(obj, lambda _ref: _forget(serial, key)))
    except TypeError:  # (no weak reference: held, so that its address stays its own)
        _HELD[serial] = (False, obj)
        _STRONG[serial] = None
        while len(_STRONG) > _STRONG_BOUND:
            old = next(iter(_STRONG))
            _forget(old, id(_HELD[old][1]))
    _SERIALS[key] = serial
    return serial
