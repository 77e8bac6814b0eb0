"""Hugging Face models through every front door, on a GPU: ms per generated token.

``python3 -m benchmarks.bench_hf [out.json [model ...]]``. Random weights in the real configs'
shapes (no download), bf16, ``generate(cache_implementation="static", do_sample=False)``, 64 new
tokens after a 16-token prompt, every contender in one process:

- eager (``disable_compile=True``), transformers' auto-compile (its default for a static cache
  on a GPU: inductor, ``reduce-overhead``), ``torch.compile`` default of ``model.forward``;
- Trident's three doors: ``model.forward = trident.jit(model.forward)``,
  ``torch.compile(model.forward, backend="trident")``, and
  ``generation_config.compile_config = CompileConfig(backend="trident")``;
- floors: a greedy decode loop replaying the eager decode forward from one CUDA graph
  (``torch.cuda.graph``: the GPU's own pace per token, no ``generate``), and ``generate``'s own
  Python per token (a forward that returns stored logits);
- each decode step of one ``generate`` through ``trident.jit``, the backend and eagerly, timed
  alone: host time until the call returns, and until its GPU work is done; for the
  ``torch.compile`` doors, their graphs' counters (captures, replays), Dynamo's graph breaks,
  and the backend decode graph's hit split into its parts (benchmarks/bench_doors.py measures
  the doors' host cost on the CPU).

Models: ``llama-3.2-1b-like``, ``qwen2.5-0.5b-like``, and either with ``+liger`` (its RoPE,
RMSNorm and SwiGLU replaced by Liger-Kernel's Triton kernels: the workload Trident is for; one
process per such model). ``TRIDENT_BENCH_BATCH=4`` generates for 4 prompts at once;
``TRIDENT_BENCH_REPS=N`` times N generates per contender after its first two (default 3): the
first compiles (``first_s``), the second (``warm-up``, untimed in the median) captures the
prefill's graph (its size's second call) and the decode step's again for the new cache
(Note [Sizes seen across installs] in trident/frontend/graphs.py), so the timed ones are steady.
``TRIDENT_BENCH_NO_FLOOR=1`` skips the floors; ``TRIDENT_BENCH_TTFT=0`` skips the time to first
token (16-, 128- and 512-token prompts, eager and ``trident.jit``, and its floor: the eager
prefill replayed from one CUDA graph); ``TRIDENT_BENCH_PROFILE=1``
prints a cProfile of one ``trident.jit`` generate (and of one through the backend) and a torch
profile (GPU kernel time per token);
``TRIDENT_BENCH_ONLY=jit,backend,config,auto,compile`` runs only those contenders (eager, the
reference, always runs). Trident's native runtime is loaded (built, in a fresh cache folder:
once per torch version) before the contenders, and its time is reported on its own row.

Each contender's tokens and logits are compared with eager's (``torch.equal``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

MODELS = {
    "llama-3.2-1b-like": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=2048,
        tie_word_embeddings=True, rope_theta=500000.0)),
    "qwen2.5-0.5b-like": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=2048,
        tie_word_embeddings=True, rope_theta=1000000.0)),
}
PROMPT, NEW = 16, 64
BATCH = int(os.environ.get("TRIDENT_BENCH_BATCH", "1"))
# "<model>+liger": the hot ops replaced by Liger-Kernel's Triton kernels before the model is
# built. The patch is global (transformers' modeling modules): run such a model in a process of
# its own.
LIGER = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
             fused_linear_cross_entropy=False)



def _cache_kw(model) -> str:
    """The keyword under which ``model``'s forward takes its cache: ``cache`` where the
    installed transformers has it (5.25 deprecates ``past_key_values``, whose FutureWarning at
    every call makes a jitted call eager: Note [Warnings a trace gives] in
    trident/lower/state/warned.py), else ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else \
        "past_key_values"

