"""Host cost of one decode step through each of Trident's front doors (CPU, one process).

``python3 -m benchmarks.bench_doors [--models llama16,qwen24] [--calls 200] [--repeats 3]
[--json PATH]``. A Hugging Face model with tiny layers (hidden 64) but the real depth (Llama:
16 layers, Qwen2: 24), so that a call's time is mostly host work; ``generate``'s decode step
(greedy, static cache) recorded once from an eager ``generate`` and called again with the same
arguments, the cache's positions put back before each call. Contenders, in this order:

- ``eager``: ``model(**kwargs)``, as ``generate`` calls it;
- ``trident.jit``: ``model.forward = trident.jit(model.forward)``;
- ``backend``: ``model.forward = torch.compile(model.forward, backend="trident")``;
- ``backend graph alone``: the backend's Trident graph called with the inputs Dynamo passes
  it (read by their Dynamo sources, as ``trident.backend_explain`` reads them): the backend
  door less Dynamo's guards, frame and output rebuild;
- ``CompileConfig``: ``generation_config.compile_config = CompileConfig(backend="trident")``,
  one ``generate`` (transformers compiles ``model.__call__`` for its decode steps), then the
  compiled call ``generate`` uses (``model._compiled_call``);
- Dynamo's floors, ``backend=eager`` and ``CompileConfig(backend=eager)``: the same doors with
  Dynamo's own ``eager`` backend (its guards, frame evaluation and output rebuild, and the
  graph's ops run by the GraphModule's Python);
- ``Dynamo alone``: the backend door with a backend whose graph returns what its first call
  computed (no op runs; not compared): Dynamo's guards, frame and output rebuild. It runs with
  the CPU's caches warm; inside a real door, after the graph's ops, the same guards take 2-3x
  longer (their data evicted), so ``backend`` less ``backend graph alone`` is larger.

Each contender runs ``--calls`` calls timed one by one (``time.perf_counter``; garbage
collection off, one intra-op thread), per round; Dynamo's cache is reset before each Dynamo
door (its cache entries are per code object, shared by every ``torch.compile`` of the same
``forward``). Printed: the median µs per call over the rounds (and the rounds' range), and each
contender's time over eager's, over ``trident.jit``'s and over its Dynamo floor's. Results are
compared before anything is timed: ``trident.jit`` with eager, each Dynamo door with its
Dynamo floor (``torch.equal``; on the CPU, Dynamo's graph may differ from eager in the last
ulp, docs/huggingface.md).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import statistics
import sys
import time

import torch

MODELS = {"llama16": ("LlamaConfig", "LlamaForCausalLM", 16),
          "qwen24": ("Qwen2Config", "Qwen2ForCausalLM", 24)}
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=96)


def build(name: str, layers: int | None = None):
    """The model ``name`` of MODELS (random weights, seed 0, eval mode), with ``layers`` layers
    instead of its own count when given."""
    import transformers

    config_name, model_name, depth = MODELS[name]
    config = getattr(transformers, config_name)(num_hidden_layers=layers or depth, **SMALL)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


def _generate(model, **kwargs) -> None:
    prompt = torch.randint(0, model.config.vocab_size, (1, 6),
                           generator=torch.Generator().manual_seed(0))
    model.generate(prompt, max_new_tokens=3, do_sample=False, cache_implementation="static",
                   **kwargs)


class DecodeCall:
    """The keyword arguments of the first decode step's call of a greedy ``generate`` (3 tokens
    after 6, static cache), and the cache's position tensors as they were then: ``restore()``
    puts them back, so the same call can be made again."""

    def __init__(self, model, attribute: str, **generate_kwargs):
        """Records the calls of ``model.<attribute>`` (``forward``, or ``_compiled_call``: what
        ``generate`` calls for its decode steps under a ``CompileConfig``) during one
        ``generate(**generate_kwargs)``."""
        fn, calls = getattr(model, attribute), []

        def record(*args, **kwargs):
            cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.24, 5.17
            lengths = [(layer.cumulative_length, layer.cumulative_length.clone())
                       for layer in cache.layers if getattr(layer, "is_initialized", False)]
            calls.append((dict(kwargs), lengths))
            return fn(*args, **kwargs)

        setattr(model, attribute, record)
        try:
            _generate(model, **generate_kwargs)
        finally:
            setattr(model, attribute, fn)
        decode = next(c for c in calls if c[1])  # the prefill's cache is not initialized yet
        self.kwargs, self.lengths = {**decode[0], "return_dict": True}, decode[1]

    def restore(self) -> None:
        for tensor, value in self.lengths:
            tensor.copy_(value)


def _compiled_call(model, backend: str):
    """What ``generate`` calls for its decode steps under ``CompileConfig(backend=backend)``
    (transformers' ``torch.compile`` of ``model.__call__``, made by a first ``generate``), and
    the decode call it makes in a second one."""
    import transformers

    config = transformers.CompileConfig(backend=backend, fullgraph=False)
    config._compile_all_devices = True  # transformers compiles on CUDA only, unless told
    model.__dict__.pop("_compiled_call", None)
    model.generation_config.compile_config = config
    try:
        _generate(model)
        call = DecodeCall(model, "_compiled_call")
    finally:
        model.generation_config.compile_config = None
    return model.__dict__.pop("_compiled_call"), call


def graph_inputs(graph, function, args: tuple, kwargs: dict) -> list:
    """The inputs Dynamo passes ``graph`` (a backend graph compiled from ``function``'s frame)
    for the call ``function(*args, **kwargs)``, read by their Dynamo sources."""
    from torch._dynamo.guards import _get_closure_vars

    bound = inspect.signature(function, follow_wrapped=False).bind(*args, **kwargs)
    scope = {**_get_closure_vars(), "L": {**dict(bound.arguments), **dict(zip(
        function.__code__.co_freevars, (c.cell_contents for c in function.__closure__ or ())))},
        "G": function.__globals__}
    return [eval(source, scope) for source in graph._input_sources]  # Dynamo's text


def _stored_outputs(gm, example_inputs):
    """A Dynamo backend whose graph returns what its first call computed."""
    stored = []

    def graph(*args):
        if not stored:
            stored.append(gm.forward(*args))
        return stored[0]

    return graph


def contenders(model, call: DecodeCall) -> dict:
    """{name: (setup, reference name)}: ``setup()`` returns the function to time (called with
    no arguments) and the DecodeCall it makes; its result's logits must equal the reference's (``torch.equal``; None: not
    compared)."""
    import trident
    from trident.frontend import backend

    forward, kwargs = model.forward, call.kwargs

    def door(make):
        def setup():
            torch._dynamo.reset()
            model.forward = make(forward)
            return lambda: model(**kwargs), call
        return setup

    def graph_alone():
        torch._dynamo.reset()
        model.forward = torch.compile(forward, backend="trident")
        call.restore()
        model(**kwargs)  # compiles the graph
        (graph,) = backend.graphs(forward)
        function = next(f for c, f in backend._frames(forward)[0] if c is graph._frame_code)
        inputs = graph_inputs(graph, function, (model,), kwargs)
        return lambda: graph(*inputs), call

    def compiled(name):
        def setup():
            torch._dynamo.reset()
            model.forward = forward
            compiled_call, decode = _compiled_call(model, name)
            return lambda: compiled_call(**decode.kwargs), decode
        return setup

    def eager():
        model.forward = forward
        return lambda: model(**kwargs), call

    return {"eager": (eager, "eager"),
            "trident.jit": (door(trident.jit), "eager"),
            "backend": (door(lambda f: torch.compile(f, backend="trident")), "backend=eager"),
            "backend graph alone": (graph_alone, "backend=eager"),
            "CompileConfig": (compiled("trident"), "CompileConfig(backend=eager)"),
            "backend=eager": (door(lambda f: torch.compile(f, backend="eager")), "eager"),
            "CompileConfig(backend=eager)": (compiled("eager"), "eager"),
            "Dynamo alone": (door(lambda f: torch.compile(f, backend=_stored_outputs)), None)}


def _logits(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out.logits


def run(name: str, layers: int | None = None, calls: int = 200, repeats: int = 3) -> dict:
    """Every contender on the decode step of model ``name``: {contender: row}, each row with
    ``us`` (median over the rounds of each round's median µs per call), ``rounds_us``,
    ``first_call_s`` (its first round's set-up and first call: a compile, where it has one),
    ``equal`` (to its reference), ``reference`` and, for Trident's doors, ``stats`` (hits,
    misses, compiles, fallbacks of its last round)."""
    import trident
    from trident.frontend import backend

    model = build(name, layers)
    call = DecodeCall(model, "forward", disable_compile=True)
    forward = model.forward
    rows: dict[str, dict] = {}
    results: dict[str, torch.Tensor] = {}
    try:
        for round_ in range(repeats):
            for contender, (setup, reference) in contenders(model, call).items():
                # backend_stats counts the graphs torch._dynamo.reset() freed too: a door's
                # counts are what its round added
                before = trident.backend_stats(forward)
                start = time.perf_counter()
                fn, made = setup()
                made.restore()
                with torch.no_grad():
                    out = _logits(fn())
                    row = rows.setdefault(contender, {
                        "first_call_s": round(time.perf_counter() - start, 2),
                        "reference": reference, "rounds_us": []})
                    results.setdefault(contender, out)
                    for _ in range(2):
                        made.restore()
                        fn()
                    times = []
                    gc.disable()
                    try:
                        for _ in range(calls):
                            made.restore()
                            t0 = time.perf_counter()
                            fn()
                            times.append((time.perf_counter() - t0) * 1e6)
                    finally:
                        gc.enable()
                row["rounds_us"].append(round(statistics.median(times), 1))
                if contender in ("trident.jit", "backend", "CompileConfig"):
                    jitted = contender == "trident.jit"
                    stats = model.forward.stats if jitted else trident.backend_stats(forward)
                    row["stats"] = {k: getattr(stats, k) - (0 if jitted else getattr(before, k))
                                    for k in ("hits", "misses", "compiles", "fallbacks")}
                    row["stats"]["graphs"] = 1 if jitted else len(backend.graphs(forward))
                model.forward = forward
    finally:
        model.forward = forward
        torch._dynamo.reset()
    for row in rows.values():
        row["us"] = statistics.median(row["rounds_us"])
    for contender, row in rows.items():
        reference = row["reference"]
        row["equal"] = reference and bool(torch.equal(results[contender], results[reference]))
        for base in ("eager", "trident.jit", reference or "eager"):
            row[f"/ {base}"] = round(row["us"] / rows[base]["us"], 3)
    rows["backend"]["Dynamo's part (backend - its graph alone)"] = round(
        rows["backend"]["us"] - rows["backend graph alone"]["us"], 1)
    return rows


def table(name: str, rows: dict) -> str:
    lines = [f"{name}: µs per decode call (median of rounds; rounds' range)",
             f"{'contender':30s} {'µs':>9s} {'range':>19s} {'/ eager':>8s} {'/ jit':>7s} "
             f"{'/ its floor':>12s}  equal"]
    for contender, row in rows.items():
        r = row["rounds_us"]
        lines.append(f"{contender:30s} {row['us']:9.1f} {min(r):9.1f}-{max(r):<9.1f} "
                     f"{row['/ eager']:8.2f} {row['/ trident.jit']:7.2f} "
                     f"{row['/ ' + (row['reference'] or 'eager')]:12.2f}  "
                     + (f"{row['equal']} (vs {row['reference']})" if row["reference"] else "-"))
    lines.append("backend door less its graph alone (Dynamo's guards, frame, output): "
                 f"{rows['backend'][next(k for k in rows['backend'] if k.startswith('Dynamo'))]}"
                 " µs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="llama16,qwen24")
    parser.add_argument("--layers", type=int, default=None, help="instead of each model's own")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as benchmarks/bench.py: decode-sized ops, a shared machine
    results = {"torch": torch.__version__}
    try:
        import transformers

        results["transformers"] = transformers.__version__
        for name in opts.models.split(","):
            results[name] = run(name, opts.layers, opts.calls, opts.repeats)
            print(table(name, results[name]), flush=True)
    finally:
        torch.set_num_threads(threads)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
