"""What a ``functools.partial`` in an argument tree is checked by (Note [Partials in arguments]):
the words that name its function the same way in every process, where it has such a name."""

from __future__ import annotations

import functools
import types

import torch

from trident import frames
from trident.identity import identity_words, named_at
from trident.ir.trees import _CONSTS

# Note [Partials in arguments]: a ``functools.partial`` that a tree reaches (a parameter, a
# default, an item, a module's attribute: transformers' ``GELUTanh.act``, every Gemma's
# ``functools.partial(F.gelu, approximate="tanh")``) decides the code by its function, arguments
# and keywords, which are no entries of a ``__dict__``: ``__setstate__`` replaces them in the
# same object, and its keywords dict can be written in place. Where its function has a name
# that holds in every process (a builtin of a module, a torch operator, a library's function by
# its module path: Note [Library state] in lower/state/library_steps.py) and its arguments and keywords
# are constants (numbers, strings, dtypes... in tuples, lists and dicts), it is checked as a
# value: its exact type (a node of TYPE), then ``func`` by identity, named by that name,
# ``args`` and ``keywords`` by value, each read through ``getattr`` (GETATTR) at every call:
# the memo of unchanged subtrees reads such a value afresh and finds it the same object as at
# the last walk, or walks the root again (Note [Unchanged subtrees] in runtime/tree_eval.cpp).
# Its words are the same in every process, so the specialization is stored and a new process
# loads it (issue 27). Any other partial (of a user function, whose code, defaults and cells
# are state; of a lambda; holding a tensor or an object) is checked by identity, and its
# ``func``, ``args`` and ``keywords`` are a state read rooted at the object itself
# (``_partials_of`` in frontend/tracing.py): never stale, but it serves its process only (Note
# [Process-only state] in frontend/install.py).


def _constant(value, depth: int = 0) -> bool:
    """A value a tree checks as constants: a CONST, or a tuple, list or str-keyed dict of
    them (nested at most 4 deep)."""
    t = type(value)
    if t in _CONSTS:
        return True
    if depth >= 4:
        return False
    if t in (tuple, list):
        return all(_constant(v, depth + 1) for v in value)
    return t is dict and all(type(k) is str and _constant(v, depth + 1)
                             for k, v in value.items())


def partial_words(value) -> str | None:
    """Note [Partials in arguments]: the words naming the function of a ``functools.partial``
    (its exact type) checked as a value, the same in every process; None for any other value,
    and for a partial checked by identity."""
    if type(value) is not functools.partial or not (
            _constant(value.args) and _constant(value.keywords)):
        return None
    fn = value.func
    if isinstance(fn, types.BuiltinFunctionType) and (
            fn.__self__ is None or isinstance(fn.__self__, types.ModuleType)):
        module = fn.__self__.__name__ if fn.__self__ is not None else fn.__module__
        words = f"builtin {module}.{fn.__qualname__}"
        if named_at(module, fn.__name__) is not fn:  # not where its name says
            return None
    elif isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        words = identity_words(fn)
    elif isinstance(fn, types.FunctionType) and not frames.user_file(fn.__code__.co_filename) \
            and "<locals>" not in fn.__qualname__ and _by_path(fn):
        words = f"library function {fn.__module__}.{fn.__qualname__}"
    else:
        return None
    return words


def _by_path(fn) -> bool:
    """``fn`` is what its module's path names (``torch.nn.functional.silu``)."""
    return named_at(fn.__module__, fn.__qualname__) is fn