def _model(name: str):
    import transformers

    name, _, liger = name.partition("+")
    config_name, model_name, kw = MODELS[name]
    if liger:
        from liger_kernel import transformers as lk

        patch = {"LlamaConfig": lk.apply_liger_kernel_to_llama,
                 "Qwen2Config": lk.apply_liger_kernel_to_qwen2}[config_name]
        patch(**LIGER)
    config = getattr(transformers, config_name)(**kw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = getattr(transformers, model_name)(config).to(torch.bfloat16).eval()
    return model


def _generate(model, ids, **kw):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         cache_implementation="static", output_logits=True,
                         return_dict_in_generate=True, **kw)
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def _first_token(model, lengths=(16, 128, 512), reps: int = 3) -> dict:
    """Time to first token (ms): ``generate(max_new_tokens=1)`` of a prompt of each length,
    the GPU synchronized around it; the first call of a length (``first_ms``, a compile or a
    capture included) and the fastest of the next ones (``ms``). Set
    ``TRIDENT_BENCH_TTFT=0`` to skip."""
    rows = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    for n in lengths:
        ids = torch.randint(0, model.config.vocab_size, (BATCH, n), device="cuda", generator=g)
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False,
                           cache_implementation="static", disable_compile=True)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        rows[str(n)] = {"first_ms": round(times[0], 2), "ms": round(min(times[1:]), 2)}
    return rows


def _first_token_floor(model, lengths=(16, 128, 512), reps: int = 5) -> dict:
    """The floor for time to first token (ms) at each prompt length: the eager prefill forward
    (a static cache of the prompt's length plus one, the logits of the last position, their
    argmax) captured once in a CUDA graph (``torch.cuda.graph``) and replayed, the GPU
    synchronized around each replay; the fastest of ``reps``. No ``generate``, no guards: the
    GPU's own pace for the prefill's kernels, against which ``_first_token``'s rows are read."""
    import transformers

    rows = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    for n in lengths:
        ids = torch.randint(0, model.config.vocab_size, (BATCH, n), device="cuda", generator=g)
        cache = transformers.StaticCache(config=model.config, max_cache_len=n + 1)
        positions = torch.arange(n, device="cuda")

        def prefill():
            return model(input_ids=ids, **{_cache_kw(model): cache}, cache_position=positions,
                         logits_to_keep=1).logits.argmax(-1)

        def restore():  # the prefill advances the cache's token counts
            for layer in cache.layers:
                layer.cumulative_length.zero_()

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):  # (the first allocates the cache's tensors)
                prefill()
                restore()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            prefill()
        times = []
        for _ in range(reps):
            restore()
            torch.cuda.synchronize()
            start = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        rows[str(n)] = {"ms": round(min(times), 3)}
    return rows


def _same(out, ref) -> bool:
    return torch.equal(out.sequences, ref.sequences) and \
        all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))


def _contender(model, ids, ref, reps: int, **kw) -> dict:
    try:
        return _measure(model, ids, ref, reps, **kw)
    except Exception as e:  # reported in its row; the other contenders still run
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def _measure(model, ids, ref, reps: int, **kw) -> dict:
    out, first = _generate(model, ids, **kw)
    jf = getattr(model.forward, "forward", None)  # a trident.jit under _timed, else none
    jf = jf if hasattr(jf, "stats") else None
    before = _graph_counts(jf)
    _, warm = _generate(model, ids, **kw)  # the prefill's capture, the decode step's for a
    warm = [round(warm * 1e3 / NEW, 3)] + [  # new cache: untimed (module docstring)
        b - a for a, b in zip(before, _graph_counts(jf))]
    times, each = [], []
    for _ in range(reps):
        before = _graph_counts(jf)
        out2, t = _generate(model, ids, **kw)
        times.append(t * 1e3 / NEW)
        after = _graph_counts(jf)
        each.append([round(times[-1], 3)] + [b - a for a, b in zip(before, after)])
    row = {"first_s": round(first, 2), "ms_per_token": round(statistics.median(times), 3),
           "min": round(min(times), 3), "max": round(max(times), 3),
           "bit_equal": bool(ref is not None and _same(out2, ref))}
    row["warm-up generate (ms/token, misses, captures, replays)"] = warm
    if jf is not None:  # per generate: ms/token, then misses, captures, replays in it
        row["each (ms/token, misses, captures, replays)"] = each
    return row


def _graph_counts(jf) -> tuple:
    return () if jf is None else (jf.stats.misses, jf.stats.graph_captures,
                                  jf.stats.graph_replays)


