"""``python -m trident.bench cpu|gpu``: eager PyTorch vs torch.compile vs Trident, per call.

``gpu`` runs benchmarks/bench_gpu.py (Triton launches and LLM decode steps, with CUDA graphs and a
raw driver launch among the contenders), benchmarks/bench_host.py (the host floor under a
step-by-step decode step: what its cuBLAS, cuDNN, ATen and launch calls cost), then
benchmarks/bench_hf.py (Hugging Face models through ``generate`` and each of Trident's front
doors, with their floors). ``cpu`` runs the cases below.

Cases:
    chain30   30 small ATen ops (``a = a + b; a = a * b; a = a - b``, ten times) on 16-element
              float32 tensors: nearly all host overhead.
    views40   40 view ops (``t``, ``unsqueeze``, ``squeeze``, ``transpose``, ten times) and one
              add on float32[16, 16]: eager's dispatcher per view against views computed in C
              (Note [Views in C] in trident/lower/plan.py).
    block     the transformer block of ``python -m trident.demo`` (benchmarks/demo.py), batch 1,
              decode-sized.
    head2, head24
              ``F.linear(x, m.lm_head.weight)`` with a Hugging Face ``Qwen2ForCausalLM`` (hidden
              64) of 2 and of 24 layers passed whole: what a hit costs beside what the argument
              reaches (not run by default: ``--cases head2,head24``).

For each case, in one process: Trident's result is checked against eager bit for bit
(``torch.equal``) before anything is timed; then each contender's per-call time is the median of
``--repeats`` timed loops of N calls (N chosen so a loop takes ~50 ms), the contenders' loops
interleaved, after warm-up. Each contender's time over Trident's is printed with its range over
the loops, and called a win or a loss only where the loops' min-max ranges do not overlap
(``benchmarks.demo.compare``); otherwise "no measurable difference". By default first calls
compile from scratch (an empty Trident cache, Inductor's caches off), so the "first call"
column is the compile time; ``--warm-caches`` lets both use their disk caches. ``--json PATH`` writes everything, raw samples included.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from typing import Callable

import torch

from benchmarks.demo import (compare, default_config, format_table, make_inputs, run_case,
                   set_cpu_threads, transformer_block)


def chain30(a, b):
    """30 dependent elementwise ops: ``a = a + b; a = a * b; a = a - b``, ten times."""
    for _ in range(10):
        a = a + b
        a = a * b
        a = a - b
    return a


def chain30_inputs(device: torch.device) -> tuple:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, generator=gen)
    b = torch.rand(16, generator=gen) * 0.5 + 0.75  # keeps |a| bounded over the 10 rounds
    return a.to(device), b.to(device)


def views40(x, y):
    """40 view ops and one add: ``x = x.t().unsqueeze(0).squeeze(0).transpose(0, 1)`` ten
    times, then ``x + y``."""
    for _ in range(10):
        x = x.t().unsqueeze(0).squeeze(0).transpose(0, 1)
    return x + y


def views40_inputs(device: torch.device) -> tuple:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(16, 16, generator=gen).to(device),
            torch.randn(16, generator=gen).to(device))


def head(m, x):
    """The output projection of a Hugging Face model passed whole: a hit checks only what the
    call reads of it (Note [Unchanged subtrees] in trident/runtime/tree_eval.cpp)."""
    return torch.nn.functional.linear(x, m.lm_head.weight)


def head_inputs(device: torch.device, layers: int) -> tuple:
    import transformers

    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(device).eval().requires_grad_(False)
    return model, torch.randn(2, 64, device=device)


def cases(device: torch.device) -> dict[str, tuple[str, Callable, tuple]]:
    cfg = default_config(device)
    return {
        "head2": ("head(m, x) of a 2-layer Hugging Face Qwen2 (hidden 64)", head,
                  head_inputs(device, 2)),
        "head24": ("head(m, x) of a 24-layer Hugging Face Qwen2 (hidden 64)", head,
                   head_inputs(device, 24)),
        "chain30": ("30 ATen ops (add, mul, sub) on float32[16]", chain30,
                    chain30_inputs(device)),
        "views40": ("40 view ops and one add on float32[16, 16]", views40,
                    views40_inputs(device)),
        "block": (f"transformer block (benchmarks/demo.py): {cfg.describe()}", transformer_block,
                  make_inputs(device, cfg)),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    info = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "intra_op_threads": torch.get_num_threads()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    from trident import __version__

    info["trident"] = __version__
    return info


def summary_table(results: dict) -> str:
    """Median µs per call, and each contender's time over Trident's with its range over the
    timed loops and the verdict (:func:`benchmarks.demo.compare`)."""
    rows = [f"{'case':<10}{'eager µs':>10}{'compile µs':>12}{'Trident µs':>12}  "
            f"{'eager / Trident':<44}{'torch.compile / Trident'}", "-" * 132]
    for name, r in results.items():
        times = "".join(f"{r[c]['us']:>{w}.1f}" if "us" in r[c] else f"{'n/a':>{w}}"
                        for c, w in (("eager", 10), ("torch.compile", 12), ("Trident", 12)))
        ratios = [str(compare(r[c]["samples_us"], r["Trident"]["samples_us"]))
                  if "us" in r[c] and "us" in r["Trident"] else "n/a"
                  for c in ("eager", "torch.compile")]
        rows.append(f"{name:<10}{times}  {ratios[0]:<44}{ratios[1]}")
    return "\n".join("  " + row for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trident.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=["cpu", "gpu"], help="run on the CPU or on CUDA")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per contender (7)")
    parser.add_argument("--cases", default="chain30,views40,block",
                        help="comma-separated cases (default: chain30,views40,block)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--warm-caches", action="store_true",
                        help="let Trident and Inductor use their disk caches on the first call")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads on the CPU (default 1)")
    parser.add_argument("--models", default="llama-3.2-1b-like,qwen2.5-0.5b-like",
                        help="gpu: decode-step models to run, or none")
    parser.add_argument("--model-compile-modes", default="default,reduce-overhead",
                        help="gpu: torch.compile modes timed on the decode steps")
    parser.add_argument("--hf-models", default="llama-3.2-1b-like,qwen2.5-0.5b-like",
                        help="gpu: Hugging Face models through generate and every front door "
                             "(benchmarks/bench_hf.py; its JSON beside --json's, .hf.json), "
                             "or none")
    opts = parser.parse_args(argv)

    if opts.suite == "gpu":
        if not torch.cuda.is_available():
            print("trident.bench gpu: CUDA is not available here (torch "
                  f"{torch.__version__}); run `python -m trident.bench cpu`", file=sys.stderr)
            return 2
        from benchmarks import bench_gpu  # the Triton and LLM decode cases (docs/benchmarks.md)

        models = [m for m in opts.models.split(",") if m and m != "none"]
        bench_gpu.main(opts.json, model_names=models,
                       model_compile_modes=tuple(opts.model_compile_modes.split(",")))
        if models:  # the host floor under the step-by-step steps
            from benchmarks import bench_host

            bench_host.main(opts.json and os.path.splitext(opts.json)[0] + ".host.json", models)
        hf_models = [m for m in opts.hf_models.split(",") if m and m != "none"]
        if hf_models:
            from benchmarks import bench_hf

            bench_hf.main(opts.json and os.path.splitext(opts.json)[0] + ".hf.json", hf_models)
        return 0
    device = torch.device("cpu")
    set_cpu_threads(opts.threads)
    import trident

    trident.jit(chain30)  # load (the first time: build) Trident's native runtime up front
    all_cases = cases(device)
    names = [n.strip() for n in opts.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in all_cases]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(all_cases)}")

    info = machine()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"trident.bench {opts.suite}: {date}")
    print(f"  {info['cpu']} ({info['cpu_count']} CPUs), {info['intra_op_threads']} intra-op "
          f"thread(s)")
    print(f"  Python {info['python']}, torch {info['torch']}, triton {info['triton']}, "
          f"Trident {info['trident']}")
    print(f"  per call: median of {opts.repeats} timed loops, interleaved, after warm-up; first "
          f"calls {'may use disk caches' if opts.warm_caches else 'compile from scratch'}")

    started = time.perf_counter()
    results: dict[str, dict] = {}
    failed = False
    for name in names:
        description, fn, args = all_cases[name]
        print(f"\n[{name}] {description}")
        result = run_case(fn, args, device, use_compile=not opts.no_compile,
                          cold=not opts.warm_caches, repeats=opts.repeats)
        result["description"] = description
        results[name] = result
        if "error" in result["Trident"]:
            failed = True
            print(f"  Trident: {result['Trident']['error']}")
        print()
        print(format_table(result))

    print(f"\nsummary, {time.perf_counter() - started:.0f} s in all: median µs per call; "
          f"x / Trident = x's time over Trident's (above 1: Trident took less), in parentheses\n"
          f"its range over the {opts.repeats} loops; a side wins only where the loops' min-max "
          "ranges do not overlap\n")
    print(summary_table(results))

    if opts.json:
        payload = {
            "command": "python -m trident.bench " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "date": date, "suite": opts.suite, "device": str(device), "machine": info,
            "settings": {"repeats": opts.repeats, "warm_caches": opts.warm_caches,
                         "torch_compile": not opts.no_compile},
            "cases": results,
        }
        with open(opts.json, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"\nwrote {opts.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
