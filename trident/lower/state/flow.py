"""Where a value on a code object's stack comes from (Note [Write targets]): the walk-back that
decides whether a write lands outside the function's frame and arguments.

Note [Write targets]: a hit runs no Python, so a write the trace made to state outside the
call's arguments would not be made again (writes to the arguments are seen by the argument
tree, capture.py). Which writes land outside is decided from the bytecode, soundly: each
mutation (``STORE_ATTR``, ``STORE_SUBSCR``, ``STORE_SLICE``, their ``DELETE_`` twins, a
mutating method such as ``append`` or ``update``, ``setattr``, a helper that writes its
parameter) has a **target**, the object it changes, and the target's **origin** is found by
walking back over the instructions that put it on the stack (``dis.stack_effect``; every
predecessor at a jump target, ``COPY`` and ``SWAP`` followed). An origin is

* fresh: made in the frame (a literal, ``[]``, a call of a library function or class,
  ``a + b``), or an immutable value (a number, a string, a tuple of them, a dtype);
* a parameter's, or derived from one (``self.items``, ``cfg["k"]``, ``x.view(2)``);
* outside: a global, a closure variable, an import, ``globals()``, or derived from one
  (``L[0]``, ``OBJ.__dict__``, ``for l in (L,)``, a local bound to one anywhere in the code,
  a user helper's result that is one), or anything the walk cannot follow.

A value derived from several (``[L]``, ``l = L if c else D``, a call's result) has the
origins of all its inputs: what the walk does not know is outside, never fresh. A call passes
its arguments' origins to a user function's parameters: a helper that writes a parameter
(``def push(lst, v): lst.append(v)``) called with an outside object writes outside (through a
``functools.partial``: Note [Writes through wrappers] in wrappers.py). CPython 3.11-3.13."""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import types
from typing import Any

import torch

from trident import frames
from trident.lower.state import wrappers
from trident.lower.state.wrappers import (  # (what a call writes and returns: there)
    _UNKNOWN, FRESH, MUTATORS, _join, _shared_result, _user_function)

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device,
              torch.memory_format, torch.layout, range, type(Ellipsis))
# Library functions whose result holds what their arguments hold (an attribute, an item, an
# element): their result has their arguments' origins.
_PASS_THROUGH = frozenset({getattr, vars, iter, next, reversed, min, max, sorted, filter, map,
                           zip, enumerate, list, tuple, set, frozenset, dict,
                           types.MappingProxyType})
_HELD = frozenset({"BINARY_SUBSCR", "LOAD_ATTR", "LOAD_GLOBAL", "LOAD_DEREF"})  # read from state
_OUTSIDE_RESULT = {globals: "globals()", __import__: "an imported module",
                   __import__("importlib").import_module: "an imported module",
                   __import__("sys")._getframe: "a frame"}
_OUTSIDE_LOADS = frozenset({"LOAD_NAME", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_GLOBALS",
                            "LOAD_FROM_DICT_OR_DEREF", "IMPORT_NAME", "IMPORT_FROM"})
_NO_PUSH = ("STORE_", "DELETE_", "POP_JUMP", "JUMP", "RETURN_", "RAISE_", "RERAISE", "POP_TOP",
            "NOP", "RESUME", "KW_NAMES", "EXTENDED_ARG", "SETUP_", "POP_BLOCK", "POP_EXCEPT",
            "LIST_APPEND", "LIST_EXTEND", "SET_ADD", "SET_UPDATE", "MAP_ADD", "DICT_UPDATE",
            "DICT_MERGE", "COPY_FREE_VARS", "MAKE_CELL", "PRINT_EXPR", "END_FOR",
            "IMPORT_STAR", "CACHE", "PRECALL", "END_SEND", "INSTRUMENTED_", "ENTER_EXECUTOR",
            "CHECK_EG_MATCH_NO", "SET_FUNCTION_ATTRIBUTE_NO")
