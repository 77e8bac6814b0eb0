"""Library code that ran in a trace (Note [Library code that ran]): which frames count, and the
global and module-attribute loads of their code, guarded by identity or by value."""

from __future__ import annotations

import dis
import enum
import functools
import gc
import logging
import signal
import sys
import threading
import types

from trident.ir.trees import _CONSTS
from trident.lower.state.chain import _MISSING, _STOP, Read, _globals_root, _plain_object, _step

# Note [Library code that ran]: a library's code reads its own module state too: nn.LayerNorm's
# forward reads ``F.layer_norm`` in ``torch.nn.modules.normalization``'s globals, Llama's
# attention reads ``apply_rotary_pos_emb`` in ``modeling_llama``'s. Users and kernel libraries
# rebind exactly those names (``F.layer_norm = ...``, ``mock.patch("torch.nn.functional.linear",
# ...)``, liger-kernel's ``apply_liger_kernel_to_llama()``), so what the trace ran is no longer
# what eager runs. Dynamo inlines such code and guards the globals it reads; so does this:
#
# * Which frames. The recording (recording.py) keeps each library frame that the function's
#   own code called, directly or through frames kept so (a forward that ``Module.__call__``
#   called, the helpers it calls): **inlined** frames. A frame of the tracing machinery is not
#   one, nor anything below it: Trident's own (its ``TorchFunctionMode``, through which every
#   torch op of the trace goes), a ``__torch_function__`` or ``__torch_dispatch__``, torch's
#   other internals (the dispatcher's Python, fake tensors, FX, decompositions: as Dynamo's
#   skipfiles, taken as fixed), Triton's, sympy's, numpy's, a module's body run by an import,
#   nor code the interpreter runs between the function's instructions (a gc callback, a
#   finalizer the collector runs, a signal handler: Note [Interrupts] in recording.py).
#   torch's modules whose code Dynamo inlines are scanned (``torch.nn``, ``torch.functional``,
#   ``torch._tensor``), and ``torch.backends``, whose Python getters serve settings from their
#   module's globals (``torch.backends.mha.get_fastpath_enabled()``, which the function or
#   ``nn.MultiheadAttention`` calls, returns ``_is_fastpath_enabled``: a library value); the
#   standard library's frames and torch's decorators (``no_grad``, ``autograd.Function.
#   apply``) pass the inlining on without being scanned themselves (``contextlib`` entering a
#   library's context manager, ``functools``); any other installed package's frame is
#   scanned.
# * Which reads. Each ``LOAD_GLOBAL`` of a scanned code object, followed by the attribute loads
#   after it while the value is a plain module (``F.layer_norm``, ``torch.nn.functional.
#   linear``, ``torch._C._nn.linear``), is a read of its module's globals up to the longest
#   prefix whose value is a function, a builtin function, a class or a module, checked by
#   identity (Note [Library state] in library_steps.py), or an immutable value, checked by value (Note
#   [Library values]). Every instruction of a code object that ran counts, taken or not. A
#   value of another kind (a dict, a list, a logger, an object) is not guarded: it is library
#   state taken as fixed (Note [Library values]; docs/design.md, Not guarded).
# * What a hit pays. Those reads are lookups in a module's dict by a constant name: each node
#   is proven by its module dict's version tag (Note [Quiet state] in runtime/state_memo.cpp),
#   and on Python 3.12 a watched dict costs nothing until it changes (Note [Watched state]); a
#   hit checks per module its exact type, not per read.
# * What it writes of its own state: Note [Library code that writes its state] (library_writes.py).

# torch's modules whose code is scanned (as Dynamo inlines them), and those that pass the
# inlining on without being scanned (decorators and autograd's Function.apply).
_TORCH_SCANNED = ("torch.nn", "torch.functional", "torch._tensor", "torch.backends")
_TORCH_PASSED = frozenset({"torch.utils._contextlib", "torch.autograd.grad_mode",
                           "torch.autograd.function", "torch.amp.autocast_mode"})
