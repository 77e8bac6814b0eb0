"""Dynamic dims: which of a missed call's dims a compile traces as symbolic sizes (Note
[Automatic dynamic]), and the compile that tries them before the exact sizes. The miss policy
(policy.py) asks here; tracing is tracing.py's.
"""

from __future__ import annotations

import torch

from trident import config
from trident.errors import CompileForbidden, TridentError
from trident.frontend import batch, ints
from trident.frontend.eager import _sizeless
from trident.frontend.install import _Call
from trident.ir import sizes
from trident.ir.guards import first_failure
from trident.ir.specialization import Specialization

_recompiles = config.logger("recompiles")


# Note [Dims of a failed size expression]: a dynamic compile fails where a size expression
# calls arithmetic the generated C does not compute (``sizes.check`` in ir/sizes.py): Triton's
# block-size idiom ``BLOCK=triton.next_power_of_2(x.shape[1])`` (a constexpr of the launch:
# ``guardable`` in lower/guards.py), a Python branch on it (a ShapeEnv guard:
# ``symbolic_guards``), such a size reaching an op. Its error carries the expression's free
# symbols (``symbols``), which the trace turns into the places they are read from
# (``at_sources``, from ``size_sources`` of the fake arguments: ``size_1_1``, ``value_3``);
# ``sizes.dims_at`` reads the leaf dims. ``_compile_dynamic_or_static`` then compiles again with
# those dims static and the others symbolic (as torch.compile specializes the symbols such an
# expression reads, not the whole frame), and remembers them by leaf path in
# ``_static_dims``: ``_dynamic_dims`` never makes them symbolic again, for this function, asked
# for (``dynamic={"x": [1]}``, ``dynamic=True``) or automatic. Each retry drops at least one
# dim, so it ends. An rmsnorm over rows of one width compiles its first rows exactly, then
# rows symbolic and the columns static (one specialization per width, not per row count).
# A failure whose error names no dims (an op that reads a symbolic size as an int, Python
# asking whether a size is an int, a stride's expression) keeps the fallback: that signature's
# exact sizes, and in automatic mode every size from then on (``_dynamic_failed``).


