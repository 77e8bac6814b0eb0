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
from _trident_helpers import cache_kw, counts, installed_package

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


MASKS = [torch.ones(2, 5, dtype=torch.long), torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]),
         torch.ones(2, 5, dtype=torch.long)]


@pytest.mark.parametrize("which", ["choose", "values_only"])
def test_fake_read_takes_eager_branch(lib, which):
    """A library's ``is_fake_tensor(m) or not bool(...)`` on an argument (and the value read
    alone): eager reads False, then the mask's values; each call equals eager's (x + 2 for all
    ones, x + 1 with a 0). All ones, then a padded mask, then all ones: 2 compiles, hits
    after; the padded call's miss names the value read."""
    read = getattr(lib, which)

    def f(x, m):
        return read(x, m)

    jf = trident.jit(f)
    x = torch.randn(3)
    expected = [(1, 0, 0), (2, 0, 0), (2, 1, 0), (2, 2, 0)]
    for m, count in zip(MASKS + [MASKS[1].clone()], expected):
        assert torch.equal(jf(x, m), f(x, m))
        assert counts(jf) == count, jf.stats.miss_reasons
        if count == (1, 0, 0):
            assert "was True, now False" in jf.explain(x, MASKS[1])
    assert jf.stats.misses == 2 and "was True, now False" in jf.stats.miss_reasons[1]
    assert "accepts these arguments" in jf.explain(x, MASKS[1])


def _sdpa_masks(spec) -> list:
    """The ``attn_mask`` operand of each SDPA step of ``spec``'s plan."""
    return [s.args[3] for s in spec.plan.steps
            if getattr(s, "op", "") == "aten::scaled_dot_product_attention"]


