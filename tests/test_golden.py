"""Golden files: checked-in specializations (``tests/golden/<case>.json``) rendered to C by
codegen, without tracing, and compared with the checked-in C (``tests/golden/<case>-<i>.c``, one
module per specialization); the C is then built with cffi and initialized against the runtime.

A change to codegen or the template shows here as a diff of the generated C. After a change
that is meant, write the files again and review their diff:

    cd tests && python -c "import test_golden; test_golden.update()"

(``update`` traces the functions below, so the JSON changes too when capture, import or plan
change what they store.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
import triton

import trident
from trident import build, runtime
from trident.codegen import render as codegen
from trident.ir import operands
from trident.ir.operands import (Arg, Bool, Bools, Device, Drop, Float, Floats, Int, IntList, Ints,
                                 Item, List, NoneConst, OptTensors, Scalar, Str, Tensors, Val)
from trident.ir.specialization import Specialization

from _triton_kernels import add_kernel

GOLDEN = Path(__file__).resolve().parent / "golden"


def mlp(x, w1, b1, w2):
    h = torch.relu(x @ w1 + b1)
    y = torch.nn.functional.linear(h, w2)
    return torch.softmax(y, -1), h.t()[0]


def halves(x, n: int):
    y = x.view(x.shape[0] // 2, -1) * n
    return y.sum(0), y.shape[0]


def triton_add(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return out * 2


def catching(x):
    try:
        return x.pow(-2) + 1
    except RuntimeError:
        return x


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# case -> (function, jit options, the calls that make its specializations)
CASES = {
    "mlp": (mlp, {}, [(_r(2, 4), _r(4, 8, seed=1), _r(8, seed=2), _r(3, 8, seed=3))]),
    "halves_dynamic": (halves, {}, [(_r(4, 3), 2), (_r(6, 3), 2)]),
    "triton_interpreted": (triton_add, {}, [(_r(100), _r(100, seed=1))]),
    "catching": (catching, {}, [(_r(3),)]),
}


def _specs(case: str) -> list[Specialization]:
    return [Specialization.from_json(d)
            for d in json.loads((GOLDEN / f"{case}.json").read_text())]


def _golden_c(case: str) -> list:
    """The checked-in C of each of the case's specializations: one module each (Note
    [Incremental modules] in build.py)."""
    return sorted(GOLDEN.glob(f"{case}-*.c"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_stored_specializations_render_to_the_golden_c(case):
    specs, files = _specs(case), _golden_c(case)
    assert len(files) == len(specs), files
    for i, spec in enumerate(specs):
        source = codegen.render(spec, case).source
        golden = (GOLDEN / f"{case}-{i}.c").read_text()
        assert source == golden, (f"the C of {case}-{i} changed; if that is meant, run update() "
                                  "(see this module's docstring) and review the diff")


@pytest.mark.parametrize("case", sorted(CASES))
def test_stored_specializations_read_back_as_written(case):
    """The stored JSON is read into typed objects (operands, steps, guards) and written back
    unchanged."""
    data = json.loads((GOLDEN / f"{case}.json").read_text())
    assert [Specialization.from_json(d).to_json() for d in data] == data


# one operand of each kind (trident/ir/operands.py), with edge values
OPERANDS = [Arg(0), Val(3), List(4), Item(4, 1), Scalar(2), Drop(), Int(-2**63), Float(-0.0),
            Float(float("inf")), Bool(False), Str('a "quoted" */ string'), NoneConst(),
            Device(1, 0), Ints((2, -1)), Ints(()), Floats((0.1, 1e300)), Bools((True, False)),
            IntList((Int(4), Scalar(0))), Tensors((Arg(1), Item(0, 2))),
            OptTensors((NoneConst(), Val(1)))]


def test_every_operand_kind_reads_back_as_written():
    assert {type(o) for o in OPERANDS} == set(operands._KINDS.values())  # new kinds: add one
    for o in OPERANDS:
        text = json.dumps(o.to_json())
        back = operands.from_json(json.loads(text))
        assert type(back) is type(o) and back == o and json.dumps(back.to_json()) == text


@pytest.mark.parametrize("data", [{"k": "tensor", "i": 0}, {"k": "arg"}, {"k": "arg", "i": 0,
                                  "list": 1}, {"k": "tensors", "v": [{"k": "nothing"}]},
                                  {"i": 0}, ["arg", 0]])
def test_stored_operands_of_unknown_kinds_or_fields_raise_value_error(data):
    with pytest.raises(ValueError, match="not a stored"):
        operands.from_json(data)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_c_builds_and_initializes(case, tmp_path):
    for spec in _specs(case):  # its translation units (Note [Parallel C build] in build.py)
        module = build.build(codegen.render(spec, case).sources, tmp_path)
        assert module.lib.scm_init(runtime.load().api_address()) == 0


def update() -> None:
    """Trace each case and write its specializations and their C (see the docstring), in a
    fresh cache folder that shares the current one's runtime build."""
    from trident import config

    runtime_dir = config.cache_dir() / "runtime"
    os.environ["TRIDENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="trident-golden-")
    if runtime_dir.is_dir():
        (config.cache_dir() / "runtime").symlink_to(runtime_dir, target_is_directory=True)
    GOLDEN.mkdir(exist_ok=True)
    for case, (fn, options, calls) in CASES.items():
        jf = trident.jit(fallback=False, **options)(fn)
        for args in calls:
            jf(*args)
        assert len(jf._specs) == len(calls) and not jf.stats.fallbacks, (case, jf.stats)
        (GOLDEN / f"{case}.json").write_text(
            json.dumps([s.to_json() for s in jf._specs], indent=1, sort_keys=True) + "\n")
        for old in _golden_c(case):
            old.unlink()
        for i, spec in enumerate(_specs(case)):
            (GOLDEN / f"{case}-{i}.c").write_text(codegen.render(spec, case).source)
