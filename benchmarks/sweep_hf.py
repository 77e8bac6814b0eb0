"""A serving sweep: many ``generate`` calls of new prompt lengths, token counts and batches
through ``model.forward = trident.jit(model.forward)``; compiles, traces, fallbacks and hits.

``python3 -m benchmarks.sweep_hf [ARCH [N [CACHE [DOOR [MASK [SEED [FIRST]]]]]]]`` (defaults:
``llama``, 50, ``static``, ``jit``, ``mask``, 0, none). SEED other than 0 shuffles the drawn
requests with that seed (a compile count must not depend on the order); FIRST, a prompt
length, is given to the first request (``1``: a one-token prompt first). CACHE, the
``cache_implementation``: ``default`` passes none, transformers' default ``DynamicCache``. MASK ``mask`` passes an ``attention_mask`` of ones
(transformers 5.25's ``generate`` drops one of all ones before the forward, 5.17's passes it),
``padded`` a server's batch of prompts of their own lengths, left-padded (each row but the
first of a length drawn from 1..the prompt's, its mask 0 over the padding, ``pad_token_id``
0), ``nomask`` none. DOOR ``jit`` is ``trident.jit(model.forward)``, compared with eager;
``backend`` is ``torch.compile(model.forward, backend="trident")``, compared with Dynamo's own
``eager`` backend (Dynamo's graph differs from plain eager in the last ulp on the CPU; its
``recompile_limit`` raised to 64 for the references), its
compiles Trident's (``trident.backend_stats``), ``dynamo=`` the graphs Dynamo captured for the
served calls (``TRIDENT_SWEEP_DYNAMIC=true``: both compiled with ``dynamic=True``, Dynamo's
dims symbolic from its first graph); ``config`` is transformers' ``CompileConfig(backend="trident")`` (generate
compiles the forward of its decode steps), compared with ``CompileConfig(backend="eager")``.
Tiny random configs (hidden 64, 2 layers, no download) of transformers' architectures at
their default configs: ``llama``, ``qwen2``, ``mistral`` (``sliding_window=4096``), ``qwen2sw``
(``use_sliding_window``), ``gemma2``, ``gemma3``. Each call draws a batch from 1, 2 and 4, a
prompt length from 1..512 and ``max_new_tokens`` from 1..128 (seeded), runs eagerly and through
Trident, and compares every token and logit (``torch.equal``). Runs on the CPU or, with
``TRIDENT_SWEEP_DEVICE=cuda``, on a GPU. ``TRIDENT_SWEEP_WINDOW=8`` sets the config's
``sliding_window`` (a window shorter than most prompts; the sliding archs' default is 4096). One line per call, then the totals and the
distinct miss reasons.
"""

from __future__ import annotations

import random
import sys
import time
import warnings

import torch

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2sw": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": True,
                                                    "max_window_layers": 1}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16}),
}


