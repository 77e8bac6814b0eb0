"""Recording a trace (Note [State guards]): the user code that runs, under ``sys.setprofile``,
and the calls whose results no guard keeps."""

from __future__ import annotations

import _thread
import collections
import contextlib
import dataclasses
import functools
import gc
import logging
import random
import sys

import torch

from trident import frames
from trident.errors import TridentError, transient
from trident.lower.state.asked import ASKERS, judge
from trident.lower.state.draws import Draws
from trident.lower.state.hooks import _CHAINED
from trident.lower.state.impure import (
    _FILE_OPENERS, _IMPURE_MODULES, _OS_READS, _OS_WRAPPERS, _SOURCE_READERS, _impure_name)
from trident.lower.state.library import (
    handler_codes, interrupt_code, library_kind, torch_state_read)
from trident.lower.state.library_writes import Watch
from trident.lower.state.writes import EntryCheck

_RANDOM = random._inst  # the random module's functions' generator (Note [Draws of a trace])
# Note [Recording cost]: the profile hook runs at every Python call and return and every C call
# and return of the trace, nearly all of them torch's own (fake tensors, proxies, the
# dispatcher's Python), so its cost per event is a large part of a first compile. Returns are
# left at once. Whether a code object is user code is decided once per code object (a file's
# code; exec'd code, named "<...>", belongs to the module whose globals it runs in, so its
# frames are asked each time), looked up by the object's id: hashing a code object hashes its
# bytecode, names and constants, on every lookup. The recording keeps those code objects alive,
# so no id is reused meanwhile. The cheap test of a frame's module comes before the walk up its
# callers.
_QUIET_EVENTS = frozenset({"return", "c_return", "c_exception"})
_TENSOR_HASH = torch.Tensor.__hash__.__code__  # (Python: torch/_tensor.py, torch 2.11-2.13)
# Note [Calls of the same code]: the reads of a user function's parameters (``l.K``, ``self.K``
# of a method that a base class defines) are read through the objects it was called with,
# whose classes may differ from call to call (``gain(layers[0]) * gain(layers[1])``,
# ``map(lambda l: l.K, layers)``, layers of two subclasses whose ``forward`` is their base's).
# So each later call with other objects keeps its parameters too, and the chains of the code
# are read through each set (``reads_of`` in reads.py); past ``_CALLS_BOUND`` sets the call
# runs eagerly (a generator's resumption holds the objects of its call: none new).
_CALLS_BOUND, _PLAIN_VALUES = 256, (int, float, complex, bool, str, bytes, type(None))
_USER, _IMPURE, _OS, _MODULE_CALL, _TRACE_STATE, _LOGS = 1, 2, 4, 8, 16, 32  # what a code's
_SCANNED, _PASSED = 64, 128  # frames record (Note [Library code that ran] in library.py)
_HAS_TORCH_FUNCTION = torch._C._has_torch_function  # Note [Trace state]
_INTERRUPT = 256  # a gc callback's or a signal handler's code (Note [Interrupts])
_TORCH = 512  # torch's own Python, not scanned (Note [torch's Python state] in library.py)

# Note [Interrupts]: the interpreter runs some code between the function's instructions, from
# whatever frame is running, that the function did not call: the collector's callbacks
# (``gc.callbacks``: hypothesis registers one for the rest of a test process that rewrites a
# module global at every collection) and the finalizers of the garbage it frees (``__del__``,
# weakref callbacks, ``weakref.finalize``), started by an allocation anywhere or by a
# ``gc.collect()`` of library code, and Python signal handlers. Their reads are not the
# function's: guarded, a value they rewrite at every run (a counter) made every call miss;
# recorded as user code, their writes made the function eager. So none of their frames, nor
# anything they call, is recorded: the collector's run on this thread is bracketed by two gc
# callbacks of the recording's own (the first of ``gc.callbacks`` marks its start, the last
# its end), during which the hook records nothing, and the code of a gc callback (one listed
# before the first: registered meanwhile) or of a signal handler (``handler_codes``, as the
# recording starts) is ``_INTERRUPT``, which ``under_fn`` does not walk through. Not by the
# caller's instruction: code the function does call runs from instructions that are not
# calls too (``1 - x`` runs ``Tensor.__rsub__`` from BINARY_OP, ``m.layer`` runs
# ``Module.__getattr__`` from LOAD_ATTR), and a finalizer runs from CALL (``gc.collect()``,
# ``signal.raise_signal``). A finalizer that the function's own code starts by dropping the
# last reference to an object (refcounting, not the collector) is the function's code, as
# eager runs it at every call. A trace or profile function (``sys.settrace``) needs nothing:
# the interpreter reports no calls made inside one.