def _mask_skips(monkeypatch, run):
    """``run()`` eagerly with each answer of transformers' ``_ignore_causal_mask_sdpa``
    recorded: (the answers, ``run()``'s result)."""
    import transformers.masking_utils as mu

    answers, original = [], mu._ignore_causal_mask_sdpa

    def recorded(*args, **kwargs):
        answers.append(original(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(mu, "_ignore_causal_mask_sdpa", recorded)
    try:
        return answers, run()
    finally:
        monkeypatch.setattr(mu, "_ignore_causal_mask_sdpa", original)


def test_qwen2_forward_takes_eager_mask_branch(monkeypatch):
    """A tiny Qwen2's forward with an all-ones attention mask: eager's
    ``_ignore_causal_mask_sdpa`` returns True (SDPA without a mask, ``is_causal``); the
    trace's plan calls SDPA as eager does."""
    pytest.importorskip("transformers")
    from benchmarks.sweep_hf import tiny_model
    from trident.ir.operands import NoneConst

    model = tiny_model("qwen2", "cpu")
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, 6, dtype=torch.long)
    with torch.no_grad():
        answers, ref = _mask_skips(monkeypatch, lambda: model(input_ids=ids,
                                                               attention_mask=mask).logits)
        assert answers and all(answers)  # eager drops the all-ones mask
        jf = trident.jit(model.forward)
        out = jf(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(out, ref)
    assert counts(jf) == (1, 0, 0)
    masks = _sdpa_masks(jf._specs[0])
    assert len(masks) == 2 and all(isinstance(m, NoneConst) for m in masks), masks


def test_int_and_item_reads_are_value_checks():
    """``int(t)`` and ``t.item()`` in Python: the values become checks of the specialization,
    a size taken from one too (``x[:n]``)."""
    def f(x, m):
        n = int(m.sum())
        if m.max().item() > 1:
            return x[:n] * 2
        return x[:n]

    jf = trident.jit(f)
    x = torch.arange(8.0)
    calls = [(torch.tensor([1, 1, 0]), (1, 0, 0)), (torch.tensor([1, 1, 1]), (2, 0, 0)),
             (torch.tensor([0, 1, 1]), (2, 1, 0)), (torch.tensor([2, 1, 1]), (3, 1, 0)),
             (torch.tensor([1, 0, 1]), (3, 2, 0)), (torch.tensor([1, 1, 1]), (3, 3, 0))]
    for m, count in calls:
        assert torch.equal(jf(x, m), f(x, m))
        assert counts(jf) == count, jf.stats.miss_reasons


def test_reads_that_no_check_covers_run_eagerly(lib):
    """Where no value check applies the call runs eagerly, with one warning, as before: a read
    after the function wrote its argument (the check would read the argument as the call
    began), a float read."""
    def after_write(x, m):
        m.mul_(1)
        return lib.choose(x, m)

    def float_read(x, m):
        return x + 1 if float(m.sum() * 0.5) > 4.75 else x + 2  # a float tensor's value

    for f in (after_write, float_read):
        jf = trident.jit(f)
        x = torch.randn(3)
        with pytest.warns(UserWarning, match="runs eagerly"):
            assert torch.equal(jf(x, MASKS[0].clone()), f(x, MASKS[0].clone()))
        assert torch.equal(jf(x, MASKS[1].clone()), f(x, MASKS[1].clone()))
        assert counts(jf) == (0, 0, 2), jf.stats.miss_reasons


def test_stored_value_checks_serve_a_new_process(lib, trident_cache):
    """A later process installs the stored specialization whose values the call has (the
    checks' Python twin picks it) and compiles nothing."""
    from _trident_helpers import as_in_a_new_process

    def f(x, m):
        return lib.choose(x, m)

    x = torch.randn(3)
    first = trident.jit(f)
    for m in MASKS[:2]:
        assert torch.equal(first(x, m), f(x, m))
    assert counts(first) == (2, 0, 0)
    as_in_a_new_process()
    later = trident.jit(f)
    for m in (MASKS[1], MASKS[0], MASKS[1]):
        assert torch.equal(later(x, m), f(x, m))
    assert later.stats.compiles == 0 and later.stats.fallbacks == 0


def _greedy(forward, model, ids, mask, steps=4):
    """A greedy decode through ``forward`` with a DynamicCache and an explicit attention mask
    at every step (as transformers 5.17's ``generate`` passes it): each step's logits."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = forward(input_ids=ids, attention_mask=mask, **{cache_kw(model): cache}, use_cache=True)
    logits = [out.logits]
    for _ in range(steps):
        ids = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        out = forward(input_ids=ids, attention_mask=mask, **{cache_kw(model): cache},
                      use_cache=True)
        logits.append(out.logits)
    return logits


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_decode_with_a_mask_of_ones_takes_eager_branch(arch, monkeypatch):
    """A tiny model's greedy decode with an all-ones mask at every step (batch 2), then one
    with a padded row: every step's logits equal eager's, eager drops the all-ones mask at
    every step, and so does every specialization of the first decode; the padded decode keeps
    it."""
    pytest.importorskip("transformers")
    from benchmarks.sweep_hf import tiny_model
    from trident.ir.operands import NoneConst, Val

    model = tiny_model(arch, "cpu")
    ids = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0))
    ones, padded = torch.ones(2, 6, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)
    padded[0, 0] = 0
    with torch.no_grad():
        answers, ref = _mask_skips(monkeypatch, lambda: _greedy(model.forward, model, ids, ones))
        assert len(answers) == 5 and all(answers)
        jf = trident.jit(model.forward)
        out = _greedy(jf, model, ids, ones)
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
        assert jf.stats.fallbacks == 0 and jf.stats.hits >= 1
        specs = list(jf._specs)
        assert specs and all(isinstance(m, NoneConst) for s in specs for m in _sdpa_masks(s))
        ref = _greedy(model.forward, model, ids, padded)
        out = _greedy(jf, model, ids, padded)
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
        assert jf.stats.fallbacks == 0
        new = [s for s in jf._specs if s not in specs]
        assert new and all(isinstance(m, Val) for s in new for m in _sdpa_masks(s))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_generate_equals_eager(arch):
    """transformers' own ``generate`` (default DynamicCache), batch 2, with an all-ones and a
    padded attention mask: tokens and every step's logits equal eager's, no call eager."""
    pytest.importorskip("transformers")
    from benchmarks.sweep_hf import tiny_model

    model = tiny_model(arch, "cpu")
    ids = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0))
    padded = torch.ones(2, 6, dtype=torch.long)
    padded[1, :2] = 0
    forward = model.forward
    jf = trident.jit(forward)
    for mask in (torch.ones(2, 6, dtype=torch.long), padded):
        kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, output_logits=True,
                  return_dict_in_generate=True)
        model.forward = forward
        ref = model.generate(ids, **kw)
        model.forward = jf
        out = model.generate(ids, **kw)
        model.forward = forward
        assert torch.equal(out.sequences, ref.sequences)
        assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
    assert jf.stats.fallbacks == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 2])
def test_cuda_decode_with_a_mask_of_ones_is_bit_equal(batch):
    """Issue 26 on CUDA: a tiny Qwen2's greedy decode with an all-ones mask at every step
    (DynamicCache), and transformers' ``generate``, equal eager's logits bit for bit (SDPA
    without a mask, as eager calls it: another kernel than with one), with CUDA graphs
    replayed (the value checks run before each replay)."""
    pytest.importorskip("transformers")
    from benchmarks.sweep_hf import tiny_model
    from trident.ir.operands import NoneConst

    model = tiny_model("qwen2", "cuda")
    ids = torch.randint(0, 96, (batch, 6), generator=torch.Generator().manual_seed(0)).cuda()
    mask = torch.ones(batch, 6, dtype=torch.long, device="cuda")
    with torch.no_grad():
        ref = _greedy(model.forward, model, ids, mask, steps=8)
        jf = trident.jit(model.forward)
        for _ in range(2):
            out = _greedy(jf, model, ids, mask, steps=8)
            assert all(torch.equal(a, b) for a, b in zip(out, ref))
        assert jf.stats.fallbacks == 0 and jf.stats.graph_replays > 0, jf.stats
        assert all(isinstance(m, NoneConst) for s in jf._specs for m in _sdpa_masks(s))
        forward = model.forward
        kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, output_logits=True,
                  return_dict_in_generate=True)
        expected = model.generate(ids, **kw)
        model.forward = jf
        try:
            got = model.generate(ids, **kw)
        finally:
            model.forward = forward
        assert torch.equal(got.sequences, expected.sequences)
        assert all(torch.equal(a, b) for a, b in zip(got.logits, expected.logits))


def test_outside_a_trace_fake_tensors_are_fake(lib):
    """The stand-in answers only code that a trace of this thread runs: after a trace,
    ``torch._subclasses.FakeTensor`` is the class itself, and a fake tensor is fake (to torch's
    code and to a library's)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, is_fake

    def f(x, m):
        return lib.choose(x, m)

    jf = trident.jit(f)
    assert torch.equal(jf(torch.ones(3), MASKS[0]), torch.ones(3) + 2)
    assert torch._subclasses.FakeTensor is FakeTensor
    with FakeTensorMode():
        t = torch.empty(2)
    assert lib.is_fake_tensor(t) and is_fake(t) and torch._subclasses.fake_tensor.is_fake(t)
    assert not lib.is_fake_tensor(torch.ones(2))
