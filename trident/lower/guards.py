"""The guards of a trace: every fact of the call that the trace depends on (Note [Guard order]),
with symbolic sizes and strides guarded by relations (Note [Symbolic guards])."""

from __future__ import annotations

import traceback

import sympy
import torch

from trident import frames

from trident.errors import TridentError
from trident.ir import sizes
from trident.ir.guards import (Aligned16, Aliased, ArgCount, Attributes, Autocast, DefaultDtype,
                               DeviceIndex, DeviceType, Dim, Dtype, FloatBits, FunctionModes,
                               GlobalFlags, GradEnabled, Guard, Inference, InferenceMode, IntValue,
                               IsParameter, Kind, NumThreads, ProcessGroup, RequiresGrad, SameAs,
                               Size, SizeRelation, Stride, Transforms)
from trident.ir.facts import BOOL, FLOAT, INT, TENSOR, arg_facts, env_facts


_ENV_GUARDS = (GradEnabled, InferenceMode, Autocast, Aliased, DefaultDtype, Transforms,
               FunctionModes, ProcessGroup, NumThreads, GlobalFlags)


def guards_for(args: tuple, fake_args: tuple | None = None, shape_env=None,
               looked_up: frozenset | None = None) -> list[Guard]:
    """The guards that hold for ``args`` and the current grad mode and autocast state
    (Note [Guard order]). With ``fake_args`` and ``shape_env`` (a trace with dynamic dims),
    symbolic sizes and strides are guarded by Note [Symbolic guards] instead of by value.
    ``looked_up``: the tensors whose Python attributes the trace looked up (Note [Tensor
    types and attributes] in ir/guards.py), None for all."""
    facts = [arg_facts(a) for a in args]
    env = env_facts(args)
    guards: list[Guard] = [ArgCount(len(args))]
    # Note [Guard order]: leaf 0 of a call with an argument tree is the tree's key (an int):
    # checked right after the count, so that the module of another tree (of as many leaves)
    # fails there, not after every other check
    key = bool(facts) and facts[0].kind == INT and not (
        fake_args is not None and isinstance(fake_args[0], torch.SymInt))
    if key:
        guards += [Kind(INT, 0), IntValue(int(facts[0].value), 0)]
    guards += [kind(getattr(env, kind.field)) for kind in _ENV_GUARDS]
    guards += [Kind(f.kind, i) for i, f in enumerate(facts) if not (key and i == 0)]
    tensors = [(i, f) for i, f in enumerate(facts) if f.kind == TENSOR]
    for i, f in tensors:
        guards += [kind(getattr(f, kind.field), i)
                   for kind in (Dtype, DeviceType, DeviceIndex, Dim)]
    if fake_args is None:
        for i, f in tensors:
            guards += [Size(s, i, d) for d, s in enumerate(f.sizes)]
            guards += [Stride(s, i, d) for d, s in enumerate(f.strides)]
    else:
        guards += symbolic_guards(fake_args, shape_env)
    first_seen: dict[int, int] = {}
    for i, f in tensors:  # the trace binds one tensor passed twice to one input
        if f.id in first_seen:
            guards.append(SameAs(first_seen[f.id], i))
        first_seen.setdefault(f.id, i)
    for i, f in tensors:
        guards += [kind(getattr(f, kind.field), i)
                   for kind in (Aligned16, RequiresGrad, Inference, IsParameter)]
        if looked_up is None or i in looked_up:  # Note [Tensor types and attributes]
            guards.append(Attributes(f.attributes, i))
    for i, f in enumerate(facts):
        if key and i == 0:
            continue
        if f.kind in (INT, BOOL) and not (
                fake_args is not None and isinstance(fake_args[i], torch.SymInt)):
            guards.append(IntValue(int(f.value), i))  # (a symbolic int: Note [Symbolic ints])
        elif f.kind == FLOAT and not (fake_args is not None and  # (one no trace read: Note
                                       isinstance(fake_args[i], torch.SymFloat)):  # [Float leaves])
            guards.append(FloatBits(f.value, i))
    return guards