def _graph_floor(model, ids) -> dict:
    """The GPU's own pace for a token: a greedy decode loop that replays the eager decode
    forward from one CUDA graph (``torch.cuda.graph``), as serving engines do: the new token id
    and its position copied into the graph's static inputs, no ``generate``, no guards. The
    static cache advances its own position tensors inside the graph."""
    import transformers

    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    positions = torch.arange(PROMPT, device=ids.device)
    with torch.no_grad():
        logits = model(input_ids=ids, **{_cache_kw(model): cache}, cache_position=positions).logits
    token = logits[:, -1:].argmax(-1)
    position = torch.tensor([PROMPT], device=ids.device)
    lengths = [layer.cumulative_length for layer in cache.layers]
    saved = [t.clone() for t in lengths]

    def restore():
        for t, v in zip(lengths, saved):
            t.copy_(v)

    def step():
        return model(input_ids=token, **{_cache_kw(model): cache}, cache_position=position).logits

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            step()
            restore()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = step()
    times = []
    for _ in range(5):
        restore()
        position.fill_(PROMPT)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(NEW - 1):
            graph.replay()
            torch.argmax(out[:, -1:], -1, out=token)
            position.add_(1)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3 / (NEW - 1))
    # the host time of the replay alone (``CUDAGraph.replay``: its RNG prologue and
    # ``cudaGraphLaunch``), each of 10 replays timed, the GPU synchronized before each round
    launches = []
    for _ in range(5):
        restore()
        torch.cuda.synchronize()
        for _ in range(10):
            start = time.perf_counter()
            graph.replay()
            launches.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return {"ms_per_token": round(min(times), 3),
            "replay_host_us": round(statistics.median(launches), 2),
            "replay_host_us_min": round(min(launches), 2)}


