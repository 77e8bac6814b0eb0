"""Source lines while tracing (Note [Source lines]): each node is tagged with the user's line
that made its torch call, what a call reads or writes that no guard covers is refused, and a
torch call inside a ``try`` is recorded (Note [Errors inside try])."""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import linecache
import sys
import threading
import traceback
import types
from pathlib import Path

import torch
import torch.fx.traceback as fx_traceback
from torch.overrides import TorchFunctionMode

from trident import frames, runtime
from trident.errors import TridentError
from trident.lower import (collectives, conversions, rng, setitem, tensor_attributes,
                           trace_writes)
from trident.lower.patched_methods import method_run


_USER_LINE_FILES: dict[str, bool] = {}  # a code object's file name -> user_line_file(name)


def _user_line(filename: str) -> bool:
    """``frames.user_line_file(filename)``, which depends on the name alone: kept per name."""
    user = _USER_LINE_FILES.get(filename)
    if user is None:
        user = _USER_LINE_FILES[filename] = frames.user_line_file(filename)
    return user


def _at(frame: traceback.FrameSummary | None) -> str:
    """`` (file.py:LINE)`` of the user's line, for a message; "" where there is none."""
    return f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""


def _user_line_frame(frame):
    """The innermost frame from ``frame`` out whose line is the user's (``_user_line``) or None."""
    while frame is not None:
        if _user_line(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


_TRACER_MODULES = ("torch.fx.", "torch._subclasses.")  # make_fx's and fake tensors'


def _made_outside(where: str, frame: traceback.FrameSummary | None) -> str:
    """Why a call runs eagerly whose trace met a real tensor that no argument holds and no
    traced op made (``torch.from_numpy(array)``, ``torch.frombuffer``): torch reads where it
    lies in its memory (its ``storage_offset()``, a read the user did not write) to trace it
    as a constant, and Trident guards no memory that is neither an argument's nor a traced op's."""
    line = f": {frame.line}" if frame and frame.line else ""
    return (f"the function makes a tensor over memory it does not own{where}{line} (as "
            "torch.from_numpy or torch.frombuffer do: the tensor shares a NumPy array's or "
            "a buffer's memory, which no guard watches); pass the tensor as an argument for "
            "the call to compile")


def _user_frame() -> traceback.FrameSummary | None:
    """The user's line (Note [User code] in frames.py): the innermost frame, from the caller's
    caller out, that is neither Trident's, torch's nor a frozen module's."""
    frame = _user_line_frame(sys._getframe(2))
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    return traceback.FrameSummary(filename, frame.f_lineno, frame.f_code.co_name,
                                  line=linecache.getline(filename, frame.f_lineno).strip())


# Facts of a tensor's memory that no guard covers (guards.py guards sizes, strides and 16-byte
# alignment, not where a view starts in its storage or which tensor it views), and its gradient.
_UNGUARDED_READS = {
    "storage_offset()": torch.Tensor.storage_offset, "data_ptr()": torch.Tensor.data_ptr,
    "untyped_storage()": torch.Tensor.untyped_storage, "storage()": torch.Tensor.storage,
    "_is_view()": torch.Tensor._is_view, "is_set_to()": torch.Tensor.is_set_to,
    "_version": torch.Tensor._version.__get__, "_base": torch.Tensor._base.__get__,
    "grad": torch.Tensor.grad.__get__, "_grad": torch.Tensor._grad.__get__,  # (the fake's: None)
}
# Note [Tensors as text]: ``repr(x)``, ``str(x)``, ``f"{x}"`` of a tensor the function holds
# give its values in eager and the fake tensor's description in a trace ("FakeTensor(...,
# size=(6,))"): a hit returned what the trace's text made (its length, a branch on it). They
# reach the mode as ``Tensor.__repr__`` and ``Tensor.__format__``; the call runs eagerly.
_AS_TEXT = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__})

