"""CUDA-graph replay of CUDA specializations (Note [CUDA graphs]; skipped without CUDA).

Every call is compared with eager PyTorch bit for bit; the counters say whether a graph was
captured and replayed.
"""

import sys

import pytest
import torch

import trident

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

triton = pytest.importorskip("triton")

from _triton_kernels import add_kernel, scale_inplace_kernel  # noqa: E402


def mlp(x, w1, w2):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 256),)](x, x, out, x.numel(), BLOCK=256)
    return torch.relu(out @ w1) @ w2, out.sum()


def weights(d=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    return (torch.randn(d, 2 * d, device="cuda", generator=g),
            torch.randn(2 * d, d, device="cuda", generator=g))


def assert_equal(got, want):
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_same_arguments_replay_and_results_survive_later_calls():
    f = trident.jit(mlp)
    w1, w2 = weights()
    x = torch.randn(8, 64, device="cuda")
    kept = []
    for i in range(6):
        x.mul_(1.5)  # new values at the same address: the graph reads them at replay
        kept.append((f(x, w1, w2), mlp(x, w1, w2)))
    for got, want in kept:  # each call's outputs are its own tensors
        assert_equal(got, want)
    # Note [Graph outputs]: call 1 compiles (the warm-up), call 2 captures and hands out the
    # static outputs; call 3 finds them kept and recaptures at once, copying out (Note [Hand
    # out after a move]); calls 4-6 replay
    s = f.stats
    assert (s.misses, s.compiles, s.hits, s.graph_captures, s.graph_replays) == (1, 1, 5, 2, 5)


def test_results_dropped_before_the_next_call_are_handed_out():
    """Note [Graph outputs]: a caller that drops each result gets the static outputs
    themselves, no copy; one that keeps a view of one gets a copy-out graph, and its view keeps
    its values."""
    f = trident.jit(mlp)
    w1, w2 = weights()
    x = torch.randn(8, 64, device="cuda")
    addresses = set()
    for i in range(6):
        x.add_(0.5)
        got, want = f(x, w1, w2), mlp(x, w1, w2)
        assert_equal(got, want)
        if i >= 1:
            addresses.add(got[0].data_ptr())
        del got
    assert len(addresses) == 1  # the same static output, handed out by each replay
    s = f.stats
    assert (s.hits, s.graph_captures, s.graph_replays) == (5, 1, 5)
    kept = f(x, w1, w2)[0][2:]  # a view of a handed-out result
    want = mlp(x, w1, w2)[0][2:].clone()
    for _ in range(3):
        x.add_(0.5)
        assert_equal(f(x, w1, w2), mlp(x, w1, w2))
    assert torch.equal(kept, want)
    s = f.stats  # the first of the 3 calls recaptures (copies out) and replays; 2 replays
    assert (s.hits, s.graph_captures, s.graph_replays) == (9, 2, 9)


def test_a_result_held_until_the_next_call_returns_recaptures_once():
    """Note [Hand out after a move]: a caller that keeps each result until the next call has
    returned (``out = generate(...)`` in a loop: the last ``generate``'s KV cache, which its
    prefill made, alive during the next prefill) gets one copy-out recapture, at the first call
    that finds a handed-out result held. Before, that call ran step by step and the capture at
    the next call, where the result was no longer held, handed out again: a recapture at every
    other call, without bound."""
    f = trident.jit(mlp)
    w1, w2 = weights()
    last = None
    for i in range(8):
        x = torch.randn(8, 64, device="cuda")
        last = f(x, w1, w2)  # the previous result is released only now
        assert_equal(last, mlp(x, w1, w2))
    # call 1 compiles, call 2 captures and hands out, call 3 finds call 2's result held and
    # recaptures (copies out), calls 4-8 replay
    s = f.stats
    assert (s.hits, s.graph_captures, s.graph_replays) == (7, 2, 7), s
    (graph,) = next(iter(f._graph_states.graphs.values())).values()
    assert not graph.handed


class Cache:
    def __init__(self):
        self.keys = None


def prefill(x, w, cache):
    cache.keys = x @ w  # a lazily initialized cache: Note [Attribute writes]
    return torch.relu(cache.keys).sum(0)


def test_an_output_stored_into_a_caller_object_is_copied_out_from_the_first_capture():
    """Note [Stored outputs]: a new cache per call, filled by the call and held by the caller
    until after the next call (a ``generate`` per prompt, its prefill making the KV cache): the
    stored tensor is copied out from the first capture, so no call finds it held. Before, the
    graph handed it out and the third call recaptured."""
    f = trident.jit(prefill)
    w = weights()[0][:, :64]
    last = None
    for _ in range(6):
        x = torch.randn(8, 64, device="cuda")
        cache, want_cache = Cache(), Cache()
        out = f(x, w, cache)
        assert torch.equal(out, prefill(x, w, want_cache))
        assert torch.equal(cache.keys, want_cache.keys)
        last, out = cache, None  # the result dropped, the cache held during the next call
    assert last.keys is not None
    # call 1 compiles, call 2 captures (x copied in, the keys copied out), calls 3-6 replay
    s = f.stats
    assert (s.hits, s.graph_captures, s.graph_replays) == (5, 1, 5), s
    (graph,) = next(iter(f._graph_states.graphs.values())).values()
    assert len(graph.handed) == 1  # the result alone


def test_new_input_each_call_is_copied_in():
    f = trident.jit(mlp)
    w1, w2 = weights()
    for _ in range(5):
        x = torch.randn(8, 64, device="cuda")
        assert_equal(f(x, w1, w2), mlp(x, w1, w2))
    s = f.stats
    assert (s.graph_captures, s.graph_replays) == (1, 4)


def test_argument_moving_after_capture_recaptures_once():
    f = trident.jit(mlp)
    w1, w2 = weights()
    x = torch.randn(8, 64, device="cuda")
    for _ in range(3):
        assert_equal(f(x, w1, w2), mlp(x, w1, w2))
    for _ in range(4):
        y = torch.randn(8, 64, device="cuda")  # by pointer until now: one step-by-step call
        assert_equal(f(y, w1, w2), mlp(y, w1, w2))
    s = f.stats
    assert (s.graph_captures, s.graph_replays, s.hits) == (2, 2 + 3, 6)


def test_recapture_after_a_moved_argument_hands_out():
    """Note [Hand out after a move]: the recapture that a moved by-pointer argument asks for
    hands out the static outputs as the first capture does (a generate's new KV cache); a
    result kept after it still gets a copy-out recapture, and keeps its values."""
    f = trident.jit(mlp)
    w1, w2 = weights()
    x = torch.randn(8, 64, device="cuda")
    for _ in range(3):
        assert_equal(f(x, w1, w2), mlp(x, w1, w2))
    for i in range(5):  # x was read by pointer: one step-by-step call, then a recapture
        y = torch.randn(8, 64, device="cuda")
        got = f(y, w1, w2)
        assert_equal(got, mlp(y, w1, w2))
        if i >= 1:
            (graph,) = next(iter(f._graph_states.graphs.values())).values()
            assert graph.handed and got[0].data_ptr() == graph.handed[0].data_ptr()
        del got
    s = f.stats
    assert (s.graph_captures, s.graph_replays, s.hits) == (2, 2 + 4, 7)
    kept = f(y, w1, w2)[0]
    want = mlp(y, w1, w2)[0]
    for _ in range(3):  # the kept result: a copy-out recapture at once, then replays
        y = torch.randn(8, 64, device="cuda")
        assert_equal(f(y, w1, w2), mlp(y, w1, w2))
    assert torch.equal(kept, want)
    s = f.stats
    assert (s.graph_captures, s.graph_replays, s.hits) == (3, 6 + 1 + 3, 11)
    (graph,) = next(iter(f._graph_states.graphs.values())).values()
    assert not graph.handed


def scale_(x, s: float):
    scale_inplace_kernel[(triton.cdiv(x.numel(), 256),)](x, x.numel(), s, BLOCK=256)
    return x * 2


def test_written_argument_by_pointer_replays_and_writes_the_caller_tensor():
    f = trident.jit(scale_)
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    ref = x.clone()
    for _ in range(4):
        out = f(x, 0.5)
        ref = ref * 0.5
        assert torch.equal(x, ref) and torch.equal(out, ref * 2)
        del out  # Note [Graph outputs]: a result kept across calls makes a copy-out recapture
    assert (f.stats.graph_captures, f.stats.graph_replays) == (1, 3)


def test_written_argument_at_new_addresses_is_copied_in_and_back():
    f = trident.jit(scale_)
    for _ in range(4):
        x = torch.randn(1000, device="cuda")
        ref = x * 0.5
        out = f(x, 0.5)
        assert torch.equal(x, ref) and torch.equal(out, ref * 2)
        del out
    assert (f.stats.graph_captures, f.stats.graph_replays, f.stats.hits) == (1, 3, 3)


def scale_both_(x, y, s: float):
    scale_inplace_kernel[(triton.cdiv(x.numel(), 256),)](x, x.numel(), s, BLOCK=256)
    return y + 1


def test_copied_in_argument_overlapping_a_written_one_runs_step_by_step():
    f = trident.jit(scale_both_)
    base = torch.randn(2048, device="cuda")
    for _ in range(2):  # x by pointer, y copied in (a new tensor each call)
        y = torch.randn(1024, device="cuda")
        f(base[:1024], y, 2.0)
    assert f.stats.graph_captures == 1
    replays = f.stats.graph_replays
    ref = base.clone()
    ref[:1024] *= 2
    out = f(base[:1024], base[512:1536], 2.0)  # y overlaps x, which the kernel writes
    assert torch.equal(base, ref) and torch.equal(out, ref[512:1536] + 1)
    assert f.stats.graph_replays == replays


def returns_argument(x):
    return x, x + 1


def test_output_that_is_an_argument_keeps_aliasing():
    f = trident.jit(returns_argument)
    x = torch.randn(16, device="cuda")
    for _ in range(4):
        a, b = f(x)
        assert a.data_ptr() == x.data_ptr() and torch.equal(b, x + 1)
    assert f.stats.graph_captures == 0


def noisy(x):
    return x + torch.rand_like(x)


def test_random_ops_are_not_replayed():
    f = trident.jit(noisy)
    x = torch.zeros(1024, device="cuda")
    outs = [f(x) for _ in range(4)]
    assert f.stats.graph_captures == 0
    assert not torch.equal(outs[2], outs[3])


def decode_attention(q, k_cache, v_cache, k, v):
    k_all = torch.cat([k_cache[:, :, 1:], k], dim=2)
    v_all = torch.cat([v_cache[:, :, 1:], v], dim=2)
    return torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, enable_gqa=True)


