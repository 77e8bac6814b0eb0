"""Which specializations get a CUDA graph, and what their replays must not copy (Note [CUDA
graphs]). Decided from the plan and guards, so it is tested on the CPU; replays run in
tests/test_cuda_graphs.py on the GPU machine."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import trident
from trident import build, runtime
from trident.codegen import render as codegen
from trident.frontend import graphs
from trident.lower import passes


def spec_of(fn, *args):
    f = trident.jit(fallback=False, cuda_graphs=False)(fn)
    f(*args)
    return f._specs[f._select(*args)]


def on_cuda(spec):
    """The same specialization as if its tensors were on cuda:0 (guards only)."""
    return dataclasses.replace(copy.deepcopy(spec), guards=[
        dataclasses.replace(g, value=1) if g.field == "device_type" else
        dataclasses.replace(g, value=0) if g.field == "device_index" else g
        for g in spec.guards])


def reads_only(x, w):
    return torch.relu(x @ w).t()


def writes_first(x, y):
    x.add_(1)
    return x * y


def writes_through_a_view(x, y):
    x[0].mul_(2)
    y.t().contiguous().neg_()  # a copy: y itself is not written
    return x + 1


def writes_via_out(x, y):
    torch.add(y, 1, out=x)
    return y * 2


def test_written_args_follow_in_place_ops_views_and_out_arguments():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    assert passes.written_args(spec_of(reads_only, x, y).plan) == set()
    # leaf 0 is the argument tree's key (Note [Argument trees]); x is leaf 1
    assert passes.written_args(spec_of(writes_first, x.clone(), y).plan) == {1}
    assert passes.written_args(spec_of(writes_through_a_view, x.clone(), y).plan) == {1}
    assert passes.written_args(spec_of(writes_via_out, x.clone(), y).plan) == {1}


def noisy(x):
    return x + torch.randn_like(x)


def test_graph_device_needs_cuda_tensors_and_no_random_ops():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    spec = spec_of(reads_only, x, w)
    assert passes.graph_device(spec) is None  # CPU tensors
    assert passes.graph_device(on_cuda(spec)) == 0
    assert passes.graph_device(on_cuda(spec_of(noisy, x))) is None  # randn_like draws RNG
    # one tensor in two positions is one leaf (Note [Argument trees]): one graph input
    assert passes.graph_device(on_cuda(spec_of(reads_only, x, x))) == 0


def attention(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def attention_dropout(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


def test_attention_without_dropout_draws_no_random_numbers():
    q = torch.randn(1, 2, 3, 8)
    assert passes.graph_device(on_cuda(spec_of(attention, q, q.clone(), q.clone()))) == 0
    assert passes.graph_device(on_cuda(spec_of(attention_dropout, q, q.clone(), q.clone()))) \
        is None


def test_graph_code_builds_without_a_gpu(tmp_path):
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    cpu, cuda = spec_of(reads_only, x, w), on_cuda(spec_of(reads_only, x, w))
    # only the CUDA specialization tries its graph slot (the one the dispatcher hands the
    # module it calls) before its launch sequence
    assert "trt_graph" not in codegen.render(cpu, "reads_only").source
    # the signature (quotes, a backslash) is escaped where a C string holds it
    cuda = dataclasses.replace(cuda, signature='reads_only(x: "a\\b")')
    rendered = codegen.render(cuda, "reads_only")
    source = rendered.source
    assert 'rt->set_error("CUDA graph of reads_only(x: \\"a\\\\b\\")", ' in source
    assert source.count("trt_graph_replay(") == 1
    assert "trt_graph_replay(env->graphs, a, n, rt, out)" in source
    module = build.build(rendered.sources, tmp_path / "graph-build")
    assert module.lib.scm_init(runtime.load().api_address()) == 0


def test_graph_slots_belong_to_the_function():
    f = trident.jit(reads_only)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    f(x, w)
    f._set_graph(0, graphs.PENDING)
    with pytest.raises(IndexError):
        f._set_graph(1, graphs.PENDING)  # one slot per specialization
    with pytest.raises(ValueError, match="descriptor"):
        f._set_graph(0, graphs.READY)
    f._set_graph(0, graphs.OFF)
    assert f._graph_replays() == 0 and torch.equal(f(x, w), reads_only(x, w))


def test_cpu_only_module_has_no_graph_code(tmp_path):
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    source = codegen.render(spec_of(reads_only, x, w), "reads_only").source
    assert "trt_graph" not in source and "trident_cuda.h" not in source


def test_symbolic_specializations_get_graphs_per_size():
    # Note [Graphs per size]: a symbolic specialization may have graphs; its slot is ready with
    # no graph yet and takes sizes, so the SCM itself counts each size's first call
    x, w = torch.randn(8, 4), torch.randn(4, 4)
    f = trident.jit(reads_only, dynamic={"x": [0]})
    f(x, w)
    spec = on_cuda(f._specs[0])
    assert spec.symbolic and passes.graph_device(spec) == 0
    states = graphs.GraphStates(True, sizes=2)
    assert states.slot(spec) == (graphs.READY, graphs.RECAPTURES, (), True)
    static = on_cuda(spec_of(writes_first, x.clone(), x))
    assert not static.symbolic
    assert states.slot(static) == (graphs.PENDING,)
    assert graphs.size_key(static, (x, w)) == ()
    assert graphs.size_key(spec, (x.t(), w)) == ((0, (4, 8), (1, 4), 0), (1, (4, 4), (4, 1), 0))
    # an int whose value the launch sequence does not read is no part of the key
    assert graphs.size_key(spec, (7, w, True)) == ((1, (4, 4), (4, 1), 0),)
    assert graphs._key_words(((0, 7), (1, (4, 4), (4, 1), 0))) == [0, -1, 7, 1, 2, 4, 4, 4, 1, 0]
    states.done(spec, (x, w), graphs.NoGraph("capture failed: a test"))  # no more sizes
    assert states.slot(spec) == (graphs.OFF,)


def test_only_a_pools_first_graph_hands_out():
    # Note [Graph outputs]: a graph captured while another graph of its specialization lives
    # may have its static outputs in that one's dead intermediates (one memory pool), which
    # the earlier graph's replays write: only the first hands out, static or symbolic
    x, w = torch.randn(8, 4), torch.randn(4, 4)
    f = trident.jit(reads_only, dynamic={"x": [0]})
    f(x, w)
    spec = on_cuda(f._specs[0])
    static = on_cuda(spec_of(writes_first, x.clone(), x))

    class Graph:  # a captured graph's memory pool, as torch.cuda.CUDAGraph.pool() gives it
        def pool(self):
            return (0, 1)

    def captured():
        return graphs.Captured(Graph(), {}, [], {}, [])

    states = graphs.GraphStates(True, sizes=4)
    for s in (spec, static):
        assert states.hands_out(s)  # no graph of it yet
    states.done(spec, (x, w), captured())
    assert not states.hands_out(spec)  # a second size shares the first's pool
    assert states.hands_out(static)  # another specialization's graphs: another pool
    states.done(spec, (torch.randn(9, 4), w), graphs.NoGraph("capture failed: a test"))
    assert not states.hands_out(spec)  # the first graph still lives
    assert states.next_call(spec, (x, w)) is not None  # pops the graph of x's size
    assert states.hands_out(spec)  # none lives: a new pool
    states.done(static, (x, w), captured())
    assert not states.hands_out(static)  # (a recapture pops its one graph first)
    states.copy_out.add(spec.key)  # Note [Hand out after a move]: a kept result was seen
    assert not states.hands_out(spec)


class Box:
    pass


def take(x, box):
    return x[:box.n] * 2


def test_a_symbolic_ints_value_is_part_of_the_size_key():
    # Note [Graphs per size]: a symbolic int (Note [Symbolic ints]) that the launch sequence
    # reads as a value picks its graph with the tensors' geometry: x[:n] of one x is another
    # graph for each n
    f = trident.jit(take)
    x, box = torch.randn(8), Box()
    for n in (3, 4, 5):
        box.n = n
        assert torch.equal(f(x, box), take(x, box))
    assert f.stats.compiles == 2
    spec = f._specs[1]
    assert spec.symbolic
    (i,) = graphs._value_ints(spec)
    call = f._flatten((x, box), {})
    assert call.leaves[i] == 5
    assert graphs.size_key(spec, call.leaves) == tuple(
        (k, 5) if k == i else (k, (8,), (1,), 0) for k, a in enumerate(call.leaves)
        if k == i or isinstance(a, torch.Tensor))


def test_graph_slots_count_each_sizes_first_call():
    f = trident.jit(reads_only, dynamic={"x": [0]})
    w = torch.randn(4, 4)
    f(torch.randn(8, 4), w)
    assert f._graph_seen(0, torch.randn(8, 4), w) is False  # remembered from now on
    assert f._graph_seen(0, torch.randn(8, 4), w) is True
    assert f._graph_seen(0, torch.randn(9, 4), w) is False  # another size
    assert f._graph_seen(0, torch.randn(4, 8).t(), w) is False  # other strides
    assert f._graph_seen(0, torch.randn(9, 4)[1:], w) is False  # another offset
    assert f._graph_seen(0, torch.randn(10, 4)[1:-1], w) is True  # 8 rows at offset 4
    with pytest.raises(IndexError):
        f._graph_seen(1, torch.randn(8, 4), w)


def test_sizes_seen_stay_seen_when_another_specialization_is_installed():
    # Note [Sizes seen across installs]: a new specialization's install makes new graph slots;
    # each specialization keeps the sizes its slot saw, at whatever index it now has (as a
    # generate's prefill, whose compile's call is its size's first, before the decode step
    # compiles)
    f = trident.jit(reads_only, dynamic={"x": [0]})
    w, x = torch.randn(4, 4), torch.randn(8, 4)
    assert torch.equal(f(x, w), reads_only(x, w))  # the compile's call enters its size
    first, leaves = f._specs[0].key, f._flatten((x, w), {}).leaves
    w6, x6 = torch.randn(6, 6, dtype=torch.float64), torch.randn(8, 6, dtype=torch.float64)
    assert torch.equal(f(x6, w6), reads_only(x6, w6))  # another specialization installed
    assert f.stats.compiles == 2
    (index,) = [i for i, s in enumerate(f._specs) if s.key == first]
    assert f._graph_seen(index, *leaves) is True
    other = f._flatten((torch.randn(9, 4), w), {}).leaves
    assert f._graph_seen(index, *other) is False  # another size: not seen
    assert f._graph_seen(1 - index, *leaves) is False  # the other slot: its own sizes


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_cuda_graph_sizes_must_be_a_positive_int(bad):
    with pytest.raises(trident.TridentError, match="cuda_graph_sizes"):
        trident.jit(reads_only, cuda_graph_sizes=bad)