# Note [Symbolic values as text]: where an int is symbolic (a size under automatic dynamic
# shapes, an int leaf: Note [Int leaves] in frontend/policy.py), the function's Python holds a
# torch.SymInt, whose text is its expression: ``str(n)``, ``repr(n)``, ``f"{n}"`` gave "s0" in
# the trace, which it baked, and every hit returned what that text made. Each of them reaches
# the class's ``__repr__`` (``object.__str__`` and ``object.__format__`` call it), which, called
# from user code while this thread traces, specializes the value (a guard on it: torch's
# ``guard_int``, ``guard_float``, ``guard_bool``) and gives its text as eager does. torch's own
# code (its messages, its logs) keeps the expression. Installed once, for every thread (each
# asks its own trace: ``_TRACING``). ``type(n)``, ``isinstance``, ``is``: Note [Questions about
# symbolic values] in lower/state/questions.py.
_TRACING = threading.local()  # .mode: the _SourceLines of this thread's trace, or None


@functools.cache
def _symbolic_text() -> None:
    from torch.fx.experimental.symbolic_shapes import guard_bool, guard_float, guard_int

    for cls, guard in ((torch.SymInt, guard_int), (torch.SymFloat, guard_float),
                       (torch.SymBool, guard_bool)):
        def text(self, _original=cls.__repr__, _guard=guard):
            return repr(_guard(self)) if _users() else _original(self)
        cls.__repr__ = text


def _users() -> bool:
    """Whether this thread traces and the caller of ``__repr__`` (who asked a symbolic
    value's text) is user code (Note [Symbolic values as text])."""
    mode = getattr(_TRACING, "mode", None)
    if mode is None or not mode.in_user_code:
        return False
    return _user_line(sys._getframe(2).f_code.co_filename)


# Writes that rebind what a tensor is (``x.data = y`` gives ``x`` another storage and shape;
# ``x.grad = g``): a hit would not make them, and the plan holds ``x``'s old metadata.
_UNGUARDED_WRITES = {".data": torch.Tensor.data.__set__, ".grad": torch.Tensor.grad.__set__}


# Note [Early assignment check]: a function that assigns to the Python state of its arguments
# cannot be compiled (substitute.substituted finds it when the trace ends), and a Hugging Face
# model's first call assigns a new tensor into its cache object at its first layer. While the
# traced function runs, its 32nd, 64th, 128th, ... torch call (each power of two from 32 on)
# asks the check of the trace in progress (``at_torch_calls``), which raises where an
# argument's container already holds a tensor that it did not hold at the start: the trace of
# a model stops at a layer, not after all of them. The check snapshots every mutable object of
# the argument tree (each module of a model), so its cost grows with the model: asked at every
# 32nd call it was about a third of a 16-layer tiny Llama's trace (py-spy); at doubling counts
# a trace of n calls asks it about log2(n / 16) times, and one that assigns at its k-th call
# still stops by its 2k-th. The check is only the early exit: the check at the end sees every
# assignment whatever the schedule. Other values a function may assign and put back before it
# returns (a flag) are left to the check at the end, and so are the attributes of objects
# whose writes a specialization replays (Note [Attribute writes] in writes.py: a static
# cache's lazily allocated tensors).
_CHECKS: list = []  # the checks of the traces in progress (compiles hold a lock: one a time)
FIRST_CHECK = 32  # the torch call that asks the check first; then every doubled count


@contextlib.contextmanager
def at_torch_calls(check):
    """While active, ``check()`` runs at the traced function's own 32nd, 64th, 128th, ... torch
    call (Note [Early assignment check]); what it raises ends the trace."""
    _CHECKS.append(check)
    try:
        yield
    finally:
        _CHECKS.remove(check)


def new_tensor(now: dict | list, before: dict | list) -> bool:
    """Whether the snapshot ``now`` of a container's entries holds a tensor that ``before``
    (an earlier snapshot) did not hold at the same key or index."""
    if isinstance(now, dict):
        return any(isinstance(v, torch.Tensor) and v is not before.get(k) for k, v in now.items())
    return any(isinstance(v, torch.Tensor) and (j >= len(before) or v is not before[j])
               for j, v in enumerate(now))


