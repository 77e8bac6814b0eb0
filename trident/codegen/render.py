"""Codegen: render one specialization of a function into the C source of its module.

Everything is decided here; the templates (``templates/scm.c.jinja``, the main translation unit;
``scm_guard.c.jinja``; ``scm_part.c.jinja``, a part of the launch sequence: Note [Parallel C
build] in build.py) only loop over the prepared values. Each step carries the user's line.
"""

from __future__ import annotations

import functools
import jinja2

from trident import config
from trident.codegen import checks, cpu as target_cpu, cuda as target_cuda, size_steps
from trident.codegen.cprint import c_comment, c_float, c_int, c_string, out_spec_code, size_c
from trident.codegen.guards import guard_checks
from trident.codegen.target import CStep, Prologue, Release, Take, Target
from trident.codegen.units import Rendered, guard_parts, step_parts
from trident.ir.operands import (Arg, Bool, Bools, Device, Float, Floats, Int, IntList, Ints, Item,
                                 NoneConst, Operand, OptTensors, Scalar, Str, Tensors, Val)
from trident.ir.guards import SizeRelation
from trident.ir.launch import TritonLaunch
from trident.ir.plan import OpCall, SizeStep, Step, TritonStep
from trident.lower import passes
from trident.ir.specialization import Specialization


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(config.TEMPLATE_DIRS),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True)


def _target_of(device: str) -> Target:
    """The target of tensors on ``device`` (``"cpu"``, ``"cuda:0"``)."""
    return target_cuda if device.startswith("cuda") else target_cpu


def _target_of_spec(spec: Specialization) -> Target:
    """The target of a specialization's launch sequence: CUDA when its tensor arguments are all
    on one CUDA device, else the CPU's."""
    return _target_of("cuda" if spec.cuda_device is not None else "cpu")


# Note [Checked size steps]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# Size steps (Note [Symbolic sizes] in plan.py) are Python's int operators computed in C on
# int64, and Python's ints do not wrap: ``n * 4`` with ``n = 2**62`` is 2**64 in eager, and a
# counter an attribute write multiplies (Note [Attribute writes]) grows past 2**63. So each step
# is checked (trident_rt.h's ``trt_add_ck`` ... ``trt_mod_ck``, GCC's and Clang's
# ``__builtin_*_overflow``): where Python's answer is no int64, or Python raises (a zero divisor
# of ``//`` or ``%``: ZeroDivisionError), the step jumps to the eager label and the call runs
# eagerly (TRT_EAGER), which gives Python's big int or raises eager's exception; never a wrapped
# value, never C's SIGFPE (``INT64_MIN // -1`` included). Size steps read only the call's sizes,
# int arguments and earlier size steps, so the renderer puts them before the first step whose
# effect the caller could see (``first`` in size_steps.py): a failing check always leaves nothing
# done. The guards' size relations (Note [Symbolic guards] in lower/guards.py) are computed the
# same way (``CPrinter(checked=True)``, the ``trt_*_x`` forms, which set ``bad``): a relation
# int64 cannot decide makes ``guard()`` return -1 and the call eager, not a miss that would
# trace again. A launch's symbolic grid and int arguments (Note [Symbolic launches]) are range
# guarded by such relations over the same expressions, so they are computed unchecked.
# A true division (``n / 2``: Python's float) is computed in double from operands of at most
# 2**53 in magnitude, which a double holds exactly, so IEEE's correctly rounded quotient is
# Python's (``int.__truediv__``); larger ones, and a zero divisor, run eagerly.


