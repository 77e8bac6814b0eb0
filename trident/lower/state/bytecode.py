"""The bytecode scan (Note [State guards]): the chains a code object's instructions read."""

from __future__ import annotations

import dis
import types
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from trident import frames
from trident.lower.state import flow, type_strings

_LOAD_FAST = ("LOAD_FAST", "LOAD_FAST_CHECK")


def _single_stores(code: types.CodeType, ins: list) -> set:
    """The locals (not parameters) that ``code`` binds exactly once: a local bound to a chain
    there is an alias of that chain wherever it is loaded (``log = LOG``, ``import mod``)."""
    params = frames.parameter_names(code)
    counts: dict = {}
    for i in ins:
        if i.opname in ("STORE_FAST", "DELETE_FAST"):
            counts[i.argval] = counts.get(i.argval, 0) + 1
    return {n for n, c in counts.items() if c == 1 and n not in params}


def _chains(code: types.CodeType) -> list[tuple[str, Any, tuple]]:
    """(start kind, name, steps) per chain of ``code``'s bytecode: start ``global``, ``free``
    (a closure cell), ``param`` or ``import`` (``import m`` / ``from m import n`` inside the
    function: name is ``(module name, level, whether the top package is bound)``); steps as in
    :class:`Read` (chain.py), plus ``("call0",)`` and ``("call1", constant)`` / ``("call2",
    constant, constant)`` for a call with no argument or constant arguments (``globals()``,
    ``.get("k")``, ``os.getenv("k", "2")``), ``("gattr", global name)`` for ``getattr(obj,
    NAME)`` and ``("eager", why)`` for a read this scan cannot follow, resolved by
    :func:`reads_of` (reads.py). ``type(v)`` is the step ``("attr", "__class__")`` and
    ``vars(v)`` the step ``("attr", "__dict__")``; a local bound once to a chain (``log =
    LOG``, ``import mod``) continues that chain where it is loaded."""
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL")]
    params = set(frames.parameter_names(code))  # (*args and **kwargs too: read through items)
    single = _single_stores(code, ins)
    aliases: dict = {}  # local -> (start kind, name, steps)
    out: list = []

    def const_at(j):
        return j < len(ins) and ins[j].opname == "LOAD_CONST" and \
            type(ins[j].argval) in (str, int, bytes)

    def call_at(j, n):
        return j < len(ins) and ins[j].opname == "CALL" and ins[j].argval == n

    def chain_at(i, depth=0):
        """(start, name, steps, next index) of the chain that starts at ``ins[i]``, or None."""
        op = ins[i]
        steps: list = []
        called, first = op.argval, i + 1
        if op.opname == "LOAD_GLOBAL" and called in ("object", "type") and i + 2 < len(ins) \
                and ins[i + 1].opname in ("LOAD_ATTR", "LOAD_METHOD") and \
                ins[i + 1].argval == "__getattribute__":  # object.__getattribute__(v, "k"):
            called, first = "__getattribute__", i + 2  # getattr(v, "k") without a default
        if op.opname == "LOAD_GLOBAL" and called in ("type", "vars", "getattr", "hasattr",
                                                     "__getattribute__") \
                and depth < 8 and first < len(ins):
            inner = chain_at(first, depth + 1)
            if inner is not None:
                kind, name, isteps, j = inner
                if called == "type" and call_at(j, 1):
                    return _more(kind, name, list(isteps) + [("attr", "__class__")], j + 1)
                if called == "vars" and call_at(j, 1):  # Note [Module dicts] (chain.py)
                    out.append(("global", "vars", ()))  # the builtin's own read
                    return _more(kind, name, list(isteps) + [("attr", "__dict__")], j + 1)
                if called not in ("type", "vars"):
                    nargs = 2 if called in ("hasattr", "__getattribute__") else None
                    if const_at(j) and isinstance(ins[j].argval, str):
                        step, k = ("attr", ins[j].argval), j + 1
                    elif j < len(ins) and ins[j].opname == "LOAD_GLOBAL" and not (
                            j + 1 < len(ins) and ins[j + 1].opname in ("LOAD_ATTR",
                                                                          "LOAD_METHOD")):
                        out.append(("global", ins[j].argval, ()))  # the name's own read
                        step, k = ("gattr", ins[j].argval), j + 1
                    else:
                        out.append((kind, name, tuple(isteps) + (
                            ("eager", f"{called}() with a name computed at run time"),)))
                        return None
                    if nargs is None and k < len(ins) and ins[k].opname == "LOAD_CONST" and \
                            call_at(k + 1, 3):  # a default
                        return _more(kind, name, list(isteps) + [step], k + 2)
                    if call_at(k, 2):
                        return _more(kind, name, list(isteps) + [step], k + 1)
                    out.append((kind, name, tuple(isteps) + (
                        ("eager", f"{called}() called in a way Trident does not follow"),)))
                    return None
                out.append((kind, name, tuple(isteps)))  # type(v) called otherwise
                return None
        if op.opname == "LOAD_GLOBAL":
            start = ("global", op.argval)
        elif op.opname == "LOAD_DEREF" and op.argval in code.co_freevars:
            start = ("free", op.argval)
        elif op.opname in _LOAD_FAST and op.argval in aliases:
            (kind, name, asteps), *others = aliases[op.argval]
            found = _more(kind, name, list(asteps), i + 1)
            more = found[2][len(asteps):]
            for okind, oname, osteps in others:  # bound elsewhere to another chain
                out.append((okind, oname, tuple(osteps) + more))
            return found
        elif op.opname in _LOAD_FAST and op.argval in params:
            start = ("param", op.argval)
        elif op.opname == "IMPORT_NAME":
            level = ins[i - 2].argval if i >= 2 and ins[i - 2].opname == "LOAD_CONST" else 0
            fromlist = ins[i - 1].argval if i >= 1 and ins[i - 1].opname == "LOAD_CONST" \
                else None
            start = ("import", (op.argval, level or 0, not fromlist))
            j = i + 1
            while j < len(ins) and ins[j].opname == "IMPORT_FROM":  # from m import a, b
                step = ("attr", ins[j].argval)
                if j + 1 < len(ins) and ins[j + 1].opname == "STORE_FAST":
                    bind(ins[j + 1].argval, (*start, (step,)))
                out.append((*start, (step,)))
                j += 2
                if j < len(ins) and ins[j].opname == "POP_TOP":
                    j += 1
            if j == i + 1:
                out.append((*start, ()))
                if j < len(ins) and ins[j].opname == "STORE_FAST":
                    bind(ins[j].argval, (*start, ()))
            return None if j > i + 1 else (*start, (), j)
        else:
            return None
        return _more(*start, steps, i + 1)

    def _more(kind, name, steps, j):
        while j < len(ins):
            nxt = ins[j]
            if nxt.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                steps.append(("attr", nxt.argval))
                j += 1
            elif const_at(j) and j + 1 < len(ins) and ins[j + 1].opname == "BINARY_SUBSCR":
                steps.append(("item", nxt.argval))
                j += 2
            elif call_at(j, 0):
                steps.append(("call0",))
                j += 1
            elif const_at(j) and call_at(j + 1, 1):
                if steps and steps[-1] == ("attr", "__getattribute__") and \
                        isinstance(nxt.argval, str):  # v.__getattribute__("k") is v.k
                    steps[-1] = ("attr", nxt.argval)
                else:
                    steps.append(("call1", nxt.argval))
                j += 2
            elif nxt.opname == "LOAD_GLOBAL" and steps and steps[-1][0] == "attr" and (
                    call_at(j + 1, 1) or (j + 2 < len(ins) and ins[j + 1].opname ==
                                          "LOAD_CONST" and call_at(j + 2, 2))):
                out.append(("global", nxt.argval, ()))  # d.get(NAME), os.getenv(NAME): the
                steps.append(("gcall", nxt.argval))  # name's own read, then the call
                j += 2 if call_at(j + 1, 1) else 3
            elif nxt.opname == "LOAD_GLOBAL" and j + 1 < len(ins) and \
                    ins[j + 1].opname == "BINARY_SUBSCR":  # d[NAME]
                out.append(("global", nxt.argval, ()))
                steps.append(("gitem", nxt.argval))
                j += 2
            elif const_at(j) and j + 1 < len(ins) and ins[j + 1].opname == "LOAD_CONST" and \
                    call_at(j + 2, 2):
                steps.append(("call2", nxt.argval, ins[j + 1].argval))
                j += 3
            else:
                break
        return kind, name, tuple(steps), j

    def bind(local, chain):
        """``local`` is bound to ``chain`` (each of its loads continues it)."""
        if local in params:
            return
        chains = aliases.setdefault(local, [])
        if chain not in chains:
            chains.append(chain)

    at = {i.offset: (i.opname, i.argval) for i in ins}  # jump targets
    ends: dict = {}  # index of a chain's last instruction -> the chain (Note [Items reached
    # by iteration] in instances.py)

    def emit(kind, name, steps, i, j):
        """The chain ``steps`` found at ``ins[i:j]``: a local it is stored in continues it."""
        ends[j - 1] = (kind, name, steps)
        if kind == "param" and not steps:
            return
        stored = j < len(ins) and ins[j].opname == "STORE_FAST"
        if stored:
            bind(ins[j].argval, (kind, name, steps))
        elif j < len(ins) and ins[j].opname in ("JUMP_FORWARD", "JUMP") and \
                at.get(ins[j].argval, (None,))[0] == "STORE_FAST":  # c = A if f else B
            bind(at[ins[j].argval][1], (kind, name, steps))
            stored = True
        if stored and ins[j].argval in single:
            pass  # each load of it is a chain
        elif j < len(ins) and ins[j].opname == "CONTAINS_OP" and const_at(i - 1):
            out.append((kind, name, steps + (("contains", ins[i - 1].argval),)))  # "k" in d
        else:
            out.append((kind, name, steps))

    for scan in range(8):  # the first finds what locals are bound to (a loop may load first;
        out.clear()  # a loop variable is bound to its items after the pass that finds them)
        ends.clear()
        bound = {k: list(v) for k, v in aliases.items()}
        i = 0
        while i < len(ins):
            found = chain_at(i)
            if found is None:
                i += 1
                continue
            kind, name, steps, j = found
            emit(kind, name, steps, i, j)
            i = max(j, i + 1)
        _items_reached(code, ins, ends, emit, bind, _more, out)
        if scan and bound == aliases:
            break
    return list(dict.fromkeys(out))


