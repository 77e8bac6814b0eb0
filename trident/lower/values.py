"""Reads of a call's values while tracing (Note [Value reads]): whether a tensor is fake, and a
Python bool or int taken from a tensor of the call.

Note [Value reads]
~~~~~~~~~~~~~~~~~~
A trace runs the function on fake tensors, and two kinds of read get another answer there than
in eager, so that a specialization would take another branch than eager takes:

- *Is this tensor fake?* transformers' ``is_tracing(padding_mask)`` asks
  ``isinstance(x, torch._subclasses.FakeTensor)`` (``is_fake_tensor``), True for every tensor
  of a trace and False in eager: the trace of every Hugging Face forward kept the explicit
  attention mask where eager drops an all-ones mask and calls SDPA with ``attn_mask=None,
  is_causal=...``, another kernel on CUDA (logits that differ in their last bits). So while this
  thread traces and code other than torch's and Trident's asks (``frames.user_line_file``:
  the function's own and its libraries'), ``torch._subclasses.FakeTensor`` is a stand-in whose
  ``isinstance`` answers as eager does for the trace's tensors (False; ``issubclass`` of a class
  answers the truth: the classes are the same in eager), and
  ``torch._subclasses.fake_tensor.is_fake`` answers False for them. torch's own code keeps the
  truth: it reads the package's attribute (``_fake_answer``: the package's ``__getattr__``
  asks who reads) or binds the class at its import (``from torch._subclasses.fake_tensor
  import FakeTensor``), which is the real class. Code that bound ``is_fake`` or the
  ``fake_tensor`` module's ``FakeTensor`` before the first trace keeps the truth too (not
  covered: no library we know of does).
- *Which value does this tensor hold?* ``bool(t)``, ``int(t)``, ``t.item()`` compared in
  Python (``fast_all(padding_mask)`` = ``m.sum() == m.numel()``, then ``if``): on fake tensors
  the trace holds an unbacked symbol (``aten::item``, ``aten::_local_scalar_dense``), and a
  guard on it failed the trace (the call ran eagerly). Now the ShapeEnv's failed guard
  (``ValueReads.resolve``, through ``_guard_hook``)
  computes the symbol's real value: the traced nodes it depends on run on the call's real
  arguments, the symbol is replaced by that value, and the trace goes on down eager's
  branch. The value becomes a *value check* of the specialization (``checks_graph`` here,
  ``ValueChecks`` in ir/specialization.py): the nodes that compute it are a graph of their
  own, planned like the function's, which the SCM runs on every call after its guards and
  before the launch sequence or the CUDA graph's replay (reading the scalar syncs with the
  device, as eager's ``bool`` does at that point); another value is a miss, which traces
  again and compiles a second specialization (Note [Value checks] in codegen/checks.py).
  The read node leaves the function's graph where nothing else uses it (a CUDA graph cannot
  capture its device sync). It applies where those nodes are pure ATen ops of the arguments (no write, no
  random draw) and no node traced before the read writes anything (the read must see what
  the call's arguments hold at its start) and the value is an int or bool; elsewhere the
  trace fails as before and the call runs eagerly (with the fake-ness read answered as
  eager's, which is then moot).
"""

from __future__ import annotations

import functools
import math
import sys
import threading

import torch
import torch.fx as fx

from trident import frames

_ACTIVE = threading.local()  # .reads: the ValueReads of this thread's trace, or None


def _asked_by_traced_code(frame) -> bool:
    """Whether this thread traces and ``frame`` (who asks) is the function's or a library's
    code (Note [Value reads])."""
    reads = getattr(_ACTIVE, "reads", None)
    return reads is not None and reads.mode.in_user_code and \
        frames.user_line_file(frame.f_code.co_filename)


def _of_trace(x) -> bool:
    """A fake tensor of this thread's trace."""
    reads = getattr(_ACTIVE, "reads", None)
    return reads is not None and getattr(x, "fake_mode", None) in reads.fake_modes