def tiny_model(arch: str, device: str, layers: int = 2):
    import transformers

    import os

    config_name, model_name, extra = ARCHS[arch]
    window = os.environ.get("TRIDENT_SWEEP_WINDOW")
    if window:  # a window shorter than the prompts (the default is 4096)
        extra = {**extra, "sliding_window": int(window)}
    config = getattr(transformers, config_name)(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval().to(device)


def _doors(model, door: str):
    """(a function that sets up the reference, one that sets up the served door, its Stats as
    a function)."""
    import trident

    forward = model.forward
    if door == "jit":
        jf = trident.jit(forward)
        return (lambda: setattr(model, "forward", forward),
                lambda: setattr(model, "forward", jf), lambda: jf.stats)
    if door == "config":  # transformers compiles the forward itself (its decode steps)
        import transformers

        def use(backend: str) -> None:
            torch._dynamo.reset()
            model.__dict__.pop("_compiled_call", None)
            config = transformers.CompileConfig(backend=backend)
            config._compile_all_devices = True  # transformers compiles on GPUs only by default
            model.generation_config.compile_config = config

        return lambda: use("eager"), lambda: use("trident"), lambda: trident.backend_stats(model)
    import os

    torch._dynamo.reset()
    dynamic = {"true": True}.get(os.environ.get("TRIDENT_SWEEP_DYNAMIC", ""))
    ref = torch.compile(forward, backend="eager", dynamic=dynamic)
    served = torch.compile(forward, backend="trident", dynamic=dynamic)

    def use_served() -> None:
        torch._dynamo.reset()
        model.forward = served

    return (lambda: setattr(model, "forward", ref), use_served,
            lambda: trident.backend_stats(served))


def _dynamo_frames() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def main(arch: str = "llama", n: int = 50, cache: str = "static", door: str = "jit",
         mask: str = "mask", seed: int = 0, first: int = 0) -> None:
    import os

    device = os.environ.get("TRIDENT_SWEEP_DEVICE", "cpu")
    model = tiny_model(arch, device)
    use_reference, use_served, stats = _doors(model, door)
    rng = random.Random(0)
    calls = [(rng.choice([1, 2, 4]), rng.randint(1, 512), rng.randint(1, 128)) for _ in range(n)]
    if seed:
        random.Random(seed).shuffle(calls)
    if first:
        calls[0] = (calls[0][0], first, calls[0][2])

    def inputs(i, batch, length, new):
        torch.manual_seed(i)
        ids = torch.randint(0, 96, (batch, length), device=device)
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, disable_compile=door != "config")
        if cache != "default":
            kw["cache_implementation"] = cache
        if mask == "mask":
            kw["attention_mask"] = torch.ones_like(ids)
        elif mask == "padded":
            rows = [length] + [int(n) for n in torch.randint(1, length + 1, (batch - 1,))]
            kw["attention_mask"] = torch.stack([torch.arange(length, device=device) >= length - n
                                                for n in rows]).long()
            ids = ids * kw["attention_mask"]
            kw["pad_token_id"] = 0
        return ids, kw

    # the references first: Dynamo's recompile limit (8) counts the entries of a frame's
    # code of every backend, so references between the served calls would take its entries.
    # A static cache is as long as the longest before it (``_previous_max_cache_length``),
    # so each served call starts from the length its reference started from. The references
    # may take more of Dynamo's graphs than the served calls (Trident's door makes the batch
    # symbolic with the lengths); past its limit a frame runs uncompiled, whose CPU results
    # differ from a graph's in the last bits: so the references' limit is raised.
    use_reference()
    refs, lengths = [], []
    with torch._dynamo.config.patch(recompile_limit=64):
        for i, call in enumerate(calls):
            lengths.append(getattr(model, "_previous_max_cache_length", -1))
            ids, kw = inputs(i, *call)
            refs.append(model.generate(ids, **kw))
    use_served()
    start, wrong, frames = time.perf_counter(), 0, 0
    for i, (batch, length, new) in enumerate(calls):
        ids, kw = inputs(i, batch, length, new)
        ref, model._previous_max_cache_length = refs[i], lengths[i]
        before = _dynamo_frames()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.generate(ids, **kw)
        frames += _dynamo_frames() - before
        same = torch.equal(out.sequences, ref.sequences) and all(
            torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
        wrong += not same
        s = stats()
        print(f"{i} batch={batch} prompt={length} new={new} equal={same} compiles={s.compiles} "
              f"dynamo={frames} "
              f"traces={s.traces} fallbacks={s.fallbacks} hits={s.hits} "
              f"t={time.perf_counter() - start:.1f}s", flush=True)
    s = stats()
    print(f"{arch} {cache} {door} {mask} seed={seed} first={first or '-'}: {n} generates, "
          f"compiles={s.compiles} traces={s.traces} fallbacks={s.fallbacks} hits={s.hits} "
          f"not equal={wrong} dynamo={frames} graph captures={getattr(s, 'graph_captures', 0)} "
          f"replays={getattr(s, 'graph_replays', 0)}")
    for reason in dict.fromkeys(s.miss_reasons):
        print("  ", reason[:300])


if __name__ == "__main__":
    main(*(t(a) for t, a in zip((str, int, str, str, str, int, int), sys.argv[1:])))
