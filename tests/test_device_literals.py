"""Tensors made from Python data on a device (``torch.tensor(data, device=x.device)``), in a
CUDA specialization: make_fx holds the device's copy as the constant, and the launch sequence
makes the same new tensor on that device at every call (``build_literal`` in
trident/lower/literals.py). Before, such a constant was made on the CPU: transformers 5.17's
``DynamicLayer.lazy_initialization`` (``torch.tensor([], device=key_states.device)``, then
``torch.cat``) made every call of a model with its default cache on CUDA run eagerly. Skipped
without CUDA; each call is compared with eager bit for bit, with exact counters."""

import pytest
import torch

import trident

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.gpu]

LITERALS = {
    "empty, then cat": lambda x: torch.cat([torch.tensor([], dtype=x.dtype, device=x.device),
                                            x], dim=-2),  # as DynamicLayer.update
    "0-dim": lambda x: x * torch.tensor(3.0, device=x.device),
    "one element": lambda x: x + torch.tensor([2.5], device=x.device),
    "a vector": lambda x: x * torch.tensor([1.0, -2.0, 0.5, 4.0], device=x.device),
    "a matrix": lambda x: x[:2] @ torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]],
                                               device=x.device),
    "int index": lambda x: x[torch.tensor([2, 0], device=x.device)],
    "bool mask": lambda x: torch.where(torch.tensor(True, device=x.device), x, -x),
}


@pytest.mark.parametrize("use", list(LITERALS), ids=list(LITERALS))
def test_a_literal_on_the_device_is_made_there(use):
    fn = LITERALS[use]

    def f(x):
        return fn(x)

    jf = trident.jit(f)
    for i in range(4):
        x = torch.randn(3, 4, device="cuda") + i
        got, want = jf(x), f(x)
        assert got.device == want.device and torch.equal(got, want), (use, i)
    s = jf.stats
    # call 1 compiles, call 2 captures its graph and replays it; call 3 finds call 2's
    # handed-out result still held by ``got`` (Note [Graph outputs]) and recaptures at once,
    # copying out (Note [Hand out after a move]); call 4 replays
    assert (s.compiles, s.hits, s.fallbacks, s.graph_captures, s.graph_replays) == \
        (1, 3, 0, 2, 3), s


def test_a_model_with_its_default_cache_on_cuda_is_served():
    """A tiny Llama called without a cache (transformers makes a ``DynamicCache`` in forward,
    whose first update is ``DynamicLayer.lazy_initialization``): served natively, equal to
    eager."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1,
                                      vocab_size=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval().to("cuda", torch.bfloat16)

    def logits(m, ids):
        return m(input_ids=ids).logits

    jf = trident.jit(logits)
    with torch.no_grad():
        for i in range(3):
            ids = torch.randint(0, 64, (1, 5), device="cuda")
            assert torch.equal(jf(model, ids), logits(model, ids)), i
    s = jf.stats
    assert (s.compiles, s.hits, s.fallbacks) == (1, 2, 0), s
