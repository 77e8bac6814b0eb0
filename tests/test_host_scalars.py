"""Note [Host scalars] (trident/ir/specialization.py): a 0-dim CPU tensor argument that the
function only copies to its CUDA device keeps the specialization a CUDA one, whose graph copies
the scalar in from the host at each replay (skipped without CUDA).

Every call is compared with eager PyTorch bit for bit; the counters say whether a graph was
captured and replayed.
"""

import pytest
import torch

import trident

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.gpu]


def shifted(n, x):
    return x * 2 + n.to(x.device)


def doubled_on_the_host(n, x):
    return x + (n * 2).to(x.device)  # the CPU tensor is read by a CPU op: no host scalar


def test_host_scalar_is_read_at_every_replay():
    f = trident.jit(shifted)
    x = torch.randn(64, device="cuda")
    n = torch.tensor(0.0)
    for i in range(4):  # the same CPU tensor, new values
        n.fill_(float(i))
        assert torch.equal(f(n, x), shifted(n, x))
    for i in range(4):  # a new CPU tensor at every call: not a recapture
        n = torch.tensor(float(10 + i))
        assert torch.equal(f(n, x), shifted(n, x))
    s = f.stats
    # call 1 compiles (the warm-up), call 2 captures and replays, calls 3-8 replay
    assert (s.misses, s.compiles, s.hits, s.graph_captures, s.graph_replays) == (1, 1, 7, 1, 7)
    spec = f._specs[0]
    assert len(spec.host_scalars) == 1 and spec.cuda_device == 0


def test_cpu_tensor_read_on_the_host_runs_step_by_step():
    f = trident.jit(doubled_on_the_host)
    x = torch.randn(64, device="cuda")
    for i in range(4):
        n = torch.tensor(float(i))
        assert torch.equal(f(n, x), doubled_on_the_host(n, x))
    s = f.stats
    assert (s.compiles, s.hits, s.graph_captures, s.graph_replays) == (1, 3, 0, 0)
    assert f._specs[0].host_scalars == frozenset() and f._specs[0].cuda_device is None


def test_prefill_with_a_fresh_static_cache_replays_a_graph():
    """transformers' StaticLayer starts with ``cumulative_length`` on the CPU: each
    ``generate`` with a new static cache runs a prefill whose host scalars are copied in."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval().cuda()
    forward = model.forward
    jf = trident.jit(forward)
    args = dict(max_new_tokens=1, do_sample=False, cache_implementation="static",
                output_logits=True, return_dict_in_generate=True, disable_compile=True)
    for _ in range(4):
        ids = torch.randint(0, 96, (1, 8), device="cuda")
        model.forward = forward
        ref = model.generate(ids, **args)
        model.forward = jf
        out = model.generate(ids, **args)
        assert torch.equal(out.sequences, ref.sequences)
        assert torch.equal(out.logits[0], ref.logits[0])
    model.forward = forward
    s = jf.stats
    assert (s.compiles, s.fallbacks) == (1, 0)
    assert s.graph_captures >= 1 and s.graph_replays >= 2
    assert jf._specs[0].host_scalars  # one per layer
