"""A first ``generate`` with its compile, and a restarted process's first ``generate``, per door.

``python3 -m benchmarks.bench_cold [OUT.json] [model ...]`` (``--table OUT.json`` prints the
table of a run's JSON, which is written after each door): for each model (bench_hf's
``MODELS``; a ``+liger`` suffix patches Liger-Kernel's RoPE, RMSNorm and SwiGLU in) and each door
(``jit``: ``trident.jit(model.forward)``; ``backend``: ``torch.compile(backend="trident")``;
``config``: transformers' ``CompileConfig(backend="trident")``; ``auto``: transformers' own
auto-compile, inductor, the peer every ratio is taken to), two fresh processes in a row on one
fresh cache folder (Trident's, Triton's and inductor's): ``cold``, the first process's first
``generate`` (16-token prompt, 64 new tokens, static cache, greedy) with its compile, and
``warm``, the next process's, which loads what the first stored (``TRIDENT_BENCH_WARM=N``: N
warm processes in a row, ``warm``, ``warm2``, ...). An optional door, ``dynamo``,
is ``torch.compile(backend="eager")``: Dynamo's own trace and guards with no compiler behind
them, the floor of the torch.compile doors' warm restart. One invocation runs every door of
every model and prints a table (seconds, the ratios to ``auto``, Trident's compile stages) after
the JSON rows it writes to ``OUT.json``.

Each process runs one eager ``generate`` first (CUDA's and the libraries' set-up, not a
compile), then the door's first (``first_s``) and second (``second_s``, nothing left to compile
or load), with the CPU seconds of the first, the second and the eager one (``cpu_s``), the wall
and CPU seconds of ``import trident`` (``import_s``, after torch and transformers), the seconds
of each compile stage (``trident.config.compile_times()``, Note [Compile stages]; CPU seconds,
the C compiler's included, in ``compile_cpu``), the door's stats, and whether its tokens equal
eager's.

Note [Cold bench processes]: what a run costs besides the doors' own work is paid once.
Trident's native runtime is built (or found built) once, before any door, in the cache folder of
the invoking environment (``TRIDENT_CACHE_DIR``, so a second invocation builds nothing), and
every door's fresh cache links to it: no figure includes it, and the output says so. Each
measured process is forked from one fork server (``multiprocessing``'s ``forkserver``) that
imported torch and transformers once; neither initializes CUDA there, so each child is a new
process with a fresh CUDA context, no Trident imported and nothing compiled, as a restarted
server is after its imports. ``TRIDENT_BENCH_FORK=0`` starts each child as a fresh interpreter
instead (``spawn``).

Environment: ``TRIDENT_BENCH_MODELS=llama-3.2-1b-like,qwen2.5-0.5b-like+liger`` picks models
(the command line's override it; default every model, plain and ``+liger``; on the CPU plain
only: Liger's kernels are Triton GPU kernels); ``TRIDENT_BENCH_ONLY=jit,backend,config,auto,
dynamo`` picks doors (default all but ``dynamo``); ``TRIDENT_BENCH_CHILD_TIMEOUT`` (default 300)
bounds one process, in seconds. A model of ``MORE_MODELS`` (a Gemma2: a hybrid model, whose
attention masks come in a dict of the layer types, ordered by the hash seed) runs when named.

Note [Hash seeds of the bench]: a dict built from a set of str is ordered by the process's hash
seed (Note [Dict orders] in trident/lower/orders.py), so a warm restart is only shown where
the warm process's seed is not the cold one's. With ``TRIDENT_BENCH_FORK=0`` each process is
a fresh interpreter started with ``PYTHONHASHSEED`` its phase's number (cold 0, warm 1, warm2
2, ...); the fork server's children all have the server's seed. Each row has ``str_hash``,
``hash("trident")`` in its process: rows of another seed have another. Without a GPU the models run on the CPU in float32 at a width of
256 (their layer counts kept, or ``TRIDENT_BENCH_LAYERS``), on one thread, to see the compile's
stages and to try the driver (tests/test_bench_cold.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks import bench_hf

DOORS = ("auto", "jit", "backend", "config")  # the peer first; "dynamo" on request
ALL_DOORS = DOORS + ("dynamo",)
CPU_WIDTH = dict(hidden_size=256, intermediate_size=512, vocab_size=1024)
MORE_MODELS = {  # run when named: (config, model, config keywords, more keywords on the CPU)
    "gemma-2-2b-like": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, vocab_size=256000, max_position_embeddings=2048),
        dict(head_dim=32)),
}
STAGES = ("trace", "import", "plan", "kernels", "C build")  # the table's columns; "other": the rest
INSIDE = ("order probe", "writes probe")  # stages inside a column's (Note [Compile stages]), not in "other"


def _model(name: str):
    if torch.cuda.is_available() and name not in MORE_MODELS:
        return bench_hf._model(name)
    import transformers

    base, _, liger = name.partition("+")
    config_name, model_name, kw, cpu = (*bench_hf.MODELS[base], {}) \
        if base in bench_hf.MODELS else MORE_MODELS[base]
    if torch.cuda.is_available():
        torch.manual_seed(0)
        with torch.device("cuda"):
            return getattr(transformers, model_name)(getattr(transformers, config_name)(
                **kw)).to(torch.bfloat16).eval()
    if liger:
        from liger_kernel import transformers as lk

        {"LlamaConfig": lk.apply_liger_kernel_to_llama,
         "Qwen2Config": lk.apply_liger_kernel_to_qwen2}[config_name](**bench_hf.LIGER)
    layers = os.environ.get("TRIDENT_BENCH_LAYERS")  # a tiny config: the warm-restart bound
    config = getattr(transformers, config_name)(**{**kw, **CPU_WIDTH, **cpu, **(
        {"num_hidden_layers": int(layers)} if layers else {})})
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def child(name: str, door: str) -> dict:
    """One process's first ``generate`` through ``door``."""
    import dataclasses
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
    elif door in ("config", "auto"):
        config = transformers.CompileConfig(backend="trident") if door == "config" else \
            transformers.CompileConfig()  # what generate's auto-compile uses
        config._compile_all_devices = True  # transformers compiles on GPUs only by default
        model.generation_config.compile_config = config
        kw = {}
    else:
        raise ValueError(f"no door {door!r}: one of {', '.join(ALL_DOORS)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the jitted prefill's eager call (docs/huggingface.md)
        out, first_s = generate(**kw)
        second_s = generate(**kw)[1]
    row = {"first_s": round(first_s, 2), "second_s": round(second_s, 2),
           "eager_s": round(eager_s, 2), "cpu_s": [cpu_s[1], cpu_s[2], cpu_s[0]],
           "import_s": import_s, "bit_equal": bool(torch.equal(out, eager)),
           "str_hash": hash("trident"),  # Note [Hash seeds of the bench]
           "compile_times": {k: round(v, 2) for k, v in trident.config.compile_times().items()},
           "compile_cpu": {k: round(v, 2) for k, v in
                           trident.config.compile_times(cpu=True).items()}}
    if door not in ("auto", "dynamo"):
        stats = model.forward.stats if door == "jit" else trident.backend_stats()
        row["stats"] = {k: v for k, v in dataclasses.asdict(stats).items()
                        if k != "miss_reasons"}
    return row


# ---- the driver ------------------------------------------------------------------------------

def _env(folder: Path) -> dict:
    """A door's cache folders: Trident's (its runtime linked in), Triton's and inductor's."""
    return {"TRIDENT_CACHE_DIR": str(folder / "trident"), "TRITON_CACHE_DIR": str(folder / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRIDENT_PROGRESS": "0"}


def _worker(conn, name: str, door: str, folder: str, phase: str = "cold") -> None:
    """A measured process (Note [Cold bench processes]): its caches set before Trident, Triton
    or inductor reads them, its output to ``folder/<door>.log``, its row sent back."""
    os.environ.update(_env(Path(folder)))
    log = os.open(Path(folder) / f"{door}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(log, f"---- {phase}\n".encode())
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        row = child(name, door)
    except BaseException:
        row = {"error": traceback.format_exc()[-3000:]}
    conn.send(row)


_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        if os.environ.get("TRIDENT_BENCH_FORK", "1") == "0":
            _CONTEXT = multiprocessing.get_context("spawn")
        else:
            _CONTEXT = multiprocessing.get_context("forkserver")
            # none initializes CUDA: each child makes its own context (bench_cold itself is not
            # preloaded: a child's start runs ``python -m``'s module again, as ``__mp_main__``)
            _CONTEXT.set_forkserver_preload(["torch", "transformers", "benchmarks.bench_hf"])
    return _CONTEXT


def _run_child(name: str, door: str, folder: Path, phase: str = "cold", seed: int = 0) -> dict:
    """``child(name, door)`` in a new process on ``folder``'s caches (a spawned one under
    ``PYTHONHASHSEED=seed``: Note [Hash seeds of the bench]); its row, with ``process_s``
    (the process's whole life) or ``error``."""
    ctx, start = _context(), time.perf_counter()
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_worker, args=(send, name, door, str(folder), phase))
    was = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = str(seed)  # (what a spawned interpreter starts with)
    try:
        process.start()
    finally:
        if was is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = was
    send.close()
    timeout = float(os.environ.get("TRIDENT_BENCH_CHILD_TIMEOUT", "300"))
    try:
        row = receive.recv() if receive.poll(timeout) else {"error": f"over {timeout:g} s"}
    except EOFError:  # it died: a signal or os._exit
        row = {"error": "the process died"}
    process.join(60)  # its CUDA context and memory gone before the next one starts
    if process.is_alive():
        process.kill()
        process.join()
    if "error" in row:
        log = folder / f"{door}.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        row["error"] += f" (exit code {process.exitcode}; log tail:\n{tail})"
    row["process_s"] = round(time.perf_counter() - start, 2)
    return row


def run(name: str, root: Path, runtime: Path, doors=DOORS, rows: dict | None = None,
        done=lambda: None) -> dict:
    """Each door's ``cold`` and ``warm`` rows for model ``name`` (into ``rows``), on fresh
    caches under ``root`` whose Trident cache links ``runtime`` (the shared runtime folder);
    ``done()`` after each door."""
    rows = {} if rows is None else rows
    for door in doors:
        folder = root / f"{name}-{door}"
        (folder / "trident").mkdir(parents=True)
        (folder / "trident" / "runtime").symlink_to(runtime)
        rows[door] = {}
        for seed, phase in enumerate(phases()):
            rows[door][phase] = row = _run_child(name, door, folder, phase, seed)
            print(f"{name} {door} {phase}: " + (
                f"first generate {row['first_s']} s (process {row['process_s']} s)"
                if "error" not in row else "ERROR " + row["error"]), flush=True)
        done()
    return rows


def phases() -> tuple:
    """``cold``, then ``TRIDENT_BENCH_WARM`` (default 1) warm phases: ``warm``, ``warm2``..."""
    warm = int(os.environ.get("TRIDENT_BENCH_WARM", "1"))
    return ("cold", "warm") + tuple(f"warm{i}" for i in range(2, warm + 1))


def _doors() -> tuple:
    only = [d for d in os.environ.get("TRIDENT_BENCH_ONLY", "").split(",") if d]
    unknown = [d for d in only if d not in ALL_DOORS]
    if unknown:
        raise SystemExit(f"TRIDENT_BENCH_ONLY: no door {', '.join(unknown)} (doors: "
                         f"{', '.join(ALL_DOORS)})")
    return tuple(d for d in ALL_DOORS if d in only) if only else DOORS


def _models(given: list[str] | None) -> list[str]:
    names = given or [m for m in os.environ.get("TRIDENT_BENCH_MODELS", "").split(",") if m]
    if not names:
        names = [m + suffix for suffix in ("", "+liger") for m in bench_hf.MODELS
                 if torch.cuda.is_available() or not suffix]
    unknown = [n for n in names if n not in MORE_MODELS and (
        n.partition("+")[0] not in bench_hf.MODELS or n.partition("+")[2] not in ("", "liger"))]
    if unknown:
        raise SystemExit(f"no model {', '.join(unknown)} (models: {', '.join(bench_hf.MODELS)}, "
                         f"each with an optional +liger; {', '.join(MORE_MODELS)})")
    return names


def _ratio(value, peer) -> str:
    return f"{value / peer:.2f}x" if isinstance(value, float | int) and peer else "-"


def table(results: dict) -> str:
    """The markdown table of ``main``'s results: per model and door, the cold and warm first
    ``generate`` in seconds and as a ratio to ``auto``'s, the cold compile's stages (wall
    seconds, ``other`` the stages not named), bit-equality, and the warm process's traces and
    compiles (0 and 0: it loaded everything); several warm processes (``TRIDENT_BENCH_WARM``)
    each, in their order, the ratio the first one's."""
    head = ["model", "door", "cold (s)", "/ auto", "warm (s)", "/ auto", *STAGES, "other",
            "bit-equal", "warm traces, compiles"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, doors in results.items():
        if not isinstance(doors, dict) or "cold" not in next(iter(doors.values()), {}):
            continue
        auto = doors.get("auto", {})
        for door, rows in doors.items():
            cold = rows.get("cold", {"error": "not run"})
            warms = [row for phase, row in rows.items() if phase.startswith("warm")] or \
                [{"error": "not run"}]
            warm = warms[0]
            if "error" in cold or any("error" in row for row in warms):
                lines.append(f"| {name} | {door} | error: see the JSON |" + " |" * (len(head) - 3))
                continue
            times = cold["compile_times"]
            stages = [f"{times.get(s, 0):.2f}" for s in STAGES] + [
                f"{sum(v for k, v in times.items() if k not in STAGES + INSIDE):.2f}"]
            if door in ("auto", "dynamo"):
                stages = ["-"] * len(stages)
            lines.append("| " + " | ".join([
                name, door, f"{cold['first_s']:.2f}",
                _ratio(cold["first_s"], auto.get("cold", {}).get("first_s")),
                ", ".join(f"{row['first_s']:.2f}" for row in warms),
                _ratio(warm["first_s"], auto.get("warm", {}).get("first_s")), *stages,
                "yes" if cold["bit_equal"] and all(row["bit_equal"] for row in warms) else "no",
                "; ".join(f"{row['stats']['traces']}, {row['stats']['compiles']}"
                          for row in warms if "stats" in row) or "-"]) + " |")
    return "\n".join(lines)


def main(out: str | None = None, models: list[str] | None = None) -> dict:
    """Every door of every model (``_models``, ``_doors``), the results written to ``out``
    (JSON) and the table printed. Returns the results."""
    import transformers

    from trident import config, runtime

    start = time.perf_counter()
    names, doors = _models(models), _doors()
    results = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "cpus": os.cpu_count(), "torch": torch.__version__,
               "transformers": transformers.__version__}
    shared = config.cache_dir() / "runtime"  # Note [Cold bench processes]
    built = not runtime._intact(shared / runtime.build_key())
    runtime.load()
    results["runtime"] = (f"Trident's native runtime {'built' if built else 'found built'} in "
                          f"{shared} in {time.perf_counter() - start:.1f} s, once, before any "
                          "door: no figure includes it")
    print(results["runtime"], flush=True)

    def save():  # after each door: a run stopped by a time limit keeps what it measured
        results["total_s"] = round(time.perf_counter() - start, 1)
        if out:
            with open(out, "w") as f:
                json.dump(results, f, indent=1)

    root = Path(tempfile.mkdtemp(prefix="bench_cold."))
    try:
        for name in names:
            run(name, root, shared, doors, results.setdefault(name, {}), save)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    save()
    print(f"\n{results['device']}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}; first generate (16-token prompt, 64 new tokens), cold: "
          "a fresh process on fresh caches, compile included; warm: the next fresh process on "
          "the same caches; stages: the cold compile's wall seconds (Trident's doors)\n"
          + table(results) + f"\n{results['runtime']}; the whole run {results['total_s']} s",
          flush=True)
    return results


if __name__ == "__main__":
    from benchmarks import bench_cold  # the children's functions by their module's name

    if sys.argv[1:2] == ["--child"]:
        print("ROW " + json.dumps(bench_cold.child(sys.argv[2], sys.argv[3])), flush=True)
    elif sys.argv[1:2] == ["--table"]:  # the table of a run's JSON, whole or cut short
        print(bench_cold.table(json.loads(Path(sys.argv[2]).read_text())))
    else:
        bench_cold.main(sys.argv[1] if len(sys.argv) > 1 else None, sys.argv[2:] or None)
