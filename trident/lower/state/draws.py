"""Random state that a trace draws from (Note [Draws of a trace]).

Note [Draws of a trace]: the trace runs the function's Python code once, and what that code
draws from a Python-level random generator it draws for real: Python's ``random`` module (its
hidden ``Random`` instance) or a ``random.Random`` of the user's, numpy's global ``RandomState``
(``np.random.rand()``: Cython methods, which no profile hook reports, so the recording never saw
them, and every hit returned the trace's draw), a numpy ``Generator`` or ``BitGenerator``. Such
a call then runs eagerly (a draw is a result no guard keeps), and eager drew again from the
state the trace had moved on: the first call's answer was eager's second draw. So the recording
keeps the state of each generator the trace may draw from before the draw: numpy's global one at
the start (``numpy.random`` imported then where numpy is: numpy imports it at its first use,
which may be the trace's), a ``random.Random`` at the C call of its method (the profile hook
runs before it; one of user code, or the ``random`` module's own: a library's own generator, as
sympy's, is the library's), a generator that user code names (a global, a closure's cell, a
parameter) as its frame starts. At the end, a generator whose state moved is put back as it was,
and the trace is refused: the call runs eagerly and draws once, as eager does. Not seen: a
generator that only library code or an attribute reaches (``self.rng``), whose draw is a result
the trace keeps.
"""

from __future__ import annotations

import pickle
import random
import sys


def _kind(obj) -> str | None:
    """``obj``'s kind of generator, or None: ``random``, ``numpy`` (a ``RandomState``),
    ``bit`` (a numpy ``Generator`` or ``BitGenerator``)."""
    if isinstance(obj, random.Random):
        return "random"
    module = type(obj).__module__
    if not isinstance(module, str) or not module.startswith("numpy.random"):
        return None
    if hasattr(obj, "get_state") and hasattr(obj, "set_state"):
        return "numpy"
    if hasattr(obj, "bit_generator") or hasattr(type(obj), "state"):
        return "bit"
    return None


def _state(obj, kind: str):
    if kind == "random":
        return obj.getstate()
    if kind == "numpy":
        return obj.get_state(legacy=False)
    return (obj.bit_generator if hasattr(obj, "bit_generator") else obj).state


def _set(obj, kind: str, state) -> None:
    if kind == "random":
        obj.setstate(state)
    elif kind == "numpy":
        obj.set_state(state)
    else:
        (obj.bit_generator if hasattr(obj, "bit_generator") else obj).state = state


class Draws:
    """Note [Draws of a trace]: the generators a trace may draw from, and their states before
    it."""

    def __init__(self) -> None:
        self.saved: dict = {}  # id -> (generator, kind, state)
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is None and "numpy" in sys.modules:  # (numpy imports it lazily: the
            try:  # trace's first np.random.rand() would import it, unwatched)
                import numpy.random as numpy_random
            except Exception:  # noqa: BLE001 (numpy without its random module: no draws)
                numpy_random = None
        legacy = getattr(getattr(numpy_random, "mtrand", None), "_rand", None)
        if legacy is not None:
            self.watch(legacy)

    def watch(self, obj) -> None:
        """Keep ``obj``'s state, where it is a generator not kept yet."""
        if id(obj) in self.saved:
            return
        kind = _kind(obj)
        if kind is not None:
            try:
                self.saved[id(obj)] = (obj, kind, _state(obj, kind))
            except Exception:  # noqa: BLE001 (a generator that hides its state: not kept)
                pass

    def watch_frame(self, code, frame) -> None:
        """The generators that a user code's frame, just started, names: the globals its code
        names, its parameters and closure cells."""
        g = frame.f_globals
        for name in code.co_names:
            if name in g:
                self.watch(g[name])
        for value in list(frame.f_locals.values()):
            self.watch(value)

    def finish(self) -> list[str]:
        """Put back each generator whose state moved; the words of each."""
        moved = []
        for obj, kind, state in self.saved.values():
            try:
                now = _state(obj, kind)
                same = now == state if kind == "random" else pickle.dumps(now) == pickle.dumps(
                    state)
                if not same:
                    _set(obj, kind, state)
                    moved.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
            except Exception:  # noqa: BLE001 (its state cannot be read back: taken as moved)
                moved.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
        self.saved.clear()
        return moved
