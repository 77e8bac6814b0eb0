"""Issue 26 (session 44): reads that a trace on fake tensors answered otherwise than eager.

transformers' ``_ignore_causal_mask_sdpa(padding_mask, ...)`` returns False where
``is_tracing(padding_mask)``, which is True for a FakeTensor, and otherwise reads the mask's
values (``fast_all``: ``m.sum() == m.numel()``, a Python bool). Trident traces on fake tensors,
so its trace always kept the explicit attention mask where eager drops an all-ones mask and
calls SDPA with ``attn_mask=None, is_causal=q_len > 1``: another attention kernel on CUDA,
logits that differ in their last bits. Each test compares with eager (``torch.equal``) and,
for the model, which branch the trace took against eager's.
"""

from __future__ import annotations

import pytest
import torch

import trident
from _trident_helpers import installed_package

NAME = "trident_masklib44"
_LIB = '''
import torch


def is_fake_tensor(x):  # as transformers.utils.import_utils.is_fake_tensor
    try:
        return isinstance(x, getattr(torch, "_subclasses").FakeTensor)
    except Exception:
        return False


def choose(x, m):  # as transformers' _ignore_causal_mask_sdpa reads its padding mask
    if is_fake_tensor(m) or not bool(m.sum() == m.numel()):
        return x + 1  # the explicit mask
    return x + 2  # no mask


def values_only(x, m):  # the value read alone
    if bool(m.sum() == m.numel()):
        return x + 2
    return x + 1
'''


@pytest.fixture
def lib(tmp_path):
    with installed_package(tmp_path, NAME, {"__init__": _LIB}) as module:
        yield module


def counts(jf) -> tuple[int, int, int]:
    s = jf.stats
    return s.compiles, s.hits, s.fallbacks


MASKS = [torch.ones(2, 5, dtype=torch.long), torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]),
         torch.ones(2, 5, dtype=torch.long)]


@pytest.mark.xfail(strict=True, reason="issue 26: the trace answers is_fake_tensor(m) True")
def test_fake_read_takes_eager_branch(lib):
    """A library's ``is_fake_tensor(m) or not bool(...)`` on an argument: eager reads False,
    then the mask's values; each call equals eager's (x + 2 for all ones, x + 1 with a 0)."""
    def f(x, m):
        return lib.choose(x, m)

    jf = trident.jit(f)
    x = torch.randn(3)
    for m in MASKS:
        assert torch.equal(jf(x, m), f(x, m))


def _sdpa_masks(spec) -> list:
    """The ``attn_mask`` operand of each SDPA step of ``spec``'s plan."""
    return [s.args[3] for s in spec.plan.steps
            if getattr(s, "op", "") == "aten::scaled_dot_product_attention"]


@pytest.mark.xfail(strict=True, reason="issue 26: the trace keeps the explicit mask")
def test_qwen2_forward_takes_eager_mask_branch(monkeypatch):
    """A tiny Qwen2's forward with an all-ones attention mask: eager's
    ``_ignore_causal_mask_sdpa`` returns True (SDPA without a mask, ``is_causal``); the
    trace's plan calls SDPA as eager does."""
    pytest.importorskip("transformers")
    import transformers.masking_utils as mu
    from benchmarks.sweep_hf import tiny_model
    from trident.ir.operands import NoneConst

    model = tiny_model("qwen2", "cpu")
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, 6, dtype=torch.long)
    answers = []
    original = mu._ignore_causal_mask_sdpa

    def recorded(*args, **kwargs):
        answers.append(original(*args, **kwargs))
        return answers[-1]

    with torch.no_grad():
        monkeypatch.setattr(mu, "_ignore_causal_mask_sdpa", recorded)
        ref = model(input_ids=ids, attention_mask=mask).logits
        monkeypatch.setattr(mu, "_ignore_causal_mask_sdpa", original)
        assert answers and all(answers)  # eager drops the all-ones mask
        jf = trident.jit(model.forward)
        out = jf(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(out, ref)
    assert counts(jf) == (1, 0, 0)
    masks = _sdpa_masks(jf._specs[0])
    assert len(masks) == 2 and all(isinstance(m, NoneConst) for m in masks), masks