# ---- Note [Symbolic guards] ------------------------------------------------------------------
#
# A specialization traced with dynamic dims (capture.py) holds for every call whose sizes and
# strides satisfy what the trace knew and assumed about them:
#   * each symbol's first appearance (argument i, size d) is its source; the guard is its range
#     (``>= 2``: sizes 0 and 1 are specialized, as in torch.compile);
#   * every other size or stride equals its expression over the sources (a contiguous tensor's
#     ``stride(0) == size(1) * 16``; the same symbol in two places is an equality);
#   * every guard the ShapeEnv recorded while tracing (``Eq(s0, s1)``, ``s0 < 100``), once
#     (``s0 < 2**31`` and ``s0 <= 2**31 - 1`` are one guard).
# Each is a sympy expression over the places sizes are read from (Note [Size expressions] in
# sizes.py): codegen prints it to C, ``sizes.evaluate`` is its Python twin.


# ---- Note [Symbolic ints] ---------------------------------------------------------------------
#
# An int leaf of the argument tree (``cache.layers[0].max_cache_len``, a model's
# ``_previous_max_cache_length``, ``cache.layers[0].cumulative_length_int``) is guarded by
# value in a static trace. Under automatic dynamic (frontend/dynamic.py), an int whose value changed while
# the rest of the call stayed alike is traced as a ShapeEnv symbol of its own (capture.py), as
# Dynamo's automatic dynamic does for ints: every read of it the trace makes is recorded (a
# branch on it is a ShapeEnv guard, ``int()`` of it specializes it, arithmetic on it that
# reaches an op is a size expression), and only those facts are guarded, over the place
# ``value_i`` (``a[i].i`` in C). An int the trace never reads is not guarded at all. An int
# symbol the graph itself takes as a value (``torch.zeros(n)``, ``x[:n]``, ``n + 1`` written
# to an attribute: Note [Attribute writes] in writes.py) is read in C by the plan's first
# steps (a ``SizeStep`` ``"value"``, plan.py) and computed on as a size is.


def _places(fake_args: tuple):
    """Each size and stride (and symbolic storage offset) of a dynamic trace's tensor
    arguments, in order: ``(arg, sympy expression over ShapeEnv symbols, place symbol)``."""
    for i, t in enumerate(fake_args):
        if isinstance(t, torch.SymInt):  # Note [Symbolic ints]
            yield i, t.node._expr, sizes.place("value", i)
        if not isinstance(t, torch.Tensor):
            continue
        for kind, values in (("size", t.shape), ("stride", t.stride())):
            for d, v in enumerate(values):
                # the symbol as allocated: ``node.expr`` would apply what the trace learned
                # later (``s0`` -> 64 after a view); those facts are the ShapeEnv's guards
                expr = v.node._expr if isinstance(v, torch.SymInt) else sympy.Integer(v)
                yield i, expr, sizes.place(kind, i, d)
        # a view's storage offset is a symbol of its own when a dim is dynamic (ShapeEnv's
        # duck sizing); a static offset is not guarded, as in a static specialization
        offset = t.storage_offset()
        if isinstance(offset, torch.SymInt) and not offset.node._expr.is_number:
            yield i, offset.node._expr, sizes.place("offset", i)


def _sources(places: list) -> dict:
    """Each symbol's source: the first place that is that bare symbol (all of them before any
    guard is made, since a stride may read a symbol that a later stride is)."""
    sources: dict = {}
    for _, expr, here in places:
        if isinstance(expr, sympy.Symbol):
            sources.setdefault(expr, here)
    return sources


def size_sources(fake_args: tuple) -> dict:
    """Where each symbol of a dynamic trace is read, for ``size_expr``."""
    return _sources(list(_places(fake_args)))


def size_expr(value: "torch.SymInt", sources: dict) -> sympy.Basic:
    """A SymInt of a dynamic trace as Note [Size expressions]' expression over the places its
    symbols are read from (``size_sources``, as the guards read them).

    Raises:
        TridentError: arithmetic the generated C does not compute (``sizes.check``).
    """
    return sizes.at_places(value.node._expr, sources)