_POPS = {"LOAD_ATTR": 1, "LOAD_METHOD": 1, "LOAD_GLOBAL": 0, "LOAD_SUPER_ATTR": 3,
         "UNPACK_SEQUENCE": 1, "UNPACK_EX": 1, "BEFORE_WITH": 1, "FOR_ITER": 0}
_UNCONDITIONAL = ("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP",
                  "JUMP_NO_INTERRUPT", "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS",
                  "RERAISE", "JUMP_ABSOLUTE")


def immutable(value) -> bool:
    """A value no write can change (a number, a string, a dtype, a tuple of them)."""
    if isinstance(value, (tuple, frozenset)):
        return all(immutable(v) for v in value)
    return isinstance(value, _IMMUTABLE) and not isinstance(value, torch.Tensor)


def _static_attr(obj, name):
    """``obj.name`` when no Python code serves it: a module's or a class's own dict, an
    object's ``__dict__`` or a method of its class (bound to it)."""
    try:
        if isinstance(obj, types.ModuleType):
            return vars(obj).get(name, _UNKNOWN)
        if isinstance(obj, type):
            for klass in obj.__mro__:
                if name in vars(klass):
                    return vars(klass)[name]
            return _UNKNOWN
        own = getattr(obj, "__dict__", None)
        if isinstance(own, dict) and name in own:
            return own[name]
        for klass in type(obj).__mro__:
            if name in vars(klass):
                found = vars(klass)[name]
                if isinstance(found, types.FunctionType):
                    return types.MethodType(found, obj)
                return _UNKNOWN
    except Exception:  # a __getattr__ that raises what it likes
        pass
    return _UNKNOWN


_NO_INSTRUCTION = ("CACHE", "PRECALL")  # dis's entries that are no instruction