# Note [Unrecorded ops]: the state recording (Note [State guards] in lower/state) watches a
# trace with a Python profile hook, which runs at every Python and C call, and nearly all the
# calls of a trace are torch's own, made while an op runs on fake tensors (the dispatcher's
# Python: the proxy and fake tensor modes, meta functions, decompositions). The hook keeps
# only what runs for the traced function: a frame whose callers reach the function's frame
# with no Trident frame between them (``under_fn`` in recording.py). Every op the function
# calls goes through this mode's ``__torch_function__``, a Trident frame, so nothing that
# runs inside an op, or inside the mode's own bookkeeping, is ever the function's: not
# torch's Python, and not what an op may call back (a subclass's or a mode's handler, a
# kernel registered from Python). So the mode sets the hook aside for its whole call
# (``hooks.pause``), and the profile function the hook chains to, if any, runs in its
# place; the hook is set back when the op returns or raises. Likewise ``capture.trace`` sets
# it aside for all but the function's own run: the fake arguments (a process's first symbol
# imports torch.export's and inductor's modules, a second of CPU under the hook), make_fx's
# placeholders and the graph's code, the checks of the graph after it. Nothing the
# hook would have kept is lost, none of its answers changes (no guard is lost and none goes
# stale), and the function's own code between its ops (where its reads are) is watched as
# before. Trident's own code around a trace is unrecorded too (Note [Own code unrecorded]).
# Note [Inference mode inside]: a tensor made under ``torch.inference_mode()`` is an inference
# tensor (eager then refuses an in-place update of it outside the mode, and autograd's use);
# one made outside is not. A hit runs its ops under the call's mode, which the guards check, so
# a function that switches the mode around its own torch calls (``with
# torch.inference_mode():``, ``inference_mode(False)`` in a call under it, a decorated
# helper) returned tensors of the other kind. The trace refuses such a call (the mode at each
# of the function's torch calls against the call's): it runs eagerly, with one warning
# (``tests/test_break47.py``).
class _SourceLines(TorchFunctionMode):
    """Tags every node created inside a torch call with the user's line that made the call.

    While the traced function itself runs (``in_user_code``), a read of one of
    ``_UNGUARDED_READS`` raises TridentError: the specialization would bake in one call's
    answer, so the function runs eagerly instead. A TorchFunctionMode sees the read however it
    is spelled (``x.storage_offset()``, ``torch.Tensor.storage_offset(x)``, code made by
    ``exec``); torch's own reads while making fake tensors happen outside that window.
    """

    def __init__(self, pause=lambda: None):
        super().__init__()
        self.pause = pause  # Note [Unrecorded ops]: the recording's ``pause``
        self.in_user_code = False
        self.rng: bytes | None = None  # the generators' state when the function was entered
        self.rng_set = False  # a torch call ran while they were in another state
        self.catching = ""  # Note [Errors inside try]
        self.calls = 0  # the function's torch calls (Note [Early assignment check])
        self.next_check = FIRST_CHECK  # the call that asks the check next
        self.tags: dict = {}  # (file name, line) -> its tag (Note [Source lines])
        self.attributed: frozenset = frozenset()  # Note [Python attributes of tensors]
        self.leaves: frozenset = frozenset()  # (ditto) ids of the arguments' fakes, and
        self.looked_up: set = set()  # those an attribute was looked up on
        self.refused: str | None = None  # Note [Python attributes of tensors]
        self.inference = False  # the call's inference mode (Note [Inference mode inside])

    def refuse(self, why: str | None = None):
        """Raises TridentError (at any sizes: policy.py) for ``why`` or the reason kept
        (user code may have caught it); with neither, returns."""
        self.refused = self.refused or why
        if self.refused:
            error = TridentError(self.refused)
            error.any_sizes = True
            raise error

    def __enter__(self):
        _symbolic_text()  # Note [Symbolic values as text]
        tensor_attributes.install(_TRACING)  # Note [Python attributes of tensors]
        self.outer, _TRACING.mode = getattr(_TRACING, "mode", None), self
        return super().__enter__()

    def __exit__(self, *exc):
        _TRACING.mode = self.outer
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        hook = self.pause()  # Note [Unrecorded ops]
        try:
            return self._call(func, args, kwargs or {})
        finally:
            if hook is not None:
                sys.setprofile(hook)

    def _call(self, func, args, kwargs):
        # (asked of the function as called, before a remap puts Trident's own in its place)
        original = _overridden_api(func, sys._getframe(2))  # Note [Patched torch functions]
        func = func if original is not None else method_run(func)  # Note [Patched tensor
        # methods] in patched_methods.py
        if self.in_user_code:
            self.calls += 1
            if self.calls == self.next_check:  # Note [Early assignment check]
                self.next_check *= 2
                if _CHECKS:
                    _CHECKS[-1]()
            if not self.rng_set and self.rng is not None:  # Note [Global side effects]
                self.rng_set = rng.generator_states() != self.rng
            if not self.catching:
                self.catching = _enclosing_try(sys._getframe(1))
            for table, doing, why in ((_UNGUARDED_READS, "reads", "Trident does not guard"),
                                      (_UNGUARDED_WRITES, "assigns", "a compiled call would not")):
                for name, unguarded in table.items():
                    if func == unguarded:
                        frame = _user_frame()
                        where = _at(frame)
                        caller = sys._getframe(2)  # who reads: the user, or torch's tracer
                        while caller and caller.f_code.co_name == "__torch_function__":
                            caller = caller.f_back  # (another mode's dispatch)
                        if caller and caller.f_globals.get("__name__", "").startswith(
                                _TRACER_MODULES):
                            raise TridentError(_made_outside(where, frame))
                        raise TridentError(f"the function {doing} a tensor's {name}{where}, "
                                           f"which {why}")
            if trace_writes.written_outside(func, args, kwargs):  # (Note [Tensors written
                self.refuse(trace_writes.why(_user_frame()))  # outside] there)
            # Note [Inference mode inside]
            if torch.is_inference_mode_enabled() is not self.inference:
                self.refuse("the function switches inference mode around a torch call (a "
                            "torch.inference_mode block), whose tensors eager makes inference "
                            "tensors or not by it; a hit makes the call's kind")
            what = conversions.converted(args, kwargs)  # Note [Conversions inside ops]
            if what is not None:
                self.refuse(f"torch calls {what} inside {getattr(func, '__name__', func)}"
                            f"{_at(_user_frame())}, where its reads are not recorded")
            if func in _AS_TEXT:  # Note [Tensors as text]
                raise TridentError(f"the function turns a tensor into text{_at(_user_frame())} "
                                   "(repr, str, format): a trace sees no values, and a hit "
                                   "would return the trace's text")
            remapped = collectives.remap(func, args, kwargs)  # Note [Collectives]
            if remapped is not None:
                func, args, kwargs = remapped
            func = _bool_results().get(func, func)  # Note [Bool results]
            put = setitem.remap(func, args, kwargs)  # Note [Leading ones of a stored value]
            if put is not None:
                func, args = put
        self.tag(sys._getframe(1))
        if original is not None:
            return original()
        return func(*args, **kwargs)

    def tag(self, frame) -> None:
        """Note [Source lines]: the nodes made next are tagged with the user's line from
        ``frame`` out (its tag made once per file and line in this trace)."""
        frame = _user_line_frame(frame)
        if frame is None or not fx_traceback.has_preserved_node_meta():
            return
        key = (frame.f_code.co_filename, frame.f_lineno)
        tag = self.tags.get(key)
        if tag is None:
            tag = self.tags[key] = (f"{Path(key[0]).name}:{key[1]}",
                                    linecache.getline(*key).strip(), *key)
        fx_traceback.current_meta["custom"] = {SOURCE: tag}