# make_fx's tracer patches ``nn.Module.__call__`` for the trace: its wrapper's frames stand
# between the function's code and the module's ``_wrapped_call_impl``, and pass the inlining on.
_TRACER_CALLS = {"torch.fx._symbolic_trace": ("module_call_wrapper", ".call_module"),
                 "torch.fx.experimental.proxy_tensor": (".call_module",)}
_BLOCKED_PACKAGES = frozenset({"trident", "torch", "triton", "torch_mlir", "sympy", "numpy",
                               "functorch", "jinja2", "cffi", "_pytest", "pytest", "pluggy"})
_BLOCKED_CODES = frozenset({"__torch_function__", "__torch_dispatch__", "<module>"})


def library_kind(frame, scanned: int, passed: int) -> int:
    """Note [Library code that ran]: ``scanned``, ``passed`` or 0 for a library frame (not user
    code), decided by its module's name (code the interpreter runs between the function's
    instructions is neither: Note [Interrupts] in recording.py)."""
    if frame.f_code.co_name in _BLOCKED_CODES:
        return 0
    name = frame.f_globals.get("__name__")
    if not isinstance(name, str):
        return 0
    top = name.partition(".")[0]
    if top == "torch":
        if name in _TORCH_PASSED or (name in _TRACER_CALLS and any(
                n in frame.f_code.co_qualname for n in _TRACER_CALLS[name])):
            return passed
        return scanned if any(name == m or name.startswith(m + ".") for m in _TORCH_SCANNED) \
            else 0
    if top in _BLOCKED_PACKAGES:
        return 0
    if top in sys.stdlib_module_names:
        return passed
    return scanned


def _code_of(handler):
    """The code object a handler (a gc callback, a signal handler) runs first: a function's, a
    bound method's, a ``functools.partial``'s function's, a callable object's ``__call__``'s;
    None where another."""
    for _ in range(4):
        if isinstance(handler, functools.partial):
            handler = handler.func
        elif isinstance(handler, types.MethodType):
            handler = handler.__func__
        elif isinstance(handler, types.FunctionType):
            return handler.__code__
        elif not isinstance(handler, type) and isinstance(
                getattr(type(handler), "__call__", None), types.FunctionType):
            handler = type(handler).__call__
        else:
            return None
    return None


def handler_codes() -> frozenset:
    """Note [Interrupts] in recording.py: the ids of the code objects of the Python signal
    handlers set now (the signal module holds them: no id is reused meanwhile)."""
    out = set()
    for number in signal.valid_signals():
        try:
            code = _code_of(signal.getsignal(number))
        except (ValueError, OSError):  # (a number the platform does not know)
            continue
        if code is not None:
            out.add(id(code))
    return frozenset(out)


def interrupt_code(code, handlers: frozenset) -> bool:
    """Note [Interrupts] in recording.py: whether ``code`` is a gc callback's or a signal
    handler's (``handlers``: ``handler_codes()``)."""
    return id(code) in handlers or any(_code_of(cb) is code for cb in gc.callbacks)


_LOADS: dict = {}  # id of a code object -> (the code, its loads): kept alive, no id reused
_MAX_LOADS = 65536


def _global_loads(code: types.CodeType) -> tuple:
    """(global name, the attribute names loaded right after it) per ``LOAD_GLOBAL`` of
    ``code``."""
    found = _LOADS.get(id(code))
    if found is not None and found[0] is code:
        return found[1]
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL",
                                                                     "EXTENDED_ARG")]
    out: dict = {}
    for k, i in enumerate(ins):
        if i.opname != "LOAD_GLOBAL" or not isinstance(i.argval, str):
            continue
        attrs, j = [], k + 1
        while j < len(ins) and ins[j].opname in ("LOAD_ATTR", "LOAD_METHOD") and \
                isinstance(ins[j].argval, str):
            attrs.append(ins[j].argval)
            j += 1
        out[(i.argval, tuple(attrs))] = None
    if len(_LOADS) >= _MAX_LOADS:
        _LOADS.clear()
    result = tuple(out)
    _LOADS[id(code)] = (code, result)
    return result


