"""What makes a call run eagerly whatever is compiled: facts of its leaves or of torch's state,
or a signature that failed to compile (Note [Eager decisions])."""

from __future__ import annotations

from typing import Callable

import torch

from trident.frontend.install import _Call
from trident.errors import with_article
from trident.ir.facts import MAX_ARGS, OTHER, arg_facts
from trident.ir.guards import IntValue, Size, SizeRelation, first_failure

# Note [Eager decisions]: a call runs eagerly, whatever is compiled, when a fact of its
# leaves or of torch's state says so (a tensor that requires grad under grad mode, autocast
# on, a leaf the native guards cannot read, more leaves than they read) or when its
# signature failed to compile. Deciding that by flattening the call in Python and reading
# every leaf's facts walks every node of the call's argument tree in Python at every call
# (thousands for a transformers model). So the tree of a call that ran eagerly is installed
# in the dispatcher like a specialization's: a later call of that tree reaches Python with
# the leaves the native tree read (``_tree_miss``), and the fact that decided the last
# eager call of the tree is tested on them, on its one leaf. It is read again at every
# call, so it is never stale: a tensor that stops requiring grad, or autocast turned off,
# fails the test and the call takes the whole miss path (flattened in Python), which
# compiles it, or records the fact that now makes it eager. Each test holds only of values
# Python flattens as leaves too (a tensor, or a value of the decided leaf's own type): the
# native tree also accepts a call whose own tree differs (a tensor passed twice, a list
# where a tensor was), which the whole miss path flattens as its own.


def _sizeless(guards: list) -> list:
    """``guards`` but those of sizes, strides and int values (``Size``, ``Stride``,
    ``SizeRelation``, ``IntValue``: Note [Symbolic ints] in lower/guards.py): what a call of
    other sizes must still hold to be alike (Note [Automatic dynamic], Note [Eager
    decisions])."""
    return [g for g in guards if not isinstance(g, (Size, SizeRelation, IntValue))]


def _eager_decision(call: _Call, signatures: list[tuple[int, list, str]]
                    ) -> tuple[str, Callable[[tuple], bool]] | None:
    """Why ``call`` runs eagerly whatever is compiled, and a test that another call of the
    same argument tree still does for the same reason (Note [Eager decisions]); None when it
    may be compiled. ``signatures``: (tree key, guards, why) of signatures that failed to
    compile."""
    args, names = call.leaves, call.names
    if len(args) > MAX_ARGS:
        return (f"{len(args) - 1} argument leaves; the native path reads at most "
                f"{MAX_ARGS - 1}",
                lambda leaves: True)  # a tree's leaves are as many at every call
    if _eager_mode_on() and _in_a_trace():
        return ("called while another jitted function is traced: its code is traced into "
                "that function's specialization (Note [Nested jitted calls] in "
                "trident/frames.py)", lambda leaves: _eager_mode_on() and _in_a_trace())
    if _eager_mode_on():
        return ("autocast, a torch.func transform or a TorchFunctionMode "
                "(torch.set_default_device, ...) is on: Trident does not compile under "
                "them", lambda leaves: _eager_mode_on())
    grad = torch.is_grad_enabled()
    for i, a in enumerate(args):
        f = arg_facts(a)
        if f.dual:
            return (f"{names[i]} is a forward-mode AD dual tensor: its tangent is computed "
                    "eagerly", lambda leaves: arg_facts(leaves[i]).dual)
        if f.kind == OTHER:
            return (f"argument {names[i]} is {with_article(type(a).__name__)} that the "
                    "native guards do not read (expected a strided CPU/CUDA tensor, int, "
                    "float, bool or None)", lambda leaves: type(leaves[i]) is type(a) and
                    arg_facts(leaves[i]).kind == OTHER)
        if f.requires_grad and grad:
            return (f"{names[i]} requires grad: Trident serves inference; autograd runs "
                    "eagerly", lambda leaves: torch.is_grad_enabled() and
                    isinstance(leaves[i], torch.Tensor) and leaves[i].requires_grad)
    for key, guards, why in signatures:
        if key == call.tree.key and first_failure(guards, args) is None:
            return why, lambda leaves: first_failure(guards, leaves) is None
    return None


def _eager_mode_on() -> bool:
    """Autocast, a torch.func transform or a TorchFunctionMode is on (``env_facts``)."""
    return (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda") or
            torch._C._are_functorch_transforms_active() or
            torch._C._len_torch_function_stack() > 0)


def _in_a_trace() -> bool:
    """A Trident trace is running in this thread (its TorchFunctionMode is on the stack)."""
    from torch.overrides import _get_current_function_mode_stack

    from trident.lower.source_lines import _SourceLines

    return any(isinstance(m, _SourceLines) for m in _get_current_function_mode_stack())
