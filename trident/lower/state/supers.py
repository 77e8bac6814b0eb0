"""Attributes read through ``super()`` (Note [Reads through super])."""

from __future__ import annotations

import dis
import sys
import types

# Note [Reads through super]: ``super().k`` (and ``super(Sub, self).k``, a ``super()`` kept in
# a local) looks ``k`` up in the MRO of ``type(self)`` after the method's class, on an object
# that a call made: no chain names it (a call's result, Limits today), so a hit kept the
# trace's ``Base.k`` after ``Base.k = 7.0`` or after a class between them gained its own
# ``k``. A method called through it (``super().forward(x)``, ``super().__init__()``) is served:
# the code that runs is recorded as any user function's, with its reads. So a user code that
# uses ``super()``'s result otherwise than to call a method of it makes the call run eagerly,
# with one warning, decided from its bytecode when it starts in the trace (Note [Writes at
# entry] in writes.py; ``tests/test_break47.py``). CPython 3.11 calls ``super`` and loads the
# method (``LOAD_METHOD``); 3.12 has ``LOAD_SUPER_ATTR``, whose oparg's low bit is set for a
# method (and ``LOAD_ATTR``'s, after a plain call of ``super``).


def super_read(code: types.CodeType) -> str | None:
    """What ``code`` reads through ``super()`` other than a method it calls, as
    ``"super().k at file:line"``, or None."""
    if "super" not in code.co_names:  # (3.12's LOAD_SUPER_ATTR loads the global first)
        return None
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL")]
    for j, i in enumerate(ins):
        what = None
        if i.opname == "LOAD_SUPER_ATTR" and not i.arg & 1:
            what = f"super().{i.argval}"
        elif i.opname == "LOAD_GLOBAL" and i.argval == "super":
            call = next((k for k in range(j + 1, len(ins))
                         if ins[k].opname in ("CALL", "LOAD_SUPER_ATTR")), None)
            if call is not None and ins[call].opname == "LOAD_SUPER_ATTR":
                continue  # 3.12: its own case above
            after = ins[call + 1] if call is not None and call + 1 < len(ins) else None
            if after is None or not (after.opname == "LOAD_METHOD" or (
                    after.opname == "LOAD_ATTR" and sys.version_info >= (3, 12) and
                    after.arg & 1)):
                what = "super()" + (f".{after.argval}" if after is not None and
                                    after.opname == "LOAD_ATTR" else "'s result")
        if what is not None:
            line = i.positions.lineno if i.positions else "?"
            return f"{what} at {code.co_filename.rsplit('/', 1)[-1]}:{line}"
    return None