class _SpecRenderer:
    """Turns one specialization's plan into C declarations and statements."""

    def __init__(self, spec: Specialization, op_index, callbacks: list, kernels):
        self.spec = spec
        self.op_index = op_index
        self.callbacks = callbacks
        self.kernels = kernels  # target_cuda.Kernels: the module's cubins
        self.target = _target_of_spec(spec)  # its launch sequence's
        self.targets = {self.target}  # and its Triton launches'
        self.statics: list[str] = []
        self.locals: list[str] = []
        self.on_error = "fail"  # the label a failing step jumps to (Note [Errors inside try])
        self.static_prefix = "k"  # its module-level arrays' names (Note [Value checks]: "q")
        # Note [Views in C] in plan.py: views not yet made into tensors live in w[slot]; a slot
        # is free again once its view is released
        self.views: dict[int, tuple[int, bool]] = {}  # value -> (slot, made as eager makes it)
        self.free_slots: list[int] = []
        self.num_slots = 0

    def static_array(self, ctype: str, items: list[str]) -> str:
        name = f"{self.static_prefix}{len(self.statics)}"
        self.statics.append(f"static const {ctype} {name}[] = {{{', '.join(items)}}};")
        return name

    def operand(self, o: Operand) -> str:
        """The C ``trt_value`` of an operand (lists and computed ints in ``self.locals``)."""
        match o:
            case Arg(i):
                return f"TRT_T(a[{i}].tensor)"
            case Val(i):
                return f"TRT_T(v[{i}])"
            case Item(lst, i):
                return f"TRT_T(l[{lst}].u.items[{i}].u.t)"
            case Scalar(i):
                return f"s[{i}]"
            case Int(v):
                return f"TRT_I({c_int(v)})"
            case Float(v):
                return f"TRT_F({c_float(v)})"
            case Bool(v):
                return f"TRT_B({int(v)})"
            case NoneConst():
                return "TRT_NONE_V"
            case Str(v):
                return f"TRT_S({c_string(v)})"
            case Device(device_type, index):
                return f"TRT_DEV({device_type}, {index})"
            case Ints(v) | Bools(v):
                macro = "TRT_IL" if isinstance(o, Ints) else "TRT_BL"
                if not v:
                    return f"{macro}(NULL, 0)"
                name = self.static_array("int64_t", [c_int(int(x)) for x in v])
                return f"{macro}({name}, {len(v)})"
            case Floats(v):
                name = self.static_array("double", [c_float(x) for x in v])
                return f"TRT_FL({name}, {len(v)})"
            case IntList(v):  # Note [Symbolic sizes] in plan.py: some items computed
                name = f"il{len(self.locals)}"
                items = ", ".join(self.int_expr(i) for i in v)
                self.locals.append(f"int64_t {name}[] = {{{items}}};")
                return f"TRT_IL({name}, {len(v)})"
            case Tensors(v) | OptTensors(v):
                name = f"t{len(self.locals)}"
                items = ", ".join(self.operand(item) for item in v) or "TRT_NONE_V"
                self.locals.append(f"trt_value {name}[] = {{{items}}};")
                macro = "TRT_TL" if isinstance(o, Tensors) else "TRT_OTL"
                return f"{macro}({name}, {len(v)})"
        raise ValueError(f"not an operand a step can pass: {o}")

    def tensor(self, o: Arg | Val | Item) -> str:
        """The C ``trt_tensor*`` of a tensor operand (borrowed)."""
        return self.operand(o)[len("TRT_T("):-1]

    def int_expr(self, o: Int | Scalar) -> str:
        """An int operand as a C int64 expression."""
        return c_int(o.v) if isinstance(o, Int) else f"s[{o.i}].u.i"

    def int_step(self, s: SizeStep) -> CStep:
        """Note [Symbolic sizes] in plan.py: size arithmetic in C."""
        return size_steps.render(s, self.int_expr, self.on_error)

    def releases(self, s) -> list[Release]:
        out = []
        for rel in s.release:
            if isinstance(rel, Val) and rel.i in self.views:  # a tensor only if one was made
                self.free_slots.append(self.views.pop(rel.i)[0])
            out.append(Release(rel))
        return out

    def triton(self, index: int, s: TritonStep) -> CStep:
        """A Triton launch, as the target of its tensors launches it."""
        self.locals = []
        target = _target_of(s.launch.device)
        self.targets.add(target)
        launch = target.launch(self, index, s)
        return CStep(launch.KIND, s.where, c_comment(s.text + s.launch.ref.comment),
                     f"triton {s.launch.kernel}", list(launch.locals), list(launch.args),
                     self.releases(s), launch=launch)

    def callback_slot(self, index: int) -> int:
        """The slot in the module's callback table of step ``index`` (a Triton launch that runs
        in Python)."""
        self.callbacks.append(index)
        return len(self.callbacks) - 1

    def grid(self, launch: TritonLaunch) -> list[str]:
        """A launch's grid dims: ints, or Note [Symbolic launches]'s expressions (guarded to
        [0, 2**31))."""
        return [str(g) if isinstance(g, int) else f"(unsigned)({size_c(g)})"
                for g in launch.grid]

    def step(self, index: int, s: Step) -> CStep:
        if isinstance(s, TritonStep):
            return self.triton(index, s)
        if isinstance(s, SizeStep):
            return self.int_step(s)
        return self.call(index, s)

    def call(self, index: int, s: OpCall) -> CStep:
        """A dispatcher call, a view computed in C (Note [Views in C] in plan.py), or a call
        writing into a reused buffer (Note [Buffer reuse] in plan.py)."""
        self.locals = []
        if s.view is not None and (step := self.view_step(s)):
            return step
        for a in s.args:
            self.make_views(a, s)
        args = [self.operand(a) for a in s.args]
        takes = [Take(j, r) for j, r in enumerate(s.results)]
        op = f"{s.op}.{s.overload}" if s.overload else s.op
        step = CStep("aten", s.where, c_comment(s.text), op, self.locals, args,
                     self.releases(s), op_index=self.op_index(s.op, s.overload),
                     nrets=len(s.results), takes=takes)
        if s.out_overload:  # Note [Buffer reuse] in plan.py
            step.kind = "aten_out"
            step.buffer = f"buffer{index}"
            step.out_op_index = self.op_index(s.op, s.out_overload)
            step.reuse = self.target.REUSE
            self.statics.append(f"static trt_tensor* {step.buffer};  /* {op} result, reused */")
        return step

    def make_views(self, o: Operand, s) -> None:
        """Note [Views in C]: the tensor of each view that operand ``o`` reads, unless an earlier
        step made it (``view_tensors``, in ``self.locals``)."""
        self.locals += self.view_tensors(o, s)

    def view_tensors(self, o: Operand, s) -> list[str]:
        """Note [Views in C]: statements that make the tensor of each view that operand ``o``
        reads, unless an earlier step made it."""
        if isinstance(o, (Tensors, OptTensors)):
            return [line for item in o.v for line in self.view_tensors(item, s)]
        if not (isinstance(o, Val) and o.i in self.views):
            return []
        slot, eager = self.views[o.i]
        how = "TRT_VIEW_EAGER" if eager else "TRT_VIEW_KERNEL"
        where = c_string(f"{s.where} (view)" if s else "output (view)")
        return [f"if (trt_view_at(rt, &v[{o.i}], &w[{slot}], {how}, {where})) "
                f"goto {self.on_error};"]

    def view_step(self, s) -> CStep | None:
        """Note [Views in C] in plan.py: a view's geometry in C (trident_views.h); where the
        arithmetic finds what ATen would raise, the op itself is called. None: a form this
        does not compute (the step stays a dispatcher call)."""
        call = self.view_call(s)
        lines = self.locals
        source, result = s.args[0], s.results[0].i
        where = c_string(f"{s.where} ({s.qualified_name})")
        fail = f"{{ rt->set_error({where}, NULL); goto {self.on_error}; }}"
        if call is None and not (isinstance(source, Val) and source.i in self.views):
            return None  # an ordinary dispatcher call
        if call is None:  # the op itself, on its input made as eager makes it
            rest = [self.operand(a) for a in s.args[1:]]
            lines += [f"const trt_value rest[] = {{{', '.join(rest) or 'TRT_NONE_V'}}};",
                      f"if (trt_view_by_op(rt, ops[{self.op_index(s.op, s.overload)}], NULL, "
                      f"&w[{self.views[source.i][0]}], rest, {len(rest)}, &v[{result}], NULL, "
                      f"{where})) goto {self.on_error};"]
            return CStep("view", s.where, c_comment(s.text), s.qualified_name, lines, [],
                         self.releases(s))
        if isinstance(source, Val) and source.i in self.views:
            view_in, tensor = f"&w[{self.views[source.i][0]}]", "NULL"
        else:
            tensor = self.tensor(source)
            lines.append("trt_view in;")
            view_in = "&in"
            call = f"rt->view_of({tensor}, &in) || {call}"  # not strided: the op itself
        alias = s.view.alias
        if alias:  # _unsafe_view: a tensor of its own at once
            lines.append("trt_view out;")
            view_out = "&out"
        else:
            slot = self.free_slots.pop() if self.free_slots else self.num_slots
            self.num_slots = max(self.num_slots, slot + 1)
            view_out = f"&w[{slot}]"
            self.views[result] = (slot, s.view.eager)
        rest = [self.operand(a) for a in s.args[1:]]
        lines += [f"if ({call.format(view_in, view_out)}) {{  /* ATen raises here, or the "
                  f"view is not computed in C: the op itself */",
                  f"  const trt_value rest[] = {{{', '.join(rest) or 'TRT_NONE_V'}}};",
                  f"  if (trt_view_by_op(rt, ops[{self.op_index(s.op, s.overload)}], {tensor}, "
                  f"{view_in}, rest, {len(rest)}, &v[{result}], {'NULL' if alias else view_out}"
                  f", {where})) goto {self.on_error};"]
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
        rank, op, args = s.view.rank, s.qualified_name, s.args

        def dim(o, n=rank):  # maybe_wrap_dim: the rank is static
            if not isinstance(o, Int) or not -max(n, 1) <= o.v < max(n, 1):
                raise _NotComputed
            return o.v % max(n, 1)

        def int_arg(o, none):
            if isinstance(o, NoneConst):
                return none
            if not isinstance(o, (Int, Scalar)):
                raise _NotComputed
            return self.int_expr(o)

        def int_array(o):
            if isinstance(o, Ints):
                items = [c_int(int(v)) for v in o.v]
            elif isinstance(o, IntList) and all(isinstance(i, (Int, Scalar)) for i in o.v):
                items = [self.int_expr(i) for i in o.v]
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
            if op == "aten::permute" and isinstance(args[1], Ints):
                dims = [dim(Int(d)) for d in args[1].v]
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
                elif isinstance(args[1], Ints):
                    dims = [dim(Int(d)) for d in args[1].v]
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

    def prologue(self) -> Prologue:
        """What runs before the first step: the target's (Note [Buffer reuse] in plan.py)."""
        if not any(isinstance(s, OpCall) and s.out_overload for s in self.spec.plan.steps):
            return Prologue()
        return self.target.prologue(self)

    def outputs(self) -> list[str]:
        self.locals = []
        for o in self.spec.plan.outputs:
            self.make_views(o, None)
        lines, moved = self.locals, {}
        kept = self.kept_for_outputs()
        for k, o in enumerate(self.spec.plan.outputs):
            if isinstance(o, Val) and o.i not in moved:  # hand the owned handle over
                moved[o.i] = k
                lines.append(f"out->outs[{k}] = TRT_T(v[{o.i}]); v[{o.i}] = NULL;")
            elif isinstance(o, (Val, Arg, Item)):  # a second handle to the same tensor
                inner = f"out->outs[{moved[o.i]}].u.t" if isinstance(o, Val) else self.tensor(o)
                lines += [f"out->outs[{k}] = TRT_T(rt->retain({inner}));",
                          f"if (!out->outs[{k}].u.t) {{ rt->set_error(\"output {k}\", NULL); "
                          f"goto fail; }}"]
            else:
                lines.append(f"out->outs[{k}] = {self.operand(o)};")
        for i in kept:
            lines.append(f"{Release(Val(i)).statement}  "
                         f"/* the base of a returned view */")
        return lines

    def kept_for_outputs(self) -> list[int]:
        """Values no step releases that are not outputs: the bases of returned views, kept
        until those are made (Note [Views in C] in plan.py)."""
        plan = self.spec.plan
        made = {r.i for s in plan.steps for r in s.results if isinstance(r, Val)}
        released = {r.i for s in plan.steps for r in s.release if isinstance(r, Val)}
        returned = {o.i for o in plan.outputs if isinstance(o, Val)}
        return sorted(made - released - returned)

    def render(self) -> dict:
        plan = self.spec.plan
        steps = []
        order = size_steps.first(plan.steps)  # Note [Checked size steps]
        in_order = [plan.steps[i] for i in order]
        statics = []  # per step, the module-level declarations it added (its part's)
        for i, s, clean in zip(order, in_order, passes.rerun_eagerly(in_order)):
            self.on_error = "eager" if clean else "fail"  # Note [Errors inside try]
            before = len(self.statics)
            steps.append(self.step(i, s))
            steps[-1].on_error = self.on_error
            statics.append(self.statics[before:])
        in_parts = len(self.statics)
        self.on_error = "fail"  # the outputs: after the last step
        prologue = self.prologue()
        self.statics += prologue.statics
        checked = any(isinstance(g, SizeRelation) for g in self.spec.guards)
        outputs = self.outputs()
        return {
            "signature": c_comment(self.spec.signature),
            "guard_parts": guard_parts(guard_checks(self.spec.guards, self.spec.arg_names)),
            # Note [Checked size steps]: a size relation int64 cannot decide: eager
            "checked_guards": checked,
            "guard_failed": "bad ? -1 : 0" if checked else "0",
            "guard_error": c_string(f"the guards of {self.spec.signature}"),
            "statics": self.statics[in_parts:],  # the prologue's and the outputs'
            "num_values": plan.num_values,
            "num_lists": plan.num_lists,
            "num_scalars": plan.num_scalars,
            "parts": step_parts(steps, statics),
            "frame": list(prologue.frame),
            "prologue": list(prologue.lines),
            "num_views": self.num_slots,
            "max_rets": max([len(s.results) for s in plan.steps] + [1]),
            "outputs": outputs,
            "nouts": len(plan.outputs),
            "out_spec": c_string(out_spec_code(plan.out_spec)),
            "graph": passes.graph_device(self.spec) is not None,  # Note [CUDA graphs]
            "graph_error": c_string(f"CUDA graph of {self.spec.signature}"),
            "eager": any(step.on_error == "eager" for step in steps),
        }


