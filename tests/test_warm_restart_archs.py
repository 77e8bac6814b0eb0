"""A warm restart of every architecture of ``benchmarks/sweep_hf.py`` (issue 27): Llama, Mistral,
Qwen2, Gemma2, Gemma3 and Qwen2 with ``use_sliding_window`` (a hybrid model), tiny configs at
their default settings, greedy ``generate`` with a static and with the default cache, through
each door (``trident.jit``, ``torch.compile(backend="trident")``, transformers'
``CompileConfig(backend="trident")``). A first process compiles; a second one, under another
hash seed and ``TRIDENT_FORBID_COMPILE=1`` (a trace or a build raises), loads everything from
disk: no trace, no build, no miss, no fallback, every call a hit, every token eager's, and the
cache gains no file."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from _trident_helpers import run_python
from test_warm_restart import _contents, _no_duplicates

# argv[1]: the architecture, argv[2] the cache; prints one STATS line: per cache and door,
# what that door counted in this process (the torch.compile doors': what backend_stats() gained over the generate)
ARCH_DOORS = textwrap.dedent('''
    import dataclasses, json, sys, warnings
    import torch, transformers, trident
    from benchmarks.sweep_hf import tiny_model

    FIELDS = ("traces", "compiles", "hits", "misses", "fallbacks")

    def counts(stats, before=None):
        d = dataclasses.asdict(stats)
        return {k: d[k] - (before or {}).get(k, 0) for k in FIELDS}

    model = tiny_model(sys.argv[1], "cpu")
    forward = model.forward
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(0))
    out = {}
    for cache in sys.argv[2:]:
        kw = dict(max_new_tokens=3, do_sample=False)
        if cache == "static":
            kw["cache_implementation"] = "static"
        model.forward = forward
        eager = model.generate(ids, disable_compile=True, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (counted: fallbacks)
            model.forward = trident.jit(forward)
            assert torch.equal(model.generate(ids, disable_compile=True, **kw), eager)
            out[cache + " jit"] = counts(model.forward.stats)
            torch._dynamo.reset()
            before = counts(trident.backend_stats())  # (the freed graphs' counts stay in it)
            model.forward = torch.compile(forward, backend="trident")
            assert torch.equal(model.generate(ids, disable_compile=True, **kw), eager)
            out[cache + " backend"] = counts(trident.backend_stats(), before)
            model.forward = forward
            torch._dynamo.reset()
            before = counts(trident.backend_stats())
            config = transformers.CompileConfig(backend="trident", fullgraph=False)
            config._compile_all_devices = True  # transformers compiles on GPUs only by default
            model.generation_config.compile_config = config
            assert torch.equal(model.generate(ids, **kw), eager)
            out[cache + " config"] = counts(trident.backend_stats(), before)
            model.generation_config.compile_config = None
            model.__dict__.pop("_compiled_call", None)
            torch._dynamo.reset()
    print("STATS " + json.dumps(out))
''')

# A warm process's calls per door: generate's three forward calls (the prefill and two decode
# steps), each a hit; transformers' CompileConfig compiles the decode steps only with a static
# cache (the prefill runs outside the door) and nothing with the default one ("unable to meet
# the criteria": generate runs the forward itself)
WARM = {"jit": 3, "backend": 3, "config": 2}


# Each case costs minutes of CPU (two processes, three doors): CI runs a sliding-window model
# with a static cache and the hybrid one with the default cache; TRIDENT_TEST_ALL_ARCHS=1 runs
# all twelve (every one restarted warm at 7e96e68: docs/benchmarks.md, cold46).
_CASES = [(a, c) for a in ("llama", "mistral", "qwen2", "gemma2", "gemma3", "qwen2sw")
          for c in ("static", "default")]
if os.environ.get("TRIDENT_TEST_ALL_ARCHS") != "1":
    _CASES = [("gemma3", "static"), ("qwen2sw", "default")]


@pytest.mark.parametrize("arch,cache_kind", _CASES)
def test_every_architecture_restarts_warm_through_every_door(tmp_path, subprocess_env,
                                                             trident_cache, arch, cache_kind):
    script = tmp_path / "arch_doors.py"
    script.write_text(ARCH_DOORS)

    def run(seed: str, forbid: str) -> dict:
        env = dict(subprocess_env, PYTHONHASHSEED=seed, TRIDENT_FORBID_COMPILE=forbid)
        lines = run_python(env, str(script), arch, cache_kind).stdout.splitlines()
        (stats,) = [json.loads(l[6:]) for l in lines if l.startswith("STATS ")]
        return stats

    first = run("0", "0")
    for key, s in first.items():
        assert s["fallbacks"] == 0, (key, s)
        served = WARM[key.split()[1]] if key != "default config" else 0
        assert s["hits"] + s["misses"] == served, (key, s)
    stored = _no_duplicates(trident_cache)
    second = run("1", "1")
    assert _contents(trident_cache) == stored
    expected = {f"{cache_kind} {door}": {
        "traces": 0, "compiles": 0, "misses": 0, "fallbacks": 0,
        "hits": hits if (cache_kind, door) != ("default", "config") else 0}
        for door, hits in WARM.items()}
    assert second == expected
