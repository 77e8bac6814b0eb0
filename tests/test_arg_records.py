"""Note [Argument records] (runtime/trident_rt.h): a tensor's header guards (kind, dtype, device
type and index, dim, flag bits) are one compare of its record's ``head`` word. The merged check
agrees with the conjunction of the guards' own C checks on random records, in C; it comes at
the place of the argument's first header guard, before any of its sizes is read; a value no
field can hold stays a check of its own. (That the native verdict agrees with the Python
reference on random calls, merged checks included: test_guards.py.)"""

from __future__ import annotations

import random

import pytest

from _trident_helpers import c_module
from trident.codegen.guards import guard_c, guard_checks
from trident.ir.facts import INT, TENSOR
from trident.ir.guards import (Aligned16, ArgCount, DeviceIndex, DeviceType, Dim, Dtype,
                               Inference, IntValue, IsParameter, Kind, RequiresGrad, Size,
                               Stride)

HEADER = (Kind, Dtype, DeviceType, DeviceIndex, Dim, Aligned16, RequiresGrad, Inference)
# each kind's values: the ones records take, and some no field holds (a miss either way)
VALUES = {Kind: [0, 1, 2, 5], Dtype: [0, 6, 15, 44, 127, 200], DeviceType: [0, 1, 20, 300],
          DeviceIndex: [-1, 0, 7, 32767, 40000], Dim: [0, 1, 2, 4, 32767, 40000],
          Aligned16: [False, True], RequiresGrad: [False, True], Inference: [False, True]}


def _groups(n: int, seed: int = 0) -> list[list]:
    """Random header guards of argument 1, each kind at most once, in guard order."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kinds = [k for k in HEADER if rng.random() < 0.7] or [Kind]
        out.append([k(rng.choice(VALUES[k]), 1) for k in kinds])
    return out


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """The groups and a cffi module whose ``merged(k, ...)`` and ``each(k, ...)`` evaluate group
    k's checks as guard_checks prints them and as the conjunction of guard_c's, over a record
    with the given header fields."""
    pytest.importorskip("cffi")
    groups = _groups(400)
    merged, each = [], []
    for k, group in enumerate(groups):
        printed = " && ".join(f"({expr})" for expr, _ in guard_checks(group, ["a0", "x"]))
        merged.append(f"    case {k}: return {printed};")
        each.append(f"    case {k}: return {' && '.join(f'({guard_c(g)})' for g in group)};")
    head = "const trt_arg* a = record(kind, flags, dtype, device_type, device_index, dim);"
    fields = "int kind, int flags, int dtype, int device_type, int device_index, int dim"
    source = f"""#include <stdint.h>
#include <string.h>
#include "trident_rt.h"
static trt_arg records[2];
static const trt_arg* record({fields}) {{
  memset(records, 0, sizeof records);
  records[1].kind = (int8_t)kind;
  records[1].flags = (uint8_t)flags;
  records[1].dtype = (int8_t)dtype;
  records[1].device_type = (int8_t)device_type;
  records[1].device_index = (int16_t)device_index;
  records[1].dim = (int16_t)dim;
  return records;
}}
int merged(int k, {fields}) {{
  {head}
  switch (k) {{
{chr(10).join(merged)}
  }}
  return -1;
}}
int each(int k, {fields}) {{
  {head}
  switch (k) {{
{chr(10).join(each)}
  }}
  return -1;
}}
"""
    _, lib = c_module(tmp_path_factory.mktemp("arg-records"), "arg_records",
                      f"int merged(int k, {fields}); int each(int k, {fields});", source)
    return groups, lib


def _fit(value: int, bits: int) -> int:
    """``value`` where a signed field of ``bits`` holds it, else 3 (what c10 gives fits)."""
    return value if -(1 << (bits - 1)) <= value < (1 << (bits - 1)) else 3


def test_one_compare_agrees_with_each_check_on_random_records(checks):
    groups, lib = checks
    rng = random.Random(1)
    verdicts = {0: 0, 1: 0}
    for k, group in enumerate(groups):
        for _ in range(12):
            # read_arg's records: a kind, the three flag bits alone, c10's field ranges; half
            # of them take the group's own values, so that both verdicts come often
            want = {type(g): int(g.value) for g in group}
            fields = [rng.choice([want.get(Kind, 1), 0, 1, 2]),
                      sum(bit for bit in (1, 2, 4) if rng.random() < 0.5),
                      _fit(rng.choice([want.get(Dtype, 6), 6, 15]), 8),
                      _fit(rng.choice([want.get(DeviceType, 0), 0, 1]), 8),
                      _fit(rng.choice([want.get(DeviceIndex, -1), -1, 0]), 16),
                      _fit(rng.choice([want.get(Dim, 2), 1, 2]), 16)]
            if rng.random() < 0.5:  # the group's own values, one field perhaps off
                fields = [want.get(Kind, 1), sum(bit for g, bit in (
                              (Aligned16, 2), (RequiresGrad, 1), (Inference, 4)) if want.get(g)),
                          _fit(want.get(Dtype, 6), 8), _fit(want.get(DeviceType, 0), 8),
                          _fit(want.get(DeviceIndex, -1), 16), _fit(want.get(Dim, 2), 16)]
                if rng.random() < 0.3:
                    fields[rng.randrange(6)] ^= 1
            got = lib.merged(k, *fields)
            assert got == lib.each(k, *fields), (group, fields)
            verdicts[got] += 1
    assert verdicts[0] > 500 and verdicts[1] > 500, verdicts


def test_a_tensors_header_is_one_check_before_its_sizes():
    guards = [ArgCount(3), Kind(INT, 0), IntValue(7, 0), Kind(TENSOR, 1), Kind(INT, 2),
              Dtype(6, 1), DeviceType(1, 1), DeviceIndex(0, 1), Dim(2, 1), Size(4, 1, 0),
              Size(8, 1, 1), Stride(8, 1, 0), Stride(1, 1, 1), Aligned16(True, 1),
              RequiresGrad(False, 1), Inference(False, 1), IsParameter(False, 1), IntValue(3, 2)]
    got = guard_checks(guards, ["key", "x", "n"])
    exprs = [e for e, _ in got]
    # every field and flag bit guarded: the word equals a constant (kind 1, flags 2, dtype 6,
    # device 1:0, dim 2)
    assert exprs[3] == "a[1].head == 0x2000001060201ULL"
    assert exprs[:3] == ["n == 3", "a[0].kind == TRT_ARG_INT", "a[0].i == 7LL"]
    assert exprs[4] == "a[2].kind == TRT_ARG_INT"  # one header guard: its own check
    assert exprs[5:] == [guard_c(g) for g in guards[9:13]] + ["a[2].i == 3LL"]
    assert "x.dtype == float32" in got[3][1] and "x.is_inference() is False" in got[3][1]
    # some guards: a masked compare; a value no field holds: a check of its own, after it
    partial = guard_checks([Kind(TENSOR, 1), Dim(40000, 1), Dtype(6, 1), RequiresGrad(True, 1)],
                           ["key", "x"])
    assert [e for e, _ in partial] == ["(a[1].head & 0xff01ffULL) == 0x60101ULL",
                                       "a[1].dim == 40000"]
