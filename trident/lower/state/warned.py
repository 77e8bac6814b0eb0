"""Python warnings that the function's code, or a library's for it, gives while it is traced
(Note [Warnings a trace gives]).

Note [Warnings a trace gives]: eager gives a library's warning at every call (``F.softmax(x)``
without ``dim``), under the warning filters of that moment: ``"error"`` raises it, ``"always"``
shows it each time, ``"default"`` once per filters' version (each change of the filters clears
every module's ``__warningregistry__``, by a number Python does not expose). A hit runs no
Python and gives none, so no guard of the filters could make it eager's. So a function whose
trace gives a warning runs eagerly (with one warning of Trident's), and the eager call gives it
under the filters of each call.

The trace sees them without changing what the filters decide: while it runs, the first entry
of ``warnings.filters`` is one of its own whose category is a class of a metaclass with its own
``__subclasscheck__``, which the interpreter's ``warn_explicit`` (``_warnings``, in C) calls
with each warning's category before any other filter is asked (its message matcher keeps the
text, asked first). It answers True, so the entry's ``"ignore"`` applies, only for a warning
of this thread given by a frame of user code or of a library the function runs (Note [Library
code that ran] in library.py: not Trident's own, nor torch's tracing machinery, whose warnings
a trace gives and an eager call does not), and keeps it; for every other warning it answers
False and the filters decide as before. A kept warning is not shown by the trace (the eager
call shows it), nor a ``ResourceWarning`` (a finalizer's, not the function's) kept. Adding and
removing the entry counts as a change of the filters (``warnings._filters_mutated``), so that a
warning a module's registry holds as shown is asked again, and the trace's ``"ignore"`` leaves
no entry that would hide it from the eager call; a trace changed that version already (torch's
own ``catch_warnings`` while it traces). CPython 3.11 to 3.13.
"""

from __future__ import annotations

import _thread
import contextlib
import sys
import warnings

from trident import frames
from trident.errors import TridentError
from trident.lower.state.library import library_kind


class _Text:
    """The message matcher of the trace's filter entry: keeps the text it is asked about."""

    text = ""

    def match(self, text) -> bool:
        self.text = text
        return True


class _Asks(type):
    def __subclasscheck__(cls, category) -> bool:
        if _thread.get_ident() != cls.thread or issubclass(category, ResourceWarning):
            return False
        frame = sys._getframe(1)  # (who called warnings.warn: C has no frame)
        if frames.inside_trident(frame.f_code.co_filename) or not (
                frames.user_frame(frame) or library_kind(frame, 1, 2)):
            return False
        cls.given.append(f"{category.__name__}: {str(cls.matcher.text)[:120]} "
                         f"({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
        return True


def _mutated() -> None:
    getattr(warnings, "_filters_mutated", getattr(warnings, "_filters_mutated_lock_held",
                                                  lambda: None))()


@contextlib.contextmanager
def given(on: bool = True):
    """Note [Warnings a trace gives]: yields the list of the warnings (``"UserWarning: text
    (file.py:LINE)"``) that this thread's user and library code gives meanwhile (``on``
    False: none kept, the filters untouched)."""
    if not on:
        yield []
        return
    matcher = _Text()
    category = _Asks("_GivenInTrace", (Warning,), {"thread": _thread.get_ident(), "given": [],
                                                  "matcher": matcher})
    entry = ("ignore", matcher, category, None, 0)
    filters = warnings.filters
    filters.insert(0, entry)
    _mutated()
    try:
        yield category.given
    finally:
        for held in {id(filters): filters, id(warnings.filters): warnings.filters}.values():
            while entry in held:  # (a catch_warnings() of the trace copied it)
                held.remove(entry)
        _mutated()


def raise_given(given: list) -> None:
    """Raises for the first warning of ``given`` (Note [Warnings a trace gives])."""
    if given:
        error = TridentError(f"code the function runs gives a Python warning ({given[0]}): "
                             "eager gives it at each call where the warning filters show "
                             "it, and a hit gives none (this holds under filters that hide "
                             "it too: the filters are not guarded)")
        error.any_sizes = True  # (policy.py: a trace at exact sizes gives it too)
        raise error