@dataclasses.dataclass
class Recording:
    """What ran during a trace: per user code object, its globals and its parameters' values
    at the call; and the calls whose results no guard keeps."""

    codes: dict = dataclasses.field(default_factory=dict)  # code -> (globals, {param: value})
    calls: dict = dataclasses.field(default_factory=dict)  # Note [Calls of the same code]
    impure: list = dataclasses.field(default_factory=list)
    module_call: bool = False  # an nn.Module was called: torch's global hooks were read
    module_classes: dict = dataclasses.field(default_factory=dict)  # id -> the class of each
    # nn.Module called (Note [Module forwards] in roots.py)
    generator_calls: list = dataclasses.field(default_factory=list)  # this thread's setters
    library: dict = dataclasses.field(default_factory=dict)  # id of library code the function
    # ran -> (the code, its globals) (Note [Library code that ran] in library.py)
    library_tensors: dict = dataclasses.field(default_factory=dict)  # id of such code -> (the
    # code, its globals, {param: a tensor it was called with}) (Note [Tensor types and
    # attributes] in ir/guards.py: its reads of a tensor's Python type)
    active: bool = False  # the profile hook ran (the function has code to record)
    entry: EntryCheck | None = None  # Note [Writes at entry] (writes.py)
    probe: object = None  # Note [Dict orders] (lower/orders.py): the order probe's, told of
    # each C call of its trace
    storage_orders: list = dataclasses.field(default_factory=list)  # Note [Orders of an
    # OrderedDict]: dict's own methods that read one in its dict's order
    draws: object = None  # Note [Draws of a trace] (draws.py)
    asked: list = dataclasses.field(default_factory=list)  # Note [Questions asked in the
    # trace] (asked.py): isinstance/issubclass calls whose answer may not be eager's
    hashed: str | None = None  # Note [Answers from addresses] (addresses.py): where the
    # function's code hashed a tensor
    hook: object = None  # Note [Own code unrecorded] (tracing.py): the profile hook, set aside
    # (``paused``) but for the traces (``resumed``)

    @property
    def refused(self) -> str | None:
        """Why a user function the trace started writes outside (Note [Writes at entry])."""
        return self.entry.refused if self.entry is not None else None

    def put_back_draws(self) -> list[str]:
        """Note [Draws of a trace]: each generator the trace drew from put back; their names."""
        return self.draws.finish() if self.draws is not None else []

    def changed_rng(self) -> bool:
        """Whether this thread's trace set a random generator's state (Note [Global side
        effects] in capture.py): another thread's draws meanwhile are not the function's."""
        return bool(self.generator_calls)


# Note [Orders of an OrderedDict]: an OrderedDict iterates in the order of its own linked list,
# which its argument tree (``same_keys`` in runtime/trees.cpp) and a state read check; the dict
# it is built on keeps its own order, which ``dict``'s methods called through the class read
# (``dict.keys(od)``, ``dict.values``, ``dict.items``, ``dict.copy``, ``dict.__reversed__``,
# ``dict.popitem``). The two differ once a key is moved (``move_to_end``, a key deleted and set
# again): a trace that read the dict's order was served to calls whose dict had another. Those
# are C calls that the recording's profile hook reports, bound to the OrderedDict (their
# ``__qualname__`` says ``OrderedDict.keys`` either way: told apart from the OrderedDict's own
# by equality with dict's method bound to it): the call runs eagerly. dict's slot wrappers
# (``dict.__iter__(od)``, ``dict.__repr__(od)``) are no C call the hook reports: code that loads
# one (``slot_loaded`` in lower/orders.py) and names an OrderedDict of two or more keys (a
# parameter's value, a global) runs eagerly too. Not seen: such a slot wrapper applied to an
# OrderedDict that the code reaches otherwise (an attribute, an item).
_STORAGE_ORDERS = {n: vars(dict)[n] for n in ("keys", "values", "items", "copy",
                                                "__reversed__", "popitem")}


