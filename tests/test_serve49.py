"""The backend door with Dynamo's dims symbolic from its first graph (issue 26's floor
re-examined: docs/huggingface.md, "The floor, stated"; docs/design.md, Limits today)."""

from __future__ import annotations

import warnings

import pytest
import torch

import trident
from _trident_helpers import tiny_causal_lm

pytest.importorskip("transformers")


@pytest.mark.xfail(strict=True, reason="with dynamic=True Dynamo passes the attention's scale "
                   "as a tensor read with .item(), which Trident's trace refuses: every graph "
                   "runs eagerly")
def test_the_backend_door_with_dynamic_true_serves_a_transformers_forward():
    model = tiny_causal_lm("Qwen2", max_position_embeddings=64)
    torch._dynamo.reset()
    ref = torch.compile(model.forward, backend="eager", dynamic=True)
    lengths = (5, 7, 9)
    with torch.no_grad():
        expected = [ref(torch.arange(n).unsqueeze(0), use_cache=False).logits for n in lengths]
        torch._dynamo.reset()
        served = torch.compile(model.forward, backend="trident", dynamic=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for n, want in zip(lengths, expected):
                out = served(torch.arange(n).unsqueeze(0), use_cache=False).logits
                assert torch.equal(out, want), n  # (holds: a fallback is eager's graph)
    s = trident.backend_stats(served)
    assert (s.compiles, s.fallbacks, s.hits) == (1, 0, 2), s