def _guarded(value) -> bool:
    """A value a library's load is guarded for: its code or class by identity (not its
    state), or an immutable value by value (``by_value``)."""
    if isinstance(value, types.BuiltinFunctionType):
        return value.__self__ is None or isinstance(value.__self__, types.ModuleType)
    return isinstance(value, (types.FunctionType, type, types.ModuleType)) or by_value(value)


# Note [Library values]: a library's code branches on its own module's numbers, flags and
# strings as much as on its functions (transformers' ``_is_torch_greater_or_equal_than_2_8``
# in sdpa_attention_forward, a package's ``USE_FAST_PATH = True``), and users and kernel
# libraries set them (``mod.USE_FAST_PATH = False``). As Dynamo does when it inlines library
# code (a global of a constant kind becomes a constant with a guard on its value), a load by a
# scanned frame (Note [Library code that ran]) of a global, or of a module attribute chain's
# end, whose value is of an immutable kind (``by_value``) is guarded by value: None, bools,
# ints, strs and bytes by exact type and value, floats and complex numbers by bit pattern
# (NaN, -0.0: const_equal in runtime/trees.cpp), torch's devices, sizes and ranges by value,
# its dtypes, layouts and memory formats by identity (one object per value), an enum member by
# identity, a tuple of those item by item (Note [Library state] in library_steps.py), a frozenset of str
# by identity (rebound to an equal one, the state tree made again names it by the same words,
# its repr: the same specialization, no miss). Proven by the module's dict tag like the
# functions (Note [Quiet state]): no check of its own on a hit, but for a device, a size, a
# range, and a dtype or frozenset inside a tuple, compared at each call.
#
# What is left as fixed, by kind (measured: the reads of a tiny Llama, Qwen2, Mistral and
# Gemma2 ``generate`` with static and dynamic caches, transformers 5.25; their immutable values
# are transformers' availability and version flags and ``torch.bool``/``torch.float32``, none
# of which changes between calls):
#   - loggers (``logger.warning_once``, ``LOG.isEnabledFor``): a level is set outside any
#     model; what the function logs is the write analysis's (a logging call that runs makes the
#     call eager: Note [Logging calls] in writes.py); Dynamo does not guard a logger either;
#   - context variables (transformers' ``_active_collector``, kernels' ``_ACTIVE_KERNEL_FUNCS``):
#     set and reset by the call itself around its own code: the trace's own state;
#   - caches and registration sets that grow once (``_registered_model_output_types``, the
#     pytree registrations; warning-once caches): their effect is the same at every call;
#     a set of classes has no value check;
#   - registries (``ALL_ATTENTION_FUNCTIONS``, ``ALL_MASK_ATTENTION_FUNCTIONS``): read by a key
#     from the model's config, not a constant, and guarded where they can be by Note [Library
#     registries] in roots.py; torch's global hook dicts are guarded whole (Note [Library
#     state]);
#   - other dicts, lists and objects (a config object, a table): Dynamo guards the keys and the
#     items it reads, as it interprets each access; here a read through them needs the key of
#     each access, which the load pattern does not give (a key from an argument, a method
#     call), and a table written at every call (a memo, a counter dict) would lose the dict's
#     proof at every call. No scanned frame of the models above reads one by a constant key:
#     left in docs/design.md's Not guarded.
# A value that changes between calls (a counter that code outside the trace bumps, read by
# library code inside it) makes each new value a recompile, as a user global's does, up to
# the specialization limit, which counts per code object and owner across states (Note
# [Specialization limit] in frontend/policy.py), as Dynamo's recompile limit falls back to
# eager after 8. A flag that the trace sets and resets around
# its own code is read by the guard as after the trace, as the next call finds it.
_MAX_ITEMS = 64  # a library's tuple or frozenset guarded by value: at most this many items
_MAX_DEPTH = 4


