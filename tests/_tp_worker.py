"""One rank of tests/test_collectives.py (not a test module): gloo, CPU tensors.

``run(rank, world, port, cache, out)`` runs every case on this rank and writes what it saw to
``out/<rank>.json`` (values compared with eager here, on the rank; stats as text fields); the
test asserts on both ranks' records. Every case runs in the same order on both ranks, so their
collectives pair up.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

import trident
from trident.frontend.backend import trident_backend


# torch 2.13 deprecates all_gather_into_tensor and reduce_scatter_tensor for the *_single names
# (a FutureWarning at every call, which makes a jitted call eager: Note [Warnings a trace gives]
# in trident/lower/state/warned.py); torch 2.11 has the old names only
ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def collectives(x):
    """Functional all_reduce, all_gather and reduce_scatter, the in-place all_reduce, and the
    in-place all_gather and reduce_scatter (the world size is read while traced)."""
    group, world = dist.group.WORLD, dist.get_world_size()
    s = funcol.all_reduce(x * 2, "sum", group)
    g = funcol.all_gather_tensor(x + 1, 0, group)
    r = funcol.reduce_scatter_tensor(g * 3, "sum", 0, group)
    y = x - 1
    dist.all_reduce(y)
    m = x.clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    gathered = torch.empty(world * x.shape[0], *x.shape[1:], device=x.device)
    ALL_GATHER(gathered, x * 4)
    scattered = torch.empty(x.shape[0] // world, *x.shape[1:], device=x.device)
    REDUCE_SCATTER(scattered, x + 5)
    return s + 1, g, r, y, m, gathered, scattered


def scaled_by_rank(x):
    """Reads the rank while traced: a constant of the specialization (Note [Process group
    guard])."""
    return x * (dist.get_rank() + 1)


# A tiny Llama-like decoder layer, tensor-parallel over the world: column-parallel QKV and
# gate/up (each rank holds its heads and its slice of the intermediate dim), row-parallel o_proj
# and down, each followed by an all-reduce (in place, as Megatron's RowParallelLinear; the other
# functional). One decode step: one token, a KV cache of CTX positions.
D, HEADS, KV_HEADS, HEAD_DIM, INTER, CTX = 64, 4, 2, 16, 128, 8


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def tp_decode_step(h, cos, sin, ln1, ln2, wq, wk, wv, wo, wg, wu, wd, k_cache, v_cache):
    heads, kv_heads = wq.shape[0] // HEAD_DIM, wk.shape[0] // HEAD_DIM  # this rank's
    x = rms_norm(h, ln1)
    q = F.linear(x, wq).view(1, 1, heads, HEAD_DIM).transpose(1, 2)
    k = F.linear(x, wk).view(1, 1, kv_heads, HEAD_DIM).transpose(1, 2)
    v = F.linear(x, wv).view(1, 1, kv_heads, HEAD_DIM).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    kc = torch.cat([k_cache[:, :, 1:], k], dim=2)
    vc = torch.cat([v_cache[:, :, 1:], v], dim=2)
    a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    o = F.linear(a.transpose(1, 2).reshape(1, 1, heads * HEAD_DIM), wo)
    dist.all_reduce(o)
    h = h + o
    x = rms_norm(h, ln2)
    d = F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)
    h = h + funcol.all_reduce(d, "sum", dist.group.WORLD)
    return h, kc, vc


def tp_weights(rank: int, world: int, device: str = "cpu"):
    """This rank's shards (random: the comparison is with the same TP program run eagerly);
    the hidden state, norms and rotary tables are the same on every rank."""
    g = torch.Generator().manual_seed(100 + rank)
    shared = torch.Generator().manual_seed(7)
    heads, kv_heads, inter = HEADS // world, KV_HEADS // world, INTER // world

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.1).to(device)

    same = (torch.randn(1, 1, D, generator=shared), torch.randn(1, 1, HEAD_DIM, generator=shared),
            torch.randn(1, 1, HEAD_DIM, generator=shared),
            torch.rand(D, generator=shared) + 0.5, torch.rand(D, generator=shared) + 0.5)
    return (*(t.to(device) for t in same),
            w(heads * HEAD_DIM, D), w(kv_heads * HEAD_DIM, D), w(kv_heads * HEAD_DIM, D),
            w(D, heads * HEAD_DIM), w(inter, D), w(inter, D), w(D, inter),
            w(1, kv_heads, CTX, HEAD_DIM), w(1, kv_heads, CTX, HEAD_DIM))


SUBGROUP = ""  # set by run(): the name of a group other than the default one


def on_subgroup(x):
    return funcol.all_reduce(x, "sum", SUBGROUP)


def _equal(a, b) -> bool:
    a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _stats(fn) -> dict:
    s = fn.stats
    return {"hits": s.hits, "misses": s.misses, "compiles": s.compiles,
            "fallbacks": s.fallbacks, "miss_reasons": s.miss_reasons}


def _backend(graphs: list):
    """torch.compile's backend="trident", keeping each graph's function for its stats."""
    def backend(gm, example_inputs):
        fn = trident_backend(gm, example_inputs)
        graphs.append(fn)
        return fn
    return backend


def run(rank: int, world: int, port: int, cache: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRIDENT_CACHE_DIR=cache)
    torch.manual_seed(rank)
    record: dict = {}
    timeout = datetime.timedelta(seconds=60)  # a rank that stops makes the other raise
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    warnings.simplefilter("ignore", FutureWarning)  # funcol's *_tensor names are deprecated

    x = torch.randn(4, 3)
    jf = trident.jit(collectives)
    record["collectives_equal"] = [_equal(jf(x), collectives(x)) for _ in range(3)]
    record["collectives"] = _stats(jf)
    record["collectives_source"] = jf.source()

    torch._dynamo.reset()
    graphs: list = []
    compiled = torch.compile(collectives, backend=_backend(graphs))
    record["compile_equal"] = [_equal(compiled(x), collectives(x)) for _ in range(3)]
    record["compile"] = [_stats(g) for g in graphs]

    args = tp_weights(rank, world)
    tp = trident.jit(tp_decode_step)
    record["tp_equal"] = [_equal(tp(*args), tp_decode_step(*args)) for _ in range(3)]
    record["tp"] = _stats(tp)

    # The rank is a constant of the trace: rank 1 must not run rank 0's specialization, which
    # it finds in the cache folder both ranks share.
    sr = trident.jit(scaled_by_rank)
    for turn in range(world):
        if turn == rank:
            record["scaled_equal"] = _equal(sr(x), scaled_by_rank(x))
        dist.barrier()
    record["scaled"] = _stats(sr)

    # A collective on another group than the default one runs eagerly, with a warning.
    global SUBGROUP
    SUBGROUP = dist.new_group(list(range(world))).group_name
    js = trident.jit(on_subgroup)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record["subgroup_equal"] = _equal(js(x), on_subgroup(x))
    record["subgroup"] = _stats(js)
    record["subgroup_warnings"] = [str(w.message) for w in caught if "trident" in str(w.message)]

    # A rank that leaves (its gloo connections close): the other's next collective raises at
    # once, naming the user's line, instead of waiting for the timeout.
    if rank == 1:
        dist.destroy_process_group()
    else:
        try:
            jf(x)
        except RuntimeError as e:
            record["peer_gone"] = [type(e).__name__, str(e)]
        dist.destroy_process_group()

    # Another world: each rank alone in a group of one. The same functions miss on the process
    # group guard and compile again.
    os.environ["MASTER_PORT"] = str(port + 1 + rank)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timeout)
    record["alone_equal"] = _equal(jf(x), collectives(x))
    record["alone"] = _stats(jf)
    dist.destroy_process_group()

    # No group: the call runs eagerly, with a warning, and raises what eager raises.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            jf(x)
        except Exception as e:  # noqa: BLE001 - compared with eager's below
            got = (type(e).__name__, str(e))
    try:
        collectives(x)
    except Exception as e:  # noqa: BLE001
        want = (type(e).__name__, str(e))
    record["no_group_error"] = [got, want]
    record["no_group_warnings"] = [str(w.message) for w in caught if "trident" in str(w.message)]
    record["no_group"] = _stats(jf)
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(record, f)


def run_cuda(rank: int, world: int, port: int, cache: str, out: str) -> None:
    """The same programs over NCCL, one GPU per rank: the decode step is captured into a CUDA
    graph with its collectives on its second call and replayed after (Note [CUDA graphs])."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRIDENT_CACHE_DIR=cache)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    warnings.simplefilter("ignore", FutureWarning)
    record: dict = {}
    x = torch.randn(4, 3, device="cuda", generator=torch.Generator("cuda").manual_seed(rank))
    jf = trident.jit(collectives)
    record["collectives_equal"] = [_equal(jf(x), collectives(x)) for _ in range(4)]
    record["collectives"] = _stats(jf)
    args = tp_weights(rank, world, "cuda")
    tp = trident.jit(tp_decode_step)
    record["tp_equal"] = [_equal(tp(*args), tp_decode_step(*args)) for _ in range(4)]
    record["tp"] = dict(_stats(tp), graph_captures=tp.stats.graph_captures,
                        graph_replays=tp.stats.graph_replays)
    # a CUDA graph that holds NCCL kernels must go before its communicator: NCCL's
    # ncclCommDestroy waits for it (docs/tensor-parallel.md, "Limits")
    del jf, tp
    gc.collect()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(record, f)
