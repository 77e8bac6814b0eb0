"""Guards: the checks that select a specialization, as data.

Each :class:`Guard` renders itself to a C expression over ``trt_arg`` (the SCM evaluates those on
the hit path) and checks itself in Python against the same facts (``arg_facts`` mirrors
``read_arg`` in ``runtime/runtime.cpp``). The Python side is used to explain a miss; a test
(tests/test_guards.py) proves the two agree on random arguments.

Note [Guard order]: cheapest first. The argument count and call-wide state (grad mode,
inference mode, autocast, a tensor passed twice, the default dtype, torch.func transforms,
TorchFunctionModes, the default process group, the number of threads, torch's global flags),
then each argument's kind, then per tensor dtype, device, rank, then sizes and strides, then
flags (alignment, requires_grad, inference tensor), then scalar values. Both
the C function and ``first_failure`` evaluate guards in list order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import struct
from typing import Any

import torch

from . import collectives

# trt_arg_kind in trident_rt.h
OTHER, TENSOR, INT, FLOAT, BOOL, NONE = range(6)
KIND_NAMES = {OTHER: "unsupported", TENSOR: "Tensor", INT: "int", FLOAT: "float", BOOL: "bool",
              NONE: "None"}
_C_KINDS = {OTHER: "TRT_ARG_OTHER", TENSOR: "TRT_ARG_TENSOR", INT: "TRT_ARG_INT",
            FLOAT: "TRT_ARG_FLOAT", BOOL: "TRT_ARG_BOOL", NONE: "TRT_ARG_NONE"}
DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10::DeviceType
MAX_ARGS, MAX_OUTS = 4096, 256  # TRT_MAX_ARGS, TRT_MAX_OUTS in trident_rt.h
# Call-wide facts (trt_env in trident_rt.h), guarded in every specialization.
_ENV_FIELDS = ("grad_enabled", "inference_mode", "autocast", "aliased", "default_dtype",
               "transforms", "function_modes", "process_group", "num_threads", "flags")
# trt_env.flags, bit by bit (global_flags() in runtime.cpp): torch's global flags that eager ops
# obey when they run, or that picked what a trace holds (an SDPA backend). Fields of 4 bits
# from bit 16: the float32 matmul precision and the cuBLAS fp16 / bf16 reduction options.
FLAG_BITS = ("torch.are_deterministic_algorithms_enabled()",
             "torch.is_deterministic_algorithms_warn_only_enabled()",
             "torch.backends.cuda.flash_sdp_enabled()",
             "torch.backends.cuda.mem_efficient_sdp_enabled()",
             "torch.backends.cuda.math_sdp_enabled()", "torch.backends.cuda.cudnn_sdp_enabled()",
             "torch.backends.cudnn.allow_tf32", "torch.backends.cudnn.enabled",
             "torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic")
FLAG_FIELDS = ((16, "torch.get_float32_matmul_precision()"),
               (20, "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
               (24, "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"))
_DTYPES = [getattr(torch, name) for name in dir(torch)
           if isinstance(getattr(torch, name, None), torch.dtype)]


@functools.cache
def dtype_codes() -> dict[torch.dtype, int]:
    """torch.dtype -> c10::ScalarType code, as PyTorch itself numbers them (runtime.cpp)."""
    from . import runtime

    rt = runtime.load()
    return {d: rt.dtype_code(d) for d in _DTYPES}


def dtype_name(code: int) -> str:
    return next((str(d).replace("torch.", "") for d, c in dtype_codes().items() if c == code),
                str(code))


def c_int(v: int) -> str:
    """A C literal for an int64, INT64_MIN included."""
    return "(-9223372036854775807LL - 1)" if v == -2**63 else f"{v}LL"


def float_bits(f: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", f))[0]


def arg_facts(obj: Any) -> dict:
    """What the native dispatcher reads from one argument (``read_arg`` in runtime.cpp)."""
    if type(obj) in (torch.Tensor, torch.nn.Parameter):
        if (obj.is_nested or obj.layout != torch.strided or obj.is_conj() or obj.is_neg()
                or obj.device.type not in DEVICE_TYPES):
            return {"kind": OTHER}
        try:
            data_ptr = obj.data_ptr()
        except RuntimeError:  # no storage: a torch.func wrapper (vmap, grad)
            return {"kind": OTHER}
        if any(torch._VF._unpack_dual(obj, level)[1] is not None for level in (0, 1)):
            return {"kind": OTHER, "dual": True}  # forward-AD: its tangent runs eagerly
        return {
            "kind": TENSOR,
            "id": id(obj),
            "dtype": dtype_codes()[obj.dtype],
            "device_type": DEVICE_TYPES[obj.device.type],
            "device_index": -1 if obj.device.index is None else obj.device.index,
            "dim": obj.dim(),
            "sizes": tuple(obj.shape),
            "strides": tuple(obj.stride()),
            "storage_offset": obj.storage_offset(),
            "aligned16": data_ptr % 16 == 0,
            "requires_grad": obj.requires_grad,
            "inference": obj.is_inference(),
        }
    if obj is None:
        return {"kind": NONE}
    if type(obj) is bool:
        return {"kind": BOOL, "value": obj}
    if type(obj) is int:
        return {"kind": INT, "value": obj} if -2**63 <= obj < 2**63 else {"kind": OTHER}
    if type(obj) is float:
        return {"kind": FLOAT, "value": float_bits(obj)}
    return {"kind": OTHER}


def env_facts(args: tuple) -> dict:
    """Call-wide state the native dispatcher reads (``read_args`` in runtime.cpp)."""
    tensors = [id(a) for a in args if type(a) in (torch.Tensor, torch.nn.Parameter)]
    return {
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "autocast": torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"),
        "aliased": len(set(tensors)) != len(tensors),
        "default_dtype": dtype_codes()[torch.get_default_dtype()],
        "transforms": torch._C._are_functorch_transforms_active(),
        "function_modes": torch._C._len_torch_function_stack() > 0,
        "process_group": collectives.fact(),  # Note [Process group guard]
        "num_threads": torch.get_num_threads(),
        "flags": _global_flags(),
    }


def _global_flags() -> int:
    from . import runtime

    return runtime.load().global_flags()


def flags_changed(expected: int, actual: int) -> list[str]:
    """The flags (FLAG_BITS, FLAG_FIELDS) that differ between two ``trt_env.flags`` values."""
    names = [name for i, name in enumerate(FLAG_BITS) if (expected ^ actual) >> i & 1]
    return names + [name for shift, name in FLAG_FIELDS if (expected ^ actual) >> shift & 15]


@dataclasses.dataclass(frozen=True)
class Guard:
    """``facts[arg][field](index) == value``; ``arg`` is None for call-wide facts."""

    field: str
    value: Any
    arg: int | None = None
    index: int | None = None
    float_value: bool = False  # "value" guards: compare float bit patterns
    # "sym" guards (Note [Symbolic guards]): {"c": C, "py": Python, "text": words}, one
    # condition over the arguments' sizes and strides; ``arg`` is the highest argument it reads.
    expr: dict | None = None

    def actual(self, facts: list[dict], nargs: int, env: dict) -> Any:
        if self.field == "nargs":
            return nargs
        if self.arg is None:
            return env[self.field]
        f = facts[self.arg]
        if self.field == "sym":
            return _eval_sym(self.expr["py"], facts)
        if self.field == "same_as":  # the index of the argument this one is
            return self.value if f.get("id") == facts[self.value].get("id") else None
        if self.field in ("size", "stride"):
            return f[self.field + "s"][self.index]
        return f.get(self.field)

    def check(self, facts: list[dict], nargs: int, env: dict) -> bool:
        return self.actual(facts, nargs, env) == self.value

    def c_expr(self) -> str:
        a = f"a[{self.arg}]"
        v = self.value
        return {
            "nargs": lambda: f"n == {v}",
            "grad_enabled": lambda: f"env->grad_enabled == {int(v)}",
            "inference_mode": lambda: f"env->inference_mode == {int(v)}",
            "autocast": lambda: f"env->autocast == {int(v)}",
            "aliased": lambda: f"env->aliased == {int(v)}",
            "default_dtype": lambda: f"env->default_dtype == {v}",
            "transforms": lambda: f"env->transforms == {int(v)}",
            "function_modes": lambda: f"env->function_modes == {int(v)}",
            "process_group": lambda: f"trt_streq(env->process_group, {json.dumps(v)})",
            "num_threads": lambda: f"env->num_threads == {v}",
            "flags": lambda: f"env->flags == {v}ULL",
            "kind": lambda: f"{a}.kind == {_C_KINDS[v]}",
            "dtype": lambda: f"{a}.dtype == {v}",
            "device_type": lambda: f"{a}.device_type == {v}",
            "device_index": lambda: f"{a}.device_index == {v}",
            "dim": lambda: f"{a}.dim == {v}",
            "same_as": lambda: f"{a}.tensor == a[{v}].tensor",
            "size": lambda: f"{a}.sizes[{self.index}] == {v}",
            "stride": lambda: f"{a}.strides[{self.index}] == {v}",
            "aligned16": lambda: f"{'' if v else '!'}({a}.flags & TRT_ALIGNED16)",
            "requires_grad": lambda: f"{'' if v else '!'}({a}.flags & TRT_REQUIRES_GRAD)",
            "inference": lambda: f"{'' if v else '!'}({a}.flags & TRT_INFERENCE)",
            "value": lambda: f"trt_f64_bits({a}.f) == {v}ULL" if self.float_value else
            f"{a}.i == {c_int(v)}",
            "sym": lambda: self.expr["c"],
        }[self.field]()

    def describe(self, names: list[str]) -> str:
        who = names[self.arg] if self.arg is not None and self.arg < len(names) else \
            f"argument {self.arg}"
        v = self.value
        return {
            "nargs": lambda: f"{v} positional arguments",
            "grad_enabled": lambda: f"torch.is_grad_enabled() is {v}",
            "inference_mode": lambda: f"torch.is_inference_mode_enabled() is {v}",
            "autocast": lambda: f"autocast is {'on' if v else 'off'}",
            "aliased": lambda: f"one tensor in two argument positions is {v}",
            "default_dtype": lambda: f"torch.get_default_dtype() == {dtype_name(v)}",
            "transforms": lambda: f"a torch.func transform is active is {v}",
            "function_modes": lambda: f"a TorchFunctionMode is active is {v}",
            "process_group": lambda: collectives.describe(v),
            "num_threads": lambda: f"torch.get_num_threads() == {v}",
            "flags": lambda: f"torch's global flags == {v:#x}",
            "kind": lambda: f"{who} is {KIND_NAMES[v]}",
            "dtype": lambda: f"{who}.dtype == {dtype_name(v)}",
            "same_as": lambda: f"{who} is {names[v] if v < len(names) else v}",
            "device_type": lambda: f"{who}.device.type == {'cpu' if v == 0 else 'cuda'}",
            "device_index": lambda: f"{who}.device.index == {v}",
            "dim": lambda: f"{who}.dim() == {v}",
            "size": lambda: f"{who}.size({self.index}) == {v}",
            "stride": lambda: f"{who}.stride({self.index}) == {v}",
            "aligned16": lambda: f"{who}.data_ptr() % 16 {'==' if v else '!='} 0",
            "requires_grad": lambda: f"{who}.requires_grad is {v}",
            "inference": lambda: f"{who}.is_inference() is {v}",
            "value": lambda: f"{who} == {struct.unpack('<d', struct.pack('<Q', v))[0]!r}"
            if self.float_value else f"{who} == {v!r}",
            "sym": lambda: self.expr["text"].format(*names) if names else self.expr["text"],
        }[self.field]()


def guards_for(args: tuple, fake_args: tuple | None = None, shape_env=None) -> list[Guard]:
    """The guards that hold for ``args`` and the current grad mode and autocast state
    (Note [Guard order]). With ``fake_args`` and ``shape_env`` (a trace with dynamic dims),
    symbolic sizes and strides are guarded by Note [Symbolic guards] instead of by value."""
    facts = [arg_facts(a) for a in args]
    env = env_facts(args)
    guards = [Guard("nargs", len(args))]
    guards += [Guard(k, env[k]) for k in _ENV_FIELDS]
    guards += [Guard("kind", f["kind"], i) for i, f in enumerate(facts)]
    tensors = [(i, f) for i, f in enumerate(facts) if f["kind"] == TENSOR]
    for i, f in tensors:
        guards += [Guard(k, f[k], i) for k in ("dtype", "device_type", "device_index", "dim")]
    if fake_args is None:
        for i, f in tensors:
            guards += [Guard("size", s, i, d) for d, s in enumerate(f["sizes"])]
            guards += [Guard("stride", s, i, d) for d, s in enumerate(f["strides"])]
    else:
        guards += symbolic_guards(fake_args, shape_env)
    first_seen: dict[int, int] = {}
    for i, f in tensors:  # the trace binds one tensor passed twice to one input
        if f["id"] in first_seen:
            guards.append(Guard("same_as", first_seen[f["id"]], i))
        first_seen.setdefault(f["id"], i)
    for i, f in tensors:
        guards += [Guard(k, f[k], i) for k in ("aligned16", "requires_grad", "inference")]
    for i, f in enumerate(facts):
        if f["kind"] in (INT, BOOL):
            guards.append(Guard("value", int(f["value"]), i))
        elif f["kind"] == FLOAT:
            guards.append(Guard("value", f["value"], i, float_value=True))
    return guards


def explain_failure(guard: Guard, args: tuple, names: list[str]) -> str:
    """``"x.size(0) == 4 expected, got 5"`` for a guard that ``args`` fail."""
    if guard.field not in ("nargs", *_ENV_FIELDS) and guard.arg >= len(args):
        return f"{guard.describe(names)} expected, but only {len(args)} arguments were passed"
    facts = [arg_facts(a) for a in args]
    actual = guard.actual(facts, len(args), env_facts(args))
    if guard.field == "sym":  # name the sizes it read: "(x.size(0) >= 2) is false (x.size(0) = 1)"
        return f"{guard.describe(names)} is false ({_values_read(guard, facts, names)})"
    if guard.field == "process_group":
        return f"{guard.describe(names)} expected, but {collectives.describe(actual)}"
    if guard.field == "kind":
        actual = KIND_NAMES.get(actual, actual)
    elif guard.field in ("dtype", "default_dtype") and actual is not None:
        actual = dtype_name(actual)
    elif guard.field == "flags":
        return f"{', '.join(flags_changed(guard.value, actual))} changed since the compile"
    elif guard.field == "value" and guard.float_value and actual is not None:
        actual = struct.unpack("<d", struct.pack("<Q", actual))[0]
    return f"{guard.describe(names)} expected, got {actual!r}"


def _values_read(guard: Guard, facts: list[dict], names: list[str]) -> str:
    """``"x.size(0) = 1, x.stride(0) = 8"``: the places a "sym" guard reads, with their values."""
    out = []
    for kind, i, d in dict.fromkeys(re.findall(r"([STO])\((\d+)(?:, (\d+))?\)", guard.expr["py"])):
        f, who = facts[int(i)], names[int(i)] if int(i) < len(names) else f"argument {i}"
        if f.get("kind") != TENSOR:
            continue
        if kind == "O":
            out.append(f"{who}.storage_offset() = {f['storage_offset']}")
        else:
            field = "size" if kind == "S" else "stride"
            values = f[field + "s"]
            out.append(f"{who}.{field}({d}) = {values[int(d)] if int(d) < len(values) else '-'}")
    return ", ".join(out)


def first_failure(guards: list[Guard], args: tuple) -> Guard | None:
    """The first guard (in Note [Guard order]) that ``args`` fail, or None if all hold."""
    facts = [arg_facts(a) for a in args]
    env = env_facts(args)
    for g in guards:
        if g.field not in ("nargs", *_ENV_FIELDS) and g.arg >= len(args):
            return g
        if not g.check(facts, len(args), env):
            return g
    return None


# ---- Note [Symbolic guards] ------------------------------------------------------------------
#
# A specialization traced with dynamic dims (capture.py) holds for every call whose sizes and
# strides satisfy what the trace knew and assumed about them:
#   * each symbol's first appearance (argument i, size d) is its source; the guard is its range
#     (``>= 2``: sizes 0 and 1 are specialized, as in torch.compile);
#   * every other size or stride equals its expression over the sources (a contiguous tensor's
#     ``stride(0) == size(1) * 16``; the same symbol in two places is an equality);
#   * every guard the ShapeEnv recorded while tracing (``Eq(s0, s1)``, ``s0 < 100``).
# Expressions are rendered from sympy to C (over ``a[i].sizes[d]``) and to Python (over the
# argument facts) by the same walk, so both sides agree.


def _eval_sym(py: str, facts: list[dict]) -> bool:
    try:
        return bool(eval(py, {"__builtins__": {}, "max": max, "min": min},
                         {"S": lambda i, d: facts[i]["sizes"][d],
                          "T": lambda i, d: facts[i]["strides"][d],
                          "O": lambda i: facts[i]["storage_offset"]}))
    except (KeyError, IndexError, TypeError, ZeroDivisionError):
        return False


def _render(expr, sources: dict) -> tuple[str, str, str]:
    """(C, Python, words) for a sympy expression over the source symbols."""
    import sympy
    from torch.utils._sympy import functions
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    from .errors import TridentError

    Max, Min = getattr(functions, "Max", sympy.Max), getattr(functions, "Min", sympy.Min)

    def r(e):
        if isinstance(e, sympy.Integer) or e in (sympy.true, sympy.false):
            v = int(bool(e)) if e in (sympy.true, sympy.false) else int(e)
            return c_int(v), str(v), str(v)
        if isinstance(e, sympy.Symbol):
            if e not in sources:
                raise TridentError(f"a guard reads the symbol {e}, which no argument size has")
            return sources[e]
        parts = [r(a) for a in e.args]

        def join(op_c, op_py, op_text=None):
            return tuple("(" + f" {op} ".join(p[k] for p in parts) + ")"
                         for k, op in enumerate((op_c, op_py, op_text or op_py)))

        if isinstance(e, sympy.Add):
            return join("+", "+")
        if isinstance(e, sympy.Mul):
            return join("*", "*")
        if isinstance(e, FloorDiv):
            (ac, ap, at), (bc, bp, bt) = parts
            return f"trt_floordiv({ac}, {bc})", f"({ap} // {bp})", f"({at} // {bt})"
        if isinstance(e, (sympy.Max, sympy.Min, Max, Min)):  # folded pairwise
            op, name = (">", "max") if isinstance(e, (sympy.Max, Max)) else ("<", "min")
            c, py, text = parts[0]
            for bc, bp, bt in parts[1:]:
                c = f"(({c}) {op} ({bc}) ? ({c}) : ({bc}))"
                py, text = f"{name}({py}, {bp})", f"{name}({text}, {bt})"
            return c, py, text
        if isinstance(e, (Mod, PythonMod, sympy.Mod)):
            (ac, ap, at), (bc, bp, bt) = parts
            return f"trt_mod({ac}, {bc})", f"({ap} % {bp})", f"({at} % {bt})"
        relations = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=",
                     sympy.Gt: ">", sympy.Ge: ">="}
        for cls, op in relations.items():
            if isinstance(e, cls):
                return join(op, op)
        if isinstance(e, sympy.And):
            return join("&&", "and")
        if isinstance(e, sympy.Or):
            return join("||", "or")
        if isinstance(e, sympy.Not):
            c, p, t = parts[0]
            return f"!{c}", f"(not {p})", f"not {t}"
        raise TridentError(f"cannot guard the size expression {e} ({type(e).__name__})")

    return r(expr)


def _places(fake_args: tuple):
    """Each size and stride (and symbolic storage offset) of a dynamic trace's tensor
    arguments, in order:
    ``(arg, sympy expression, (C, Python, words) naming the place)``."""
    import sympy

    for i, t in enumerate(fake_args):
        if not isinstance(t, torch.Tensor):
            continue
        for kind, values in (("S", t.shape), ("T", t.stride())):
            for d, v in enumerate(values):
                # the symbol as allocated: ``node.expr`` would apply what the trace learned
                # later (``s0`` -> 64 after a view); those facts are the ShapeEnv's guards
                expr = v.node._expr if isinstance(v, torch.SymInt) else sympy.Integer(v)
                yield i, expr, (f"a[{i}].{'sizes' if kind == 'S' else 'strides'}[{d}]",
                                f"{kind}({i}, {d})",
                                f"{{{i}}}.{'size' if kind == 'S' else 'stride'}({d})")
        # a view's storage offset is a symbol of its own when a dim is dynamic (ShapeEnv's
        # duck sizing); a static offset is not guarded, as in a static specialization
        offset = t.storage_offset()
        if isinstance(offset, torch.SymInt) and not offset.node._expr.is_number:
            yield i, offset.node._expr, (f"a[{i}].storage_offset", f"O({i})",
                                         f"{{{i}}}.storage_offset()")


def _sources(places: list) -> dict:
    """Each symbol's source: the first place that is that bare symbol (all of them before any
    guard is rendered, since a stride may read a symbol that a later stride is)."""
    import sympy

    sources: dict = {}
    for _, expr, here in places:
        if isinstance(expr, sympy.Symbol):
            sources.setdefault(expr, here)
    return sources


def size_sources(fake_args: tuple) -> dict:
    """Where each symbol of a dynamic trace is read, for ``size_expr``."""
    return _sources(list(_places(fake_args)))


def size_expr(value: "torch.SymInt", sources: dict) -> dict:
    """A SymInt of a dynamic trace as ``{"c", "py", "text"}`` over the arguments' sizes (each
    symbol read at its source in ``size_sources``, as the guards read it)."""
    c, py, text = _render(value.node._expr, sources)
    return {"c": c, "py": py, "text": text}


def symbolic_guards(fake_args: tuple, shape_env) -> list[Guard]:
    """Note [Symbolic guards]: guards over the sizes and strides of a dynamic trace."""
    import sympy
    from torch.utils._sympy.numbers import IntInfinity

    places = list(_places(fake_args))
    sources = _sources(places)
    guards: list[Guard] = []

    def guard(expr, arg: int) -> None:
        c, py, text = _render(expr, sources)
        guards.append(Guard("sym", True, arg, expr={"c": c, "py": py, "text": text}))

    for i, expr, here in places:
        if isinstance(expr, sympy.Symbol) and sources[expr] is here:
            bounds = shape_env.var_to_range[expr]
            guard(sympy.Ge(expr, int(bounds.lower)), i)
            if not isinstance(bounds.upper, IntInfinity) and bounds.upper != sympy.oo:
                guard(sympy.Le(expr, int(bounds.upper)), i)
            continue
        c, py, text = _render(expr, sources)
        guards.append(Guard("sym", True, i, expr={"c": f"{here[0]} == {c}",
                                                  "py": f"{here[1]} == {py}",
                                                  "text": f"{here[2]} == {text}"}))
    last = max((i for i, _, _ in places), default=0)
    for g in shape_env.guards:
        guard(g.expr, last)
    return guards
