"""A decode hit of a Hugging Face forward split into its parts, on the CPU (issue 25).

``python3 -m benchmarks.hit_parts_cpu [llama|qwen2] [layers] [--rounds N] [--wall]``. A tiny
random model (hidden 64, the given depth), ``model.forward`` behind ``trident.jit`` (through a
wrapper that records ``generate``'s third forward call: a decode step), three greedy
``generate`` calls with a static cache, then that decode step called again, its cache
positions put back before each round of 20 calls:

- ``Dispatcher._hit_profile`` (the native hit path with a clock between its parts), µs per
  call, the fastest round; by default in the thread's CPU time (on a machine shared with other
  work, the wall clock counts the time other processes held the core), ``--wall`` for the
  wall clock;
- the whole call and the eager forward, the fastest round, on the same clock;
- flushed: the same parts of single calls, each after a 16 MiB write evicted the CPU's caches,
  the median (on the CPU the run part flushes them too: compare on the GPU machine, where a
  replay leaves the host's caches warm);
- host parts: the parts less the run (on the GPU, a replay's host work), and the ratios of
  the flushed and in-situ columns to the repeated one (issue 25: a hit inside ``generate``
  against the same hit alone);
- in situ: the same parts and the whole call of each decode step inside ``generate`` (the
  wrapper times the call, or makes it through ``_hit_profile(..., keep=True)``), the median over
  3 more ``generate`` calls each; a decode step's arguments are new objects at each step, and
  ``generate``'s own Python runs between two steps;
- the decode step's leaves by type and its guards by kind (what a hit reads per layer);
- ``tree_passes()``: per argument tree root, how many checks took the quiet pass, the
  unchanged pass and a walk (Note [Unchanged subtrees]), summed over the installed trees;
- the Python functions that 5 hits run (``sys.setprofile``): none on a native hit.
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import time

import torch


def main(argv=None) -> dict:
    import transformers

    import trident

    p = argparse.ArgumentParser()
    p.add_argument("arch", nargs="?", default="llama", choices=("llama", "qwen2"))
    p.add_argument("layers", nargs="?", type=int, default=16)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--wall", action="store_true")
    a = p.parse_args(argv)
    threads, collecting = torch.get_num_threads(), gc.isenabled()
    torch.set_num_threads(1)
    try:
        return _run(a, transformers, trident)
    finally:  # as the caller had them (test_bench runs it in the suite's process: a collector
        torch.set_num_threads(threads)  # left off failed test_frozen_heap after it)
        if collecting:
            gc.enable()


def _run(a, transformers, trident) -> dict:
    names = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
             "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}[a.arch]
    config = getattr(transformers, names[0])(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=a.layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = getattr(transformers, names[1])(config).eval()
    eager, jf = model.forward, trident.jit(model.forward)
    clock = time.perf_counter_ns if a.wall else time.thread_time_ns
    seen = {"n": 0, "call": None, "mode": None, "whole": [], "parts": []}

    def recorded(*args, **kwargs):  # one wrapper for every generate: model.forward is guarded
        seen["n"] += 1
        if seen["n"] == 3:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))  # 5.25, 5.17
            tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)] + [
                layer.cumulative_length for layer in getattr(cache, "layers", ())
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
            seen["call"] = (args, kwargs, [(t, t.clone()) for t in tensors])
        if seen["mode"] == "whole" and seen["n"] > 1:  # a decode step, timed where it runs
            start = clock()
            out = jf(*args, **kwargs)
            seen["whole"].append((clock() - start) / 1e3)
            return out
        if seen["mode"] == "parts" and seen["n"] > 1:
            parts, out = jf._hit_profile(args, kwargs, 1, not a.wall, True)
            seen["parts"].append(parts)
            return out
        return jf(*args, **kwargs)

    def generate():
        seen["n"] = 0
        model.generate(ids, max_new_tokens=40, do_sample=False, cache_implementation="static",
                       disable_compile=True)

    model.forward = recorded
    ids = torch.randint(0, 96, (1, 6))
    for _ in range(3):
        generate()
    args, kwargs, values = seen["call"]
    gc.disable()
    with torch.no_grad():  # as generate's own calls
        for mode in ("whole", "parts") * 3:  # in situ: each decode step of a greedy generate
            seen["mode"] = mode
            generate()
    seen["mode"] = None
    in_situ = {k: statistics.median(p[k] for p in seen["parts"]) for k in seen["parts"][0]}
    in_situ["whole call"] = statistics.median(seen["whole"])

    def restore():
        for t, v in values:
            t.copy_(v)

    best: dict = {}
    whole, alone = [], []
    cold: dict = collections.defaultdict(list)
    flush = torch.empty(16 << 20, dtype=torch.uint8)  # 16 MiB: past the CPU's caches
    with torch.no_grad():
        for _ in range(a.rounds):
            restore()
            for k, v in jf._hit_profile(args, kwargs, 20, not a.wall).items():
                best[k] = min(best.get(k, v), v)
            restore()
            for _ in range(20):  # each call after the caches were flushed
                flush.add_(1)
                for k, v in jf._hit_profile(args, kwargs, 1, not a.wall).items():
                    cold[k].append(v)
            for fn, out in ((jf, whole), (eager, alone)):
                restore()
                start = clock()
                for _ in range(20):
                    fn(*args, **kwargs)
                out.append((clock() - start) / 20e3)
        calls = collections.Counter()

        def profiler(frame, event, arg):
            if event == "call":
                calls[f"{frame.f_code.co_filename}:{frame.f_code.co_name}"] += 1

        restore()
        sys.setprofile(profiler)
        for _ in range(5):
            jf(*args, **kwargs)
        sys.setprofile(None)
    print(f"{a.arch}, {a.layers} layers, Python {sys.version.split()[0]}, torch "
          f"{torch.__version__}, transformers {transformers.__version__}; "
          f"{'wall clock' if a.wall else 'thread CPU time'}, µs per call, fastest of {a.rounds}")
    print(f"  {jf.stats}".split(", miss_reasons")[0])
    cold = {k: statistics.median(v) for k, v in cold.items()}
    print(f"  {'':42s} {'repeated':>9s} {'flushed':>9s} {'in situ':>9s}")
    totals = [0.0, 0.0, 0.0]
    for k, v in best.items():
        if k.startswith("replay") or k == "hits":
            continue
        print(f"  {k:42s} {v:9.2f} {cold[k]:9.2f} {in_situ[k]:9.2f}")
        if k != "guards":  # the run checks the guards again
            totals = [t + x for t, x in zip(totals, (v, cold[k], in_situ[k]))]
    print(f"  {'parts, guards alone excluded':42s} {totals[0]:9.2f} {totals[1]:9.2f} "
          f"{totals[2]:9.2f}")
    host = [sum(v for k, v in col.items() if k not in ("guards", "hits", "whole call") and
                not k.startswith(("replay", "run"))) for col in (best, cold, in_situ)]
    print(f"  {'host parts (the run excluded)':42s} {host[0]:9.2f} {host[1]:9.2f} {host[2]:9.2f}"
          f"   flushed / repeated {host[1] / host[0]:.2f}, in situ / repeated "
          f"{host[2] / host[0]:.2f}")
    print(f"  {'whole call':42s} {min(whole):9.2f} {'':9s} {in_situ['whole call']:9.2f}")
    print(f"  {'eager forward':42s} {min(alone):9.2f}")
    call = jf._flatten(args, kwargs)  # what the hit reads: its leaves and guards, by kind
    spec = jf._specs[jf._installed_match(call)]
    kinds = collections.Counter(type(v).__name__ for v in call.leaves)
    guards = collections.Counter(type(g).__name__ for g in spec.guards)
    print(f"  leaves {len(call.leaves)} {dict(kinds)}; guards {len(spec.guards)}, of which "
          f"{dict(guards.most_common(3))}")
    print("  tree passes (quiet, unchanged, walked):")
    for path, passes in jf.tree_passes().items():
        print(f"    {path}: {passes}")
    print(f"  Python run by 5 hits: {dict(calls) or 'none'}")
    return {"parts": best, "flushed": cold, "in situ": in_situ, "python": dict(calls), "stats": jf.stats,
            "passes": jf.tree_passes(), "host": host}


if __name__ == "__main__":
    main()
