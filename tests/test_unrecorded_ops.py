"""A trace's cost cut without a guard lost (issue 27's cold start): Note [Unrecorded ops] and
Note [Early assignment check] in trident/lower/source_lines.py.

The state recording's profile hook is set aside while an op runs; what the function reads
between its ops, in a helper, or after its last early check, is still guarded: a change is seen
(one compile more), never a stale result; the hook is set back after an op that returns or
raises. The early assignment check runs at the 32nd, 64th, 128th, ... torch call; an
assignment after the last one is still found by the check at the end.
"""

from __future__ import annotations

import sys

import pytest
import torch

import trident
from _trident_helpers import check_change_is_seen, count_traced_calls, tiny_causal_lm

SCALE = 2.0
OFFSET = 1.0
CONFIG = {"shift": 0.5}


def _helper(x):
    return x * SCALE  # a global read in a helper the function calls between its ops


def deep(x):
    for _ in range(150):  # past the early checks at calls 32, 64 and 128
        x = x * 1.0001
    x = _helper(x)
    return x + OFFSET + CONFIG["shift"]  # read after the last early check


def _set(name, value):
    def change():
        old = globals()[name]
        globals()[name] = value
        return lambda: globals().__setitem__(name, old)
    return change


def _set_shift():
    old = CONFIG["shift"]
    CONFIG["shift"] = -3.0
    return lambda: CONFIG.__setitem__("shift", old)


@pytest.mark.parametrize("change", [_set("SCALE", 3.0), _set("OFFSET", -1.0), _set_shift],
                         ids=["helper-global", "global-after-ops", "dict-item-after-ops"])
def test_a_read_between_or_after_the_ops_is_still_guarded(change):
    check_change_is_seen(deep, change)


def test_a_profile_function_set_before_the_call_sees_the_ops_and_stays_set():
    """The recording chains to a Python profile function already set; while an op runs that
    function is set in the hook's place, so it sees the op's own Python (torch's fake tensor
    mode) too, and it is set again after the call."""
    seen = {"fake": 0, "deep": 0}

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            seen["fake"] += name.endswith("fake_tensor.py")
            seen["deep"] += frame.f_code is deep.__code__

    jf = trident.jit(deep)
    x = torch.randn(4, generator=torch.Generator().manual_seed(0))
    sys.setprofile(profile)
    try:
        out = jf(x)
        assert sys.getprofile() is profile
    finally:
        sys.setprofile(None)
    assert torch.equal(out, deep(x))
    assert seen["fake"] > 0 and seen["deep"] == 1  # traced once; the hit runs no Python
    assert (jf.stats.compiles, jf.stats.fallbacks) == (1, 0)


def test_the_hook_is_set_back_after_each_op_that_returns_or_raises():
    from trident.lower import state
    from trident.lower.source_lines import _SourceLines

    def fn():
        pass

    with state.record(fn):
        hook = sys.getprofile()
        assert callable(hook)
        with _SourceLines(state.pause):
            with pytest.raises(RuntimeError, match="invalid for input of size 4"):
                torch.ones(4).view(3, -1)
            assert sys.getprofile() is hook
            assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0))
            assert sys.getprofile() is hook
    assert sys.getprofile() is None




def assigns_at(d, x, at: int, n: int):
    for i in range(n):
        if i == at:
            d["t"] = x + 1  # a new tensor in the argument's dict: cannot be compiled
        x = x * 1.5
    return x


@pytest.mark.parametrize("at, n, traced_calls", [
    (0, 100, 32),     # found by the first check
    (40, 100, 64),    # by the second: the 41st call made it, the 64th asks
    (300, 600, 512),  # by the check at 512, not at the end (601 calls)
    (99, 100, 101),   # after the last check (64): by the check at the end
])
def test_an_assignment_is_found_at_the_next_doubled_call_or_at_the_end(
        monkeypatch, at, n, traced_calls):
    traced = count_traced_calls(monkeypatch)
    jf = trident.jit(assigns_at)
    d, x = {"t": torch.zeros(2)}, torch.ones(2)
    with pytest.warns(UserWarning, match=r"assigns to d\.t \(Python state of its arguments"):
        out = jf(d, x, at, n)
    assert sum(traced) == traced_calls
    expected_d = {"t": torch.zeros(2)}
    assert torch.equal(out, assigns_at(expected_d, x, at, n))
    assert torch.equal(d["t"], expected_d["t"])  # the eager call's own assignment, once
    assert (jf.stats.fallbacks, jf.stats.compiles) == (1, 0)


# Note [Own code unrecorded] (trident/frontend/tracing.py): Trident's own code around a trace
# (the arguments' substitution, the analyses of what the trace recorded: reads_of,
# check_questions) runs with the hook set aside.
# Under the hook each of its calls and C calls was an event (the hook's Python ran for it, and
# kept nothing: no Trident frame is the function's): 508,000 events in the exact prefill trace
# of an 8-layer tiny Llama, 18,000 without them (docs/benchmarks.md, "cold49").
_OWN = ("substitute.py", "state/reads.py", "state/tensor_reads.py", "state/flow.py",
        "state/questions.py", "/dis.py")


def _hook_events(monkeypatch) -> dict:
    """Count the events the recording's hook gets, by whether their frame is in one of
    ``_OWN``'s files (the hook wrapped where it is set: ``sys.setprofile``)."""
    from trident.lower.state import recording

    counts = {"own": 0, "other": 0}
    wrappers, hooks = {}, {}
    set_profile, get_profile = sys.setprofile, sys.getprofile

    def setprofile(hook):
        if hook is not None and hook in recording._CHAINED:
            if hook not in wrappers:
                def counted(frame, event, arg, hook=hook):
                    name = frame.f_code.co_filename.replace("\\", "/")
                    counts["own" if name.endswith(_OWN) else "other"] += 1
                    return hook(frame, event, arg)
                wrappers[hook] = counted
                hooks[counted] = hook
            hook = wrappers[hook]
        set_profile(hook)

    def getprofile():
        hook = get_profile()
        return hooks.get(hook, hook)

    monkeypatch.setattr(sys, "setprofile", setprofile)
    monkeypatch.setattr(sys, "getprofile", getprofile)
    return counts


def test_tridents_own_code_around_a_trace_gives_the_hook_no_events(monkeypatch):
    """A tiny Llama's prefill and decode step (a static cache: the substitution of its layers'
    state, the reads of the model's modules): the hook gets the function's own events, none
    from Trident's substitution or analyses; the result is eager's, the guards as before (a
    second ``generate`` hits)."""
    pytest.importorskip("transformers")
    model = tiny_causal_lm("Llama")
    ids = torch.randint(0, 96, (1, 6))

    def generate():
        return model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                              cache_implementation="static", disable_compile=True)

    eager = generate()
    counts = _hook_events(monkeypatch)
    model.forward = jf = trident.jit(model.forward)
    assert torch.equal(generate(), eager)
    assert torch.equal(generate(), eager)
    assert counts["own"] == 0 and counts["other"] > 0, counts
    # (the prefill's writes found by a run with no graph: Note [Writes probe])
    assert (jf.stats.traces, jf.stats.compiles, jf.stats.fallbacks) == (2, 2, 0), jf.stats