# Note [Patched torch functions]: a torch function written in Python (``F.layer_norm``) asks
# for an override first: ``handle_torch_function(layer_norm, ...)``, the function named by its
# global name, which this mode's dispatch calls. Eager asks nothing (no mode is active) and
# goes on in the body. Where a user rebound that name (``F.layer_norm = wrapper`` around the
# original, ``mock.patch``), the name is the wrapper: calling it would run the wrapper again
# inside the original's body, which eager never does (a patch applied twice in the trace). So
# where the name is now a function of other code than the body that asks, and not torch's own
# (a torch decorator's wrapper runs the same body), the body that asked runs again, with the
# arguments it was called with, inside this handler (where the mode is off, as in eager).
_ASKS = ("handle_torch_function", "torch.overrides")


def _overridden_api(func, frame):
    """Note [Patched torch functions]: a call of the body that asked, where ``frame`` is
    ``handle_torch_function``'s and ``func`` a user's function in the API's place; else
    None."""
    if frame is None or (frame.f_code.co_name, frame.f_globals.get("__name__")) != _ASKS or \
            not isinstance(func, types.FunctionType):
        return None
    api = frame.f_back
    if api is None or func.__code__ is api.f_code or api.f_code.co_freevars or \
            frames.torch_file(func.__code__.co_filename) or \
            not frames.torch_file(api.f_code.co_filename):
        return None
    code, local = api.f_code, api.f_locals
    names = frames.parameter_names(code)
    if any(n not in local for n in names):
        return None
    body = types.FunctionType(code, api.f_globals, code.co_name)
    positional = [local[n] for n in code.co_varnames[:code.co_argcount]]
    keywords = {n: local[n] for n in code.co_varnames[code.co_argcount:code.co_argcount +
                                                      code.co_kwonlyargcount]}
    rest = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        positional += list(local[code.co_varnames[rest]])
        rest += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        keywords.update(local[code.co_varnames[rest]])
    return functools.partial(body, *positional, **keywords)


