"""The demo's and the benchmarks' verdicts: a ratio is a win only where the loops' min-max
ranges do not overlap (benchmarks.demo.compare), on synthetic samples and one real short run."""

from __future__ import annotations

import gc
import json
import sys

import pytest
import torch

from benchmarks import bench, bench_gpu
from benchmarks.demo import Ratio, compare, format_table


@pytest.fixture(autouse=True)
def _threads_as_they_were():
    """The benchmarks set torch's intra-op thread count to 1 for their run (benchmarks/demo.py
    set_cpu_threads) and leave it so, as their processes end: a test here gives the worker
    back its count (a later test in the same worker that sets the count to 1 to change global
    state changed nothing, and its warning did not come: test_eager_semantics, CI)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_compare_wins_only_without_overlap():
    faster = compare([10.0, 11.0, 12.0], [7.0, 8.0, 9.0])  # Trident's slowest beat the fastest
    assert faster == Ratio(median=11.0 / 8.0, low=10.0 / 9.0, high=12.0 / 7.0,
                           fastest=10.0 / 7.0)
    assert faster.verdict == "Trident faster"
    assert compare([7.0, 8.0, 9.0], [10.0, 11.0, 12.0]).verdict == "Trident slower"


def test_compare_overlap_is_no_measurable_difference():
    # a median ratio of 1.03 with ranges overlapping: the case the old demo called a win
    r = compare([10.3, 10.0, 12.0], [10.0, 9.5, 11.0])
    assert r.median == pytest.approx(1.03) and r.low < 1 < r.high
    assert r.verdict == "no measurable difference"
    # ranges that touch overlap; one loop far off spoils a clear median
    assert compare([10.0, 11.0], [9.0, 10.0]).verdict == "no measurable difference"
    assert compare([20.0, 20.0, 20.0, 5.0], [10.0, 10.0, 10.0]).verdict == \
        "no measurable difference"


def test_compare_says_when_the_machine_was_too_noisy_to_tell():
    """Loops whose range allows Trident both twice as fast and half as fast (a new user's busy
    machine: medians 1006 and 14731 µs, range 0.04-115.61, printed as "no measurable
    difference") are too noisy to tell; the verdict gives the fastest loops' ratio. A range
    within 2x either way stays "no measurable difference"."""
    busy = compare([1006.0, 900.0, 30000.0], [14731.0, 880.0, 25000.0])
    assert busy.low < 0.5 and busy.high > 2 and busy.noisy
    assert str(busy) == (f"{1006 / 14731:.2f} ({900 / 25000:.2f}-{30000 / 880:.2f}): the "
                         "machine was too noisy to tell (run again on an idle machine; "
                         f"fastest loops' ratio {900 / 880:.2f})")
    assert not compare([10.0, 19.0], [10.0, 19.0]).noisy  # 0.53-1.9
    assert compare([10.0, 19.0], [10.0, 19.0]).verdict == "no measurable difference"


def test_demo_says_whether_it_built_the_runtime():
    """The demo's start line: a warm run (the runtime built before) says nothing was built; a
    run that built it says so (a new user's warm run printed "built once per torch version")."""
    from benchmarks.demo import ready_line
    assert ready_line(7.7, False) == ("  Trident ready in 7.7 s: imported its modules and "
                                      "loaded its native runtime, built by an earlier run "
                                      "(nothing was built)")
    assert "built its native runtime for torch" in ready_line(40.0, True)
    import trident.runtime
    trident.runtime.load()
    assert trident.runtime.built()


def test_compare_formats_and_rejects_bad_samples():
    assert str(compare([3.0, 4.0], [1.0, 2.0])) == "2.33 (1.50-4.00): Trident faster"
    for other, trident in (([], [1.0]), ([1.0], []), ([1.0], [0.0])):
        with pytest.raises(ValueError):
            compare(other, trident)


def _case(eager, compiled, trident):
    def contender(samples):
        return {"us": sorted(samples)[len(samples) // 2], "samples_us": samples}
    return {"eager": contender(eager), "torch.compile": contender(compiled),
            "Trident": {**contender(trident), "first_call_s": 0.5}}


def test_demo_and_bench_tables_print_the_spread_and_verdict():
    result = _case([20.0, 21.0, 22.0], [10.0, 10.5, 12.0], [9.8, 10.2, 10.4])
    table = format_table(result)
    assert "eager / Trident = 2.06 (1.92-2.24): Trident faster" in table
    assert "torch.compile / Trident = 1.03 (0.96-1.22): no measurable difference" in table
    summary = bench.summary_table({"block": result})
    assert "2.06 (1.92-2.24): Trident faster" in summary
    assert "1.03 (0.96-1.22): no measurable difference" in summary


def test_gpu_table_prints_the_spread_and_verdict():
    row = {"eager": 21.0, "trident": 8.0, "compile_default": 8.2, "cuda_graph": 5.0,
           "samples": {"eager": [20.0, 21.0, 22.0], "trident": [7.5, 8.0, 9.0],
                       "compile_default": [7.9, 8.2, 8.4], "cuda_graph": [5.0, 5.0, 5.1]}}
    line = bench_gpu.table({"micro (us)": row}).splitlines()[-1]
    assert line.endswith("| 2.62 (2.22-2.93): Trident faster "
                         "| 1.02 (0.88-1.12): no measurable difference "
                         "| 0.62 (0.56-0.68): Trident slower |")


def test_bench_cpu_runs_and_records_verdicts(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        assert bench.main(["cpu", "--cases", "chain30", "--no-compile", "--repeats", "3",
                           "--json", str(tmp_path / "b.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    case = json.loads((tmp_path / "b.json").read_text())["cases"]["chain30"]
    assert case["Trident"]["bit_exact"] and len(case["Trident"]["samples_us"]) == 3
    ratio = compare(case["eager"]["samples_us"], case["Trident"]["samples_us"])
    assert case["ratios"]["eager"]["verdict"] == ratio.verdict
    assert f"eager / Trident = {ratio}" in out and "chain30" in out


def test_bench_doors_cpu_runs_every_door_bit_equal_with_exact_counts(tmp_path, capsys):
    """benchmarks/bench_doors.py on a 2-layer Llama: every door's decode call equals its
    reference (trident.jit eager's, the torch.compile doors Dynamo's eager backend's), each
    Trident door compiles once (a fresh cache folder) and serves every later call natively from
    one graph, and the table prints each contender's ratios."""
    from benchmarks import bench_doors

    threads = torch.get_num_threads()
    calls = 3
    results = bench_doors.main(["--models", "llama16", "--layers", "2", "--calls", str(calls),
                                "--repeats", "1", "--json", str(tmp_path / "d.json")])
    assert torch.get_num_threads() == threads
    rows = results["llama16"]
    assert json.loads((tmp_path / "d.json").read_text())["llama16"] == rows
    assert list(rows) == ["eager", "trident.jit", "backend", "backend graph alone",
                          "CompileConfig", "backend=eager", "CompileConfig(backend=eager)",
                          "Dynamo alone"]
    for name in ("trident.jit", "backend", "backend graph alone", "CompileConfig"):
        assert rows[name]["equal"] is True, (name, rows[name])
    # Dynamo's graph run eagerly may differ from eager in the last ulp on the CPU
    assert rows["Dynamo alone"]["equal"] is None
    for row in rows.values():
        assert row["us"] > 0 and len(row["rounds_us"]) == 1
    # the first call compiles (a miss), two warm-up calls and the timed ones hit
    one = {"misses": 1, "compiles": 1, "fallbacks": 0, "graphs": 1}
    assert rows["trident.jit"]["stats"] == {"hits": 2 + calls, **one}
    assert rows["backend"]["stats"] == {"hits": 2 + calls, **one}
    # CompileConfig: two generates first (2 decode calls each; the prefill runs eagerly)
    assert rows["CompileConfig"]["stats"] == {"hits": 3 + 1 + 2 + calls, **one}
    out = capsys.readouterr().out
    assert "backend door less its graph alone" in out
    jit = rows["trident.jit"]
    assert f"{jit['/ eager']:8.2f}" in next(line for line in out.splitlines()
                                            if line.startswith("trident.jit"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_hf_first_token_floor_replays_the_eager_prefill():
    """bench_hf's floor for time to first token: the eager prefill of a static cache captured
    in one CUDA graph, replayed at each prompt length."""
    import transformers

    from benchmarks import bench_hf

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=96, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).cuda().eval()
    rows = bench_hf._first_token_floor(model, lengths=(4, 16), reps=2)
    assert list(rows) == ["4", "16"]
    assert all(row["ms"] > 0 for row in rows.values())


def test_hit_parts_cpu_runs_a_decode_hit_with_no_python():
    """benchmarks/hit_parts_cpu.py on a 2-layer Llama: every decode step of three generates
    after the two compiles (prefill, decode) and every timed call is a native hit, and 5 hits
    run no Python (sys.setprofile); the parts are printed and positive."""
    from benchmarks import hit_parts_cpu

    threads = torch.get_num_threads()
    out = hit_parts_cpu.main(["llama", "2", "--rounds", "1"])
    assert torch.get_num_threads() == threads
    assert gc.isenabled()  # (its timed loop turns the collector off: back on for the suite)
    assert out["python"] == {}
    stats = out["stats"]
    # 3 generates of 40 forward calls, two of them misses; 6 generates in situ; 20 profiled,
    # 20 flushed, 20 timed, 5 profiled
    assert (stats.hits, stats.misses, stats.fallbacks) == (118 + 240 + 65, 2, 0), stats
    assert out["parts"]["argument tree"] > 0 and out["parts"]["hits"] == 20
    assert out["in situ"]["hits"] == 1 and out["in situ"]["argument tree"] > 0
    assert out["flushed"]["hits"] == 1 and out["in situ"]["whole call"] > 0


def test_generate_hits_finds_no_walk_that_generate_causes():
    """benchmarks/generate_hits.py on a 2-layer Llama, static cache and DynamicCache: every
    decode step of each generate is a native hit in situ and alone, with equal tokens; in situ,
    the model's root is never walked (the quiet or unchanged pass at every call: generate writes
    nothing the model's tree holds), and with a static cache no root but the step's new token
    tensors is walked after the first decode step, nor a DynamicCache, whose layers' keys and
    values the hit itself set at the last step (Note [Own writes]); alone, nothing is walked but
    the DynamicCache, which the benchmark puts back before each call (another's write). On
    Python 3.12 the state tree's proofs hold through their watchers at every call (Note
    [Watched state])."""
    from benchmarks import generate_hits

    threads = torch.get_num_threads()
    rows = generate_hits.main(["--archs", "llama", "--layers", "2", "--tokens", "6",
                               "--generates", "1", "--alone", "2"])
    assert torch.get_num_threads() == threads and gc.isenabled()
    watchers = sys.version_info[:2] == (3, 12)
    fresh = {"tree input_ids", "tree attention_mask"}  # a new tensor at every step: a leaf
    for row, cache in zip(rows, ("static", "default")):
        assert row["not hits"] == 0 and row["tokens differ"] == []
        assert row["calls"] == {"jit in situ": 5, "jit alone": 10, "eager alone": 10,
                                "eager in situ": 5}, row
        (situ_calls, situ), (alone_calls, alone) = row["counts"]["in situ"], row["counts"]["alone"]
        assert (situ_calls, alone_calls) == (5, 10)
        root = next(k for k in ("tree past_key_values", "tree cache") if k in situ)  # 5.17, 5.25
        model = situ["tree self"]  # (the first decode step may try the prefill's tree first)
        assert model[2] == 0 and 5 <= model[0] + model[1] <= 6 and \
            model[1] == 0, situ  # quiet at every call (3.11: Note [Tag table])
        assert alone["tree self"] == (10, 0, 0), alone
        for k in set(situ) - fresh - {root, "state"}:
            assert situ[k][2] == 0, (k, situ)
        for k in set(alone) - {root, "state"}:
            assert alone[k][2] == 0, (k, alone)
        if cache == "static":  # walked at the first decode step only (the cache the prefill made)
            assert situ[root][2] <= 2 and alone[root][2] == 0, (situ, alone)
        else:  # walked at the first decode step (the new cache; and in the prefill's tree, tried
            # first), then the unchanged pass: the memo followed the hit's own writes of the
            # layers' keys and values (Note [Own writes]); alone, the cache put back before
            # each call is another's write, seen by a walk
            assert situ[root] == (0, 4, 2) and alone[root] == (0, 0, 10), (situ, alone)
        if watchers:
            assert situ["state"] == (5, 0, 0) and alone["state"] == (10, 0, 0)
