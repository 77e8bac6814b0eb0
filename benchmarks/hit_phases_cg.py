"""A decode hit inside ``generate`` counted in instructions per phase, under callgrind (issue 25).

Instruction counts are exact and do not move with the machine's load, which wall-clock parts
(``generate_hits --parts``) do. Two steps, from the repository root:

``valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT.%p
python3 -m benchmarks.hit_phases_cg run ARCH LAYERS CACHE [--tokens 7] [--mask]``

runs three greedy ``generate`` calls of a tiny random model (``sweep_hf.tiny_model``: hidden 64,
batch 1, a 6-token prompt; ``CACHE`` ``static`` or ``default``; ``--mask``: an attention mask of
ones given to ``generate``) through ``trident.jit(model.forward)`` uninstrumented (compiles),
one instrumented, then zeroes the counters after the next ``generate``'s prefill and dumps them
after its ``--tokens - 1`` decode hits (``callgrind_control``); then

``python3 -m benchmarks.hit_phases_cg report OUT.PID.1 HITS``

prints, per hit, the inclusive instructions of each phase of the native hit path (the functions
of ``runtime/dispatcher.cpp`` and the SCM): the state guards, binding and argument tree, reading
the leaves, the guards, the value checks (Note [Value checks]), the launch sequence (on the
CPU, ATen's kernels) or the graph replay, and the output's rebuild and recipe.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess

PHASES = [("native hit (Dispatcher_call)", r"Dispatcher_call\("),
          ("state guards (state_holds)", r"state_holds\("),
          ("binding and argument tree (flatten_args)", r"flatten_args\("),
          ("environment and leaves (read_args)", r"read_args\("),
          ("guards (guard)", r"^guard$"),
          ("value checks (check_values)", r"^check_values$"),
          ("launch sequence (run)", r"^run$"),
          ("graph replay (trt_graph_replay)", r"trt_graph_replay"),
          ("output rebuild (build_output)", r"build_output\("),
          ("output recipe (apply_recipe)", r"apply_recipe\(")]


def run(a) -> None:
    import torch

    import trident
    from benchmarks.sweep_hf import tiny_model

    torch.set_num_threads(1)
    model = tiny_model(a.arch, "cpu", a.layers)
    jf = trident.jit(model.forward)
    pid, state = str(os.getpid()), {"n": 0, "zero": False}

    def ctl(*args):
        subprocess.run(["callgrind_control", *args, pid], check=True, stdout=subprocess.DEVNULL)

    def forward(*args, **kwargs):
        out = jf(*args, **kwargs)
        state["n"] += 1
        if state["n"] == 1 and state["zero"]:  # after the prefill: its decode hits alone
            ctl("-z")
        return out

    model.forward = forward
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (1, 6))
    kw = dict(max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False,
              disable_compile=True)
    if a.cache != "default":
        kw["cache_implementation"] = a.cache
    if a.mask:
        kw["attention_mask"] = torch.ones_like(ids)

    def generate():
        state["n"] = 0
        return model.generate(ids, **kw)

    for _ in range(3):
        generate()
    gc.disable()
    ctl("-i", "on")
    generate()
    state["zero"] = True
    hits = jf.hits
    generate()
    print(f"{jf.hits - hits - 1} decode hits counted; {jf.stats}", flush=True)
    ctl("-d", "decode")


def report(path: str, hits: int) -> list[tuple[str, float]]:
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    costs: dict = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([\d. %]+\)\s+\S*?:(.*?)( \[.*)?$", line)
        if not m or m.group(2).endswith("'2"):  # (a recursive call's cost is its caller's)
            continue
        fn = m.group(2).replace("(anonymous namespace)::", "")
        for name, pattern in PHASES:
            if re.search(pattern, fn):
                costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    rows = [(name, costs.get(name, 0) / hits) for name, _ in PHASES]
    rest = costs.get(PHASES[0][0], 0) - sum(v for k, v in costs.items() if k != PHASES[0][0])
    rows.append(("the rest (the hit's own code, holds, recipe values)", rest / hits))
    for name, v in rows:
        print(f"{name:52s} {v:12,.0f}")
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("arch")
    r.add_argument("layers", type=int)
    r.add_argument("cache")
    r.add_argument("--tokens", type=int, default=7)
    r.add_argument("--mask", action="store_true")
    s = sub.add_parser("report")
    s.add_argument("path")
    s.add_argument("hits", type=int)
    a = p.parse_args(argv)
    if a.what == "run":
        run(a)
    else:
        report(a.path, a.hits)


if __name__ == "__main__":
    main()