@functools.cache
def _fake_answer() -> None:
    """Note [Value reads]: installed once, for every thread (each asks its own trace)."""
    import torch._subclasses as package
    from torch._subclasses import fake_tensor

    real = package.__dict__.pop("FakeTensor", None) or fake_tensor.FakeTensor

    class _Eager(type):
        answers_as_eager = True  # (Note [Questions asked in the trace] in lower/state/asked.py)

        def __instancecheck__(cls, obj):
            return isinstance(obj, real) and not _of_trace(obj)

        def __subclasscheck__(cls, sub):  # (a question about classes: the truth)
            return issubclass(sub, real)

        def __getattr__(cls, name):
            return getattr(real, name)

    standin = _Eager("FakeTensor", (), {"__module__": real.__module__,
                                        "__qualname__": real.__qualname__})

    def __getattr__(name):
        if name == "FakeTensor":
            return standin if _asked_by_traced_code(sys._getframe(1)) else real
        raise AttributeError(f"module 'torch._subclasses' has no attribute {name!r}")

    __getattr__.answers = {"FakeTensor": standin}  # (what traced code gets: lower/state/asked.py)
    package.__getattr__ = __getattr__
    original = fake_tensor.is_fake

    @functools.wraps(original)
    def is_fake(x):
        if _of_trace(x) and _asked_by_traced_code(sys._getframe(1)):
            return False
        return original(x)

    fake_tensor.is_fake = is_fake


@functools.cache
def _guard_hook() -> None:
    """Note [Value reads]: a guard on an unbacked symbol that ``evaluate_expr`` cannot decide
    is decided by the symbol's real value where this thread's trace can compute it."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

    original = ShapeEnv.evaluate_expr

    @functools.wraps(original)
    def evaluate_expr(self, orig_expr, *args, **kwargs):
        try:
            return original(self, orig_expr, *args, **kwargs)
        except GuardOnDataDependentSymNode:
            reads = getattr(_ACTIVE, "reads", None)
            if reads is None or not reads.resolve(self, orig_expr):
                raise
        return original(self, orig_expr, *args, **kwargs)

    ShapeEnv.evaluate_expr = evaluate_expr


class ValueReads:
    """The value reads of one trace (Note [Value reads]): ``reads``, per read, the
    ``_local_scalar_dense`` node and the value it had."""

    def __init__(self, real_args: tuple, mode):
        self.real_args = real_args
        self.mode = mode  # the trace's _SourceLines
        self.tracer = None
        self.fake_modes: tuple = ()
        self.reads: list[tuple[fx.Node, int | bool]] = []
        self.why_not = "a value no .item() made"  # why the last read was not resolved

    def bind(self, fake_args: tuple) -> None:
        """At the traced function's entry: the trace's tracer and fake mode."""
        from torch._guards import detect_fake_mode
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        proxy = get_proxy_mode()
        self.tracer = proxy.tracer if proxy is not None else None
        fake = detect_fake_mode(fake_args)
        self.fake_modes = (fake,) if fake is not None else ()

    def __enter__(self):
        _fake_answer()
        _guard_hook()
        self.outer, _ACTIVE.reads = getattr(_ACTIVE, "reads", None), self
        return self

    def __exit__(self, *exc):
        _ACTIVE.reads = self.outer

    def resolve(self, shape_env, expr) -> bool:
        """Replaces each unbacked symbol of ``expr`` by its real value where it can; whether
        all were."""
        import sympy
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        if self.tracer is None:
            return False
        hook = self.mode.pause()  # Note [Unrecorded ops]: the computation is Trident's
        try:
            for symbol in free_unbacked_symbols(expr):
                node = self._read_node(symbol)
                value = None if node is None else self._compute(node)
                if value is None:
                    return False
                shape_env._set_replacement(symbol, sympy.Integer(int(value)),
                                           "trident: a value read (Note [Value reads])")
                self.reads.append((node, value))
            return True
        finally:
            if hook is not None:
                sys.setprofile(hook)

    def _read_node(self, symbol) -> fx.Node | None:
        for node in reversed(self.tracer.graph.nodes):
            if node.target in _READS:
                val = node.meta.get("val")
                if isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)) and \
                        symbol in val.node.expr.free_symbols:
                    if isinstance(val, torch.SymFloat):
                        self.why_not = "a float (Note [Value reads])"
                        return None
                    return node
        self.why_not = "a value no .item() made"
        return None

    def _compute(self, node: fx.Node) -> int | bool | None:
        """The real value of the read ``node``, from the call's arguments; None where Note
        [Value reads] does not apply."""
        nodes = slice_of([node])
        placeholders = [n for n in self.tracer.graph.nodes if n.op == "placeholder"]
        for n in self.tracer.graph.nodes:
            if n is node:
                break
            if n.op == "call_function" and not _pure(n):
                self.why_not = f"{n.target} before the read writes or draws (Note [Value reads])"
                return None
        if any(n.op not in ("placeholder", "call_function", "get_attr") or
               (n.op == "call_function" and not _pure(n)) for n in nodes):
            self.why_not = "the value depends on an op that writes or draws (Note [Value reads])"
            return None
        env: dict = {}
        from torch.utils._python_dispatch import _disable_current_modes

        try:
            with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
                for n in nodes:
                    if n.op == "placeholder":
                        env[n] = self.real_args[placeholders.index(n)]
                    elif n.op == "get_attr":
                        env[n] = getattr(self.tracer.root, n.target)
                    else:
                        args, kwargs = fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
                        env[n] = n.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a constant the trace holds as a fake tensor
            self.why_not = f"its computation failed ({type(e).__name__}: {e})"
            return None
        value = env[node]
        return value if type(value) in (bool, int) else None


# the ops that take a Python number from a tensor (``bool(t)`` traces as ``ne(t, 0)``, ``item``)
_READS = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)


# Note [Questions about read values]: a number taken from a tensor in Python (``v =
# t.item()``, ``t.tolist()``) is a SymInt, SymFloat or SymBool in the trace, whether or not
# a value check then fixes its value (Note [Value reads]), and an int, float or bool in eager:
# ``isinstance(v, int)``, ``type(v) is int``, ``v is 3`` answer otherwise, with no guard, and
# every hit returned what eager never does. So a trace with such a read is scanned for those
# questions as a symbolic trace is (Note [Questions about symbolic values] in
# lower/state/questions.py, run by tensor_reads.py's ``check_questions``): where the user's
# code asks one of a value that may be symbolic, the call runs eagerly (a trace at exact sizes
# reads the number alike).
# ``int(t)``, ``bool(t)`` and ``float(t)`` return Python's numbers (torch guards the value);
# library code's questions are not scanned (as for symbolic sizes).
def has_scalar_reads(gm: fx.GraphModule) -> bool:
    """Note [Questions about read values]: whether ``gm`` took a Python number from a
    tensor."""
    return any(n.op == "call_function" and n.target in _READS for n in gm.graph.nodes)


def _pure(node: fx.Node) -> bool:
    """An ATen op that writes nothing and draws no random numbers, or Python's arithmetic on
    sizes."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        return not schema.is_mutable and \
            torch.Tag.nondeterministic_seeded not in target.tags and \
            all(a.alias_info is None or not a.alias_info.is_write for a in schema.arguments)
    return getattr(target, "__module__", None) in ("_operator", "operator") or \
        target in (torch.sym_max, torch.sym_min, torch.sym_not)