def by_value(value, depth: int = 0) -> bool:
    """Note [Library values]: a value of an immutable kind, which a guard checks whole: None,
    a bool, int, float (by bit pattern), complex, str or bytes of exactly those types, a torch
    dtype, device, layout or memory format, a ``torch.Size``, a ``range``, an enum member, and
    a tuple of those or a frozenset of str of at most ``_MAX_ITEMS`` items."""
    t = type(value)
    if t in _CONSTS or isinstance(value, enum.Enum):
        return True
    if depth >= _MAX_DEPTH or t not in (tuple, frozenset) or len(value) > _MAX_ITEMS:
        return False
    if t is frozenset:  # (a set is compared with a copy: of str, whose equality is exact)
        return all(type(item) is str for item in value)
    return all(by_value(item, depth + 1) for item in value)


def library_reads(library: dict) -> list[Read]:
    """Note [Library code that ran]: a read per global or module attribute that the library
    code in ``library`` (id -> (code, globals), the recording's) loads and that is a function,
    a builtin, a class or a module, from its module's globals."""
    reads: dict = {}
    for code, g in library.values():
        if code.co_filename.startswith("<"):
            continue
        root, kind = _globals_root(g)
        if root[0] != "module":
            continue
        for name, attrs in _global_loads(code):
            value = g.get(name, _MISSING)
            if value is _MISSING or not _guarded(value):
                continue  # (a builtin, or state of the library's own taken as fixed)
            steps, last = [("attr", name)], 1
            for attr in attrs:
                if type(value) is not types.ModuleType:
                    break
                value = _step(value, ("attr", attr))
                if value is _MISSING or value is _STOP:
                    break
                steps.append(("attr", attr))
                if _guarded(value):
                    last = len(steps)
            key = (root, tuple(steps[:last]))
            if key not in reads:
                reads[key] = Read(root, key[1], False)
            if type(value) is not types.ModuleType and len(attrs) >= len(steps):
                for flag in _flag_steps(value, attrs[len(steps) - 1]):  # Note [Flags behind
                    flag = tuple(steps) + flag  # a PropModule]
                    reads.setdefault((root, flag), Read(root, flag, False))
        for name in _imports(code):  # Note [Flags behind a PropModule]
            module = sys.modules.get(name)
            for attr in code.co_names if type(module) is not types.ModuleType else ():
                for flag in _flag_steps(module, attr):
                    reads.setdefault((name, flag), Read(("module", name), flag, False))
    return list(reads.values())


# Note [Flags behind a PropModule]: torch.backends' flags modules replace themselves in
# ``sys.modules`` by a ``PropModule``, whose ``__getattr__`` serves what its own dict lacks
# from the module it wraps (its ``m``). ``torch.backends.opt_einsum`` keeps its flags there as
# plain globals (its class body's ``global enabled`` rebinds the module's name, not the
# class's: no ``ContextProp`` serves them, torch 2.11-2.13), and ``torch.backends.opt_einsum.
# enabled = x`` sets the PropModule's own dict. ``enabled`` and ``strategy`` pick
# ``torch.einsum``'s contraction order for three or more operands (so the values in the last
# bits), read through ``import torch.backends.opt_einsum as opt_einsum`` in einsum's body,
# below the trace's TorchFunctionMode, where no frame is scanned and no chain goes past a
# module that is not exactly ``ModuleType``: a flag set after a hit kept the trace's order
# (CPU machine, session 49). A scanned code object (Note [Library code that ran]) that loads
# such a flag through a global module chain, or imports such a module in its body and names
# the flag (every instruction counts, taken or not, as for its globals), is guarded by two
# reads of that module, as its ``__getattr__`` reads: its own dict's entry (absent, or by
# value) and ``m``'s global by value (Note [Library values]). A flag that C holds
# (``torch.backends.cudnn.enabled``) is a call-wide guard (Guards in docs/design.md).


