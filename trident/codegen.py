"""Codegen: render a function's specializations into one C source (the SCM).

Everything is decided here; ``templates/scm.c.jinja`` only loops over the prepared values.
Each step of a launch sequence is commented with the user's source line that produced it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import jinja2

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
    if math.isnan(f):
        return "NAN"
    if math.isinf(f):
        return "INFINITY" if f > 0 else "-INFINITY"
    return f"{float.hex(f)} /* {f!r} */"


def c_comment(s: str) -> str:
    return s.replace("*/", "* /")


@dataclasses.dataclass
class CStep:
    where: str
    text: str
    op: str
    op_index: int
    locals: list[str]
    args: list[str]
    nrets: int
    takes: list[str]
    releases: list[str]


class _SpecRenderer:
    """Turns one specialization's plan into C declarations and statements."""

    def __init__(self, index: int, spec: Specialization, op_index):
        self.index = index
        self.spec = spec
        self.op_index = op_index
        self.statics: list[str] = []
        self.locals: list[str] = []

    def static_array(self, ctype: str, items: list[str]) -> str:
        name = f"k{self.index}_{len(self.statics)}"
        self.statics.append(f"static const {ctype} {name}[] = {{{', '.join(items)}}};")
        return name

    def operand(self, o: dict) -> str:
        k = o["k"]
        if k == "arg":
            return f"TRT_T(a[{o['i']}].tensor)"
        if k == "val":
            return f"TRT_T(v{o['i']})"
        if k == "item":
            return f"TRT_T(l{o['list']}.u.items[{o['i']}].u.t)"
        if k == "int":
            return f"TRT_I({o['v']}LL)"
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
            name = self.static_array("int64_t", [f"{int(v)}LL" for v in o["v"]])
            return f"{macro}({name}, {len(o['v'])})"
        if k == "floats":
            name = self.static_array("double", [c_float(v) for v in o["v"]])
            return f"TRT_FL({name}, {len(o['v'])})"
        if k in ("tensors", "opt_tensors"):
            name = f"t{len(self.locals)}"
            items = ", ".join(self.operand(item) for item in o["v"]) or "TRT_NONE_V"
            self.locals.append(f"trt_value {name}[] = {{{items}}};")
            macro = "TRT_TL" if k == "tensors" else "TRT_OTL"
            return f"{macro}({name}, {len(o['v'])})"
        raise ValueError(f"unknown operand {o}")

    def step(self, s) -> CStep:
        self.locals = []
        args = [self.operand(a) for a in s.args]
        takes = []
        for j, r in enumerate(s.results):
            if r["k"] == "val":
                takes.append(f"v{r['i']} = r[{j}].u.t;")
            else:
                takes.append(f"l{r['i']} = r[{j}];")
        releases = []
        for rel in s.release:
            if rel["k"] == "val":
                releases.append(f"rt->release(v{rel['i']}); v{rel['i']} = NULL;")
            else:
                releases.append(f"rt->release_list(&l{rel['i']});")
        op = f"{s.op}.{s.overload}" if s.overload else s.op
        return CStep(s.where, c_comment(s.text), op, self.op_index(s.op, s.overload),
                     self.locals, args, len(s.results), takes, releases)

    def outputs(self) -> list[str]:
        lines, moved = [], set()
        for k, o in enumerate(self.spec.plan.outputs):
            if o["k"] == "val" and o["i"] not in moved:
                moved.add(o["i"])
                lines.append(f"out->outs[{k}] = TRT_T(v{o['i']}); v{o['i']} = NULL;")
            elif o["k"] in ("val", "arg", "item"):
                inner = self.operand(o)[len("TRT_T("):-1]
                lines.append(f"out->outs[{k}] = TRT_T(rt->retain({inner}));")
            else:
                lines.append(f"out->outs[{k}] = {self.operand(o)};")
        return lines

    def render(self) -> dict:
        plan = self.spec.plan
        steps = [self.step(s) for s in plan.steps]
        return {
            "index": self.index,
            "signature": c_comment(self.spec.signature),
            "guards": [(g.c_expr(), c_comment(g.describe(self.spec.arg_names))) for g in
                       self.spec.guards],
            "statics": self.statics,
            "tensor_vars": [f"v{i}" for i in range(plan.num_values)],
            "list_vars": [f"l{i}" for i in range(plan.num_lists)],
            "steps": steps,
            "max_rets": max([len(s.results) for s in plan.steps] + [1]),
            "outputs": self.outputs(),
            "nouts": len(plan.outputs),
            "out_spec": c_string(plan.out_spec),
        }


def render(specs: list[Specialization], function: str) -> str:
    """The SCM's C source for ``specs`` (in guard-evaluation order)."""
    ops: dict[tuple[str, str], int] = {}

    def op_index(op: str, overload: str) -> int:
        return ops.setdefault((op, overload), len(ops))

    rendered = [_SpecRenderer(i, s, op_index).render() for i, s in enumerate(specs)]
    return environment().get_template("scm.c.jinja").render(
        function=c_comment(function),
        specs=rendered,
        ops=[{"name": c_string(n), "overload": c_string(o), "comment": f"{n}.{o}" if o else n}
             for (n, o) in ops],
    )