# A torch.Generator's methods that set its state (its draws are ops, which a trace makes on
# fake tensors without drawing).
_GENERATOR_SETTERS = frozenset({"manual_seed", "seed", "set_state", "set_offset",
                                "graphsafe_set_state"})


@functools.cache
def _module_call_codes() -> frozenset:
    """The ids of the code objects of ``nn.Module``'s call (alive as long as torch is)."""
    m = torch.nn.Module
    return frozenset(id(getattr(m, n).__code__) for n in ("_call_impl", "_wrapped_call_impl")
                     if hasattr(getattr(m, n, None), "__code__"))


# Note [Trace state]: torch's answers about the trace itself, which differ while Trident traces
# (a TorchFunctionMode and FX's tracer are active) from an eager call's: a function that asks
# runs eagerly, as one that reads the clock does. ``torch.overrides.has_torch_function(args)``
# is such a question where the code that asks does not hand the call on
# (``handle_torch_function``, as every ``F.*`` does under the trace's mode) but branches on it:
# nn.MultiheadAttention's, TransformerEncoderLayer's and TransformerEncoder's forwards (eval
# mode, no grad) take their fused fast path in eager and the composite one in the trace, whose
# mode makes the answer True (other values, other strides; CPU machine, session 49). torch.compiler.is_compiling(),
# torch.jit.is_scripting() and torch.jit.is_tracing() answer in the trace as in eager. Its C
# functions: impure.py's _TRACE_STATE_C.


@functools.cache
def _trace_state_codes() -> frozenset:
    """The ids of the code objects of torch's Python functions of Note [Trace state]."""
    import torch._guards
    import torch._subclasses.fake_tensor as fake_tensor
    import torch.fx._symbolic_trace as fx_trace
    import torch.overrides
    import torch.utils._python_dispatch as dispatch

    fns = [fx_trace.is_fx_tracing, getattr(fx_trace, "is_fx_symbolic_tracing", None),
           torch.overrides._get_current_function_mode_stack,
           getattr(torch.overrides, "_get_current_function_mode", None),
           dispatch._get_current_dispatch_mode, dispatch._get_current_dispatch_mode_stack,
           getattr(dispatch, "is_in_torch_dispatch_mode", None),
           torch._guards.detect_fake_mode, getattr(torch._guards, "active_fake_mode", None),
           getattr(fake_tensor, "maybe_get_fake_mode", None)]  # (the trace's mode)
    return frozenset(id(f.__code__) for f in fns if hasattr(f, "__code__"))


@functools.cache
def _logging_codes() -> frozenset:
    """Note [Logging calls] (writes.py): the ids of the code objects of ``logging``'s calls
    that emit a record or ask a level (a ``Logger``'s, a ``LoggerAdapter``'s, the module's
    own ``logging.info`` ...), whichever way user code reached the logger."""
    from trident.lower.state.writes import _LOG_METHODS

    names = _LOG_METHODS | {"isEnabledFor", "getEffectiveLevel"}
    fns = [getattr(owner, n, None) for owner in (logging.Logger, logging.LoggerAdapter,
                                                 logging) for n in names]
    return frozenset(id(f.__code__) for f in fns if hasattr(f, "__code__"))




