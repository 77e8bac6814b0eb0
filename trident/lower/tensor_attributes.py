"""Python attributes of tensor arguments while tracing (Note [Python attributes of tensors]):
which fake tensors stand for arguments that carry attributes, and the lookups on them that make
the call run eagerly."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from trident import frames
from trident.ir.facts import has_attributes

# Note [Python attributes of tensors]: the trace runs on fake tensors, whose ``__dict__`` is
# the fake's own: an attribute set on a tensor argument (``w.scale``) read with a default, by
# ``hasattr`` or in a ``try`` gets the fake's answer (absent). Such a lookup on the fake of a
# tensor argument, by user code (Note [User code] in frames.py) or library code (Note [Library
# code that ran] in lower/state/library.py: ``nn.Buffer``'s ``isinstance``, which asks
# ``_is_buffer``; torch's internals are taken as fixed), is found at FakeTensor's
# ``__getattr__``, which Python calls only after a lookup failed (no dunder name). On a
# tensor without attributes it is served: the tensor is guarded on having none (``looked_up``,
# an Attributes guard: Note [Tensor types and attributes] in ir/guards.py), so the lookup fails
# at every hit as in the trace (GPT-2's ``is_jax_jitting`` probes ``x.jax`` at every forward).
# On one with attributes (``attributed``) no guard checks their values: the call runs eagerly.
# The entries that torch copies from a tensor to its fake (``_is_buffer``) are taken off such a
# fake first, so that a lookup of them fails too. A tensor whose attributes no code looks up is
# not guarded on them (a static cache's tensors gain ``_dynamo_static_input_type`` after the
# first call). ``vars(x)`` and ``x.__dict__`` reach no hook: the bytecode scan finds them in
# user code and in library code that ran with tensor arguments (``tensor_dict_read`` and
# ``library_dict_read`` in lower/state/tensor_reads.py; a library's ``vars(t)`` was the fake's:
# wrong at the first call, and stale after ``t.scale`` was set): the call runs eagerly.


def watch(mode, fakes, reals):
    """Sets ``mode.leaves`` (the ids of the fake tensors in ``fakes``) and ``mode.attributed``
    (those whose argument in ``reals``, index by index, has Python attributes, each taken off
    the entries its argument has: Note [Python attributes of tensors]); returns ``fakes``."""
    out = set()
    for fake, real in zip(fakes, reals):
        if isinstance(fake, torch.Tensor) and has_attributes(real):
            own = getattr(fake, "__dict__", None)
            for name in list(vars(real)):
                if isinstance(own, dict):
                    own.pop(name, None)
            out.add(id(fake))
    mode.leaves = frozenset(id(f) for f in fakes if isinstance(f, torch.Tensor))
    mode.attributed = frozenset(out)
    return fakes


def looked_up(mode, fakes) -> frozenset:
    """The indices of the fake tensors in ``fakes`` (``watch``'s) whose Python attributes the
    trace looked up (Note [Python attributes of tensors])."""
    return frozenset(i for i, f in enumerate(fakes) if id(f) in mode.looked_up)


@functools.cache
def install(tracing) -> None:
    """FakeTensor's ``__getattr__`` refuses a lookup on the fake of an argument with
    attributes (Note [Python attributes of tensors]); ``tracing.mode``: this thread's trace's
    ``_SourceLines`` (source_lines.py), or None."""
    from torch._subclasses.fake_tensor import FakeTensor

    from trident.lower.state.library import library_kind

    def missing(self, name, _original=getattr(FakeTensor, "__getattr__", None)):
        mode = getattr(tracing, "mode", None)
        if mode is not None and mode.in_user_code and id(self) in mode.leaves and not (
                name[:2] == "__" and name[-2:] == "__"):
            f = sys._getframe(1)
            if not (frames.user_frame(f) or library_kind(f, 1, 2)):
                pass
            elif id(self) not in mode.attributed:
                mode.looked_up.add(id(self))  # its Attributes guard (lower/guards.py)
            else:
                mode.refuse(f"the function reads the Python attribute {name!r} of a tensor "
                            f"argument ({Path(f.f_code.co_filename).name}:{f.f_lineno}) that "
                            "has attributes, which its fake does not carry (getattr, hasattr)")
        if _original is not None:
            return _original(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
    FakeTensor.__getattr__ = missing