def _canonical(expr):
    """``e < c`` as ``e <= c - 1`` and ``e > c`` as ``e >= c + 1`` for an int ``c``: the same
    condition in one form, so that duplicates are seen."""
    if isinstance(expr, sympy.Lt) and expr.rhs.is_Integer:
        return sympy.Le(expr.lhs, expr.rhs - 1)
    if isinstance(expr, sympy.Gt) and expr.rhs.is_Integer:
        return sympy.Ge(expr.lhs, expr.rhs + 1)
    return expr


def symbolic_guards(fake_args: tuple, shape_env) -> list[Guard]:
    """Note [Symbolic guards]: guards over the sizes and strides of a dynamic trace.

    Raises:
        TridentError: a condition the generated C does not compute (``sizes.check``).
    """
    places = list(_places(fake_args))
    sources = _sources(places)
    guards: dict[sympy.Basic, Guard] = {}  # by condition: each once

    def guard(expr, arg: int) -> None:
        expr = _canonical(sizes.at_places(expr, sources))
        if expr is not sympy.true:
            guards.setdefault(expr, SizeRelation(True, arg, expr))

    for i, expr, here in places:
        if isinstance(expr, sympy.Symbol) and sources[expr] is here:
            bounds = shape_env.var_to_range[expr]
            if isinstance(bounds.lower, sympy.Integer):  # (a symbolic int's is unbounded)
                guard(sympy.Ge(expr, int(bounds.lower)), i)
            if isinstance(bounds.upper, sympy.Integer):
                guard(sympy.Le(expr, int(bounds.upper)), i)
            continue
        expr = sympy.Eq(here, sizes.at_places(expr, sources), evaluate=False)
        guards.setdefault(expr, SizeRelation(True, i, expr))
    last = max((i for i, _, _ in places), default=0)
    for g in shape_env.guards:
        try:
            guard(g.expr, last)
        except TridentError as e:  # where the trace guarded it
            error = TridentError(f"{e}, guarded at {_where(g.sloc)}")
            error.symbols = getattr(e, "symbols", frozenset())  # (places)
            raise error from e
    return list(guards.values())


def _where(sloc) -> str:
    """A shape guard's location (torch's ``SLoc``): the user's line where Dynamo knows it, else
    the frame that guarded (``kernels.py:162 in resolve_launch``: a Triton launch's grid or
    constexpr)."""
    if sloc.maybe_user_loc is not None:
        return sloc.maybe_user_loc
    frame = sloc.framework_loc
    if frame is None or isinstance(frame, str):
        return frame or "an unknown place"
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"


def guardable(value: torch.SymInt, what: str) -> torch.SymInt:
    """``value``, an int of symbolic sizes that the trace is about to guard (a Triton launch's
    constexpr).

    Raises:
        TridentError: the generated C cannot compute its guard (``triton.next_power_of_2(n)``:
            bitwise ors of ``n``), naming ``what`` and the user's line, before the guard's
            expression (kilobytes) reaches ``symbolic_guards``."""
    try:
        sizes.check(value.node.expr)
    except TridentError as e:
        where = next((f" at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} ({f.line})"
                      for f in reversed(traceback.extract_stack())
                      if frames.user_line_file(f.filename)), "")
        error = TridentError(f"{what}{where}: {e}")
        error.symbols = e.symbols  # (ShapeEnv symbols: ``trace`` reads their places)
        raise error from None
    return value


def at_sources(error: TridentError, fake_args: tuple) -> None:
    """Note [Dims of a failed size expression] (frontend/dynamic.py): ``error.symbols``, where
    they are ShapeEnv symbols of the trace of ``fake_args`` (``guardable``'s), as the place
    symbols they are read from; others are kept."""
    symbols = getattr(error, "symbols", None)
    if symbols and fake_args is not None:
        sources = size_sources(fake_args)
        if all(s in sources for s in symbols):
            error.symbols = frozenset(sources[s] for s in symbols)
