"""The generated C (``f.source()``): a header that says not to edit it, one comment per launch
step naming the user's ``file.py:LINE`` and source text, guards commented in words."""

from __future__ import annotations

import inspect
import linecache
import re

import torch
import torch.nn.functional as F

import trident

HERE = __file__.rsplit("/", 1)[-1]
STEP = re.compile(r"^\s*/\* (?P<where>[^:*]+:\d+): (?P<text>.*) \*/\s*$")


def mlp(x, w1, b1, w2):
    h = x @ w1
    h = h + b1
    h = torch.relu(h)
    y = F.linear(h, w2)
    s = torch.softmax(y, -1)
    return s, h.sum()


def mlp_args():
    return torch.randn(2, 4), torch.randn(4, 8), torch.randn(8), torch.randn(3, 8)


def step_comments(source: str):
    return [m for m in (STEP.match(l) for l in source.splitlines()) if m]


def test_source_is_empty_before_the_first_call():
    assert trident.jit(mlp).source() == ""


def test_header_says_generated_and_do_not_edit():
    jf = trident.jit(mlp)
    jf(*mlp_args())
    src = jf.source()
    assert "Do not edit" in src
    assert "Specialization Cache Module for mlp" in src
    assert '#include "trident_rt.h"' in src


def test_each_step_names_the_users_source_line():
    jf = trident.jit(mlp)
    jf(*mlp_args())
    src = jf.source()
    steps = step_comments(src)
    # one comment per operator call (trident_steps.h's; a step that reuses its buffer calls its
    # op or the .out overload) and view (computed in C)
    calls = (src.count("trt_call_at(") + src.count("trt_call_into(") + src.count("rt->call(")
             + src.count("trt_view_by_op("))
    assert calls >= 5 and len(steps) == calls
    lines, first = inspect.getsourcelines(mlp)
    body = {first + i: l.strip() for i, l in enumerate(lines)}
    seen = set()
    for m in steps:
        file, line = m["where"].rsplit(":", 1)
        assert file == HERE, m.group(0)
        line = int(line)
        assert line in body, f"{m['where']} is not a line of mlp"
        # the comment quotes that very line
        assert m["text"] == body[line] == linecache.getline(__file__, line).strip()
        seen.add(line)
    # every statement that calls a torch op produced at least one step, in program order
    expected = [first + i for i, l in enumerate(lines)
                if any(op in l for op in ("@", "+ b1", "relu", "linear", "softmax", "sum"))]
    assert sorted(seen) == expected
    order = [int(m["where"].rsplit(":", 1)[1]) for m in steps]
    assert order == sorted(order)


def test_error_sites_name_the_same_line_as_the_step_comment():
    jf = trident.jit(mlp)
    jf(*mlp_args())
    src = jf.source()
    for m in step_comments(src):
        assert f'"{m["where"]} (aten::' in src  # rt->set_error("file:LINE (aten::op)", ...)


def test_guards_are_commented_in_words():
    jf = trident.jit(mlp)
    jf(*mlp_args())
    src = jf.source()
    for text in ("x.size(0) == 2", "x.dtype == float32", "w1.stride(0) == 8", "the call's structure and 4 leaves (x, w1, b1, w2)",
                 "b1.dim() == 1", "x is Tensor"):
        # (an argument's header guards share one compare: Note [Argument records])
        assert any(text in c.split("; ") for c in re.findall(r"/\* (.*?) \*/", src)), text


def test_one_module_per_specialization_and_a_miss_builds_only_its_own(trident_cache):
    """Note [Incremental modules] in build.py."""
    jf = trident.jit(dynamic=False)(mlp)
    args = mlp_args()
    jf(*args)
    (folder,) = (trident_cache / "functions").iterdir()
    first = {p.name: p.stat().st_mtime_ns for p in folder.glob("trident_scm_*.so")}
    args2 = (torch.randn(5, 4), *args[1:])
    for got, want in zip(jf(*args2), mlp(*args2)):
        assert torch.equal(got, want)
    for got, want in zip(jf(*args), mlp(*args)):  # the first module still serves
        assert torch.equal(got, want)
    assert (jf.stats.compiles, jf.stats.hits) == (2, 1)
    now = {p.name: p.stat().st_mtime_ns for p in folder.glob("trident_scm_*.so")}
    assert len(first) == 1 and len(now) == 2 and first.items() <= now.items()  # not rebuilt
    sources = [_module_source(p) for p in sorted(folder.glob("trident_scm_*.so"))]
    assert sorted(s.count("static int guard(") for s in sources) == [1, 1]
    # source(): the installed modules' sources, in guard order
    assert jf.source() == "\n".join(sorted(sources, key=lambda s: "float32[5, 4]" in s))


