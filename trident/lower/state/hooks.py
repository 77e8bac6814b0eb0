"""The recording's profile hook set aside and set back (Note [Unrecorded ops] in
lower/source_lines.py, Note [Own code unrecorded] in frontend/tracing.py): which hooks are
recordings' (``record`` in recording.py registers each in ``_CHAINED``) and the profile
function each chains to."""

from __future__ import annotations

import contextlib
import sys
import types

_CHAINED: dict = {}  # a hook that record() set -> the profile function it chains to, or None


def pause():
    """Note [Unrecorded ops] (trident/lower/source_lines.py): where this thread's profile
    function is a recording's hook, set the profile function that the hook chains to (or none)
    in its place and return the hook, for the caller to set back; else return None."""
    hook = sys.getprofile()
    if type(hook) is not types.FunctionType or hook not in _CHAINED:
        return None
    sys.setprofile(_CHAINED[hook])
    return hook


@contextlib.contextmanager
def paused():
    """Note [Own code unrecorded] (trident/frontend/tracing.py): Trident's own code while a call
    is recorded (``pause`` while active, the hook set back after); yields the hook set aside, or
    None where no recording's hook was set."""
    hook = pause()
    try:
        yield hook
    finally:
        if hook is not None:
            sys.setprofile(hook)


@contextlib.contextmanager
def resumed(hook):
    """Note [Own code unrecorded]: inside ``paused``, the recording's ``hook`` (``paused``'s;
    None: nothing) set again while active and set aside after."""
    if hook is None:
        yield
        return
    sys.setprofile(hook)
    try:
        yield
    finally:
        pause()


@contextlib.contextmanager
def unrecorded():
    """Torch's own set-up code while a call is recorded (not the user's): the recording's
    profile hook is off meanwhile. A profile function that is not a Python callable (a C
    profiler's object) is left alone."""
    hook = sys.getprofile()
    if not callable(hook):
        yield
        return
    sys.setprofile(None)
    try:
        yield
    finally:
        sys.setprofile(hook)