def slice_of(outputs: list[fx.Node]) -> list[fx.Node]:
    """The nodes ``outputs`` depend on, themselves included, in graph order."""
    seen: set = set()
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return [n for n in outputs[0].graph.nodes if n in seen]


def _numel_as_sizes(graph: fx.Graph) -> None:
    """``aten::sym_numel`` (``t.numel()`` under symbolic sizes, transformers' ``fast_all``),
    which the plan cannot call (torch 2.11: no dispatcher operator ``aten::numel``), as the
    product of ``t``'s sizes: size steps (Note [Symbolic sizes] in plan.py)."""
    import operator

    for n in list(graph.nodes):
        if n.target is not torch.ops.aten.sym_numel.default:
            continue
        tensor = n.args[0]
        shape = tensor.meta["val"].shape
        if not len(shape):  # (one element: the plan's numel fails, the exact trace serves)
            continue
        with graph.inserting_before(n):
            total = None
            for d in range(len(shape)):
                size = graph.call_function(torch.ops.aten.sym_size.int, (tensor, d))
                size.meta.update(n.meta, val=shape[d])
                if total is not None:
                    size = graph.call_function(operator.mul, (total, size))
                    size.meta.update(n.meta, val=total.meta["val"] * shape[d])
                total = size
        n.replace_all_uses_with(total)
        graph.erase_node(n)


def _dtype(x):
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _is_numel(count, t: fx.Node) -> bool:
    """``count`` is ``t.numel()``: the product of ``t``'s sizes in the plan (``_numel_as_sizes``:
    ``sym_size(t, d)`` for each ``d`` once, multiplied), or an int where ``t``'s sizes are
    static (the specialization's guards fix them)."""
    import operator

    shape = t.meta["val"].shape
    if isinstance(count, int) and not isinstance(count, bool):
        return all(isinstance(d, int) for d in shape) and count == math.prod(shape)
    factors, stack = [], [count]
    while stack:
        n = stack.pop()
        if isinstance(n, fx.Node) and n.target is operator.mul and len(n.args) == 2:
            stack.extend(n.args)
        elif isinstance(n, fx.Node) and n.target is torch.ops.aten.sym_size.int and \
                n.args[0] is t:
            factors.append(n.args[1])
        else:
            return False
    return sorted(factors) == list(range(len(shape)))