class _NotComputed(Exception):
    """A view step's form that trident_views.h does not compute (Note [Views in C])."""


def render(spec: Specialization, function: str) -> Rendered:
    """The C source of ``spec``'s module (Note [Incremental modules] in build.py: one module
    per specialization)."""
    ops: dict[tuple[str, str], int] = {}
    callbacks: list[int] = []

    def op_index(op: str, overload: str) -> int:
        return ops.setdefault((op, overload), len(ops))

    kernels = target_cuda.Kernels()
    renderer = _SpecRenderer(spec, op_index, callbacks, kernels)
    rendered = renderer.render()
    rendered["checks"] = checks.render_checks(spec, _SpecRenderer, op_index, callbacks, kernels)
    used = set(renderer.targets)
    if rendered["graph"]:  # Note [CUDA graphs]
        used.add(target_cuda)
    headers = sorted({h for target in used for h in target.HEADERS})
    if any(isinstance(s, OpCall) and s.view is not None for s in checks.all_steps(spec)):
        headers.append("trident_views.h")
    env = environment()
    context = dict(function=c_comment(function), spec=rendered, headers=headers,
                   kernel_externs=kernels.externs)
    main = env.get_template("scm.c.jinja").render(
        context,
        ops=[{"name": c_string(n), "overload": c_string(o),
              "comment": c_comment(f"{n}.{o}" if o else n)}
             for (n, o) in ops],
        kernels=kernels.decls,
        kernel_addresses=[f"&{name}" for name in kernels.names.values()],
        num_callbacks=len(callbacks),
    )
    guards = [env.get_template("scm_guard.c.jinja").render(context, part=part)
              for part in rendered["guard_parts"]]
    parts = [env.get_template("scm_part.c.jinja").render(context, part=part)
             for part in rendered["parts"]]
    return Rendered((main, *guards, *parts), callbacks, kernels.cubins)
