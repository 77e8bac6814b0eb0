"""benchmarks/bench_cold.py's driver on the CPU, so that the GPU run of every door cannot fail on
a typo: a one-layer tiny Llama through two doors, each a cold process then a warm one forked
from the fork server (Note [Cold bench processes]), with the runtime shared and the table
printed; and the model and door names it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_cold

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's tiny config")


def test_every_door_cold_then_warm(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRIDENT_BENCH_LAYERS", "1")
    monkeypatch.setenv("TRIDENT_BENCH_ONLY", "jit,config")
    out = tmp_path / "cold.json"
    results = bench_cold.main(str(out), ["llama-3.2-1b-like"])
    assert json.loads(out.read_text())["llama-3.2-1b-like"] == results["llama-3.2-1b-like"]
    rows = results["llama-3.2-1b-like"]
    assert list(rows) == ["jit", "config"]
    # cold: what the door compiles traced and built in this process: the prefill and the decode
    # step through trident.jit (the prefill traced once, with the static cache's capacity ints
    # as leaves, Note [Capacities of written state]: its writes found by a run with no graph,
    # Note [Writes probe]), the decode step only through generate's own compile
    for (door, row), (traced, compiled) in zip(rows.items(), ((2, 2), (1, 1))):
        cold, warm = row["cold"], row["warm"]
        assert "error" not in cold and "error" not in warm, (cold, warm)
        assert cold["bit_equal"] and warm["bit_equal"]
        assert (cold["stats"]["traces"], cold["stats"]["compiles"]) == (traced, compiled)
        assert cold["compile_times"]["trace"] > 0 and cold["compile_times"]["C build"] > 0
        # warm: loaded from the cache the cold process filled, nothing traced or built
        assert warm["stats"]["traces"] == warm["stats"]["compiles"] == 0
        assert warm["stats"]["hits"] > 0 and warm["stats"]["fallbacks"] == 0
        assert warm["compile_times"]["trace"] == warm["compile_times"]["C build"] == 0
    assert "found built" in results["runtime"] and "no figure includes it" in results["runtime"]
    printed = capsys.readouterr().out
    assert "| llama-3.2-1b-like | jit |" in printed and "| 0, 0 |" in printed
    assert "/ auto" in printed  # no auto door in this run: its ratios are "-"


def test_table_ratios_to_the_auto_compile():
    def row(first_s, stats=None):
        times = dict.fromkeys(("trace", "state", "import", "plan", "buffers", "kernels",
                               "guards", "render", "C build"), 0.5)
        return {"first_s": first_s, "bit_equal": True, "compile_times": times,
                **({"stats": stats} if stats else {})}

    stats = {"traces": 0, "compiles": 0}
    lines = bench_cold.table({"device": "cpu", "m": {
        "auto": {"cold": row(20.0), "warm": row(10.0)},
        "jit": {"cold": row(5.0, stats), "warm": row(0.5, stats)}}}).splitlines()
    assert lines[2].startswith("| m | auto | 20.00 | 1.00x | 10.00 | 1.00x | - |")
    assert lines[3] == ("| m | jit | 5.00 | 0.25x | 0.50 | 0.05x | 0.50 | 0.50 | 0.50 | 0.50 "
                        "| 0.50 | 2.00 | yes | 0, 0 |")


def test_several_warm_processes_each_a_column_entry(monkeypatch):
    """``TRIDENT_BENCH_WARM=2``: two warm phases (each spawned process under a hash seed of its
    own: Note [Hash seeds of the bench]), both in the table's warm cells."""
    assert bench_cold.phases() == ("cold", "warm")
    monkeypatch.setenv("TRIDENT_BENCH_WARM", "3")
    assert bench_cold.phases() == ("cold", "warm", "warm2", "warm3")
    times = dict.fromkeys(bench_cold.STAGES, 1.0) | {"order probe": 0.25}
    row = {"first_s": 1.0, "bit_equal": True, "compile_times": times,
           "stats": {"traces": 0, "compiles": 0}}
    lines = bench_cold.table({"m": {"jit": {
        "cold": row, "warm": dict(row, first_s=0.5),
        "warm2": dict(row, first_s=0.75, stats={"traces": 1, "compiles": 1})}}}).splitlines()
    # the order probe is inside the trace: not in "other"
    assert lines[2] == ("| m | jit | 1.00 | - | 0.50, 0.75 | - | 1.00 | 1.00 | 1.00 | 1.00 "
                        "| 1.00 | 0.00 | yes | 0, 0; 1, 1 |")
    lines = bench_cold.table({"m": {"jit": {"cold": row, "warm": row,
                                            "warm2": {"error": "x"}}}}).splitlines()
    assert "error: see the JSON" in lines[2]


def test_unknown_models_and_doors_are_refused(monkeypatch):
    with pytest.raises(SystemExit, match="no model llama-3.2-1b"):
        bench_cold._models(["llama-3.2-1b"])
    with pytest.raises(SystemExit, match="no model qwen2.5-0.5b-like\\+ligr"):
        bench_cold._models(["qwen2.5-0.5b-like+ligr"])
    monkeypatch.setenv("TRIDENT_BENCH_MODELS", "qwen2.5-0.5b-like+liger")
    assert bench_cold._models(None) == ["qwen2.5-0.5b-like+liger"]
    monkeypatch.delenv("TRIDENT_BENCH_MODELS")
    assert bench_cold._models(None) == list(bench_cold.bench_hf.MODELS)  # no Liger on the CPU
    assert bench_cold._models(["gemma-2-2b-like"]) == ["gemma-2-2b-like"]  # when named
    with pytest.raises(SystemExit, match="no model gemma-2-2b-like\\+liger"):
        bench_cold._models(["gemma-2-2b-like+liger"])
    monkeypatch.setenv("TRIDENT_BENCH_ONLY", "jit,inductor")
    with pytest.raises(SystemExit, match="no door inductor"):
        bench_cold._doors()
    monkeypatch.setenv("TRIDENT_BENCH_ONLY", "dynamo,jit")
    assert bench_cold._doors() == ("jit", "dynamo")
