"""Codegen: render one specialization of a function into the C source of its module.

Everything is decided here; ``templates/scm.c.jinja`` only loops over the prepared values.
Each step of a launch sequence is commented with the user's source line that produced it.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import math
import struct
from pathlib import Path
from typing import NamedTuple

import jinja2

from .guards import c_int
from .plan import rerun_eagerly
from .specialization import Specialization

# Installed, setup.py maps templates/ to trident/templates; in a source checkout it sits beside.
_HERE = Path(__file__).resolve().parent
TEMPLATE_DIRS = [str(_HERE / "templates"), str(_HERE.parent / "templates")]


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIRS),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True)


def c_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=True)


def c_float(f: float) -> str:
    if math.isnan(f):  # keep the sign and payload: guards compare NaNs by bit pattern
        bits = struct.unpack("<Q", struct.pack("<d", f))[0]
        payload = bits & ((1 << 51) - 1)
        return f"{'-' if bits >> 63 else ''}__builtin_nan(\"{payload:#x}\")"
    if math.isinf(f):
        return "INFINITY" if f > 0 else "-INFINITY"
    return f"{float.hex(f)} /* {f!r} */"


def c_comment(s: str) -> str:
    return s.replace("*/", "* /")


@dataclasses.dataclass
class CStep:
    """One step as the template prints it. ``kind``: ``aten`` (a boxed dispatcher call),
    ``aten_out`` (the same, writing into a reused buffer: Note [Buffer reuse] in plan.py),
    ``cuda`` (a Triton launch through the driver), ``callback`` (a Triton launch through
    Triton's interpreter, in Python) or ``int`` (size arithmetic, its one statement in
    ``locals``)."""

    kind: str
    where: str
    text: str
    op: str
    locals: list[str]
    args: list[str]
    releases: list[str]
    op_index: int = 0
    nrets: int = 0
    takes: list[str] = dataclasses.field(default_factory=list)
    kernel: str = ""  # cuda: the trt_kernel variable
    device: int = 0
    grid: tuple = (1, 1, 1)
    slot: int = 0  # callback: index into the module's callback table
    buffer: str = ""  # aten_out: the static buffer the .out overload writes
    out_op_index: int = 0
    reuse: str = ""  # aten_out: the C condition under which the buffer is reused
    on_error: str = "fail"  # the label an error jumps to: "eager" (Note [Errors inside try])


class Rendered(NamedTuple):
    """A specialization's module: its C source; per callback slot, the index of the step it
    launches; per kernel of the module, its cubin (``scm_set_cubin`` hands it over at install:
    the source names only its size and SHA-256)."""

    source: str
    callbacks: list[int]
    cubins: list[bytes]


# "int" steps (Note [Symbolic sizes] in plan.py): Python's int operators in C
_C_INT_OPS = {"mul": "{} * {}", "add": "{} + {}", "sub": "{} - {}",
              "floordiv": "trt_floordiv({}, {})", "remainder": "trt_mod({}, {})"}

_CUDA_SCALAR = {"int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
                "uint64_t"}


class _Kernels:
    """The module's compiled kernels, one ``trt_kernel`` per distinct binary (a kernel launched
    from every layer of a model is stored once)."""

    def __init__(self):
        self.names: dict[tuple, str] = {}
        self.decls: list[str] = []
        self.cubins: list[bytes] = []

    def add(self, kernel: str, binary: dict) -> str:
        key = (binary["cubin"], binary["name"], binary["threads"], binary["shared"],
               binary["num_ctas"], binary["cooperative"], binary["pdl"])
        if key in self.names:
            return self.names[key]
        name = f"kernel{len(self.names)}"
        cubin = base64.b64decode(binary["cubin"])
        self.decls.append(
            f"/* {kernel}: {binary['arch']} cubin, {len(cubin)} bytes, sha256 "
            f"{hashlib.sha256(cubin).hexdigest()} */\n"
            f"static trt_kernel {name} = {{{c_string(binary['name'])}, NULL, "
            f"{binary['threads']}, {binary['shared']}, {binary['num_ctas']}, "
            f"{int(binary['cooperative'])}, {int(binary['pdl'])}, {{0}}}};")
        self.names[key] = name
        self.cubins.append(cubin)
        return name


class _SpecRenderer:
    """Turns one specialization's plan into C declarations and statements."""

    def __init__(self, spec: Specialization, op_index, callbacks: list, kernels: "_Kernels"):
        self.spec = spec
        self.op_index = op_index
        self.callbacks = callbacks
        self.kernels = kernels
        self.statics: list[str] = []
        self.locals: list[str] = []
        self.uses_cuda = False
        # Note [Views in C] in plan.py: views not yet made into tensors live in w[slot]; a slot
        # is free again once its view is released
        self.views: dict[int, tuple[int, bool]] = {}  # value -> (slot, made as eager makes it)
        self.free_slots: list[int] = []
        self.num_slots = 0

    def static_array(self, ctype: str, items: list[str]) -> str:
        name = f"k{len(self.statics)}"
        self.statics.append(f"static const {ctype} {name}[] = {{{', '.join(items)}}};")
        return name

    def operand(self, o: dict) -> str:
        k = o["k"]
        if k == "arg":
            return f"TRT_T(a[{o['i']}].tensor)"
        if k == "val":
            return f"TRT_T(v[{o['i']}])"
        if k == "item":
            return f"TRT_T(l[{o['list']}].u.items[{o['i']}].u.t)"
        if k == "scalar":
            return f"s[{o['i']}]"
        if k == "int":
            return f"TRT_I({c_int(o['v'])})"
        if k == "float":
            return f"TRT_F({c_float(o['v'])})"
        if k == "bool":
            return f"TRT_B({int(o['v'])})"
        if k == "none":
            return "TRT_NONE_V"
        if k == "str":
            return f"TRT_S({c_string(o['v'])})"
        if k == "device":
            return f"TRT_DEV({o['type']}, {o['index']})"
        if k in ("ints", "bools"):
            macro = "TRT_IL" if k == "ints" else "TRT_BL"
            if not o["v"]:
                return f"{macro}(NULL, 0)"
            name = self.static_array("int64_t", [c_int(int(v)) for v in o["v"]])
            return f"{macro}({name}, {len(o['v'])})"
        if k == "floats":
            name = self.static_array("double", [c_float(v) for v in o["v"]])
            return f"TRT_FL({name}, {len(o['v'])})"
        if k == "int_list":  # Note [Symbolic sizes] in plan.py: some items computed
            name = f"il{len(self.locals)}"
            items = ", ".join(self.int_expr(i) for i in o["v"])
            self.locals.append(f"int64_t {name}[] = {{{items}}};")
            return f"TRT_IL({name}, {len(o['v'])})"
        if k in ("tensors", "opt_tensors"):
            name = f"t{len(self.locals)}"
            items = ", ".join(self.operand(item) for item in o["v"]) or "TRT_NONE_V"
            self.locals.append(f"trt_value {name}[] = {{{items}}};")
            macro = "TRT_TL" if k == "tensors" else "TRT_OTL"
            return f"{macro}({name}, {len(o['v'])})"
        raise ValueError(f"unknown operand {o}")

    def int_expr(self, o: dict) -> str:
        """An int operand as a C int64 expression."""
        return c_int(o["v"]) if o["k"] == "int" else f"s[{o['i']}].u.i"

    def int_step(self, s) -> CStep:
        """Note [Symbolic sizes] in plan.py: size arithmetic in C."""
        r = s.results[0]["i"]
        if s.overload == "size":
            (tensor, dim) = s.args
            expr = f"a[{tensor['i']}].sizes[{dim['v']}]"
        else:
            expr = _C_INT_OPS[s.overload].format(*(self.int_expr(a) for a in s.args))
        lines = [f"s[{r}] = TRT_I({expr});"]
        if s.overload in ("floordiv", "remainder"):
            lines.insert(0, f"if ({self.int_expr(s.args[1])} == 0) {{ rt->set_error("
                            f"{c_string(s.where + ' (' + s.overload + ')')}, \"integer division "
                            f"by zero in a size expression\"); goto fail; }}")
        return CStep("int", s.where, c_comment(s.text), f"int {s.overload}", lines, [], [])

    def pointer(self, o: dict) -> str:
        """A tensor operand's data pointer, for a kernel parameter."""
        if o["k"] == "arg":
            return f"(CUdeviceptr)a[{o['i']}].data_ptr"
        if o["k"] == "val" and o["i"] in self.views:  # Note [Views in C]: no tensor needed
            w = f"w[{self.views[o['i']][0]}]"
            return f"(CUdeviceptr)({w}.data + {w}.offset * {w}.itemsize)"
        return f"(CUdeviceptr)rt->data_ptr({self.operand(o)[len('TRT_T('):-1]})"

    def releases(self, s) -> list[str]:
        out = []
        for rel in s.release:
            if rel["k"] == "val" and rel["i"] in self.views:  # a tensor only if one was made
                self.free_slots.append(self.views.pop(rel["i"])[0])
                out.append(f"if (v[{rel['i']}]) {{ rt->release(v[{rel['i']}]); "
                           f"v[{rel['i']}] = NULL; }}")
            elif rel["k"] == "val":
                out.append(f"rt->release(v[{rel['i']}]); v[{rel['i']}] = NULL;")
            else:
                out.append(f"rt->release_list(&l[{rel['i']}]);")
        return out

    def triton(self, index: int, s) -> CStep:
        self.locals = []
        launch = s.launch
        tensors = iter(s.args)
        binary = launch.get("binary")
        grid = [_grid_c(g) for g in launch["grid"]]
        if binary is None:  # CPU tensors: Triton's interpreter, called back in Python
            values = []
            for p in launch["params"]:
                if p["kind"] == "tensor":
                    tensor = next(tensors)
                    self.make_views(tensor, s)  # Note [Views in C]: the interpreter reads tensors
                    values.append(self.operand(tensor))
                elif "size" in p:  # Note [Symbolic launches] in kernels.py
                    values.append(f"TRT_I({p['size']['c']})")
                elif p["kind"] == "scalar":
                    values.append(self.operand(_scalar_operand(p["value"])))
            values += [f"TRT_I({g})" for g in grid]
            self.callbacks.append(index)
            return CStep("callback", s.where, c_comment(s.text), f"triton {s.overload}",
                         self.locals, values, self.releases(s), slot=len(self.callbacks) - 1)
        self.uses_cuda = True
        name = self.kernels.add(launch["kernel"], binary)
        params = []
        for p, ctype in zip(launch["params"], binary["arg_types"]):
            if p["kind"] == "tensor":
                operand = next(tensors)
            if ctype is None:
                continue
            var = f"p{len(params)}"
            if p["kind"] == "tensor":
                self.locals.append(f"CUdeviceptr {var} = {self.pointer(operand)};  "
                                   f"/* {p['name']} */")
            elif "size" in p:  # Note [Symbolic launches] in kernels.py
                words = c_comment(p["size"]["text"].format(*self.spec.arg_names))
                self.locals.append(f"{ctype} {var} = ({ctype}){p['size']['c']};  "
                                   f"/* {p['name']} = {words} */")
            elif ctype in _CUDA_SCALAR:
                self.locals.append(f"{ctype} {var} = {int(p['value'])};  /* {p['name']} */")
            else:
                self.locals.append(f"{ctype} {var} = {c_float(float(p['value']))};  "
                                   f"/* {p['name']} */")
            params.append(f"&{var}")
        self.locals.append("CUdeviceptr scratch[2] = {0, 0};  /* Triton's global and profile "
                           "scratch */")
        params += ["&scratch[0]", "&scratch[1]"]
        device = int(launch["device"].split(":")[1]) if ":" in launch["device"] else 0
        return CStep("cuda", s.where, c_comment(s.text), f"triton {s.overload}", self.locals,
                     params, self.releases(s), kernel=name, device=device, grid=tuple(grid))

    def step(self, index: int, s) -> CStep:
        if s.op == "triton":
            return self.triton(index, s)
        if s.op == "int":
            return self.int_step(s)
        self.locals = []
        if s.view is not None and (step := self.view_step(s)):
            return step
        for a in s.args:
            self.make_views(a, s)
        args = [self.operand(a) for a in s.args]
        takes = []
        for j, r in enumerate(s.results):
            if r["k"] == "val":
                takes.append(f"v[{r['i']}] = r[{j}].u.t;")
            elif r["k"] == "scalar":
                takes.append(f"s[{r['i']}] = r[{j}];")
            elif r["k"] == "list":
                takes.append(f"l[{r['i']}] = r[{j}];")
            else:  # dropped (an undefined tensor): give back whatever came
                takes.append(f"if (r[{j}].tag == TRT_TENSOR) rt->release(r[{j}].u.t);")
        op = f"{s.op}.{s.overload}" if s.overload else s.op
        step = CStep("aten", s.where, c_comment(s.text), op, self.locals, args,
                     self.releases(s), op_index=self.op_index(s.op, s.overload),
                     nrets=len(s.results), takes=takes)
        if s.out_overload:  # Note [Buffer reuse] in plan.py
            step.kind = "aten_out"
            step.buffer = f"buffer{index}"
            step.out_op_index = self.op_index(s.op, s.out_overload)
            step.reuse = "reuse" if self.cuda_device() is not None else "!env->inference_mode"
            self.statics.append(f"static trt_tensor* {step.buffer};  /* {op} result, reused */")
        return step

    def make_views(self, o: dict, s) -> None:
        """Note [Views in C]: the tensor of each view that operand ``o`` reads, unless an earlier
        step made it."""
        if o["k"] in ("tensors", "opt_tensors"):
            for item in o["v"]:
                self.make_views(item, s)
        elif o["k"] == "val" and o["i"] in self.views:
            slot, eager = self.views[o["i"]]
            how = "TRT_VIEW_EAGER" if eager else "TRT_VIEW_KERNEL"
            where = c_string(f"{s.where} (view)" if s else "output (view)")
            self.locals.append(f"if (!v[{o['i']}] && !(v[{o['i']}] = rt->view_tensor(&w[{slot}], "
                               f"{how}))) {{ rt->set_error({where}, NULL); goto fail; }}")

    def view_step(self, s) -> CStep | None:
        """Note [Views in C] in plan.py: a view's geometry in C (trident_views.h); where the
        arithmetic finds what ATen would raise, the op itself is called. None: a form this
        does not compute (the step stays a dispatcher call)."""
        call = self.view_call(s)
        lines = self.locals
        source, result = s.args[0], s.results[0]["i"]
        where = c_string(f"{s.where} ({s.qualified_name})")
        fail = f"{{ rt->set_error({where}, NULL); goto fail; }}"
        if call is None and not (source["k"] == "val" and source["i"] in self.views):
            return None  # an ordinary dispatcher call
        if call is None:  # the op itself, on its input made as eager makes it
            rest = [self.operand(a) for a in s.args[1:]]
            lines += [f"const trt_value rest[] = {{{', '.join(rest) or 'TRT_NONE_V'}}};",
                      f"if (trt_view_by_op(rt, ops[{self.op_index(s.op, s.overload)}], NULL, "
                      f"&w[{self.views[source['i']][0]}], rest, {len(rest)}, &v[{result}], NULL"
                      f")) {fail}"]
            return CStep("view", s.where, c_comment(s.text), s.qualified_name, lines, [],
                         self.releases(s))
        if source["k"] == "val" and source["i"] in self.views:
            view_in, tensor = f"&w[{self.views[source['i']][0]}]", "NULL"
        else:
            tensor = self.operand(source)[len("TRT_T("):-1]
            lines.append("trt_view in;")
            view_in = "&in"
            call = f"rt->view_of({tensor}, &in) || {call}"  # not strided: the op itself
        alias = s.view["alias"]
        if alias:  # _unsafe_view: a tensor of its own at once
            lines.append("trt_view out;")
            view_out = "&out"
        else:
            slot = self.free_slots.pop() if self.free_slots else self.num_slots
            self.num_slots = max(self.num_slots, slot + 1)
            view_out = f"&w[{slot}]"
            self.views[result] = (slot, s.view["eager"])
        rest = [self.operand(a) for a in s.args[1:]]
        lines += [f"if ({call.format(view_in, view_out)}) {{  /* ATen raises here, or the "
                  f"view is not computed in C: the op itself */",
                  f"  const trt_value rest[] = {{{', '.join(rest) or 'TRT_NONE_V'}}};",
                  f"  if (trt_view_by_op(rt, ops[{self.op_index(s.op, s.overload)}], {tensor}, "
                  f"{view_in}, rest, {len(rest)}, &v[{result}], {'NULL' if alias else view_out}"
                  f")) {fail}"]
        if alias:
            lines.append(f"}} else if (!(v[{result}] = rt->view_tensor(&out, TRT_VIEW_ALIAS))) "
                         f"{fail}")
        else:
            lines.append("}")
        return CStep("view", s.where, c_comment(s.text), s.qualified_name, lines, [],
                     self.releases(s))

    def view_call(self, s) -> str | None:
        """The trident_views.h call of a view step, with ``{0}``/``{1}`` for its input and
        output, or None."""
        rank, op, args = s.view["rank"], s.qualified_name, s.args

        def dim(o, n=rank):  # maybe_wrap_dim: the rank is static
            if o["k"] != "int" or not -max(n, 1) <= o["v"] < max(n, 1):
                raise _NotComputed
            return o["v"] % max(n, 1)

        def int_arg(o, none):
            if o["k"] == "none":
                return none
            if o["k"] not in ("int", "scalar"):
                raise _NotComputed
            return self.int_expr(o)

        def int_array(o):
            if o["k"] == "ints":
                items = [c_int(int(v)) for v in o["v"]]
            elif o["k"] == "int_list" and all(i["k"] in ("int", "scalar") for i in o["v"]):
                items = [self.int_expr(i) for i in o["v"]]
            else:
                raise _NotComputed
            if len(items) > 16:
                raise _NotComputed
            name = f"z{len(self.locals)}"
            self.locals.append(f"const int64_t {name}[] = {{{', '.join(items) or '0'}}};")
            return f"{name}, {len(items)}"

        try:
            if op == "aten::t" and rank <= 2:
                return f"trt_view_transpose({{0}}, 0, {1 if rank == 2 else 0}, {{1}})"
            if op == "aten::transpose.int":
                return f"trt_view_transpose({{0}}, {dim(args[1])}, {dim(args[2])}, {{1}})"
            if op == "aten::permute" and args[1]["k"] == "ints":
                dims = [dim({"k": "int", "v": d}) for d in args[1]["v"]]
                if sorted(dims) != list(range(rank)):
                    return None
                return f"trt_view_permute({{0}}, {self.static_array('int64_t', [str(d) for d in dims]) if dims else 'NULL'}, {{1}})"
            if op == "aten::unsqueeze":
                return f"trt_view_unsqueeze({{0}}, {dim(args[1], rank + 1)}, {{1}})"
            if op in ("aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims"):
                if op == "aten::squeeze":
                    dims = range(rank)
                elif op == "aten::squeeze.dim":
                    dims = [dim(args[1])]
                elif args[1]["k"] == "ints":
                    dims = [dim({"k": "int", "v": d}) for d in args[1]["v"]]
                else:
                    return None
                mask = sum(1 << d for d in set(dims)) if rank else 0
                return f"trt_view_squeeze({{0}}, {mask:#x}u, {{1}})"
            if op == "aten::slice.Tensor" and len(args) == 5:
                return (f"trt_view_slice({{0}}, {dim(args[1])}, {int_arg(args[2], '0')}, "
                        f"{int_arg(args[3], 'INT64_MAX')}, {int_arg(args[4], '1')}, {{1}})")
            if op == "aten::select.int" and rank > 0:
                return f"trt_view_select({{0}}, {dim(args[1])}, {int_arg(args[2], None)}, {{1}})"
            if op in ("aten::view", "aten::_unsafe_view"):
                return f"trt_view_view({{0}}, {int_array(args[1])}, {{1}})"
            if op == "aten::expand":
                return f"trt_view_expand({{0}}, {int_array(args[1])}, {{1}})"
            if op == "aten::as_strided" and len(args) == 4:
                sizes, strides = int_array(args[1]), int_array(args[2])
                if sizes.split(", ")[1] != strides.split(", ")[1]:
                    return None
                offset = int_arg(args[3], "")
                return (f"trt_view_as_strided({{0}}, {sizes.split(', ')[0]}, "
                        f"{strides.split(', ')[0]}, {sizes.split(', ')[1]}, "
                        f"{0 if offset == '' else 1}, {offset or 0}, {{1}})")
        except _NotComputed:
            return None
        return None

    def cuda_device(self) -> int | None:
        """The CUDA device of a specialization whose tensor arguments are all on it."""
        facts: dict[str, set] = {}
        for g in self.spec.guards:
            if g.field in ("device_type", "device_index"):
                facts.setdefault(g.field, set()).add(g.value)
        if facts.get("device_type") != {1} or len(facts.get("device_index", ())) != 1:
            return None
        return next(iter(facts["device_index"]))

    def prologue(self) -> list[str]:
        """Note [Buffer reuse] in plan.py: on CUDA, buffers are reused on the stream that made
        them, and a call on another stream allocates."""
        device = self.cuda_device()
        if device is None or not any(s.out_overload for s in self.spec.plan.steps):
            return []
        stream = "buffer_stream"
        self.statics.append(f"static void* {stream};  /* the stream the buffers are used on */")
        self.statics.append(f"static int {stream}_set;")
        return [f"void* stream;  /* Note [Buffer reuse]: buffers stay on the stream that made them */",
                f"if (rt->cuda_stream({device}, &stream)) {{ rt->set_error(\"current stream\", "
                f"NULL); goto fail; }}",
                f"if (!{stream}_set) {{ {stream} = stream; {stream}_set = 1; }}",
                f"const int reuse = !env->inference_mode && stream == {stream};"]

    def outputs(self) -> list[str]:
        self.locals = []
        for o in self.spec.plan.outputs:
            self.make_views(o, None)
        lines, moved = self.locals, {}
        kept = self.kept_for_outputs()
        for k, o in enumerate(self.spec.plan.outputs):
            if o["k"] == "val" and o["i"] not in moved:  # hand the owned handle over
                moved[o["i"]] = k
                lines.append(f"out->outs[{k}] = TRT_T(v[{o['i']}]); v[{o['i']}] = NULL;")
            elif o["k"] == "val":  # returned twice: a second handle to the same tensor
                lines.append(f"out->outs[{k}] = TRT_T(rt->retain(out->outs[{moved[o['i']]}].u.t));")
            elif o["k"] in ("arg", "item"):
                inner = self.operand(o)[len("TRT_T("):-1]
                lines.append(f"out->outs[{k}] = TRT_T(rt->retain({inner}));")
            else:
                lines.append(f"out->outs[{k}] = {self.operand(o)};")
        for i in kept:
            lines.append(f"if (v[{i}]) {{ rt->release(v[{i}]); v[{i}] = NULL; }}  "
                         f"/* the base of a returned view */")
        return lines

    def kept_for_outputs(self) -> list[int]:
        """Values no step releases that are not outputs: the bases of returned views, kept
        until those are made (Note [Views in C] in plan.py)."""
        plan = self.spec.plan
        made = {r["i"] for s in plan.steps for r in s.results if r["k"] == "val"}
        released = {r["i"] for s in plan.steps for r in s.release if r["k"] == "val"}
        returned = {o["i"] for o in plan.outputs if o["k"] == "val"}
        return sorted(made - released - returned)

    def render(self) -> dict:
        plan = self.spec.plan
        steps = [self.step(i, s) for i, s in enumerate(plan.steps)]
        if self.spec.catching:  # Note [Errors inside try] in capture.py
            for step, clean in zip(steps, rerun_eagerly(plan)):
                step.on_error = "eager" if clean else "fail"
        return {
            "signature": c_comment(self.spec.signature),
            "guards": [(g.c_expr(), c_comment(g.describe(self.spec.arg_names))) for g in
                       self.spec.guards],
            "statics": self.statics,
            "num_values": plan.num_values,
            "num_lists": plan.num_lists,
            "num_scalars": plan.num_scalars,
            "steps": steps,
            "prologue": self.prologue(),
            "num_views": self.num_slots,
            "max_rets": max([len(s.results) for s in plan.steps] + [1]),
            "outputs": self.outputs(),
            "nouts": len(plan.outputs),
            "out_spec": c_string(plan.out_spec),
            "graph": self.spec.graph_device is not None,  # Note [CUDA graphs]
            "graph_error": c_string(f"CUDA graph of {self.spec.signature}"),
            "eager": any(step.on_error == "eager" for step in steps),
        }


