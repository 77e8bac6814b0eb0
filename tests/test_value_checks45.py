"""Note [All reads] (lower/values.py): a value check of ``bool(b.sum() == b.numel())`` on a mask
converted to bool, transformers' ``fast_all``, is one reduction (``all``, ``item``) in the plan
that runs at every hit, not a copy of the mask and three more ops; and it stays exact: each call
takes eager's branch, with the hits, misses and compiles of the reads' values."""

from __future__ import annotations

import pytest
import torch

import trident
from _trident_helpers import counts


def check_ops(jf) -> list[list[str]]:
    """Per specialization, the ops of its value checks' plan."""
    return [[s.op for s in spec.checks.plan.steps] for spec in jf._specs if spec.checks]


def fast_all(x, m):  # as transformers' _ignore_causal_mask_sdpa reads a 2D attention mask
    b = m.to(torch.bool)
    if b.sum() == b.numel():
        return x + 2
    return x + 1


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.bool, torch.float32])
def test_fast_all_of_a_bool_mask_is_one_reduction(dtype):
    """Masks of every value kind the conversion to bool decides (nonzero ints, NaN, -0.0, inf):
    each call equals eager; the all-true and the not-all-true masks are one specialization each
    (2 compiles, hits after); each plan reads the mask once, with ``all``."""
    x = torch.randn(3)
    if dtype.is_floating_point:
        true = [[1.0, float("nan")], [float("inf"), -2.5], [0.5, 1e-30]]
        false = [[-0.0, 1.0], [1.0, 0.0], [0.0, float("nan")]]
    else:
        true = [[1, 1], [1, 1], [1, 1]] if dtype is torch.bool else [[1, 7], [-3, 1], [2, 2]]
        false = [[0, 1], [1, 0], [0, 0]]
    masks = [true[0], false[0], true[1], false[1], true[2], false[2]]
    jf = trident.jit(fast_all)
    for k, values in enumerate(masks):
        m = torch.tensor(values, dtype=dtype).reshape(1, 2)
        assert torch.equal(jf(x, m), fast_all(x, m)), (k, values)
    assert counts(jf) == (2, 4, 0), jf.stats.miss_reasons
    assert check_ops(jf) == [["aten::all", "aten::item"]] * 2


def int_sum(x, m):  # an int mask's sum against its numel: not "all nonzero"
    if m.sum() == m.numel():
        return x + 2
    return x + 1


def test_an_int_sum_is_not_read_as_all():
    """``m.sum() == m.numel()`` of an int tensor is not ``all(m)`` ([0, 2] sums to its numel,
    [2, 2] does not): the check keeps the sum, and each call takes eager's branch with the
    hits the sum's value decides."""
    x = torch.randn(3)
    calls = [([2, 2], (1, 0, 0)), ([2, 2], (1, 1, 0)), ([1, 1], (2, 1, 0)),
             ([0, 2], (2, 2, 0)), ([3, 0], (2, 3, 0)), ([5, 0], (2, 4, 0))]
    jf = trident.jit(int_sum)
    for values, count in calls:
        m = torch.tensor([values])
        assert torch.equal(jf(x, m), int_sum(x, m)), values
        assert counts(jf) == count, (values, jf.stats.miss_reasons)
    assert all("aten::sum" in ops and "aten::all" not in ops for ops in check_ops(jf))


def test_fast_all_over_a_growing_mask():
    """A mask that grows by one at every call (a decode loop's): its numel is a product of
    symbolic sizes once the length is symbolic, still read as ``all``; a mask with a zero
    then takes the other branch, and all-ones masks hit again."""
    x = torch.randn(3)
    jf = trident.jit(fast_all)
    for n in range(4, 10):
        m = torch.ones(2, n, dtype=torch.long)
        assert torch.equal(jf(x, m), fast_all(x, m))
    assert counts(jf) == (2, 4, 0), jf.stats.miss_reasons
    padded = torch.ones(2, 10, dtype=torch.long)
    padded[1, 0] = 0
    assert torch.equal(jf(x, padded), fast_all(x, padded))
    for n in (11, 12):
        m = torch.ones(2, n, dtype=torch.long)
        assert torch.equal(jf(x, m), fast_all(x, m))
        padded = torch.ones(2, n, dtype=torch.long)
        padded[0, n - 1] = 0
        assert torch.equal(jf(x, padded), fast_all(x, padded))
    assert counts(jf) == (3, 8, 0), jf.stats.miss_reasons
    assert check_ops(jf)[-1] == ["aten::all", "aten::item"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_all_of_a_cuda_mask_is_one_reduction():
    """On CUDA (the conversion's ``device`` is the mask's own): the plan reads the mask once,
    with ``all``, before each call's launches; every call equals eager, the all-true and the
    not-all-true masks one specialization each."""
    x = torch.randn(3, device="cuda")
    jf = trident.jit(fast_all)
    for n, zero in ((5, None), (5, 2), (5, None), (5, 0), (5, None)):
        m = torch.ones(2, n, dtype=torch.long, device="cuda")
        if zero is not None:
            m[1, zero] = 0
        assert torch.equal(jf(x, m), fast_all(x, m)), (n, zero)
    assert counts(jf) == (2, 3, 0), jf.stats.miss_reasons
    assert check_ops(jf) == [["aten::all", "aten::item"]] * 2