class DynamicDims:
    """The JitFunction methods that choose a compile's symbolic dims."""

    __slots__ = ()

    def _dynamic_dims(self, call: _Call) -> dict[int, set[int]]:
        """Note [Automatic dynamic]: the dims of ``args`` to trace as symbolic sizes.

        Asked for: every dim (``dynamic=True``), the dims named per argument
        (``dynamic={"kv_cache": [2]}``), dims marked with ``torch._dynamo.mark_dynamic``.
        Automatic: a call that misses a specialization only because some sizes changed makes
        those dims dynamic, with the dims that specialization already had, as torch.compile's
        automatic dynamic shapes do. ``dynamic=False`` (and automatic mode after a failed dynamic
        compile, such as an op whose C++ reads a symbolic size as an int) specializes on every
        size; a compile that failed on a size expression specializes on the dims it read only,
        asked for or not (Note [Dims of a failed size expression]). Argument names are leaf
        paths (``x``, ``past_key_values.layers[0].keys``)."""
        args, names = call.leaves, call.names
        tensors = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        dims = {i: set(getattr(a, "_dynamo_dynamic_indices", ())) | self._graph_dims.get(
            names[i], set()) for i, a in tensors.items()}  # Note [Graph dims] in backend.py
        if self._dynamic is True:
            dims = {i: set(range(a.dim())) for i, a in tensors.items()}
        elif isinstance(self._dynamic, dict):
            for i, a in tensors.items():
                asked = set(self._dynamic.get(names[i], ()))
                if any(d >= a.dim() for d in asked):
                    raise TridentError(f"trident.jit: dynamic dims {sorted(asked)} of "
                                       f"{names[i]}, which has {a.dim()} dims")
                dims[i] |= asked
        asked = {i: set(d) for i, d in dims.items() if d}
        varied: set[int] = set()  # Note [Tensors by path] in ints.py
        fresh: set[str] = set()  # tensors at paths another path of their tree held none at
        for spec in self._specs:  # automatic: what differs from a spec alike in all but sizes
            if spec.shapes is not None and spec.tree in self._int_trees.get(call.tree.key, ()):
                varied |= ints.differing_dims(dims, spec, call)  # Note [Int leaves]: by path
                continue
            if spec.shapes is None or spec.tree != call.tree.key:
                continue
            if first_failure(_sizeless(spec.guards), args) is not None:
                # another path of the same tree (Note [Paths of one tree] in ints.py)
                varied |= ints.differing_dims(dims, spec, call)
                fresh |= ints.new_paths(spec, call)
                continue
            for i, a in tensors.items():
                dims[i] |= set(spec.dynamic.get(str(i), ()))
                dims[i] |= {d for d, n in enumerate(a.shape) if n != spec.shapes[i][d]}
        if self._dynamic is None:  # Note [Int leaves]
            for i, a in enumerate(args):  # (Note [Float leaves] in policy.py: floats too)
                if type(a) in (int, float) and names[i] in self._int_leaves - self._read_floats:
                    dims[i] = {0}
            known = {n for s in self._specs for n, shape in zip(s.arg_names, s.shapes or ())
                     if shape is not None} - fresh  # Note [Ints by path] in ints.py: new tensors
            for i, d in ints.sized_by(call, self._varied_ints).items():
                dims[i] = dims.get(i, set()) | (d if names[i] not in known else set())
            for i, d in ints.new_tensor_dims(call, known, varied).items():
                dims[i] = dims.get(i, set()) | d
            for i, d in ints.written_dims(call, self._written_dims).items():  # (the Note's)
                dims[i] = dims.get(i, set()) | d
            if {i: d for i, d in dims.items() if d} != asked:  # Note [Batch dims]
                for i, d in batch.batch_dims(call).items():
                    dims[i] = dims.get(i, set()) | d
        static = self._static_dims  # Note [Dims of a failed size expression]
        dims = {i: d - static.get(names[i], frozenset()) for i, d in dims.items()}
        return {i: d for i, d in dims.items() if d}

    def _compile_dynamic_or_static(self, call: _Call) -> Specialization:
        automatic, failed_before = self._dynamic is None, self._dynamic_failed
        dynamic = {} if self._dynamic is False or (automatic and self._dynamic_failed) else \
            self._dynamic_dims(call)
        while dynamic:
            try:
                return self._compile(call, dynamic)
            except CompileForbidden:
                raise
            except TridentError as e:
                if getattr(e, "any_sizes", False):  # the sizes' trace would fail alike
                    e.static_trace = True
                    raise
                failed = sizes.dims_at(getattr(e, "symbols", ()))
                if failed and all(d <= dynamic.get(i, set()) for i, d in failed.items()):
                    # Note [Dims of a failed size expression]: those dims, from now on
                    _recompiles.info("%s: dynamic dims %s not compiled (%s); specializing on "
                                     "%s from now on", self.__qualname__, dynamic, e,
                                     {call.names[i]: sorted(d) for i, d in failed.items()})
                    for i, d in failed.items():
                        name = call.names[i]
                        self._static_dims[name] = self._static_dims.get(name, frozenset()) | d
                    dynamic = {i: d - failed.get(i, set()) for i, d in dynamic.items()}
                    dynamic = {i: d for i, d in dynamic.items() if d}
                    continue
                # automatic: one failed attempt per function, not per new size; dims the user
                # asked for are tried again at the next new signature
                _recompiles.info("%s: dynamic dims %s not compiled (%s); specializing on the "
                                 "sizes%s", self.__qualname__, dynamic, e,
                                 " from now on" if automatic else "")
                self._dynamic_failed = True
                break
        try:  # Note [Lengths of written state] in ints.py: automatic, before any failure
            return self._compile(call, {}, self._lengths_compile if automatic and
                                 not self._dynamic_failed else None)
        except TridentError as e:  # decided by the call and the code, not by jit's options
            self._dynamic_failed = failed_before  # (not the dims' failure: the sizes' fails too)
            e.static_trace = True
            raise

    def _capacities_compile(self, call: _Call, caps: frozenset[str]) -> Specialization | None:
        """Note [Capacities of written state] in ints.py: ``call`` flattened again with the
        capacities ``caps`` its exact trace allocated as int leaves, compiled with them, the
        dims of their sizes, the lengths and the batch symbolic; None where that failed (once
        per function: the exact trace is compiled, the int leaves as they were)."""
        kept = self._int_leaves, self._varied_ints, self._written_ints
        lengths = self._written_lengths
        self._int_leaves, self._varied_ints = self._int_leaves | caps, self._varied_ints | caps
        again = self._flatten(call.args, call.kwargs)
        index = {name: i for i, name in enumerate(again.names)}
        lengths = {index[call.names[i]]: set(d) for i, d in lengths.items()
                   if call.names[i] in index}
        dynamic = self._dynamic_dims(again)
        for i, d in lengths.items():
            dynamic[i] = dynamic.get(i, set()) | d
        try:
            return self._compile(again, dynamic, lengths=lengths)
        except CompileForbidden:
            raise
        except TridentError as e:
            _recompiles.info("%s: the capacities of the written state %s not compiled (%s); "
                             "specializing on them", self.__qualname__, sorted(caps), e)
            self._capacities_failed = True
            self._int_leaves, self._varied_ints, self._written_ints = kept
            return None

    def _lengths_compile(self, call: _Call) -> Specialization | None:
        """Note [Lengths of written state] in ints.py: ``call`` compiled with the lengths its
        exact trace stored, and its batch, symbolic; None where that failed (the exact trace
        is compiled, and automatic dynamic specializes on the sizes from now on). Lengths of
        one: what the exact trace stored is read back symbolic, and where their trace failed,
        the batch alone is symbolic, automatic dynamic kept."""
        caps = self._capacities - self._int_leaves
        if caps and not self._capacities_failed:  # Note [Capacities of written state]
            spec = self._capacities_compile(call, caps)
            if spec is not None or not self._written_lengths:
                return spec
        lengths = dict(self._written_lengths)
        rows = batch.batch_dims(call)
        dynamic = dict(lengths)
        for i, d in rows.items():
            dynamic[i] = dynamic.get(i, set()) | d
        one = any(call.leaves[i].shape[d] == 1 for i, dims in lengths.items() for d in dims)
        if one:  # (a trace may tie a length of one to 1: code branches on it)
            for path, dims in self._stored_lengths.items():
                self._written_dims[path] = self._written_dims.get(path, frozenset()) | dims
        try:
            return self._compile(call, dynamic, lengths=lengths)
        except CompileForbidden:
            raise
        except TridentError as e:
            _recompiles.info("%s: the lengths of the written state %s not compiled (%s); %s",
                             self.__qualname__, dynamic, e, "lengths of one: the batch alone"
                             if one else "specializing on the sizes from now on")
            if not one:
                self._dynamic_failed = True
                return None
        # a length of one, which code branches on (transformers' SDPA: ``is_causal = q_length
        # > 1 and ...``, a SymBool where the length is a symbol of hint 1)
        if not rows:
            return None
        try:
            return self._compile(call, {i: set(d) for i, d in rows.items()})
        except CompileForbidden:
            raise
        except TridentError as e:
            _recompiles.info("%s: the batch %s not compiled (%s); specializing on the sizes "
                             "from now on", self.__qualname__, rows, e)
            self._dynamic_failed = True
            return None