# Note [Patched Module.__call__]: make_fx's tracer puts its wrapper in ``nn.Module.__call__``
# for the trace, and the wrapper calls the ``__call__`` that ``torch.fx._symbolic_trace`` held
# when it was imported (``_orig_module_call``; ``__getattr__`` alike): a ``__call__`` patched
# by the user (a wrapper around every module call) would not run in the trace, and the
# specialization would keep the unpatched result where eager runs the patch. So for the trace,
# the wrapper calls the ``__call__`` that Python finds now. (Which one that is, is read by the
# state tree: Note [Module forwards] in lower/state/roots.py.)
_FX_ORIGINALS = (("_orig_module_call", "__call__"), ("_orig_module_getattr", "__getattr__"))
_fx_lock = threading.Lock()
_fx_held: list = []  # the values torch.fx held at the first trace, and the traces running


@contextlib.contextmanager
def module_calls_as_now():
    """Note [Patched Module.__call__]: while active, make_fx's module wrapper calls
    ``nn.Module``'s ``__call__`` and ``__getattr__`` as they are now."""
    import torch.fx._symbolic_trace as fx_trace

    with _fx_lock:
        if not _fx_held:
            _fx_held[:] = [{n: getattr(fx_trace, n, None) for n, _ in _FX_ORIGINALS}, 0]
        _fx_held[1] += 1
        for name, attr in _FX_ORIGINALS if _fx_held[1] == 1 else ():  # (a trace inside a
            if _fx_held[0][name] is not None:  # trace: the outer's are set, and Module's
                setattr(fx_trace, name, getattr(torch.nn.Module, attr))  # are its wrapper)
    try:
        yield
    finally:
        with _fx_lock:
            _fx_held[1] -= 1
            if not _fx_held[1]:  # the last trace running: torch.fx's own values back
                for name, _ in _FX_ORIGINALS:
                    if _fx_held[0][name] is not None:
                        setattr(fx_trace, name, _fx_held[0][name])


@functools.cache
def _bool_results() -> dict:
    """Note [Bool results]: ``aten::equal`` and ``aten::allclose`` return a C++ bool, which a
    trace on fake tensors cannot know (``DataDependentOutputException``). While tracing,
    ``torch.equal`` and ``torch.allclose`` (functions and methods) call the runtime's
    ``trident::equal`` and ``trident::allclose`` instead, which call the ATen op and return its
    bool as a 0-dim bool tensor, then ``.item()`` of it: the trace holds an unbacked bool, which
    the plan computes on every call (``aten::_local_scalar_dense``, as for ``x.item()``). A
    branch on it is a value check (Note [Value reads] in values.py). (Composite ops
    that call ``aten::equal`` inside, ``cov`` and ``corrcoef``, still run eagerly.)"""
    ops = runtime.operators()

    def bool_result(op):
        def call(*args, **kwargs):
            if "input" in kwargs:  # the Python binding's name of ``self``
                kwargs = dict(kwargs, self=kwargs.pop("input"))
            return op(*args, **kwargs).item()
        return call

    return {torch.equal: bool_result(ops.equal), torch.Tensor.equal: bool_result(ops.equal),
            torch.allclose: bool_result(ops.allclose),
            torch.Tensor.allclose: bool_result(ops.allclose)}


