"""Library code that writes its own state (Note [Library code that writes its state]): which
writes of a library frame the trace ran land in state that outlives the call."""

from __future__ import annotations

import types

import torch

from trident.lower.state import flow

# Note [Library code that writes its state]: library code that the function runs (Note [Library
# code that ran] in library.py) may write state of its own that outlives the call: a module
# global (``global CALLS; CALLS += 1``), an item or attribute of an object a module global
# holds (``MEMO["n"] = ...``, ``_STATS.calls += 1``, ``REGISTRY.append(x)``), another module's
# attribute (``import pkg.sub as s; s.state = 1``, ``sys.modules[__name__].N = 1``), a closure
# cell or a mutable default of its function, or ``globals()``. Eager writes at every call and
# its later reads see the write (``return x * CALLS``); a hit runs no Python, so it would
# neither write nor see the count move: stale. (Reverted once, 715d403, because a gc callback
# of hypothesis's ran inside the trace and was taken for the function's library code; Note
# [Interrupts] in recording.py now keeps such frames out.)
#
# So a scanned library frame is checked when it starts, before its body runs, as a user frame
# is (Note [Writes at entry] in writes.py): its code's writes are walked back to their targets'
# origins (Note [Write targets] in flow.py), and a write whose origin is state that outlives
# the call (a global, ``globals()``, an import, a frame, a closure variable, a mutable default:
# every origin the walk names, ``_UNFOLLOWED`` aside) makes the recording refuse the trace: the frame unwinds, the
# call runs eagerly with one warning and writes once. Every instruction counts, taken or not
# (a memo filled on the first call only is refused too). A library frame that writes one of its
# parameters whose value a library module's global holds (``_bump(MEMO)`` with ``def
# _bump(d): d["n"] += 1``) is refused the same way (``parameter_state``).
#
# What stays fixed, by choice: a write whose target the walk cannot follow ("a value Trident
# does not follow") in library code is not refused: the models of Note [Library values] run
# such writes to their own objects at every step (a cache layer's tensors, a module's
# attributes), which the argument tree sees. The standard library's frames and torch's
# internals are not scanned (Note [Library code that ran]): their caches (``functools.
# lru_cache``, ``warnings``' registry, torch's dispatch caches) are taken as fixed.
# Measured: no scanned frame of a tiny Llama, Qwen2, Mistral, Gemma, Gemma2, Gemma3 or GPT-2
# ``generate`` (transformers 5.25) writes such state.
_UNFOLLOWED = ("a value Trident does not follow", "a local Trident does not follow")
_WRITES: dict = {}  # id of a code object -> (the code, its first write to state or None,
#                                              the parameters it writes)
_MAX_CODES = 65536


def state_write(code: types.CodeType, g: dict) -> str | None:
    """Note [Library code that writes its state]: the first write of ``code`` (run with the
    globals ``g``) whose target is state that outlives the call, as ``"what (origin)
    (file:line)"``, or None."""
    return _walked(code, g)[0]


def _walked(code: types.CodeType, g: dict) -> tuple:
    """(``state_write``'s answer, the parameters ``code`` writes), walked once per code."""
    found = _WRITES.get(id(code))
    if found is not None and found[0] is code:
        return found[1:]
    result, params = None, set()
    walk = flow.Flow(code, g)
    for k, what, (why, written) in walk.writes():
        params.update(written)
        if result is None and why is not None and why not in _UNFOLLOWED:
            line = walk.ins[k].positions.lineno if walk.ins[k].positions else "?"
            result = f"{what} ({why}, {code.co_filename.rsplit('/', 1)[-1]}:{line})"
    if len(_WRITES) >= _MAX_CODES:
        _WRITES.clear()
    _WRITES[id(code)] = (code, result, frozenset(params))
    return result, frozenset(params)


def parameter_state(code: types.CodeType, frame, groups: list) -> str | None:
    """Note [Library code that writes its state]: the first parameter that ``code`` (just
    started in ``frame``) writes whose value is a global of one of the library modules whose
    globals are ``groups``, as ``"name (module.global)"``, or None."""
    written = _walked(code, frame.f_globals)[1]
    if not written:
        return None
    local = frame.f_locals
    for name in written:
        value = local.get(name)
        if value is None or flow.immutable(value) or isinstance(
                value, (torch.Tensor, types.ModuleType)):
            continue
        for g in groups:
            for key, held in list(g.items()):
                if held is value:
                    return f"{name} ({g.get('__name__')}.{key})"
    return None