EACH = ("each",)  # any item of the container before it (Note [Items reached by iteration])
# builtins whose iterator yields the items of their arguments (zip: of each in turn)
_ITEM_CALLS = frozenset({"enumerate", "zip", "reversed", "sorted", "list", "tuple", "iter",
                         "set", "frozenset", "filter"})
_SAME_ITEMS = _ITEM_CALLS - {"enumerate", "zip"}  # whose result holds its argument's items
_DICT_VIEWS = frozenset({"items", "values", "keys"})
_COMPREHENSION_SETUP = ("LOAD_FAST_AND_CLEAR", "SWAP", "BUILD_LIST", "BUILD_MAP", "BUILD_SET")


def item_chain(chain: tuple, unpacked: bool = False) -> tuple:
    """The chain of an item of ``chain``'s value (``unpacked``: of an item's items; a dict
    view's: the dict's keys and values, unpacked or not)."""
    kind, name, steps = chain
    if len(steps) >= 2 and steps[-1] == ("call0",) and steps[-2][0] == "attr" and \
            steps[-2][1] in _DICT_VIEWS:
        return kind, name, steps[:-2] + (EACH,)
    return kind, name, steps + (EACH,) * (1 + unpacked)


def comprehension_items(sources: list, steps: tuple) -> list:
    """The chains that a comprehension's ``("param", ".0", steps)`` (``steps`` from ``EACH``)
    reads in its maker's terms: ``sources``, the ``("iterates", code, (chain, pairs))`` of the
    code, ``pairs`` where its iterator yields tuples of the chain's items (``enumerate``,
    ``zip``)."""
    out = []
    unpacked = steps[1:2] == (EACH,)
    for chain, pairs in sources:
        if pairs and unpacked:
            kind, name, head = item_chain(chain)
            out.append((kind, name, head + steps[2:]))
        elif pairs and steps[1:2] and steps[1][0] == "item":  # pair[1].k
            kind, name, head = item_chain(chain)
            out.append((kind, name, head + steps[2:]))
        elif not pairs:
            kind, name, head = item_chain(chain, unpacked)
            out.append((kind, name, head + steps[1 + unpacked:]))
    return out