def _all_reads(graph: fx.Graph) -> None:
    """Note [All reads]
    ~~~~~~~~~~~~~~~~~~~
    A value check runs at every hit, before the launch sequence or the replay, so its plan is
    the hit's own cost: each op a dispatcher call, on CUDA a kernel and an allocation.
    transformers' ``fast_all(mask)`` (``m.sum() == m.numel()``) of a mask converted to bool,
    read by ``bool``, traces as ``_to_copy(mask, dtype=bool)``, ``sum``, ``eq(., numel)``,
    ``ne(., 0)``, ``item``: four kernels, the whole mask copied, for one bit. Three rewrites,
    each an identity of ATen's semantics for every value, make it ``all(mask)``, ``item``:

    - ``ne(b, 0)`` of a bool ``b`` is ``b``;
    - ``eq(sum(b), b.numel())`` of a bool ``b`` (no dtype given to ``sum``: an int64 count of
      the true elements) is ``all(b)`` (empty: both True);
    - ``all(_to_copy(x, dtype=bool))`` on ``x``'s own device is ``all(x)``: both ask whether
      every element is nonzero (NaN is nonzero to both; complex ``x`` is left as it is).

    The check stays exact (it reads every element, as the answer True depends on each); it
    no longer copies. Dead nodes left behind are erased (the plan holds only pure ops:
    Note [Value reads])."""
    aten = torch.ops.aten
    for n in list(graph.nodes):
        if n.target is aten.ne.Scalar and not n.kwargs and len(n.args) == 2 and \
                n.args[1] == 0 and type(n.args[1]) in (int, bool) and \
                _dtype(n.args[0]) is torch.bool:
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
    for n in list(graph.nodes):
        if n.target is not aten.eq.Scalar or n.kwargs or len(n.args) != 2:
            continue
        total, count = n.args
        if not (isinstance(total, fx.Node) and total.target is aten.sum.default and
                len(total.args) == 1 and not total.kwargs):
            continue
        b = total.args[0]
        if _dtype(b) is not torch.bool or not _is_numel(count, b):
            continue
        x = b
        if b.target is aten._to_copy.default and len(b.args) == 1 and \
                set(b.kwargs) <= {"dtype", "device", "layout"} and \
                b.kwargs.get("layout") in (None, torch.strided) and \
                isinstance(b.args[0], fx.Node) and isinstance(b.args[0].meta.get("val"), torch.Tensor):
            source = b.args[0].meta["val"]
            if not source.is_complex() and source.layout == torch.strided and \
                    b.kwargs.get("device") in (None, source.device):
                x = b.args[0]
        with graph.inserting_before(n):
            read = graph.call_function(aten.all.default, (x,))
        read.meta.update(n.meta)
        n.replace_all_uses_with(read)
        graph.erase_node(n)
    for n in reversed(list(graph.nodes)):
        if n.op == "call_function" and not n.users:
            graph.erase_node(n)


def checks_graph(gm: fx.GraphModule, reads: list[tuple[fx.Node, int | bool]]
                 ) -> fx.GraphModule | None:
    """Note [Value reads]: the graph of the value checks of ``reads`` (the function's
    placeholders, the nodes the reads depend on, the reads as outputs), and the reads that
    nothing else uses removed from ``gm``, with the nodes only they used."""
    if not reads:
        return None
    graph = fx.Graph()
    env: dict = {}
    read_nodes = [n for n, _ in reads]
    needed = set(slice_of(read_nodes))
    for n in gm.graph.nodes:
        if n.op == "placeholder" or n in needed:
            env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(tuple(env[n] for n in read_nodes))
    _numel_as_sizes(graph)
    _all_reads(graph)
    checks = fx.GraphModule(gm, graph)
    dead = [n for n in read_nodes if not n.users]
    while dead:
        n = dead.pop()
        if n.op != "call_function" or n.users or not _pure(n) or n.graph is not gm.graph:
            continue
        inputs = n.all_input_nodes
        gm.graph.erase_node(n)
        dead.extend(i for i in inputs if not i.users)
    gm.recompile()
    return checks
