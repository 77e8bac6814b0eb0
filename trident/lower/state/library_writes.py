"""Library code that writes its own state (Note [Library code that writes its state]): which
writes of a library frame the trace ran land in state that outlives the call."""

from __future__ import annotations

import _thread
import sys
import types

import torch

from trident.lower.state import flow

# Note [Library code that writes its state]: library code that the function runs (Note [Library
# code that ran] in library.py) may write state of its own that outlives the call: a module
# global (``global CALLS; CALLS += 1``), an item or attribute of an object a module global
# holds (``MEMO["n"] = ...``, ``_STATS.calls += 1``, ``REGISTRY.append(x)``), another module's
# attribute (``import pkg.sub as s; s.state = 1``, ``sys.modules[__name__].N = 1``), a closure
# cell of its function (not one its maker's running frame made: ``Module._call_impl``'s
# ``inner`` sets the call's own ``nonlocal result``), or ``globals()``. Eager writes at every call and
# its later reads see the write (``return x * CALLS``); a hit runs no Python, so it would
# neither write nor see the count move: stale. (Reverted once, 715d403, because a gc callback
# of hypothesis's ran inside the trace and was taken for the function's library code; Note
# [Interrupts] in recording.py now keeps such frames out.)
#
# Library code guards such writes with a test (transformers registers a ``ModelOutput`` class in
# a module set once, ``if output_type in _registered_model_output_types: return``), and the
# walk names as state what a library's own method returns (a dict built from a registry's
# answer): refusing every library frame whose code holds such a write would refuse every
# Hugging Face model. So the check is of the writes that run: when a scanned library frame
# starts (the recording's ``call`` event), the offsets of its state writes (``state_writes``,
# walked once per code object) are watched (:class:`Watch`), and the first of them about to
# run refuses the trace, before the instruction runs: the frame unwinds, the trace wrote
# nothing, and the call runs eagerly with one warning, writing once, as eager does. A library
# frame that writes one of its parameters whose value is a global of a library module that
# ran (``_bump(MEMO)`` with ``def _bump(d): d["n"] += 1``) has those writes watched too.
# Watched per instruction, on one frame: ``sys.monitoring``'s INSTRUCTION events of that code
# on Python 3.12+ (a tool id of its own; other threads' frames of the code pass), a frame's
# opcode trace on 3.11 (``sys.settrace`` set for the recording's thread while none is; where
# another trace function is set, a debugger's or coverage's, the frame is refused when it
# starts, as any frame whose code holds such a write).
#
# What stays fixed, by choice: what a library's call returns is taken as fresh (``_LibraryFlow``:
# ``REGISTRY.get(key).append(x)`` is not refused; transformers' ``capture_outputs`` pops, at
# every forward, a dict it built from such an answer), and so is a write whose target the walk
# cannot follow ("a value Trident does not follow"); a mutable default that a library function
# writes (``def f(x, acc=[])``) is its parameter's, not refused. The standard library's frames
# and torch's internals are not scanned (Note [Library code that ran]): their caches
# (``functools.lru_cache``, ``warnings``' registry, torch's dispatch caches) are taken as
# fixed. Measured (all scanned frames of a tiny Llama, Qwen2, Mistral, Gemma, GPT-2, Gemma2,
# Gemma3 and sliding Qwen2 ``generate``, transformers 5.25, each instruction): two writes to
# state, neither in a forward's path as called (a ``ModelOutput`` class registered once,
# generate's ``os.environ["TOKENIZERS_PARALLELISM"]``).
_UNFOLLOWED = ("a value Trident does not follow", "a local Trident does not follow")
_WRITES: dict = {}  # id of a code object -> (the code, (its state writes, its parameter writes))
_MAX_CODES = 65536


def state_writes(code: types.CodeType, g: dict) -> tuple:
    """Note [Library code that writes its state]: ({offset: ``"what (origin) (file:line)"``}
    of the writes of ``code`` (run with the globals ``g``) whose target is state that outlives
    the call, {parameter: {offset: text}} of its writes to its parameters), walked once per
    code object."""
    found = _WRITES.get(id(code))
    if found is not None and found[0] is code:
        return found[1]
    state: dict = {}
    params: dict = {}
    walk = _LibraryFlow(code, g)
    for k, what, (why, written) in walk.writes():
        i = walk.ins[k]
        text = f"{what} ({why or 'a parameter'}, {code.co_filename.rsplit('/', 1)[-1]}:" \
               f"{i.positions.lineno if i.positions else '?'})"
        if why is not None and why not in _UNFOLLOWED:
            state.setdefault(i.offset, text)
        for name in written:
            params.setdefault(name, {}).setdefault(i.offset, text)
    if len(_WRITES) >= _MAX_CODES:
        _WRITES.clear()
    _WRITES[id(code)] = (code, (state, params))
    return state, params


def _fresh_cell(frame, text: str) -> bool:
    """Whether the write ``text`` of ``frame`` goes to a closure cell that a frame running now
    made (``Module._call_impl``'s ``inner`` sets ``nonlocal result`` of the call in progress:
    the call's own state, not state that outlives it)."""
    _, _, rest = text.partition("(closure variable ")
    name = rest.partition(",")[0]
    if not name:
        return False
    f, depth = frame.f_back, 0
    while f is not None and depth < 32:
        if name in f.f_code.co_cellvars and frame.f_code in f.f_code.co_consts:
            return True
        f, depth = f.f_back, depth + 1
    return False