def _items_reached(code, ins: list, ends: dict, emit, bind, more, out: list) -> None:
    """Note [Items reached by iteration] (instances.py): the chains of the items a loop, a
    comprehension or a key computed at run time reaches, from the chains that end at
    ``ends``' instructions: a loop's targets are bound to its container's chain and ``EACH``
    (``for l in c.layers``, ``for i, l in enumerate(c.layers)``, ``for k, l in
    d.items()``), a comprehension's code gets ``("iterates", code, chain)`` (its ``.0`` is that
    chain's items), and ``c.layers[i].k`` is a chain through ``EACH``."""
    calls = not _ITEM_CALLS.isdisjoint(code.co_names) or "next" in code.co_names
    if not calls and not any(i.opname in ("FOR_ITER", "GET_ITER", "BINARY_SUBSCR",
                                          "BINARY_SLICE", "UNPACK_SEQUENCE") for i in ins):
        return
    fl = flow.Flow(code, {})

    def source(j, d):
        """(the chain of the value at depth ``d`` before ``ins[j]`` or None, its producer)."""
        found = fl.producers(j, d)
        if not found or len(found) != 1 or found[0][1] != 0:
            return None, None
        return ends.get(found[0][0]), found[0][0]

    def callee(k) -> set:
        """The names of the globals that the ``CALL`` at ``ins[k]`` may call."""
        n = ins[k].arg
        return {ins[c].argval for d in (n, n + 1) for c, _ in (fl.producers(k, d) or ())
                if ins[c].opname == "LOAD_GLOBAL"}

    def iterator_sources(g) -> list:
        """``(chain, pairs)`` of what the iterator that ``ins[g]`` (``GET_ITER``) makes
        yields: the chain's items, or (``pairs``) tuples of its items."""
        chain, p = source(g, 0)
        if chain is not None:
            return [(chain, False)]
        if p is None or ins[p].opname != "CALL" or not ins[p].arg:
            return []
        n, names = ins[p].arg, callee(p)
        args = [source(p, n - 1 - m)[0] for m in range(n)]
        if names <= {"zip", "enumerate"} and names:
            return [(a, True) for a in (args if names == {"zip"} else args[:1]) if a is not None]
        return [(args[0], False)] if names <= _SAME_ITEMS and args[0] is not None else []

    def iterated(g, targets: int, unpacked: bool) -> list:
        """Per target of a loop over the iterator that ``ins[g]`` (``GET_ITER``) makes, the
        chains of its items (``unpacked``: of its items' items)."""
        chain, p = source(g, 0)
        if chain is not None:
            return [[item_chain(chain, unpacked)]] * targets
        if p is None or ins[p].opname != "CALL" or not ins[p].arg:
            return [[]] * targets
        n, names = ins[p].arg, callee(p)
        args = [source(p, n - 1 - m)[0] for m in range(n)]
        if names == {"zip"} and targets == n:  # zip(a, b): a's items, then b's
            return [[item_chain(a)] if a is not None else [] for a in args]
        if not names & _ITEM_CALLS or args[0] is None:
            return [[]] * targets
        return [[item_chain(args[0])]] * targets  # enumerate(a): its index too (no harm)

    for k, op in enumerate(ins):
        if op.opname == "FOR_ITER":
            g = k - 1
            while g > 0 and ins[g].opname in _COMPREHENSION_SETUP:  # (3.12's inlined ones)
                g -= 1
            names = _targets(ins, k)
            unpacked = k + 1 < len(ins) and ins[k + 1].opname == "UNPACK_SEQUENCE"
            if ins[g].opname == "GET_ITER":
                items = iterated(g, len(names), unpacked)
            elif g + 1 == k and g in ends:  # a comprehension's .0, an iterator in a local
                items = [[item_chain(ends[g], unpacked)]] * len(names)
            else:
                continue
            for local, chains in zip(names, items):
                for chain in chains:
                    bind(local, chain)
        elif op.opname == "GET_ITER" and k + 1 < len(ins) and ins[k + 1].opname == "CALL" \
                and ins[k + 1].arg == 0:  # a comprehension's code called on the iterator
            made = (fl.producers(k + 1, 1) or [(None, None)])[0][0]
            made = next((ins[m].argval for m in range(made, max(made - 4, -1), -1)
                         if isinstance(ins[m].argval, types.CodeType)), None) \
                if made is not None else None
            for source_chain in iterator_sources(k) if made is not None else ():
                out.append(("iterates", made, source_chain))
        elif op.opname == "UNPACK_SEQUENCE":  # a, b = c.pair
            chain, _ = source(k, 0)
            for local in _targets(ins, k - 1) if chain is not None else ():
                bind(local, item_chain(chain))
        elif calls and op.opname == "CALL" and op.arg in (1, 2) and k not in ends:
            names = callee(k)
            chain = source(k, op.arg - 1)[0] if names & (_ITEM_CALLS | {"next"}) else None
            if chain is None:  # (the first argument's)
                continue
            if "next" in names:  # next(iter(c.layers)): an item
                kind, name, steps = item_chain(chain)
                kind, name, steps, j = more(kind, name, list(steps), k + 1)
                emit(kind, name, steps, k, j)
            elif op.arg == 1 and names <= _SAME_ITEMS:  # sorted(c.layers)[0], iter(...): its
                ends[k] = chain  # items are the container's
                if names <= {"iter", "reversed"} and k + 1 < len(ins) and \
                        ins[k + 1].opname == "STORE_FAST":  # it = iter(c.layers)
                    bind(ins[k + 1].argval, chain)
        elif op.opname in ("BINARY_SUBSCR", "BINARY_SLICE"):
            depth = 2 if op.opname == "BINARY_SLICE" else 1
            chain, _ = source(k, depth)
            key = fl.producers(k, 0) if depth == 1 else None
            if chain is None or k in ends:
                continue
            if depth == 2 or (key and len(key) == 1 and ins[key[0][0]].opname == "BUILD_SLICE"):
                ends[k] = chain  # a slice: a container of the same items
                continue
            kind, name, steps = item_chain(chain)
            kind, name, steps, j = more(kind, name, list(steps), k + 1)
            emit(kind, name, steps, k, j)


