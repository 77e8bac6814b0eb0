"""A first ``generate`` with its compile, and a restarted process's first ``generate``, per door.

``python3 -m benchmarks.bench_cold out.json [model ...]``: for each model (bench_hf's
``MODELS``, a ``+liger`` suffix patches Liger-Kernel's RoPE, RMSNorm and SwiGLU in) and each
door (``trident.jit(model.forward)``, ``torch.compile(backend="trident")``, transformers'
``CompileConfig(backend="trident")``, and the peer, transformers' auto-compile: inductor), two
processes in a row on one fresh cache (Trident's, Triton's and inductor's): ``cold``, the first
process's first ``generate`` (16-token prompt, 64 new tokens, static cache, greedy) with its
compile, and ``warm``, the next process's, which loads what the first stored. A last door,
``dynamo``, is ``torch.compile(backend="eager")``: Dynamo's own trace and guards with no compiler
behind them, the floor of the torch.compile doors' warm restart. Each process runs one eager
``generate`` first (CUDA's and the libraries' set-up, not a compile), then the door's first
(``first_s``) and second (``second_s``, nothing left to compile or load), with the CPU seconds
of the first, the second and the eager one (``cpu_s``, steadier on a busy machine), the wall and
CPU seconds of ``import trident`` (``import_s``, after torch and transformers), and reports the
seconds of each compile stage (``trident.config.compile_times()``, Note [Compile stages]; its CPU
seconds, with the C compiler's, in ``compile_cpu``), the
door's stats, and whether its tokens equal eager's. Trident's native runtime is built once, before
every door, and shared.

``TRIDENT_BENCH_ONLY=jit,backend,config,auto,dynamo`` picks doors. Without a GPU the models run on
the CPU in float32 at a width of 256 (their layer counts kept, or ``TRIDENT_BENCH_LAYERS``), on one
thread, to see the compile's stages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import bench_hf

DOORS = ("jit", "backend", "config", "auto", "dynamo")
CPU_WIDTH = dict(hidden_size=256, intermediate_size=512, vocab_size=1024)


def _model(name: str):
    if torch.cuda.is_available():
        return bench_hf._model(name)
    import transformers

    base, _, liger = name.partition("+")
    config_name, model_name, kw = bench_hf.MODELS[base]
    if liger:
        from liger_kernel import transformers as lk

        {"LlamaConfig": lk.apply_liger_kernel_to_llama,
         "Qwen2Config": lk.apply_liger_kernel_to_qwen2}[config_name](**bench_hf.LIGER)
    layers = os.environ.get("TRIDENT_BENCH_LAYERS")  # a tiny config: the warm-restart bound
    config = getattr(transformers, config_name)(**{**kw, **CPU_WIDTH, **(
        {"num_hidden_layers": int(layers)} if layers else {})})
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def child(name: str, door: str) -> dict:
    """One process's first ``generate`` through ``door``."""
    import warnings

    import transformers

    start, cpu = time.perf_counter(), time.process_time()
    import trident

    import_s = [round(time.perf_counter() - start, 2), round(time.process_time() - cpu, 2)]
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # on a busy machine a thread team's spinning swamps the rest
    model = _model(name)
    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (1, bench_hf.PROMPT), device=device)

    cpu_s = {}  # each generate's CPU seconds (the process's threads): steadier on a busy machine

    def generate(**kw):
        _sync()
        start, cpu = time.perf_counter(), time.process_time()
        out = model.generate(ids, max_new_tokens=bench_hf.NEW, min_new_tokens=bench_hf.NEW,
                             do_sample=False, cache_implementation="static", **kw)
        _sync()
        cpu_s[len(cpu_s)] = round(time.process_time() - cpu, 2)
        return out, time.perf_counter() - start

    eager, eager_s = generate(disable_compile=True)
    forward, kw = model.forward, {"disable_compile": True}
    if door == "jit":
        model.forward = trident.jit(forward)
    elif door in ("backend", "dynamo"):
        model.forward = torch.compile(forward, backend="trident" if door == "backend" else "eager")
    else:
        config = transformers.CompileConfig(backend="trident") if door == "config" else \
            transformers.CompileConfig()  # what generate's auto-compile uses
        config._compile_all_devices = True  # transformers compiles on GPUs only by default
        model.generation_config.compile_config = config
        kw = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the jitted prefill's eager call (docs/huggingface.md)
        out, first_s = generate(**kw)
        second_s = generate(**kw)[1]
    row = {"first_s": round(first_s, 2), "second_s": round(second_s, 2),
           "eager_s": round(eager_s, 2), "cpu_s": [cpu_s[1], cpu_s[2], cpu_s[0]],
           "import_s": import_s, "bit_equal": bool(torch.equal(out, eager)),
           "compile_times": {k: round(v, 2) for k, v in trident.config.compile_times().items()},
           "compile_cpu": {k: round(v, 2) for k, v in
                           trident.config.compile_times(cpu=True).items()}}
    if door not in ("auto", "dynamo"):
        stats = model.forward.stats if door == "jit" else trident.backend_stats()
        row["stats"] = str(stats).split(", miss_reasons")[0]
    return row


def _run_child(name: str, door: str, env: dict) -> dict:
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_cold", "--child", name, door],
                       env=env, capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("ROW ")]
    if p.returncode or not lines:
        return {"error": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    return json.loads(lines[-1][4:])


def run(name: str, root: Path, runtime: Path) -> dict:
    only = os.environ.get("TRIDENT_BENCH_ONLY")
    rows = {}
    for door in DOORS:
        if only and door not in only.split(","):
            continue
        folder = root / f"{name}-{door}"
        (folder / "trident").mkdir(parents=True)
        (folder / "trident" / "runtime").symlink_to(runtime)
        env = dict(os.environ, TRIDENT_CACHE_DIR=str(folder / "trident"),
                   TRITON_CACHE_DIR=str(folder / "triton"),
                   TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"), TRIDENT_PROGRESS="0")
        rows[door] = {"cold": _run_child(name, door, env), "warm": _run_child(name, door, env)}
        print(json.dumps({name: {door: rows[door]}}), flush=True)
    return rows


def main(out: str | None = None, models: list[str] | None = None) -> dict:
    import transformers

    results = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__}
    with tempfile.TemporaryDirectory(prefix="bench_cold.") as tmp:
        root = Path(tmp)
        os.environ["TRIDENT_CACHE_DIR"] = str(root / "shared")
        from trident import runtime

        start = time.perf_counter()
        runtime.load()  # built once per torch version: not a door's compile
        results["runtime build (s)"] = round(time.perf_counter() - start, 2)
        for name in models or bench_hf.MODELS:
            results[name] = run(name, root, root / "shared" / "runtime")
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print("ROW " + json.dumps(child(sys.argv[2], sys.argv[3])), flush=True)
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else None, sys.argv[2:] or None)