def test_attention_without_dropout_is_replayed():
    """SDPA's ops carry the ``nondeterministic_seeded`` tag (torch 2.11-2.13) for dropout;
    with ``dropout_p=0`` they draw nothing, so the specialization is captured."""
    f = trident.jit(decode_attention)
    g = torch.Generator(device="cuda").manual_seed(0)
    caches = [torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16, generator=g)
              for _ in range(2)]
    for _ in range(4):
        q = torch.randn(1, 8, 1, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(1, 2, 1, 64, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        assert torch.equal(f(q, *caches, k, v), decode_attention(q, *caches, k, v))
    assert (f.stats.graph_captures, f.stats.graph_replays) == (1, 3)


def test_graphs_can_be_turned_off():
    f = trident.jit(mlp, cuda_graphs=False)
    w1, w2 = weights()
    x = torch.randn(8, 64, device="cuda")
    for _ in range(4):
        assert_equal(f(x, w1, w2), mlp(x, w1, w2))
    assert (f.stats.graph_captures, f.stats.graph_replays, f.stats.hits) == (0, 0, 3)


def test_replay_runs_no_python_and_other_streams_run_step_by_step():
    f = trident.jit(mlp)
    w1, w2 = weights()
    x = torch.randn(8, 64, device="cuda")
    f(x, w1, w2)
    f(x, w1, w2)
    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame) if event == "call" else None)
    try:
        for _ in range(200):
            f(x, w1, w2)
    finally:
        sys.setprofile(None)
    assert calls == []
    replays = f.stats.graph_replays
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = f(x, w1, w2)
    stream.synchronize()
    assert_equal(got, mlp(x, w1, w2))
    assert f.stats.graph_replays == replays