def _enclosing_try(frame) -> str:
    """Note [Errors inside try]: a trace runs on fake tensors, which raise no error that only a
    real kernel raises (an int tensor to a negative power, a missing kernel for a dtype, an
    index out of range), so the trace cannot see which ``except`` branch eager would take. This
    finds, among the user's frames between a torch call and the traced function (torch's own
    frames skipped), one that is inside a ``try`` whose handler may catch (``except E``, a bare
    ``except``; not ``finally``, not ``with``): "file.py:LINE" of the frame, or "".

    A specialization traced so runs natively; a step that fails on a call before anything the
    call did is visible (no write to memory the caller sees, no random draw:
    ``plan.rerun_eagerly``) makes that call run eagerly, which takes eager's branch; a later step's
    error is raised (as a TridentError). Every specialization does so, inside a ``try``
    or not: a call that fails early raises eager's own exception (its message, its traceback)
    whatever the guards did or did not check (torch 2.11's trace of ``x.select(0, 4)`` on a
    symbolic dim adds no guard ``size > 4`` that torch 2.13's adds). The "file.py:LINE" found here
    names the ``try`` in the warning."""
    seen_user = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if frames.trident_file(filename):  # Trident's frame: the trace's root
            if seen_user:
                return ""
        elif frames.user_line_file(filename):
            seen_user = True
            if any(start <= frame.f_lasti < end for start, end in _catching_ranges(frame.f_code)):
                return f"{Path(filename).name}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


@functools.lru_cache(maxsize=4096)
def _catching_ranges(code) -> tuple[tuple[int, int], ...]:
    """Byte ranges of ``code`` whose exception handler may catch: its first instructions test
    the exception's class (``CHECK_EXC_MATCH``) or drop it (a bare ``except``). Python 3.10
    has no exception table: any ``try`` counts, over the whole function."""
    if sys.version_info < (3, 11):
        return ((0, len(code.co_code)),) if any(
            i.opname == "SETUP_FINALLY" for i in dis.get_instructions(code)) else ()
    instructions = list(dis.get_instructions(code))
    at = {ins.offset: k for k, ins in enumerate(instructions)}
    ranges = []
    for entry in dis.Bytecode(code).exception_entries:
        k = at.get(entry.target)
        if k is None or instructions[k].opname != "PUSH_EXC_INFO":
            continue  # a cleanup handler (it re-raises)
        for ins in instructions[k + 1:]:
            if ins.opname in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH") or (
                    ins.opname == "POP_TOP" and ins.offset == instructions[k + 1].offset):
                ranges.append((entry.start, entry.end))
                break
            if ins.opname in ("RERAISE", "POP_EXCEPT", "WITH_EXCEPT_START"):
                break
    return tuple(ranges)


# Note [Source lines]: every node made inside a torch call is tagged with the user's line that
# made the call, as data: ``("file.py:12", "y = x + 1", "/path/file.py", 12)`` in the node's
# ``custom`` metadata, which ``make_fx`` copies onto the nodes it creates (torch.fx.proxy's
# _COPY_META_FIELDS). The importer makes it each op's MLIR location (a name location, the text,
# whose child is the file:line location Torch-MLIR's own importer gives) and plan reads both
# back; nothing parses a formatted stack trace. The graph's inputs and output are made by
# torch's tracing machinery, not by a user line: they take none.
SOURCE = "trident.source"


def source_line(node: torch.fx.Node) -> tuple[str, str]:
    """``("file.py:12", "y = x + 1")``: the line Note [Source lines] tagged ``node`` with, or
    ``("?", "")``."""
    return tuple((node.meta.get("custom") or {}).get(SOURCE, ("?", "")))[:2]


def source_place(node: torch.fx.Node) -> tuple[str, int] | None:
    """``("/path/file.py", 12)``: the file and line Note [Source lines] tagged ``node`` with
    (None for the graph's inputs and output, and an untagged node)."""
    tag = (node.meta.get("custom") or {}).get(SOURCE)
    if node.op in ("placeholder", "output") or tag is None or len(tag) < 4:
        return None
    return tag[2], tag[3]