@contextlib.contextmanager
def record(fn):
    """Record the user code that ``fn``'s code runs in this thread (Note [State guards]);
    chains to a profile function already set. A profiler written in C (``cProfile``:
    ``sys.getprofile()`` returns its ``Profile`` object, which is not callable) cannot be
    chained: it is disabled while the call is recorded and enabled again after it."""
    rec = Recording()
    top = getattr(fn, "__code__", None)
    if top is None:
        yield rec
        return
    rec.entry = entry = EntryCheck(top)
    rec.draws = draws = Draws()  # Note [Draws of a trace] (draws.py)
    watch = Watch(entry.refuse)  # Note [Library code that writes its state] (library_writes.py)
    previous = sys.getprofile()
    suspended = previous if previous is not None and not callable(previous) and \
        callable(getattr(previous, "enable", None)) else None
    if suspended is not None:
        suspended.disable()
        previous = None
    elif previous is not None and not callable(previous):
        raise transient(TridentError("a profiler that Trident cannot chain to is active "
                                     f"({type(previous).__name__}): its calls run eagerly"))
    called: dict = {}  # frame -> whether fn's code called it (frames live until the end)
    inlined: dict = {}  # library frames of Note [Library code that ran] (library.py)
    module_codes = _module_call_codes()
    handlers = handler_codes()  # Note [Interrupts]
    collecting, thread = False, _thread.get_ident()
    trace_codes = _trace_state_codes()
    log_codes = _logging_codes()
    kinds: dict = {}  # id of a file's code object -> its _USER | _IMPURE | ... bits
    kept: list = []  # those code objects (Note [Recording cost])

    def kind_of(frame) -> int:
        code = frame.f_code
        kind = kinds.get(id(code))
        if kind is None:
            module = frame.f_globals.get("__name__")
            user = frames.user_frame(frame)
            kind = _INTERRUPT if interrupt_code(code, handlers) else (_USER if user else 0) | \
                (_IMPURE if module in _IMPURE_MODULES else 0) | \
                (_OS if module in _OS_WRAPPERS else 0) | \
                (_MODULE_CALL if id(code) in module_codes else 0) | \
                (_TRACE_STATE if id(code) in trace_codes else 0) | \
                (_LOGS if id(code) in log_codes else 0) | \
                (0 if user else library_kind(frame, _SCANNED, _PASSED))
            if not kind and str(module).startswith("torch.") and \
                    code.co_name not in ("__torch_function__", "__torch_dispatch__", "<module>"):
                kind = _TORCH  # Note [torch's Python state] (library.py)
            if not code.co_filename.startswith("<"):
                kinds[id(code)] = kind
                kept.append(code)
        return kind

    def under_fn(frame) -> bool:
        """``frame`` runs for ``fn``: ``fn``'s frame is below it, and no Trident frame in
        between (Trident's own calls of user code, as an import hook or a patched ``open`` in
        the trace's bookkeeping, are not the function's reads; a Triton heuristic or grid
        callable that a launch runs is: Note [Launch frames] in frames.py)."""
        if frame in called:
            return called[frame]
        f, seen = frame, []
        while f is not None and f not in called and f.f_code is not top:
            seen.append(f)
            if frames.eager_call_frame(f.f_code):  # Note [Nested jitted calls] in frames.py
                while f.f_back is not None and frames.inside_trident(f.f_back.f_code.co_filename):
                    f = f.f_back
                    seen.append(f)
            elif frames.inside_trident(f.f_code.co_filename) and not \
                    frames.launch_frame(f.f_code) or kind_of(f) & _INTERRUPT:  # Note [Interrupts]
                f = None
                break
            f = f.f_back
        result = f is not None and (f.f_code is top or called[f])
        for g in seen:
            called[g] = result
        return result

    def hook(frame, event, arg):  # Note [Recording cost]
        if event in _QUIET_EVENTS or collecting:  # Note [Interrupts]
            if previous is not None:
                previous(frame, event, arg)
            return
        kind = kinds.get(id(frame.f_code))
        if kind is None:
            kind = kind_of(frame)
        if event == "call":
            if frame.f_code is _TENSOR_HASH and rec.hashed is None:  # Note [Answers from
                _hashed(frame)  # addresses] (addresses.py)
            if kind:
                _call(frame, kind)
                if kind & (_SCANNED | _PASSED):
                    _library_call(frame, kind)
        elif event == "c_call":
            if rec.probe is not None:  # Note [Dict orders] (lower/orders.py)
                rec.probe.called(arg)
            owner = getattr(arg, "__self__", None)
            if type(owner) is collections.OrderedDict:
                _storage_order(frame, arg)
            elif isinstance(owner, random.Random) and (kind & _USER or owner is _RANDOM) \
                    and under_fn(frame):  # (a library's own, sympy's: not the function's)
                draws.watch(owner)  # (before the draw: Note [Draws of a trace])
            if getattr(arg, "__name__", None) in _GENERATOR_SETTERS and isinstance(
                    owner, torch.Generator) and under_fn(frame):
                rec.generator_calls.append(arg.__name__)  # from any code the function runs
            if kind:
                _c_call(frame, kind, arg)
            elif arg is _FILE_OPENERS[0] or arg is _FILE_OPENERS[1]:
                _library_open(frame, arg)
        if previous is not None:
            previous(frame, event, arg)

    def _call(frame, kind: int) -> None:
        code = frame.f_code
        if kind & _MODULE_CALL:
            if under_fn(frame):
                rec.module_call = True
                cls = type(frame.f_locals.get("self"))
                rec.module_classes.setdefault(id(cls), cls)
        elif kind & _USER and under_fn(frame):
            if code not in rec.codes:
                local = frame.f_locals
                rec.codes[code] = (frame.f_globals, {n: local[n] for n in
                                                     frames.parameter_names(code) if n in local})
                draws.watch_frame(code, frame)  # Note [Draws of a trace]
                entry(frame, rec)  # raises (the frame unwinds) for a write outside
            else:
                _later_call(frame, code)
        elif kind & _LOGS:
            caller = frame.f_back  # (logging.info calls root.info: from its caller)
            while caller is not None and kind_of(caller) & _LOGS:
                caller = caller.f_back
            if caller is not None and kind_of(caller) & _USER and under_fn(caller):
                entry.refuse(f"the function logs ({code.co_qualname} called at "
                             f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:"
                             f"{caller.f_lineno}): eager emits a record at every call, a "
                             "hit would not")  # raises before the call's body runs
        elif kind & _TORCH:  # Note [torch's Python state] (library.py)
            back = frame.f_back
            if back is not None and (back in inlined or kind_of(back) & _USER and
                                     under_fn(back)):
                name = torch_state_read(code, frame.f_globals)
                if name is not None:
                    rec.impure.append(f"{frame.f_globals['__name__']}.{code.co_qualname}, "
                                      f"which reads torch's Python state {name}")
        elif kind & (_IMPURE | _TRACE_STATE) and frame.f_back is not None and \
                kind_of(frame.f_back) & _USER and under_fn(frame.f_back):
            rec.impure.append(f"{frame.f_globals['__name__']}.{code.co_name}")

    def _hashed(frame) -> None:
        back = frame.f_back
        if back is not None and kind_of(back) & _USER and under_fn(back):
            rec.hashed = f"a tensor's hash ({back.f_code.co_filename.rsplit('/', 1)[-1]}:" \
                         f"{back.f_lineno})"

    def _later_call(frame, code) -> None:
        """Note [Calls of the same code]: the parameters of a later call of ``code`` whose
        objects are not those of a call before."""
        local = frame.f_locals
        params = {n: local[n] for n in frames.parameter_names(code) if n in local}
        objects = tuple(id(v) for v in params.values() if not isinstance(
            v, (torch.Tensor, *_PLAIN_VALUES)))
        if not objects or objects == tuple(
                id(v) for v in rec.codes[code][1].values()
                if not isinstance(v, (torch.Tensor, *_PLAIN_VALUES))):
            return
        held = rec.calls.setdefault(code, {})
        if objects not in held and len(held) <= _CALLS_BOUND:
            held[objects] = params

    def _storage_order(frame, method) -> None:
        """Note [Orders of an OrderedDict]: ``method``, bound to an OrderedDict, is dict's."""
        name = getattr(method, "__name__", None)
        own = _STORAGE_ORDERS.get(name)
        if own is not None and len(method.__self__) >= 2 and method == own.__get__(
                method.__self__) and under_fn(frame):
            rec.storage_orders.append(f"dict.{name}")

    def _library_call(frame, kind: int) -> None:
        """Note [Library code that ran] (library.py): a library's frame the function's code
        called, directly or through library frames that such calls made."""
        back = frame.f_back
        if frame.f_code is top or back is not None and (
                back in inlined or back.f_code is top or (
                    kind_of(back) & _USER and under_fn(back))):
            inlined[frame] = None  # (frames live until the end: no id is reused)
            if kind & _SCANNED and id(frame.f_code) not in rec.library:
                rec.library[id(frame.f_code)] = (frame.f_code, frame.f_globals)
            if kind & _SCANNED:  # Note [Library code that writes its state]
                watch.enter(frame)
                local, code = frame.f_locals, frame.f_code
                tensors = {n: local[n] for n in frames.parameter_names(code)
                           if isinstance(local.get(n), torch.Tensor)}
                if tensors:
                    rec.library_tensors.setdefault(id(code), (code, frame.f_globals, {}))[
                        2].update(tensors)

    def _c_call(frame, kind: int, arg) -> None:
        if arg is ASKERS[0] or arg is ASKERS[1]:  # Note [Questions asked in the trace]
            if kind & _USER and under_fn(frame):
                who = "the function"
            elif kind & _SCANNED and frame in inlined:
                who = f"library code the function runs ({frame.f_code.co_qualname})"
            else:
                return
            found = judge(frame, arg, who, str(frame.f_globals.get("__name__")).partition(
                ".")[0] != "torch")  # (torch asks of its symbolic values on purpose)
            if found is not None:
                rec.asked.append(found)
        elif arg is _HAS_TORCH_FUNCTION and "handle_torch_function" not in \
                frame.f_code.co_names and (kind & _USER and under_fn(frame) or
                                           kind & _SCANNED and frame in inlined):
            rec.impure.append("torch.overrides.has_torch_function")  # Note [Trace state]
        elif kind & _USER and under_fn(frame):
            name = _impure_name(arg)
            if name:
                rec.impure.append(name)
        elif kind & _OS:
            caller, depth = frame, 0  # the wrappers' own calls, up to the user's code
            while caller is not None and depth < 8 and \
                    caller.f_globals.get("__name__") in _OS_WRAPPERS:
                outer, caller, depth = caller, caller.f_back, depth + 1
            if getattr(arg, "__name__", None) in _OS_READS and caller is not None and \
                    kind_of(caller) & _USER and under_fn(caller):
                name = _impure_name(arg)
                if name:
                    rec.impure.append(f"{outer.f_globals['__name__']}."
                                      f"{outer.f_code.co_name}, which calls {name}")
            elif arg is _FILE_OPENERS[0] or arg is _FILE_OPENERS[1]:
                _library_open(frame, arg)
        elif arg is _FILE_OPENERS[0] or arg is _FILE_OPENERS[1]:  # (io, _io's own frames)
            _library_open(frame, arg)

    def _library_open(frame, arg) -> None:
        """Note [Files read by libraries]."""
        module = frame.f_globals.get("__name__")
        if module not in _SOURCE_READERS and under_fn(frame):
            rec.impure.append(f"{module}.{frame.f_code.co_qualname}, which opens a file by "
                              f"{arg.__module__}.{arg.__name__}")

    def collector_starts(phase, _info) -> None:  # Note [Interrupts]
        nonlocal collecting
        if phase == "start" and _thread.get_ident() == thread:
            collecting = True

    def collector_ends(phase, _info) -> None:
        nonlocal collecting
        if phase == "stop" and _thread.get_ident() == thread:
            collecting = False

    _CHAINED[hook] = previous
    gc.callbacks.insert(0, collector_starts)
    gc.callbacks.append(collector_ends)
    sys.setprofile(hook)
    rec.active = True
    try:
        yield rec
    finally:
        sys.setprofile(previous)
        watch.close()
        rec.put_back_draws()  # (a trace that failed: Note [Draws of a trace])
        for callback in (collector_starts, collector_ends):
            with contextlib.suppress(ValueError):  # (removed by another's code meanwhile)
                gc.callbacks.remove(callback)
        del _CHAINED[hook]
        called.clear()  # the frames, and what their locals hold (a closure may outlive this)
        inlined.clear()
        if suspended is not None:
            suspended.enable()