def test_cached_module_warms_up_then_captures():
    # a second JitFunction of the same code loads the cached module and captures its own graph
    w1, w2 = weights()
    x = torch.randn(8, 64, device="cuda")
    trident.jit(mlp)(x, w1, w2)
    g = trident.jit(mlp)
    for _ in range(3):
        assert_equal(g(x, w1, w2), mlp(x, w1, w2))
    assert (g.stats.compiles, g.stats.graph_captures, g.stats.graph_replays) == (0, 1, 2)


def test_symbolic_specialization_replays_a_graph_per_size():
    # Note [Graphs per size]: a size is run step by step when first seen, captured when seen
    # again, and replayed from then on, whatever sizes come in between
    f = trident.jit(mlp, dynamic={"x": [0]})
    w1, w2 = weights()
    for rows in (8, 8, 16, 16, 8, 16, 24, 8, 24, 24):
        x = torch.randn(rows, 64, device="cuda")
        assert_equal(f(x, w1, w2), mlp(x, w1, w2))
    s = f.stats
    assert (s.compiles, s.graph_captures, s.graph_replays) == (1, 3, 7), s
    assert f._specs[0].symbolic


def test_a_size_seen_before_another_compile_is_captured_at_its_second_call():
    # Note [Sizes seen across installs]: as a generate's prefill (its size seen once per
    # generate) before the decode step compiles: the size's second call captures
    f = trident.jit(mlp, dynamic={"x": [0]})
    w1, w2 = weights()
    v1, v2 = weights(32)
    x, y = torch.randn(8, 64, device="cuda"), torch.randn(8, 32, device="cuda")
    assert_equal(f(x, w1, w2), mlp(x, w1, w2))  # compile, run step by step: the size seen
    assert_equal(f(y, v1, v2), mlp(y, v1, v2))  # another specialization installed
    assert f.stats.graph_captures == 0
    assert_equal(f(x, w1, w2), mlp(x, w1, w2))  # the size's second call: captured
    s = f.stats
    assert (s.compiles, s.graph_captures, s.graph_replays) == (2, 1, 1), s