def test_cached_c_file_matches_source():
    jf = trident.jit(mlp)
    jf(*mlp_args())
    import os
    from pathlib import Path

    root = Path(os.environ["TRIDENT_CACHE_DIR"]) / "functions"
    (module,) = root.glob("*/trident_scm_*.so")
    assert _module_source(module) == jf.source()


def _module_source(module) -> str:
    """The C files the cache keeps of a module: its main translation unit, then the others
    (Note [Parallel C build] in build.py), one after another."""
    name = module.name.split(".")[0]
    units = sorted(module.parent.glob(f"{name}.*.c"), key=lambda p: int(p.name.split(".")[1]))
    assert len(units) >= 2  # the guard and a part at least
    return "\n".join(p.read_text() for p in [module.parent / f"{name}.c", *units])


def test_lines_inside_helper_functions_are_attributed_to_the_helper():
    def helper(t):
        return torch.sigmoid(t) * 3

    def f(x):
        y = x - 1
        return helper(y)

    jf = trident.jit(f)
    jf(torch.randn(3))
    where = {m["where"]: m["text"] for m in step_comments(jf.source())}
    lines, first = inspect.getsourcelines(helper)
    assert where.get(f"{HERE}:{first + 1}") == "return torch.sigmoid(t) * 3"
    lines, first = inspect.getsourcelines(f)
    assert where.get(f"{HERE}:{first + 1}") == "y = x - 1"


def test_mlir_names_the_source_file_and_line_of_each_op():
    """Each op's location is the user's file:line (Torch-MLIR's file location) named by its
    line's text; the function's arguments and its return take the locations Torch-MLIR gives
    (the first op's, the last op's), never the caller's line or torch's generated code."""
    jf = trident.jit(mlp)
    text = jf.mlir(*mlp_args())
    assert "func.func @main" in text and "torch.aten.mm" in text  # matmul's C++ body calls mm
    assert jf.stats.compiles == 0  # mlir() does not install anything
    source, first = inspect.getsourcelines(mlp)
    aliases = dict(re.findall(r"^(#loc\d*) = loc\((.*)\)$", text, re.MULTILINE))

    def resolved(loc: str) -> str:  # an alias by what it stands for
        return re.sub(r"#loc\d*", lambda m: resolved(aliases[m[0]]), loc)

    where = [(m[1], resolved(m[2])) for m in re.finditer(
        r"= (torch\.aten\.[\w.]+) .* (loc\(.*\))$", text, re.MULTILINE)]
    assert where[:3] == [(op, f'loc("{source[i].strip()}"("{__file__}":{first + i}:0))')
                         for op, i in (("torch.aten.mm", 1), ("torch.aten.add.Tensor", 2),
                                       ("torch.aten.relu", 3))], where
    for _, loc in where:  # every op, F.linear's and softmax's among them
        m = re.fullmatch(r'loc\("(.*)"\("(.*)":(\d+):0\)\)', loc)
        assert m[2] == __file__ and source[int(m[3]) - first].strip() == m[1], loc
    assert "<string>" not in text and "jf.mlir(" not in text  # no generated code, no caller


def test_output_count_never_overflows_the_result_buffer():
    """An SCM must not write past trt_result.outs[TRT_MAX_OUTS]: functions with more outputs run
    eagerly (or a bigger buffer is used)."""
    from trident.runtime import HEADER

    max_outs = int(re.search(r"#define TRT_MAX_OUTS (\d+)", HEADER.read_text()).group(1))

    def many(x):
        return tuple(x for _ in range(max_outs + 4))

    jf = trident.jit(many)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = jf(torch.ones(1))
        assert len(out) == max_outs + 4
        out = jf(torch.ones(1))
    indices = [int(i) for i in re.findall(r"out->outs\[(\d+)\]", jf.source())]
    assert all(i < max_outs for i in indices)


def test_each_device_type_target_is_a_target():
    """Codegen's targets (one module per device type) have what render asks of a target."""
    from trident.codegen import cpu, cuda
    from trident.codegen.target import Target

    for target in (cpu, cuda):
        assert isinstance(target, Target), target.NAME
