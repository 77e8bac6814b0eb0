"""The methods of ``torch.Tensor`` that the code a trace ran calls, by name or through Python's
operators, read as state (Note [Tensor methods and operators]).

Note [Tensor methods and operators]: a user may replace a method of ``torch.Tensor`` between
calls (``torch.Tensor.__add__ = ...``, ``torch.Tensor.norm = ...``, a debugging or counting
wrapper); eager then runs the new one. The state tree read ``torch.Tensor.<name>`` only for the
names that user code loads as attributes (``x.sigmoid()``), so a hit after the patch ran the
trace's method where the code reached it otherwise (Python 3.11 and 3.12):
  - through an operator or a protocol of the language: ``x + y`` runs the class's ``__add__``
    (or the right operand's ``__radd__``), ``x += y`` its ``__iadd__``, ``-x`` ``__neg__``,
    ``x[i]`` ``__getitem__``, ``x < y`` ``__lt__`` (or ``__gt__`` reflected), ``v in x``
    ``__contains__``, ``for v in x`` ``__iter__``, and the builtins ``abs``, ``len``,
    ``float``, ``int``, ``bool``, ``round``, ``pow``, ``divmod``, ``iter``, ``reversed``,
    ``hash``, ``format``, ``complex``, ``sum``, ``min``, ``max``, ``sorted``, ``any``, ``all``
    their dunders: no attribute is loaded, and the trace's TorchFunctionMode is handed
    ``TensorBase.add``, not ``__add__``, so neither the chains nor the mode name it;
  - in library code the function ran (transformers' ``rotate_half`` computes ``-x2``; a
    library's ``x.float()``), whose bytecode the chains do not scan.
So the bytecode of every user and library code object the trace ran (``Recording.codes`` and
``Recording.library``) is scanned for those instructions and attribute names, and each name
that ``torch.Tensor`` holds as a method (a C method or slot of ``torch._C.TensorBase``, or a
Python function) becomes a read ``torch.Tensor.<name>``, checked by identity: a patch, or its
undoing, misses and traces again. ``torch.Tensor``'s version tag proves all of them at once on
a hit (Note [Quiet state] in runtime/state_memo.cpp). A name of a function of the ``operator``
module, loaded from anywhere (``operator.add``, ``from operator import neg``, as
``functools.reduce(operator.mul, xs)`` and ``map(operator.neg, xs)`` call them), reads the
dunders it calls too. A graph of the ``torch.compile`` door
reads those of its generated code (``x.sigmoid()``, ``mul + 1``): Dynamo guards none of them
(torch 2.13: ``aot_eager`` returns the old result too), and the graph traced again calls the
new method. Not seen: a dunder that other C code
calls on a tensor for the code (``math.prod(xs)``'s ``__mul__``, a NumPy function given
tensors): docs/design.md, Limits today.
"""

from __future__ import annotations

import dis
import functools
import operator
import re
import types

import torch

from trident.lower.state.chain import Read
from trident.lower.state.instances import _TENSOR_STATE

_METHOD_TYPES = (types.MethodDescriptorType, types.WrapperDescriptorType, types.FunctionType)

# BINARY_OP's operator (its argrepr, "+" or "+="): the dunder's stem
_BINARY = {"+": "add", "-": "sub", "*": "mul", "@": "matmul", "/": "truediv", "//": "floordiv",
           "%": "mod", "**": "pow", "<<": "lshift", ">>": "rshift", "&": "and", "|": "or",
           "^": "xor"}
# COMPARE_OP's operator: the dunder and its reflection
_COMPARE = {"<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"), ">": ("__gt__", "__lt__"),
            ">=": ("__ge__", "__le__"), "==": ("__eq__",), "!=": ("__ne__",)}
_OPCODES = {"UNARY_NEGATIVE": ("__neg__",), "UNARY_POSITIVE": ("__pos__",),
            "UNARY_INVERT": ("__invert__",), "UNARY_NOT": ("__bool__", "__len__"),
            "BINARY_SUBSCR": ("__getitem__",), "BINARY_SLICE": ("__getitem__",),
            "STORE_SUBSCR": ("__setitem__",), "STORE_SLICE": ("__setitem__",),
            "DELETE_SUBSCR": ("__delitem__",), "CONTAINS_OP": ("__contains__",),
            "GET_ITER": ("__iter__", "__len__", "__getitem__")}
# builtins that call a dunder of their argument
_BUILTINS = {"abs": ("__abs__",), "len": ("__len__",), "float": ("__float__",),
             "int": ("__int__", "__index__"), "bool": ("__bool__", "__len__"),
             "round": ("__round__",), "pow": ("__pow__", "__rpow__"),
             "divmod": ("__divmod__", "__rdivmod__"), "iter": ("__iter__",),
             "reversed": ("__reversed__", "__len__", "__getitem__"), "hash": ("__hash__",),
             "format": ("__format__",), "complex": ("__complex__",),
             "sum": ("__add__", "__radd__"), "min": ("__lt__", "__gt__"),
             "max": ("__lt__", "__gt__"), "sorted": ("__lt__", "__gt__"),
             "any": ("__bool__", "__len__"), "all": ("__bool__", "__len__")}


@functools.lru_cache(maxsize=1024)
def _operator_dunders(name: str) -> tuple:
    """The dunders that the ``operator`` module's function ``name`` (``add``, ``iadd``,
    ``and_``, ``lt``, ``getitem``, ``__add__``) may call, or ()."""
    stem = name.strip("_")
    if not isinstance(getattr(operator, name, None), types.BuiltinFunctionType) or not stem:
        return ()
    if stem.startswith("i") and f"__{stem[1:]}__" in vars(operator):
        stem = stem[1:]  # (iadd: in place, then add)
    if stem in ("not", "truth"):
        return ("__bool__", "__len__")
    reflected = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}.get(stem, "r" + stem)
    return (f"__{stem}__", f"__{reflected}__", f"__i{stem}__")


@functools.lru_cache(maxsize=8192)
def _names_of(code: types.CodeType) -> frozenset:
    """The attribute names ``code`` loads and the dunders its operators and builtins call."""
    out = set()
    for i in dis.get_instructions(code):
        op = i.opname
        if op in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") and \
                isinstance(i.argval, str):
            if op in ("LOAD_ATTR", "LOAD_METHOD"):
                out.add(i.argval)
            out.update(_BUILTINS.get(i.argval, ()))
            out.update(_operator_dunders(i.argval))
        elif op == "BINARY_OP":
            stem = _BINARY.get(i.argrepr.rstrip("="))  # ("+=": in place, then "+")
            if stem is not None:
                out.update((f"__{stem}__", f"__r{stem}__"))
                if i.argrepr.endswith("="):
                    out.add(f"__i{stem}__")
        elif op == "COMPARE_OP":
            out.update(_COMPARE.get(re.sub(r"[^<>=!]", "", i.argrepr), ()))
        elif op in _OPCODES:
            out.update(_OPCODES[op])
    return frozenset(out)


def tensor_method_reads(codes) -> list[Read]:
    """Note [Tensor methods and operators]: a read ``torch.Tensor.<name>`` for each method of
    ``torch.Tensor`` that one of ``codes`` (code objects that ran in a trace) calls by name,
    through an operator or through a builtin, in name order."""
    names = set()
    for code in codes:
        names |= _names_of(code)
    base, own = vars(torch._C.TensorBase), vars(torch.Tensor)
    return [Read(("module", "torch"), (("attr", "Tensor"), ("attr", name)))
            for name in sorted(names - _TENSOR_STATE)
            if isinstance(own.get(name, base.get(name)), _METHOD_TYPES)]