def test_symbolic_first_graph_hands_out_and_kept_results_keep_their_values():
    """Note [Graph outputs]: a symbolic specialization's first graph (no other of its sizes
    alive in its memory pool) hands out its static outputs; a later size's graph, whose memory
    may be the first's dead intermediates, copies out; a kept handed-out result gets a
    copy-out recapture of its size. Every result kept across calls of both sizes keeps its
    values."""
    f = trident.jit(mlp, dynamic={"x": [0]})
    w1, w2 = weights()
    handed = []
    for _ in range(3):  # compile, capture (replays), replay: each result dropped
        x = torch.randn(8, 64, device="cuda")
        got = f(x, w1, w2)
        assert_equal(got, mlp(x, w1, w2))
        handed.append(got[0].data_ptr())
        del got
    (eight,) = f._graph_states.graphs[f._specs[0].key].values()
    assert eight.handed and handed[1:] == [eight.handed[0].data_ptr()] * 2
    kept = []
    # 16: step by step, capture (copies out), replay; 8: replay (handed out, kept), 16:
    # replay, 8: the kept result makes it recapture at once (copies out), 8: replay
    for rows in (16, 16, 16, 8, 16, 8, 8):
        x = torch.randn(rows, 64, device="cuda")
        got, want = f(x, w1, w2), mlp(x, w1, w2)
        assert_equal(got, want)
        kept.append((got, [w.clone() for w in want]))
    for got, want in kept:  # nothing a later replay wrote reached a kept result
        assert_equal(got, want)
    assert kept[3][0][0].data_ptr() == eight.handed[0].data_ptr()
    graphs = {c.outputs[0].shape[0]: c for c in f._graph_states.graphs[f._specs[0].key].values()}
    assert not graphs[16].handed and not graphs[8].handed
    s = f.stats
    assert (s.misses, s.compiles, s.hits, s.graph_captures, s.graph_replays) == (1, 1, 9, 3, 8), s