def _targets(ins: list, k: int) -> list:
    """The locals that the loop at ``ins[k]`` (``FOR_ITER``) stores each item in, or what an
    unpacked item's parts are stored in; none for another target."""
    nxt = ins[k + 1] if k + 1 < len(ins) else None
    if nxt is None:
        return []
    if nxt.opname == "STORE_FAST":
        return [nxt.argval]
    if nxt.opname != "UNPACK_SEQUENCE":
        return []
    names: list = []
    for t in ins[k + 2:k + 2 + nxt.arg]:
        if t.opname == "STORE_FAST":
            names.append(t.argval)
        elif t.opname == "STORE_FAST_STORE_FAST":  # (3.13)
            names += list(t.argval)
        else:
            break
        if len(names) >= nxt.arg:
            break
    return names if len(names) == nxt.arg else []

# classes whose isinstance answers on a fake tensor argument are the real one's (tensor_type_read)
_ANSWERED = (torch.Tensor, torch.nn.Parameter, *filter(None, [getattr(torch.nn, "Buffer", None)]))
# metaclass checks that answer by the class alone for a class other than those (torch's
# _ParameterMeta asks the flag for Parameter itself only: UninitializedParameter)
_BY_CLASS = (type.__instancecheck__, *{type(c).__instancecheck__ for c in _ANSWERED[1:]})