def _timed(forward):
    """``forward``, wrapped so that :func:`_step_times` can time its calls. One wrapper for all
    of a door's ``generate`` calls: the model's ``forward`` attribute is part of what
    ``trident.jit(model.forward)`` guards, so a new wrapper would be a recompile."""
    marks = []

    def timed(*args, **kwargs):
        forward = timed.forward
        if not timed.on:
            return forward(*args, **kwargs)
        if timed.keep == len(marks):  # a decode step's call, and its tensors' values then
            cache = kwargs.get("cache", kwargs.get("past_key_values"))  # 5.24, 5.17
            tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)] + [
                layer.cumulative_length for layer in getattr(cache, "layers", ())
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
            timed.last = (args, kwargs, [(t, t.clone()) for t in tensors])
        start = time.perf_counter()
        result = forward(*args, **kwargs)
        returned = time.perf_counter()
        torch.cuda.synchronize()
        marks.append((start, returned, time.perf_counter()))
        return result

    timed.on, timed.marks, timed.keep, timed.last = False, marks, NEW // 2, None
    timed.forward, timed.parts = forward, None
    return timed


def _in_situ_parts(model, ids) -> dict:
    """A decode hit's parts where ``generate`` makes it (:func:`_hit_parts`' on one saved call,
    repeated, keep the host's caches warm and its arguments the same objects): each decode step
    of one ``generate`` made through ``_hit_profile(..., keep=True)``, the median per part."""
    timed = model.forward
    jf, parts = timed.forward, []

    def profiled(*args, **kwargs):
        out = jf._hit_profile(args, kwargs, 1, False, True)
        parts.append(out[0])
        return out[1]

    timed.forward = profiled  # (only the wrapper's attribute: model.forward stays the same)
    try:
        _step_times(model, ids)
    finally:
        timed.forward = jf
    decode = parts[1:]
    best = {k: round(statistics.median(p[k] for p in decode), 2) for k in decode[0]}
    best["total"] = round(sum(v for k, v in best.items()
                              if k not in ("hits", "guards") and not k.startswith("replay")), 2)
    return best


def _step_times(model, ids) -> dict:
    """Each decode step of one ``generate`` through ``model.forward`` (a :func:`_timed`): the
    host time until the call returns (``host_us``), the time until its GPU work is done
    (``step_ms``, the GPU waited for after each call: the call alone, ``generate``'s share
    excluded) and the time between two steps (``token_ms``)."""
    timed = model.forward
    timed.marks.clear()
    timed.on = True
    try:
        _generate(model, ids, disable_compile=True)
    finally:
        timed.on = False
    decode = timed.marks[1:]
    return {"host_us": round(statistics.median(r - s for s, r, _ in decode) * 1e6, 1),
            "step_ms": round(statistics.median(d - s for s, _, d in decode) * 1e3, 3),
            "token_ms": round(statistics.median(
                b[0] - a[0] for a, b in zip(decode, decode[1:])) * 1e3, 3)}


def _hit_parts(jf, call) -> dict:
    """A decode step's hit split into its parts (``Dispatcher._hit_profile``: the native hit
    path with a clock between its parts), microseconds, the fastest of 5 rounds of 20 calls
    (each round waits for the GPU first, so no launch waits for a full queue)."""
    args, kwargs, values = call
    best: dict = {}
    for _ in range(5):
        for t, v in values:  # the step advances the cache's positions in place
            t.copy_(v)
        torch.cuda.synchronize()
        with torch.no_grad():  # as generate calls it
            parts = jf._hit_profile(args, kwargs, 20)
        for k, v in parts.items():
            best[k] = min(best.get(k, v), v)
    torch.cuda.synchronize()
    best = {k: round(v, 2) for k, v in best.items()}
    best["total"] = round(sum(v for k, v in best.items()  # the guards and replay: inside run
                              if k not in ("hits", "guards") and not k.startswith("replay")), 2)
    return best


def _backend_stats(forward) -> dict:
    """The backend's graphs of ``forward`` after a door's ``generate`` calls: their summed
    counters (CUDA graph captures and replays included: a graph per decode token shows as
    ``graph_replays``), how many graphs, and Dynamo's graph breaks and compiled graphs."""
    import trident
    from torch._dynamo.utils import counters
    from trident.frontend import backend

    stats = trident.backend_stats(forward)
    return {"stats": str(stats).split(", miss_reasons")[0],
            "last reasons": stats.miss_reasons[-3:],
            "graphs": len(backend.graphs(forward)),
            "dynamo graph breaks": sum(counters["graph_break"].values()),
            "dynamo unique graphs": counters["stats"]["unique_graphs"]}


def _backend_hit_parts(model, forward, call) -> dict:
    """:func:`_hit_parts` of the backend's decode graph (the one that served the most hits),
    its inputs read by their Dynamo sources from a decode step's call (what Dynamo passes it)."""
    from benchmarks.bench_doors import graph_inputs
    from trident.frontend import backend

    found = backend.graphs(forward)
    if not found or call is None:
        return {"error": "no graph or no decode call recorded"}
    graph = max(found, key=lambda g: g.stats.hits)
    function = next((f for c, f in backend._frames(forward)[0] if c is graph._frame_code),
                    None)
    if function is None:
        return {"error": "the decode graph follows a graph break"}
    args, kwargs, values = call
    inputs = graph_inputs(graph, function, (model, *args), kwargs)
    return {"inputs": len(inputs), **_hit_parts(graph, (tuple(inputs), {}, values))}


def _gpu_busy(model, ids) -> dict:
    """GPU kernel time per generated token of one ``generate`` (torch profiler), and the
    busiest host functions."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _generate(model, ids, disable_compile=True)
    events = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in events) / 1e3 / NEW
    print(events.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60),
          flush=True)
    return {"gpu_ms_per_token": round(gpu, 3)}


def _profile(model, ids) -> None:
    """Prints a cProfile of one ``generate`` through the model's current forward."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    _generate(model, ids, disable_compile=True)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
    print(text.getvalue()[-7000:], flush=True)


def _wanted(contender: str) -> bool:
    only = os.environ.get("TRIDENT_BENCH_ONLY")
    return not only or contender in only.split(",")


class _Rows(dict):
    """Each row printed as it is measured (a long run that is cut short still reports)."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        print(json.dumps({key: value}), flush=True)


def run(name: str, reps: int = 3) -> dict:
    import transformers
    import trident

    start = time.perf_counter()
    from trident import runtime

    runtime.load()  # built once per torch version (a fresh cache folder): not a compile
    rows = _Rows()
    rows["Trident's native runtime, load or build (s)"] = round(time.perf_counter() - start, 2)
    model = _model(name)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT), device="cuda")
    forward = model.forward
    rows["eager"] = _contender(model, ids, None, reps, disable_compile=True)
    ref, _ = _generate(model, ids, disable_compile=True)
    rows["eager"]["bit_equal"] = True

    jf = trident.jit(forward)
    model.forward = _timed(jf)
    if _wanted("jit"):
        rows["trident.jit(model.forward)"] = _contender(model, ids, ref, reps,
                                                        disable_compile=True)
        rows["trident.jit, one decode step alone"] = _step_times(model, ids)
        if os.environ.get("TRIDENT_BENCH_TTFT", "1") != "0":
            rows["trident.jit, time to first token (ms)"] = _first_token(model)
    stats = jf.stats
    rows["trident.jit(model.forward) stats"] = {
        "stats": str(stats).split(", miss_reasons")[0], "last reasons": stats.miss_reasons[-3:]}
    if _wanted("jit"):
        rows["trident.jit, a decode hit's parts (us)"] = _hit_parts(jf, model.forward.last)
        rows["trident.jit, a decode hit's parts in generate (us)"] = _in_situ_parts(model, ids)
        rows["trident.jit, argument tree roots (quiet, unchanged, walked)"] = jf.tree_passes()
    if _wanted("jit") and os.environ.get("TRIDENT_BENCH_PROFILE"):
        _profile(model, ids)
        rows["trident.jit generate, torch profiler"] = _gpu_busy(model, ids)
    model.forward = forward

    if _wanted("backend"):
        torch._dynamo.reset()
        model.forward = _timed(torch.compile(forward, backend="trident"))
        rows["torch.compile(backend=trident)"] = _contender(model, ids, ref, reps,
                                                            disable_compile=True)
        rows["torch.compile(backend=trident) stats"] = _backend_stats(forward)
        rows["backend, one decode step alone"] = _step_times(model, ids)
        rows["backend, its graph's decode hit's parts (us)"] = _backend_hit_parts(
            model, forward, model.forward.last)
        if os.environ.get("TRIDENT_BENCH_PROFILE"):
            _profile(model, ids)
        model.forward = forward

    for door, row, compile_config in (
            ("config", "CompileConfig(backend=trident)", transformers.CompileConfig(
                backend="trident")),
            ("auto", "auto-compile (inductor reduce-overhead)", None)):
        if _wanted(door):
            torch._dynamo.reset()
            model.__dict__.pop("_compiled_call", None)
            model.generation_config.compile_config = compile_config
            rows[row] = _contender(model, ids, ref, reps)
            if door == "config":
                rows[row + " stats"] = _backend_stats(forward)

    if _wanted("compile"):
        torch._dynamo.reset()
        model.forward = torch.compile(forward)
        rows["torch.compile default"] = _contender(model, ids, ref, reps,
                                                   disable_compile=True)
        model.forward = forward
    torch._dynamo.reset()

    # floor: generate's own Python per token, with a forward that costs nothing
    logits = ref.logits
    step = iter(())

    def canned(*args, **kwargs):
        return transformers.modeling_outputs.CausalLMOutputWithPast(
            logits=next(step)[:, None, :], past_key_values=kwargs.get("past_key_values"))

    model.forward = canned
    python = []
    for _ in range(reps):
        step = iter(logits)
        _, t = _generate(model, ids, disable_compile=True)
        python.append(t * 1e3 / NEW)
    rows["generate's own Python (forward free)"] = {"ms_per_token": round(min(python), 3)}
    model.forward = forward
    if os.environ.get("TRIDENT_BENCH_NO_FLOOR"):
        return rows
    try:
        rows["floor: CUDA-graph replay of the eager decode forward"] = _graph_floor(model, ids)
    except Exception as e:  # an op that cannot be captured
        rows["floor: CUDA-graph replay of the eager decode forward"] = {"error": str(e)[:300]}
    model.forward = _timed(forward)
    rows["eager, one decode step alone"] = _step_times(model, ids)
    model.forward = forward
    if os.environ.get("TRIDENT_BENCH_TTFT", "1") != "0":
        rows["eager, time to first token (ms)"] = _first_token(model)
        try:
            rows["floor: time to first token, CUDA-graph replay of the eager prefill (ms)"] = \
                _first_token_floor(model)
        except Exception as e:  # an op that cannot be captured
            rows["floor: time to first token, CUDA-graph replay of the eager prefill (ms)"] = \
                {"error": str(e)[:300]}
    return rows


def main(out: str | None = None, models: list[str] | None = None) -> dict:
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import transformers

    results["transformers"] = transformers.__version__
    results["batch"] = BATCH
    for name in models or MODELS:
        try:
            results[name] = run(name, int(os.environ.get("TRIDENT_BENCH_REPS", "3")))
        except Exception as e:  # one model's failure is reported, the other still runs
            import traceback

            results[name] = {"error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-3000:]}
        print(json.dumps({name: results[name]}, indent=1), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None, sys.argv[2:] or None)