class Box:
    pass


def take(x, box):
    return x[:box.n] * 2


def test_a_symbolic_int_picks_the_graph_of_its_value():
    """Note [Graphs per size]: a symbolic int (Note [Symbolic ints]: an int leaf whose value
    changed, traced as a symbol) reaches the graph as a value (``x[:n]``): its value is part of
    the size key, so a call replays only the graph of its own value, never another value's of
    the same tensor geometry."""
    f = trident.jit(take)
    x = torch.randn(8, device="cuda")
    box = Box()
    # 3: static; 4: the symbolic one's compile (its first call: x's geometry seen); 5, 4:
    # captures (the slot remembers geometries, not ints: each value's first replayed call is
    # its capture); 5, 4, 5: replays; 6: capture; 5: replay
    for n in (3, 4, 5, 4, 5, 4, 5, 6, 5):
        box.n = n
        got = f(x, box)
        assert got.shape == (n,) and torch.equal(got, take(x, box)), n
        del got
    assert f._specs[1].symbolic
    s = f.stats
    assert (s.compiles, s.hits, s.graph_captures, s.graph_replays) == (2, 7, 3, 7), s


def test_graph_sizes_are_bounded_and_the_rest_run_without_python():
    f = trident.jit(mlp, dynamic={"x": [0]}, cuda_graph_sizes=2)
    w1, w2 = weights()
    for rows in (8, 8, 16, 16):
        x = torch.randn(rows, 64, device="cuda")
        assert_equal(f(x, w1, w2), mlp(x, w1, w2))
    assert (f.stats.graph_captures, f.stats.graph_replays) == (2, 2)
    x = torch.randn(24, 64, device="cuda")
    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame) if event == "call" else None)
    try:
        got = [f(x, w1, w2) for _ in range(3)]
    finally:
        sys.setprofile(None)
    assert calls == []  # past the bound, a new size neither asks Python nor captures
    for g in got:
        assert_equal(g, mlp(x, w1, w2))
    assert (f.stats.graph_captures, f.stats.graph_replays, f.stats.hits) == (2, 2, 6)
    with pytest.raises(trident.TridentError, match="cuda_graph_sizes"):
        trident.jit(mlp, cuda_graph_sizes=0)


def append_attend(q, k_past, k):
    kc = torch.cat([k_past, k], dim=2)
    return torch.nn.functional.scaled_dot_product_attention(q, kc, kc), kc


def test_growing_cache_replays_the_lengths_it_revisits():
    # automatic dynamic: length 1 static, then one symbolic specialization; the first pass
    # warms each length up, the second captures it, the third only replays
    f = trident.jit(append_attend)
    g = torch.Generator(device="cuda").manual_seed(4)
    q, k = (torch.randn(1, 2, 1, 16, device="cuda", generator=g) for _ in range(2))
    for _ in range(3):
        cache = torch.randn(1, 2, 1, 16, device="cuda", generator=g)
        for _ in range(6):
            (got, got_cache), (want, want_cache) = f(q, cache, k), append_attend(q, cache, k)
            assert torch.equal(got, want) and torch.equal(got_cache, want_cache)
            cache = got_cache
    s = f.stats
    assert (s.compiles, s.graph_captures, s.graph_replays) == (2, 6, 12), s
