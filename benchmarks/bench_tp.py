"""Tensor-parallel benchmark: ``torchrun --nproc-per-node 2 -m benchmarks.bench_tp [out.json]``.

The Llama-3.2-1B-like decode step of ``benchmarks/bench_gpu.py`` (hidden 2048, 16 layers, 32/8
heads, intermediate 8192, bf16, Liger's rms_norm, rope and swiglu, KV length 256), split over
the ranks as Megatron splits it: column-parallel QKV and gate/up (each rank holds its heads and
its slice of the intermediate dim), row-parallel o_proj and down, each followed by an in-place
``dist.all_reduce`` over NCCL. Each rank's weights are its own random shards; the comparison is
with the same tensor-parallel program run eagerly on that rank.

Contenders, every one in the same run and in the same order on every rank (their collectives
pair up): eager TP; ``torch.compile`` TP (default mode); Trident TP with CUDA graphs (the
default) and without (``cuda_graphs=False``, the launch sequence step by step); the CUDA-graph
floor (the eager TP step captured once with ``torch.cuda.graph`` and replayed, no guards); and
Trident on one GPU (the whole model, TP=1, rank 0 only, the other ranks wait). Times are ms per
step (median of 5 batches of 20 steps, rank 0's clock), GPU synchronized once per batch.
Trident's results are compared with eager's bit for bit on each rank.

Robustness: each contender runs in ``try``; its row is printed and written to the JSON file as
soon as it is measured. A contender that fails on one rank only leaves the others waiting in a
collective: the process group's timeout (5 min) ends the run then, with the rows measured so far
on disk.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

import trident
from benchmarks.bench_gpu import (CONFIGS, build_model, cuda_graph, first_call, make_decode_step,
                               per_call, same)
from benchmarks.demo import compare

MODEL = "llama-3.2-1b-like"


def shard(cfg: dict, world: int) -> dict:
    """This rank's part of ``cfg``: its heads, KV heads and intermediate dims."""
    return dict(cfg, H=cfg["H"] // world, KV=cfg["KV"] // world, I=cfg["I"] // world)


def timed(fn) -> tuple[float, list[float]]:
    """ms per step: the median over 5 batches of 20 steps, and every batch's time."""
    samples = [t / 1e3 for t in per_call(fn, n=20, warm=3, reps=5)]
    return statistics.median(samples), samples


def run(rank: int, world: int, results: dict, save) -> None:
    cfg = CONFIGS[MODEL]
    step = make_decode_step(shard(cfg, world), all_reduce=dist.all_reduce)
    weights, cos, sin = build_model(shard(cfg, world))
    h = torch.randn(1, 1, cfg["D"], device="cuda", dtype=torch.bfloat16,
                    generator=torch.Generator(device="cuda").manual_seed(1))
    args = (h, cos, sin, *weights)
    row = results.setdefault(f"{MODEL} TP={world} decode step (ms)", {"samples": {}})

    def contender(name, make):
        print(f"rank {rank}: {name}", flush=True)
        try:
            fn, stats = make()
            row[name], row["samples"][name] = timed(fn)
            if stats is not None:
                row[f"{name}_stats"] = str(stats)
        except Exception:
            row[f"{name}_error"] = traceback.format_exc()[-1500:]
        if rank == 0:
            print(name, {k: v for k, v in row.items() if k.startswith(name) and
                         not k.endswith("error")}, row.get(f"{name}_error", ""), flush=True)
        save()

    with torch.no_grad():
        want = step(*args)

        def eager():
            return lambda: step(*args), None

        def jitted(**options):
            def make():
                jf = trident.jit(step, fallback=False, **options)
                label = "trident" if options.get("cuda_graphs", True) else "trident_steps"
                row[f"{label}_first_call_s"], _ = first_call(lambda: jf(*args))
                row[f"{label}_equal"] = same(jf(*args), want)
                return lambda: jf(*args), jf.stats
            return make

        def compiled():
            torch._dynamo.reset()
            fn = torch.compile(step)
            row["compile_first_call_s"], _ = first_call(lambda: fn(*args))
            row["compile_equal"] = same(fn(*args), want)
            return lambda: fn(*args), None

        def floor():
            graph, out = cuda_graph(lambda: step(*args))
            graph.replay()
            row["cuda_graph_equal"] = same(out, want)
            return graph.replay, None

        contender("eager", eager)
        contender("compile", compiled)
        contender("trident", jitted())
        contender("trident_steps", jitted(cuda_graphs=False))
        contender("cuda_graph", floor)
    one_gpu(rank, cfg, results, save)


def one_gpu(rank: int, cfg: dict, results: dict, save) -> None:
    """Trident on the whole model, TP=1, on rank 0; the other ranks wait at a barrier."""
    if rank == 0:
        row = results.setdefault(f"{MODEL} TP=1 decode step (ms)", {"samples": {}})
        print("rank 0: trident TP=1", flush=True)
        try:
            step = make_decode_step(cfg)
            weights, cos, sin = build_model(cfg)
            h = torch.randn(1, 1, cfg["D"], device="cuda", dtype=torch.bfloat16,
                            generator=torch.Generator(device="cuda").manual_seed(1))
            args = (h, cos, sin, *weights)
            jf = trident.jit(step, fallback=False)
            row["trident_equal"] = same(jf(*args), step(*args))
            row["trident"], row["samples"]["trident"] = timed(lambda: jf(*args))
            row["trident_stats"] = str(jf.stats)
        except Exception:
            row["trident_error"] = traceback.format_exc()[-1500:]
        print("TP=1", {k: v for k, v in row.items() if k != "samples"}, flush=True)
        save()
    dist.barrier()


def report(results: dict, per_rank: list[dict]) -> str:
    """Rows as measured on rank 0, each rank's equality with eager, and the ratios."""
    tp = next((r for k, r in results.items() if "TP=1" not in k), {})
    one = next((r for k, r in results.items() if "TP=1" in k), {})
    lines = []
    for name in ("eager", "compile", "trident", "trident_steps", "cuda_graph"):
        value = tp.get(name)
        lines.append(f"{name:>14}: " + (f"{value:.3f} ms" if isinstance(value, float) else
                                       "failed: " + str(tp.get(f"{name}_error", "?"))[-300:]))
    if isinstance(one.get("trident"), float):
        lines.append(f"{'trident TP=1':>14}: {one['trident']:.3f} ms")

    samples = tp.get("samples", {})
    if "trident" in samples:
        for name in ("cuda_graph", "eager", "compile", "trident_steps"):
            if name in samples:  # a win only where the batches' ranges do not overlap
                lines.append(f"{name} / Trident TP: {compare(samples[name], samples['trident'])}")
    for a, b, text in (("trident", "cuda_graph", "Trident TP / CUDA-graph floor (target <= 1.1)"),
                       ("trident_steps", "cuda_graph", "Trident TP without graphs / floor")):
        if isinstance(tp.get(a), float) and isinstance(tp.get(b), float):
            lines.append(f"{text}: {tp[a] / tp[b]:.3f}")
    if isinstance(one.get("trident"), float) and isinstance(tp.get("trident"), float):
        lines.append(f"Trident TP=1 / Trident TP: {one['trident'] / tp['trident']:.2f}")
    for rank, r in enumerate(per_rank):
        equal = {k: v for k, v in r.items() if k.endswith("_equal")}
        lines.append(f"rank {rank} equal to eager TP: {equal}")
    return "\n".join(lines)


@record  # under torchrun, a failed rank's traceback reaches the agent's report
def main(json_path: str | None = None) -> dict:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict = {}
    import triton

    env = {"gpu": torch.cuda.get_device_name(), "world": world, "torch": torch.__version__,
           "triton": triton.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "python": sys.version.split()[0]}

    def save():
        if json_path and rank == 0:
            with open(json_path, "w") as f:
                json.dump({"env": env, "results": results}, f, indent=1, default=str)

    if rank == 0:
        print(json.dumps(env), flush=True)
    try:
        run(rank, world, results, save)
    finally:
        per_rank = [None] * world
        mine = next((r for k, r in results.items() if "TP=1" not in k), {})
        dist.all_gather_object(per_rank, {k: v for k, v in mine.items() if k != "samples"})
        results["per_rank"] = per_rank
        save()
        if rank == 0:
            print(report(results, per_rank), flush=True)
        dist.destroy_process_group()
    return results


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else
         os.environ.get("OUT") and os.path.join(os.environ["OUT"], "bench_tp.json"))