class _LibraryFlow(flow.Flow):
    """Note [Library code that writes its state]: the walk of Note [Write targets], where what
    a call returns is fresh (a library's ``REGISTRY.get(self)`` or comprehension over it makes
    a new object), but for ``globals()``, an import, a frame and what ``getattr``, ``vars``,
    ``iter`` and the like hand back of their arguments."""

    def _call_result(self, k: int) -> tuple:
        parts = self.call_parts(k)
        if parts is None:
            return flow.FRESH
        callee, args, _ = parts
        try:
            if callee in flow._OUTSIDE_RESULT:
                return (flow._OUTSIDE_RESULT[callee], frozenset())
            if callee in flow._PASS_THROUGH:
                return flow._join(flow.FRESH, *args)
        except TypeError:  # an unhashable callee
            pass
        return flow.FRESH


class Watch:
    """Note [Library code that writes its state]: the recording's watch over the state writes
    of the library frames a trace runs (one per recording, on its thread). ``refuse(why)``
    raises (the recording's :meth:`EntryCheck.refuse`)."""

    def __init__(self, refuse):
        self.refuse = refuse
        self.thread = _thread.get_ident()
        self.codes: list = []  # code objects watched through sys.monitoring
        self.traced = False  # sys.settrace set by this watch (3.11)
        self.groups: dict = {}  # id -> the globals of each library module whose code ran
        self._held: dict = {}  # id of a module's globals -> ids of its values

    def enter(self, frame) -> None:
        """``frame`` (a scanned library frame, just started) writes state at the offsets it
        watches.

        Raises:
            TridentError: the frame cannot be watched and its code holds such a write."""
        code = frame.f_code
        self.groups.setdefault(id(frame.f_globals), frame.f_globals)
        try:
            state, params = state_writes(code, frame.f_globals)
        except Exception as e:  # (bytecode the walk does not know: not assumed to write none)
            self.refuse(f"library code the function runs ({code.co_qualname}) has bytecode "
                        f"Trident cannot read for writes ({type(e).__name__}: {e})")
        offsets = {o: t for o, t in state.items() if not _fresh_cell(frame, t)}
        if params:
            local = frame.f_locals
            for name, where in params.items():
                value = local.get(name)
                if value is not None and not flow.immutable(value) and not isinstance(
                        value, (torch.Tensor, types.ModuleType)) and self._global(value):
                    offsets.update((o, f"{t}: {name} is a library module's global")
                                   for o, t in where.items())
        if offsets and not self._watch(frame, offsets):
            self.refuse(self._why(code, next(iter(offsets.values()))))

    def _global(self, value) -> bool:
        for g in self.groups.values():
            held = self._held.get(id(g))
            if held is None:
                held = self._held[id(g)] = {id(v) for v in list(g.values())}
            if id(value) in held:
                return True
        return False

    @staticmethod
    def _why(code, text: str) -> str:
        return (f"library code the function runs writes its own state: {text} in "
                f"{code.co_qualname}; eager writes it at every call, a hit would not")

    def _watch(self, frame, offsets: dict) -> bool:
        code = frame.f_code
        if _TOOL is not None:  # Python 3.12+
            tool = _tool()
            if tool is None:
                return False
            _WATCHED.setdefault(code, {})[self.thread] = (offsets, self)
            if code not in self.codes:
                self.codes.append(code)
            sys.monitoring.set_local_events(tool, code, sys.monitoring.events.INSTRUCTION)
            return True
        current = sys.gettrace()
        if current is not None and current is not _no_trace:
            return False  # (a debugger's or coverage's trace function)
        if current is None:
            sys.settrace(_no_trace)
            self.traced = True

        def opcode(f, event, _arg):
            if event == "opcode" and f.f_lasti in offsets:
                self.refuse(self._why(f.f_code, offsets[f.f_lasti]))
            return opcode

        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        frame.f_trace = opcode
        return True

    def close(self) -> None:
        """Stop watching (the recording ends)."""
        if self.traced and sys.gettrace() is _no_trace:
            sys.settrace(None)
        for code in self.codes:
            per = _WATCHED.get(code, {})
            per.pop(self.thread, None)
            if not per:
                _WATCHED.pop(code, None)
                sys.monitoring.set_local_events(_tool(), code, 0)
        self.codes.clear()


def _no_trace(_frame, _event, _arg):
    return None  # (no frame is traced but those a watch sets)


_TOOL = getattr(sys, "monitoring", None)
_WATCHED: dict = {}  # code -> {thread id: (offsets, its Watch)}
_TOOL_ID: list = []  # the tool id taken, once per process


def _tool():
    """A sys.monitoring tool id of Trident's own (taken once), or None where none is free."""
    if not _TOOL_ID:
        mon = sys.monitoring
        free = next((t for t in (4, 3) if mon.get_tool(t) is None), None)
        if free is not None:
            mon.use_tool_id(free, "trident")
            mon.register_callback(free, mon.events.INSTRUCTION, _instruction)
        _TOOL_ID.append(free)
    return _TOOL_ID[0]


def _instruction(code, offset):
    per = _WATCHED.get(code)
    if per:
        found = per.get(_thread.get_ident())
        if found is not None and offset in found[0]:
            watch = found[1]
            watch.refuse(watch._why(code, found[0][offset]))
    return None
