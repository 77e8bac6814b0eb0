"""Hugging Face models through every front door, on a GPU: ms per generated token.

``python3 -m benchmarks.bench_hf [out.json [model ...]]``. Random weights in the real configs'
shapes (no download), bf16, ``generate(cache_implementation="static", do_sample=False)``, 64 new
tokens after a 16-token prompt, every contender in one process:

- eager (``disable_compile=True``), transformers' auto-compile (its default for a static cache
  on a GPU: inductor, ``reduce-overhead``), ``torch.compile`` default of ``model.forward``;
- Trident's three doors: ``model.forward = trident.jit(model.forward)``,
  ``torch.compile(model.forward, backend="trident")``, and
  ``generation_config.compile_config = CompileConfig(backend="trident")``;
- floors: Trident's own decode-step CUDA graph replayed alone, the eager decode forward captured
  in a CUDA graph (``torch.cuda.graph``), and ``generate``'s own Python per token (a forward that
  returns stored logits). ``TRIDENT_BENCH_NO_FLOOR=1`` skips the graph floors;
  ``TRIDENT_BENCH_PROFILE=1`` prints a cProfile of one ``trident.jit`` generate;
``TRIDENT_BENCH_ONLY=jit,backend,config,auto,compile`` runs only those contenders (eager, the
reference, always runs).

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


def _model(name: str):
    import transformers

    config_name, model_name, kw = MODELS[name]
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
    times = []
    for _ in range(reps):
        out2, t = _generate(model, ids, **kw)
        times.append(t * 1e3 / NEW)
    return {"first_s": round(first, 2), "ms_per_token": round(statistics.median(times), 3),
            "min": round(min(times), 3), "max": round(max(times), 3),
            "bit_equal": bool(ref is not None and _same(out2, ref))}


def _graph_floor(forward, args, kwargs) -> dict:
    """One decode step's forward replayed from a CUDA graph: the GPU's own pace for a token.
    The cache's integer position tensors (``cumulative_length``) advance in place on every
    step; the graph restores them first, so replays write the same position."""
    cache = kwargs.get("past_key_values") or kwargs.get("cache")
    positions = [t for layer in getattr(cache, "layers", ()) for t in vars(layer).values()
                 if isinstance(t, torch.Tensor) and not t.is_floating_point()]
    saved = [t.clone() for t in positions]

    def step():
        for t, s in zip(positions, saved):
            t.copy_(s)
        forward(*args, **kwargs)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        step()
    replays = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(50):
            graph.replay()
        torch.cuda.synchronize()
        replays.append((time.perf_counter() - start) * 1e3 / 50)
    return {"ms_per_token": round(min(replays), 3)}


def _replay_floor(jf, seen: dict) -> dict:
    """The GPU's own pace for one token: the CUDA graph Trident captured for the decode step,
    replayed back to back (the cache's position tensors, which each step advances in place,
    are put back before each replay: 16-24 one-element copies, included)."""
    from trident import graphs

    (captured,) = [g for g in jf._graph_states.graphs.values()
                   if isinstance(g, graphs.Captured)][-1:]
    positions, saved = seen["positions"]  # as the first decode step of the last generate
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            for t, v in zip(positions, saved):
                t.copy_(v)
            captured.graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3 / 20)
    return {"ms_per_token": round(min(times), 3), "positions restored": len(positions)}


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

    model = _model(name)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT), device="cuda")
    rows = _Rows()
    forward = model.forward
    rows["eager"] = _contender(model, ids, None, reps, disable_compile=True)
    ref, _ = _generate(model, ids, disable_compile=True)
    rows["eager"]["bit_equal"] = True

    jf = trident.jit(forward)
    seen: dict = {}

    def spy(*args, **kwargs):  # the last generate's first decode step
        if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[-1] == 1 and \
                seen.get("prefill"):
            cache = kwargs.get("past_key_values") or kwargs.get("cache")
            positions = [t for layer in getattr(cache, "layers", ())
                         for t in vars(layer).values()
                         if isinstance(t, torch.Tensor) and not t.is_floating_point()]
            seen["positions"] = (positions, [t.clone() for t in positions])
            seen["prefill"] = False
        elif kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[-1] > 1:
            seen["prefill"] = True
        return jf(*args, **kwargs)

    model.forward = spy
    if _wanted("jit"):
        rows["trident.jit(model.forward)"] = _contender(model, ids, ref, reps,
                                                        disable_compile=True)
    if _wanted("jit") and not os.environ.get("TRIDENT_BENCH_NO_FLOOR"):
        try:
            rows["floor: Trident's decode graph, replayed alone"] = _replay_floor(jf, seen)
        except Exception as e:
            rows["floor: Trident's decode graph, replayed alone"] = {"error": str(e)[:300]}
    stats = jf.stats
    rows["trident.jit(model.forward) stats"] = {
        "stats": str(stats).split(", miss_reasons")[0], "last reasons": stats.miss_reasons[-3:]}
    if _wanted("jit") and os.environ.get("TRIDENT_BENCH_PROFILE"):
        import cProfile
        import io
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        _generate(model, ids, disable_compile=True)
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
        print(text.getvalue()[-6000:], flush=True)
    model.forward = forward

    if _wanted("backend"):
        torch._dynamo.reset()
        model.forward = torch.compile(forward, backend="trident")
        rows["torch.compile(backend=trident)"] = _contender(model, ids, ref, reps,
                                                            disable_compile=True)
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
    # floor: one decode step's forward replayed from a CUDA graph (its last call's arguments)
    seen = {}

    def spy(*args, **kwargs):  # the first decode step (replays write the same position)
        if "call" not in seen and kwargs.get("input_ids") is not None and \
                kwargs["input_ids"].shape[-1] == 1:
            seen["call"] = (args, kwargs)
        return forward(*args, **kwargs)

    if os.environ.get("TRIDENT_BENCH_NO_FLOOR"):
        return rows
    model.forward = spy
    _generate(model, ids, disable_compile=True)
    model.forward = forward
    try:
        rows["CUDA-graph replay of the decode forward"] = _graph_floor(forward, *seen["call"])
    except Exception as e:  # an op that cannot be captured
        rows["CUDA-graph replay of the decode forward"] = {"error": str(e)[:300]}

    model.forward = forward
    return rows


def main(out: str | None = None, models: list[str] | None = None) -> dict:
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import transformers

    results["transformers"] = transformers.__version__
    for name in models or MODELS:
        try:
            results[name] = run(name)
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