class Flow:
    """The origins of the values on ``code``'s stack (Note [Write targets]). ``g``: its globals;
    ``fn``: its function, when known (its defaults, closure cells); ``values``: its
    parameters' values, when known (a call's arguments: ``h.helper(L)`` names a method)."""

    def __init__(self, code: types.CodeType, g: dict, fn=None, depth: int = 0,
                 values: dict | None = None, cells: dict | None = None):
        self.code, self.g, self.fn, self.depth = code, g, fn, depth
        self.values = values or {}
        self.cells = cells or {}  # a nested code's free variable: the origin its maker bound
        self.ins = [i for i in dis.get_instructions(code) if i.opname not in _NO_INSTRUCTION]
        self.at = {i.offset: k for k, i in enumerate(self.ins)}
        self.params = set(frames.parameter_names(code))
        self.preds: dict = {}  # index -> [(index, taken)] of the jumps into it
        for k, i in enumerate(self.ins):
            if i.opcode in dis.hasjrel or i.opcode in dis.hasjabs:
                t = self.at.get(i.argval)
                if t is not None:
                    self.preds.setdefault(t, []).append(k)
        self.handlers = {self.at.get(entry.target) for entry in getattr(
            dis, "_parse_exception_table", lambda c: [])(code)}
        self._locals: dict | None = None
        self._uses: dict | None = None  # (index, slot) -> its consumers (``consumers``)
        self._blind = False  # a value popped whose producers the walk cannot follow
        self._busy: set = set()  # locals whose static value is being found

    # -- the walk back ---------------------------------------------------------------------
    def effect(self, k: int, taken: bool = False) -> tuple[int, int]:
        """(pops, pushes) of ``ins[k]``, its jump taken or not."""
        i = self.ins[k]
        try:
            net = dis.stack_effect(i.opcode, i.arg if i.opcode >= dis.HAVE_ARGUMENT else None,
                                   jump=taken)
        except ValueError:
            return 0, 0
        if i.opname == "CALL":  # (3.11 counts part of it on the PRECALL before it)
            return i.arg + 2, 1
        if i.opname in _POPS and net + _POPS[i.opname] >= 0:
            return _POPS[i.opname], net + _POPS[i.opname]
        pushes = 0 if i.opname.startswith(_NO_PUSH) else 1
        if net > pushes:
            pushes = net
        if pushes - net < 0 or (i.opname in _POPS and net < 0):
            return -net, 0
        return pushes - net, pushes

    def producers(self, j: int, d: int, seen=None) -> list | None:
        """The (index, slot) of each instruction that may have pushed the value at depth ``d``
        (0: the top) of the stack just before ``ins[j]``; slot 0 is the last value it pushed.
        None: a path the walk cannot follow (an exception handler, the code's start)."""
        seen = set() if seen is None else seen
        found: list = []
        todo = [(j, d)]
        while todo:
            j, d = todo.pop()
            if (j, d) in seen:
                continue
            seen.add((j, d))
            if j in self.handlers or j == 0:
                return None
            for p in self.preds.get(j, ()):  # jumps into ins[j]
                pops, pushes = self.effect(p, taken=True)
                if d < pushes:
                    found.append((p, d))
                else:
                    todo.append((p, d - pushes + pops))
            k = j - 1
            if self.ins[k].opname in _UNCONDITIONAL:
                continue  # reached only by the jumps above
            i = self.ins[k]
            if i.opname == "COPY":
                todo.append((k, i.arg - 1 if d == 0 else d - 1))
                continue
            if i.opname == "SWAP":
                todo.append((k, i.arg - 1 if d == 0 else 0 if d == i.arg - 1 else d))
                continue
            pops, pushes = self.effect(k)
            if d < pushes:
                found.append((k, d))
            else:
                todo.append((k, d - pushes + pops))
        return found

    def consumers(self, k: int, slot: int = 0) -> list | None:
        """The ``(index, depth, alone)`` of each instruction that may pop the value that
        ``ins[k]`` pushed at ``slot`` (0: its last), ``alone`` where no other instruction may
        have pushed it there; None where some value popped in the code has producers the walk
        cannot follow. The table is made once per code, in one pass over its pops."""
        if self._uses is None:
            self._uses = {}
            for j in range(len(self.ins)):
                for d in range(self.effect(j)[0]):
                    found = self.producers(j, d)
                    if found is None:
                        self._blind = True
                        continue
                    for p in found:
                        self._uses.setdefault(p, []).append((j, d, len(found) == 1))
        return None if self._blind else self._uses.get((k, slot), [])

    # -- origins ---------------------------------------------------------------------------
    def origin(self, j: int, d: int) -> tuple:
        """The origin (Note [Write targets]) of the value at depth ``d`` before ``ins[j]``:
        ``(why it is outside or None, the parameters it derives from)``."""
        found = self.producers(j, d)
        if found is None:
            return ("a value Trident does not follow", frozenset())
        return _join(FRESH, *(self._origin_of(k, slot) for k, slot in found))

    def _inputs(self, k: int) -> tuple:
        pops, _ = self.effect(k)
        return _join(FRESH, *(self.origin(k, d) for d in range(pops)))

    def static(self, j: int, d: int):
        """The value at depth ``d`` before ``ins[j]`` when the code alone says it (a global,
        a module's or a class's attribute), else ``_UNKNOWN``."""
        found = self.producers(j, d)
        if not found or len(found) != 1:
            return _UNKNOWN
        k, slot = found[0]
        i = self.ins[k]
        if i.opname == "LOAD_GLOBAL" and slot == 0:
            name = i.argval
            return self.g[name] if name in self.g else vars(builtins).get(name, _UNKNOWN)
        if i.opname == "LOAD_CONST":
            return i.argval
        if i.opname == "CALL" and slot == 0:  # get_gen(): what a user function always returns
            return self._static_result(k)
        if i.opname in ("LOAD_FAST", "LOAD_FAST_CHECK") and i.argval in self.values:
            return self.values[i.argval]
        if i.opname in ("LOAD_FAST", "LOAD_FAST_CHECK") and i.argval not in self.params and \
                i.argval not in self._busy:
            stores = self._fast_stores.get(i.argval, ())
            if len(stores) == 1:  # lst = list.append
                self._busy.add(i.argval)
                try:
                    return self.static(stores[0], 0)
                finally:
                    self._busy.discard(i.argval)
        if i.opname == "LOAD_DEREF" and i.argval in self.code.co_freevars and self.fn:
            try:
                return self.fn.__closure__[self.code.co_freevars.index(i.argval)].cell_contents
            except (ValueError, IndexError, TypeError):
                return _UNKNOWN
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and (slot == 0 or self.effect(k)[1] == 2):
            base = self.static(k, 0)
            return _UNKNOWN if base is _UNKNOWN else _static_attr(base, i.argval)
        if i.opname == "BINARY_SUBSCR":  # GENS[0]: an item of a list, tuple or dict
            base, key = self.static(k, 1), self.static(k, 0)
            try:
                return base[key] if type(base) in (list, tuple, dict) and immutable(key) else \
                    _UNKNOWN
            except (KeyError, IndexError, TypeError):
                pass
        return _UNKNOWN

    @functools.cached_property
    def _fast_stores(self) -> dict:
        """{local name: the indices of its ``STORE_FAST`` instructions}: ``static`` asks at each
        of a local's loads (a torch.compile graph's generated forward has thousands)."""
        stores: dict = {}
        for k, o in enumerate(self.ins):
            if o.opname == "STORE_FAST":
                stores.setdefault(o.argval, []).append(k)
        return stores

    def _origin_of(self, k: int, slot: int) -> tuple:
        i, op = self.ins[k], self.ins[k].opname
        if op in ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD") and immutable(
                self.static(k + 1, slot)):
            return FRESH
        if op == "LOAD_GLOBAL":
            if i.argval not in self.g and i.argval in vars(builtins):
                return FRESH  # list, setattr: a builtin is not written through
            return (f"global {i.argval}", frozenset())
        if op in _OUTSIDE_LOADS:
            return (f"{i.argval}", frozenset())
        if op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_DEREF",
                  "LOAD_FAST_LOAD_FAST"):
            name = i.argval[slot ^ 1] if isinstance(i.argval, tuple) else i.argval
            if op == "LOAD_DEREF" and name in self.code.co_freevars:
                return self.cells.get(name, (f"closure variable {name}", frozenset()))
            return self._local(name)
        if op in ("LOAD_CONST", "LOAD_CLOSURE", "MAKE_FUNCTION", "BUILD_STRING",
                  "FORMAT_VALUE", "COMPARE_OP", "IS_OP", "CONTAINS_OP", "UNARY_NOT",
                  "UNARY_NEGATIVE", "UNARY_INVERT", "GET_LEN", "BUILD_SLICE", "PUSH_NULL",
                  "LOAD_ASSERTION_ERROR", "LOAD_BUILD_CLASS", "CONVERT_VALUE", "FORMAT_SIMPLE",
                  "FORMAT_WITH_SPEC", "TO_BOOL", "RETURN_GENERATOR"):
            return FRESH
        if op == "BINARY_OP":
            if i.argrepr.endswith("=") and i.argrepr not in ("==", "!=", "<=", ">="):
                return self.origin(k, 1)  # l += [v] is l itself
            return FRESH
        if op in ("CALL", "CALL_KW", "CALL_FUNCTION_EX"):
            return self._call_result(k)
        if op.startswith("FOR_ITER"):
            return self.origin(k, 0)  # an element of what the iterator iterates
        return self._inputs(k)  # an attribute, an item, an element: what its inputs hold

    def _local(self, name: str) -> tuple:
        """The join of every value ``name`` is bound to in the code (a parameter: also what
        the call passed), computed for all locals at once, to a fixed point (a loop binds
        one local from another)."""
        if self._locals is None:
            table = self._locals = {}
            stores = []
            for k, i in enumerate(self.ins):
                names = i.argval if isinstance(i.argval, tuple) else (i.argval,)
                if i.opname in ("STORE_FAST", "STORE_DEREF", "STORE_FAST_STORE_FAST",
                                "STORE_FAST_LOAD_FAST"):
                    for slot, n in enumerate(names[:1] if i.opname ==
                                             "STORE_FAST_LOAD_FAST" else names):
                        stores.append((k, n, slot))
            for n in set(self.code.co_varnames) | set(self.code.co_cellvars):
                table[n] = self._parameter(n) if n in self.params else FRESH
            for _ in range(2 * len(table) + 2):
                changed = False
                for k, n, slot in stores:
                    new = _join(table.get(n, FRESH), self.origin(k, slot))
                    if new != table.get(n):
                        table[n], changed = new, True
                if not changed:
                    break
            else:  # (each round adds to a local's origin: this is not reached)
                table.update((n, ("a local Trident does not follow", frozenset()))
                             for n in table)
        return self._locals.get(name, FRESH)

    def _parameter(self, name: str) -> tuple:
        out = (None, frozenset({name}))
        f = self.fn
        if isinstance(f, types.FunctionType):
            default = inspect.signature(f).parameters.get(name)
            if default is not None and default.default is not inspect.Parameter.empty and \
                    not immutable(default.default):
                out = (f"the default of {name}", out[1])  # def f(x, acc=[])
        return out

    def call_parts(self, k: int) -> tuple[Any, list[tuple], list[int]] | None:
        """(the callee's static value, the origins of its ``self`` and arguments, their
        depths) of the ``CALL`` at ``ins[k]``, or None for another kind of call."""
        i = self.ins[k]
        if i.opname == "CALL_FUNCTION_EX":  # f(*args, **kwargs)
            n = 1 + (i.arg & 1)
            return self.static(k, n), [self.origin(k, d) for d in range(n)], list(range(n))
        if i.opname != "CALL":
            return None
        argc = i.arg
        upper, lower = self.static(k, argc + 1), self.static(k, argc)
        callee = upper if upper is not _UNKNOWN and upper is not None else lower
        depths = list(range(argc))
        if callee is upper and upper is not _UNKNOWN:
            depths.append(argc)  # a method's self
        return callee, [self.origin(k, d) for d in depths], depths

    def _static_result(self, k: int):
        """The object the user function called at ``ins[k]`` returns on every path when its
        code alone says so (``return GEN``, ``return BOX.it``), else ``_UNKNOWN``: an iterator
        it hands out is advanced where it is consumed (Note [Write targets])."""
        parts = self.call_parts(k)
        user = _user_function(parts[0]) if parts is not None else None
        inner = Flow(user.__code__, user.__globals__, user, self.depth + 1) \
            if user is not None and self.depth < 4 else None
        values = {id(v): v for v in (inner.static(r, 0) for r, o in enumerate(inner.ins)
                                     if o.opname == "RETURN_VALUE")} if inner else {}
        return next(iter(values.values())) if len(values) == 1 else _UNKNOWN

    def _call_result(self, k: int) -> tuple:
        parts = self.call_parts(k)
        if parts is None:
            return self._inputs(k)
        callee, args, _ = parts
        if callee in _OUTSIDE_RESULT:
            return (_OUTSIDE_RESULT[callee], frozenset())
        try:
            if callee in _PASS_THROUGH:
                return _join(FRESH, *args)
        except TypeError:  # an unhashable callee
            pass
        user = _user_function(callee)
        if user is not None and self.depth < 4:
            inner = Flow(user.__code__, user.__globals__, user, self.depth + 1)
            returned = inner.returns()
            if returned[0] is not None:
                return returned
            return _join(FRESH, *args) if returned[1] else FRESH
        if user is None and callee is not _UNKNOWN and callable(callee) and \
                isinstance(getattr(callee, "__self__", None), (types.ModuleType, type(None))):
            shared = _shared_result(callee)  # Note [Library results] (wrappers.py)
            return (shared, frozenset()) if shared else FRESH  # a class: a new object
        return self._inputs(k)

    def returns(self) -> tuple:
        """The join of what ``code`` returns."""
        out = FRESH
        for k, i in enumerate(self.ins):
            if i.opname == "RETURN_VALUE":
                out = _join(out, self.origin(k, 0))
        return out

    # -- writes ----------------------------------------------------------------------------
    def writes(self):
        """(index, what, origin) for each write of ``code``: its target's origin."""
        for k, i in enumerate(self.ins):
            op = i.opname
            if op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                yield k, f"global {i.argval}", (f"global {i.argval}", frozenset())
            elif op in ("STORE_DEREF", "DELETE_DEREF") and i.argval in self.code.co_freevars \
                    and i.argval not in self.cells:
                yield k, f"closure variable {i.argval}", (f"closure variable {i.argval}",
                                                          frozenset())
            elif op in ("STORE_ATTR", "DELETE_ATTR"):
                yield k, f"attribute {i.argval}", self.origin(k, 0)
            elif op in ("STORE_SUBSCR", "DELETE_SUBSCR"):
                yield k, "an item", self.origin(k, 1)
            elif op in ("STORE_SLICE", "DELETE_SLICE"):
                yield k, "a slice", self.origin(k, 2)
            elif op == "BINARY_OP" and i.argrepr.endswith("=") and \
                    i.argrepr not in ("==", "!=", "<=", ">="):
                yield k, f"{i.argrepr}", self.origin(k, 1)  # a list's += extends it
            elif op in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in MUTATORS:
                if not isinstance(self.static(k, 0), (type, types.ModuleType)):  # torch.add
                    yield k, f".{i.argval}()", self.origin(k, 0)
            elif op == "GET_ITER" and _iterator(self.static(k, 0)):
                yield k, "an iterator", self.origin(k, 0)  # for v in GEN: it advances
            elif op in ("CALL", "CALL_FUNCTION_EX"):
                callee, args, depths = self.call_parts(k)
                star = op == "CALL_FUNCTION_EX"
                for n, (d, origin) in enumerate(zip(depths, args)):  # next(GEN), list(GEN):
                    if origin[0] is not None and (_iterator(self.static(k, d)) or (
                            n == 0 and callee is next and not star and all(  # next(GENS[i])
                                self.ins[p].opname in _HELD for p, _ in self.producers(k, d)))):
                        yield k, "an iterator", origin  # it advances
                written = wrappers.call_write(self, k, callee, args, depths)  # a mutating
                if written is not None:  # function or method's, or a wrapper's of one
                    yield k, *written
                    continue
                user = _user_function(callee)
                if user is not None and self.depth < 4 and any(a[0] or a[1] for a in args):
                    written = Flow(user.__code__, user.__globals__, user,
                                   self.depth + 1).written_parameters()
                    passed = None if star else self._passed(k, user, callee, args)
                    hit = [o for name, o in passed.items() if name in written] if \
                        passed is not None else ([_join(FRESH, *args)] if written else [])
                    if hit:
                        yield k, f"{user.__qualname__}(), which writes its arguments", \
                            _join(FRESH, *hit)

    def written_parameters(self) -> frozenset:
        """The parameters whose objects ``code`` writes (itself or through a helper)."""
        return frozenset().union(*(origin[1] for _, _, origin in self.writes()))

    def _passed(self, k: int, user, callee, args: list) -> dict | None:
        """{parameter name: origin} of the positional call at ``ins[k]`` of ``user``, or
        None for one with keywords or ``*args`` (every argument may reach every parameter)."""
        if k > 0 and self.ins[k - 1].opname == "KW_NAMES":
            return None
        argc = self.ins[k].arg
        positional = [args[d] for d in range(argc - 1, -1, -1)]
        if isinstance(callee, types.MethodType) or user is not getattr(callee, "__func__",
                                                                        callee):
            positional.insert(0, args[argc] if len(args) > argc else self.origin(k, argc))
        code = user.__code__
        if len(positional) > code.co_argcount:
            return None
        return dict(zip(code.co_varnames, positional))


def _iterator(value) -> bool:
    """An iterator (a generator, an ``itertools`` object, a file): reading it advances it."""
    return value is not _UNKNOWN and hasattr(type(value), "__next__") and \
        not isinstance(value, torch.Tensor)