def _flag_steps(module, attr: str) -> list:
    """The steps that read ``attr`` of ``module``, a PropModule whose wrapped module ``m``
    holds it by value, as its ``__getattr__`` does: the PropModule's own dict (where
    ``torch.backends.opt_einsum.enabled = x`` sets it), then ``m``'s globals; none for another
    module or name (a flag its class serves: Note [Library state] in tree.py)."""
    if not isinstance(module, types.ModuleType) or type(module) is types.ModuleType or any(
            attr in c.__dict__ for c in type(module).__mro__[:-2]):
        return []
    inner = module.__dict__.get("m")
    value = module.__dict__.get(attr, inner.__dict__.get(attr, _MISSING) if type(
        inner) is types.ModuleType else _MISSING)
    if value is _MISSING or not by_value(value):
        return []
    return [(("attr", "__dict__"), ("get", attr)), (("attr", "m"), ("attr", attr))]


_IMPORTS: dict = {}  # id of a code object -> (the code, its imports): as _LOADS


def _imports(code: types.CodeType) -> tuple:
    """The names of the modules that ``code`` imports (``IMPORT_NAME``)."""
    found = _IMPORTS.get(id(code))
    if found is not None and found[0] is code:
        return found[1]
    if len(_IMPORTS) >= _MAX_LOADS:
        _IMPORTS.clear()
    names = tuple({i.argval: None for i in dis.get_instructions(code)
                   if i.opname == "IMPORT_NAME" and isinstance(i.argval, str)})
    _IMPORTS[id(code)] = (code, names)
    return names


# Note [torch's Python state]: a function of torch's own Python that no frame scan reads (not
# ``torch.nn``, ``torch.functional``, ``torch._tensor``, ``torch.backends``) may return torch's
# Python state, held in a module global that is an object, not a value a guard checks:
# ``torch._tensor_str.get_printoptions()`` returns ``PRINT_OPTS``'s fields, which
# ``torch.set_printoptions`` sets; a hit returned the trace's answer (stale, CPU machine,
# session 49). Where the function's code or library code it runs (Note [Library code that
# ran]) calls such a torch function directly, and that function's code loads a global of its
# module that holds Python state (a dict, list or set, a plain object with a ``__dict__``
# other than a logger, a ``threading.local``: ``torch_state_read``), the call runs eagerly
# with one warning. Its settings held in C (``torch.is_warn_always_enabled()``, chain.py's
# ``_TORCH_GETTERS``) are guarded by value; the object read by user code
# (``torch._tensor_str.PRINT_OPTS.precision``) is read into (Note [Library objects read
# into] in chain.py). torch.distributed's registry of process groups (``distributed_c10d.
# _world``, which ``dist.group.WORLD`` reads) is no such state: the collectives' group is
# guarded by Note [Process group guard] (ir/guards.py), so that object is let through by what
# it is; any other state of torch.distributed's modules is not. Not seen: such state read by
# a torch function that the called one calls in turn, and a number, flag or string global
# that such a function returns (its code is not scanned: Note [Library values] does not guard
# it).
_STATE_KINDS = (dict, list, set, bytearray, threading.local)
_LOGGERS = (logging.Logger, logging.LoggerAdapter)  # a level is set outside any model (Note
# [Library values]): a SymInt's magic methods (torch.fx.experimental.sym_node) log
_STATE_READS: dict = {}  # id of a code object -> (the code, the global name or None)


def _process_groups():
    """torch.distributed's registry of process groups (``distributed_c10d._world``, torch
    2.11-2.13), or None where torch.distributed was not imported (Note [torch's Python
    state])."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    return getattr(c10d, "_world", None) if c10d is not None else None


def torch_state_read(code: types.CodeType, g: dict) -> str | None:
    """Note [torch's Python state]: the name of a global of ``g`` that ``code`` loads and that
    holds Python state (a dict, list, set, plain object, ``threading.local``), or None."""
    found = _STATE_READS.get(id(code))
    if found is not None and found[0] is code:
        return found[1]
    groups = _process_groups()
    name = next((n for n, _ in _global_loads(code) if n in g and g[n] is not groups and (
        isinstance(g[n], _STATE_KINDS) or _plain_object(g[n]) and
        not isinstance(g[n], _LOGGERS))), None)
    if len(_STATE_READS) >= _MAX_LOADS:
        _STATE_READS.clear()
    _STATE_READS[id(code)] = (code, name)
    return name