def tensor_type_read(code: types.CodeType, g: dict, params: dict) -> str | None:
    """A read of a tensor's Python type in ``code`` (``type(x)`` or ``x.__class__`` used
    otherwise than compared with a class that is no tensor's: ``type(y) is int`` holds of
    neither; ``isinstance(x, C)``, ``C`` a strict subclass of ``torch.Tensor``), with ``x`` a
    parameter whose value at the trace's call (``params``) is a tensor, or derived from one, as
    ``"text (file:line)"``; or None. The trace runs the code on fake tensors (``FakeTensor``),
    so its answer is not eager's: such a function runs eagerly. ``isinstance(x, torch.Tensor)``
    holds of both; ``isinstance(x, nn.Parameter)`` the fake of a Parameter answers as it does
    (torch marks it), and each tensor argument is guarded on it; ``isinstance(x, nn.Buffer)``
    asks the tensor's ``_is_buffer`` attribute, a lookup of Note [Python attributes of tensors]
    (Note [Tensor types and attributes] in ir/guards.py): none is one. A type used only as
    text compared with constants that answer alike on the fake is none either (Note [Type
    reads alike] in type_strings.py)."""
    tensors = {n for n, v in params.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        return None
    f = flow.Flow(code, g)
    compares = [j for j, i in enumerate(f.ins) if i.opname in ("IS_OP", "COMPARE_OP")]
    for k, i in enumerate(f.ins):
        depth = None
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval == "__class__":
            depth, what = 0, ".__class__"
        elif i.opname == "CALL" and i.arg in (1, 2):
            callee = f.call_parts(k)[0]
            if callee is type and i.arg == 1:
                depth, what = 0, "type()"
            elif callee in (isinstance, issubclass) and i.arg == 2:
                kinds = f.static(k, 0)
                kinds = kinds if isinstance(kinds, tuple) else (kinds,)
                if any(isinstance(c, type) and issubclass(c, torch.Tensor) and
                       c not in _ANSWERED and not _no_traced_instance(c, params) for c in kinds):
                    depth, what = 1, f"{callee.__name__}() with a subclass of torch.Tensor"
        if depth is None or not f.origin(k, depth)[1] & tensors:
            continue
        if depth == 0 and (_compared_with_other_classes(f, compares, k) or
                           type_strings.read_alike(f, k, params)):  # Note [Type reads alike]
            continue
        line = i.positions.lineno if i.positions else "?"
        return f"{what} ({code.co_filename.rsplit('/', 1)[-1]}:{line})"
    return None


# Note [Classes no traced tensor is]: ``isinstance(x, C)``, ``C`` a strict subclass of
# ``torch.Tensor``, asks a tensor's Python type, which the trace's fake tensor does not share.
# Library code asks it of every tensor it gets: liger-kernel 0.8 (``LigerRMSNormFunction``)
# tests ``isinstance(X, DTensor)`` to gather a tensor-parallel input first. The answer is
# False on both sides when the fake is no ``C`` (``C`` is no class of ``FakeTensor``, and
# answers by the class alone: no ``__instancecheck__`` of its own, as ``nn.Parameter`` has; a
# subclass of it answers by its class through torch's) and no tensor of the call is one: a
# tensor argument's guard accepts ``torch.Tensor`` and ``nn.Parameter`` only (Note [Tensor
# types and attributes] in ir/guards.py), torch's ops on them make ``torch.Tensor``s, and the
# code's parameters at the trace (``params``) hold no ``C``. Such a read is no reason to run
# eagerly; any other stays one.

def _no_traced_instance(c: type, params: dict) -> bool:
    """Note [Classes no traced tensor is]: whether ``isinstance(v, c)`` answers False on the
    trace's fake tensors and on the tensors of every call the specialization serves."""
    return (not issubclass(FakeTensor, c) and type(c).__instancecheck__ in _BY_CLASS
            and not any(isinstance(v, c) for v in params.values()))


_TYPE_NAMES = frozenset({"type", "__class__", "isinstance", "issubclass"})
_LIBRARY_TYPES: dict = {}  # (id of a code object, its tensor parameters and their types) ->
# (code, answer)


def library_type_read(code: types.CodeType, g: dict, params: dict) -> str | None:
    """``tensor_type_read`` of library code (Note [Tensor types and attributes] in
    ir/guards.py), kept per code object and tensor parameters (a library's code is walked once
    per process); code that names none of ``type``, ``__class__``, ``isinstance`` and
    ``issubclass`` reads none."""
    if _TYPE_NAMES.isdisjoint(code.co_names):
        return None
    key = (id(code), frozenset((n, type(v)) for n, v in params.items()))
    found = _LIBRARY_TYPES.get(key)
    if found is None or found[0] is not code:
        if len(_LIBRARY_TYPES) >= 65536:
            _LIBRARY_TYPES.clear()
        found = _LIBRARY_TYPES[key] = (code, tensor_type_read(code, g, params))
    return found[1]


def _compared_with_other_classes(f, compares: list, k: int) -> bool:
    """Whether the type that ``f.ins[k]`` pushes is only compared (``is``, ``==``) with
    classes that are not tensors' (``int``, ``list``): the fake tensor's type compares as the
    tensor's does."""
    found = False
    for j in compares:
        for d in (0, 1):
            if (k, 0) in (f.producers(j, d) or ()):
                other = f.static(j, 1 - d)
                if not isinstance(other, type) or issubclass(other, torch.Tensor):
                    return False
                found = True
    return found