class _NotComputed(Exception):
    """A view step's form that trident_views.h does not compute (Note [Views in C])."""


def _grid_c(g) -> str:
    """A grid dim: an int, or Note [Symbolic launches]'s expression (guarded to [0, 2**31))."""
    return str(g) if isinstance(g, int) else f"(unsigned){g['c']}"


def _scalar_operand(value) -> dict:
    if value is None:
        return {"k": "none"}
    return {"k": {bool: "bool", int: "int", float: "float"}[type(value)], "v": value}


def render(spec: Specialization, function: str) -> Rendered:
    """The C source of ``spec``'s module (Note [Incremental modules] in build.py: one module
    per specialization)."""
    ops: dict[tuple[str, str], int] = {}
    callbacks: list[int] = []

    def op_index(op: str, overload: str) -> int:
        return ops.setdefault((op, overload), len(ops))

    kernels = _Kernels()
    renderer = _SpecRenderer(spec, op_index, callbacks, kernels)
    rendered = renderer.render()
    source = environment().get_template("scm.c.jinja").render(
        function=c_comment(function),
        spec=rendered,
        ops=[{"name": c_string(n), "overload": c_string(o), "comment": f"{n}.{o}" if o else n}
             for (n, o) in ops],
        uses_cuda=renderer.uses_cuda or rendered["graph"],
        uses_views=any(s.view is not None for s in spec.plan.steps),
        kernels=kernels.decls,
        kernel_addresses=[f"&{name}" for name in kernels.names.values()],
        num_callbacks=len(callbacks),
    )
    return Rendered(source, callbacks, kernels.cubins)
