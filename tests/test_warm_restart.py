"""A warm restart (issue 27): a new process's first call through each door, on a function or a
model an earlier process compiled, loads from disk. With ``TRIDENT_FORBID_COMPILE=1`` a trace
or a module build raises ``CompileForbidden`` (Note [Compile stages] in trident/config.py), so a
child that runs to its end traced and built nothing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import textwrap

import pytest
import torch

import trident
from trident.errors import CompileForbidden, TridentError
from _trident_helpers import TINY_LLAMA_SCRIPT, count_traced_calls, run_python

TWO_OPS = textwrap.dedent('''
    import dataclasses, json, sys
    import torch, trident

    for _ in range(int(sys.argv[1])):  # GraphModules made before: fx files the code of the Nth
        torch.fx.symbolic_trace(torch.nn.ReLU())  # as "<eval_with_key>.N"

    def block(x, y):
        return torch.relu(x) * y

    f = torch.compile(block, backend="trident")
    x, y = torch.randn(8), torch.randn(8)
    for _ in range(2):
        assert torch.equal(f(x, y), block(x, y))
    print("STATS " + json.dumps(dataclasses.asdict(trident.backend_stats(f))))
    print("TIMES " + json.dumps({**trident.config.compile_times(), **{
        "cpu " + k: v for k, v in trident.config.compile_times(cpu=True).items()}}))
    print("MLIR " + json.dumps("torch_mlir" in sys.modules))
''')

# A launch whose grid and constexpr come from triton.cdiv and triton.next_power_of_2
# (ConstexprFunction objects in triton 3.6, which a state guard checks by identity)
CDIV = textwrap.dedent('''
    import dataclasses, json, sys
    import torch, triton, trident
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs,
                 mask=mask), mask=mask)

    @trident.jit
    def add(x, y):
        out = torch.empty_like(x)
        block = triton.next_power_of_2(48)
        add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
        return out

    x, y = torch.randn(100), torch.randn(100)
    for _ in range(2):
        assert torch.equal(add(x, y), x + y)
    print("STATS " + json.dumps(dataclasses.asdict(add.stats)))
    print("TIMES " + json.dumps({**trident.config.compile_times(), **{
        "cpu " + k: v for k, v in trident.config.compile_times(cpu=True).items()}}))
    print("MLIR " + json.dumps("torch_mlir" in sys.modules))
''')

# Each door in turn on one tiny Llama, its output compared with eager generate's
HF_DOORS = TINY_LLAMA_SCRIPT + textwrap.dedent('''
    import sys

    forward = model.forward

    def generate(**kw):
        return model.generate(ids, max_new_tokens=4, do_sample=False,
                              cache_implementation="static", **kw)

    eager = generate(disable_compile=True)
    warnings.simplefilter("ignore")  # (this test counts traces and compiles, not warnings)
    stats = {}
    model.forward = trident.jit(forward)
    assert torch.equal(generate(disable_compile=True), eager)
    stats["jit"] = dataclasses.asdict(model.forward.stats)
    model.forward = torch.compile(forward, backend="trident")
    assert torch.equal(generate(disable_compile=True), eager)
    stats["backend"] = dataclasses.asdict(trident.backend_stats(model.forward))
    model.forward = forward
    torch._dynamo.reset()
    compile_config = transformers.CompileConfig(backend="trident", fullgraph=False)
    compile_config._compile_all_devices = True  # transformers compiles on GPUs only by default
    model.generation_config.compile_config = compile_config
    assert torch.equal(generate(), eager)
    stats["config"] = dataclasses.asdict(trident.backend_stats())
    print("STATS " + json.dumps(stats))
    print("TIMES " + json.dumps({**trident.config.compile_times(), **{
        "cpu " + k: v for k, v in trident.config.compile_times(cpu=True).items()}}))
    print("MLIR " + json.dumps("torch_mlir" in sys.modules))
''')


def _run(env: dict, script, *argv, forbid: bool = False,
         traces: bool | None = None) -> tuple[dict, dict]:
    """The child's stats and compile times; a child that may not compile (or, ``traces``
    False, does not trace) is checked not to have imported Torch-MLIR either (Note [Lazy
    Torch-MLIR] in trident/lower/compiler.py), one that compiles to have."""
    env = dict(env, TRIDENT_FORBID_COMPILE="1" if forbid else "0")
    lines = run_python(env, str(script), *argv).stdout.splitlines()
    stats = [json.loads(l[6:]) for l in lines if l.startswith("STATS ")]
    times = [json.loads(l[6:]) for l in lines if l.startswith("TIMES ")]
    (mlir,) = [json.loads(l[5:]) for l in lines if l.startswith("MLIR ")]
    assert mlir is (not forbid if traces is None else traces)
    return stats[-1], times[-1]


def _contents(cache) -> dict[str, str]:
    """Each file of the cached functions (not the empty lock files): its SHA-256."""
    return {str(p.relative_to(cache)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((cache / "functions").rglob("*")) if p.is_file() and p.stat().st_size}


def _no_duplicates(cache) -> dict[str, str]:
    """The cache's contents, asserted to hold no two byte-identical files (issue 27)."""
    files = _contents(cache)
    assert len(set(files.values())) == len(files), files
    return files


def test_a_backend_graph_loads_in_a_process_that_made_other_graphs_first(
        tmp_path, subprocess_env, trident_cache):
    """The graph's key holds its code, not fx's count of the process's GraphModules in its file
    name (Note [Function key] in trident/identity.py)."""
    script = tmp_path / "two_ops.py"
    script.write_text(TWO_OPS)
    first, times = _run(subprocess_env, script, "0")
    assert (first["traces"], first["compiles"], first["hits"]) == (1, 1, 1)
    assert times["trace"] > 0 and times["C build"] > 0
    stored = _no_duplicates(trident_cache)
    second, times = _run(subprocess_env, script, "3", forbid=True)
    assert (second["traces"], second["compiles"], second["misses"], second["hits"]) == \
        (0, 0, 0, 2)
    assert set(times.values()) == {0}, times  # every stage, wall and CPU
    assert _contents(trident_cache) == stored  # nothing added, nothing rewritten


def test_a_grid_of_triton_cdiv_restarts_warm(tmp_path, subprocess_env, trident_cache):
    """triton.cdiv and triton.next_power_of_2 are described by their code, not their address
    (a new process's state guards matched no stored specialization: a fresh user's finding)."""
    script = tmp_path / "cdiv.py"
    script.write_text(CDIV)
    first, _ = _run(subprocess_env, script)
    assert (first["traces"], first["compiles"], first["hits"]) == (1, 1, 1), first
    stored = _no_duplicates(trident_cache)
    second, times = _run(subprocess_env, script, forbid=True)
    assert (second["traces"], second["compiles"], second["misses"], second["hits"]) == \
        (0, 0, 0, 2), second
    assert set(times.values()) == {0}, times  # its callback slot (the interpreted launch)
    # recorded too: not rendered
    assert _contents(trident_cache) == stored


# A warm process's calls per door (hits, misses, fallbacks): generate's four forward calls
# (prefill and three decode steps), each served from disk; transformers' CompileConfig
# compiles the decode step only (the prefill runs eagerly outside the door), and the config
# door's figure is the process's backend_stats(), the backend door's 4 hits included. With
# the default (dynamic) cache transformers compiles nothing ("unable to meet the criteria"):
# the config door's figure is the backend door's.
HF_WARM_HITS = {"jit": (4, 0, 0), "backend": (4, 0, 0), "config": (4 + 3, 0, 0)}


@pytest.mark.parametrize("family, cache", [("Llama", "static"), ("Qwen2", "static"),
                                           ("Gemma2", "static"), ("Llama", "dynamic")])
def test_each_door_of_a_hugging_face_model_restarts_warm(tmp_path, subprocess_env,
                                                         trident_cache, family, cache):
    """Each door's second process loads what the first stored, under another hash seed:
    Gemma2, a hybrid model, gets its attention masks in a dict ordered by the seed (Note
    [Dict orders] in trident/lower/orders.py), which seeds 0 and 1 order apart. Issue 27:
    Llama and Qwen, with a static cache and with generate's default one."""
    script = tmp_path / "hf_doors.py"
    text = HF_DOORS.replace("Llama", family)
    script.write_text(text if cache == "static" else
                      text.replace('cache_implementation="static", ', ""))
    hits = HF_WARM_HITS if cache == "static" else dict(HF_WARM_HITS, config=(4, 0, 0))
    first, _ = _run(dict(subprocess_env, PYTHONHASHSEED="0"), script)
    # the jitted prefill and decode step (docs/huggingface.md)
    assert first["jit"]["compiles"] == 2 and first["backend"]["compiles"] >= 1
    stored = _no_duplicates(trident_cache)  # the config door reuses the backend door's graphs
    second, times = _run(dict(subprocess_env, PYTHONHASHSEED="1"), script, forbid=True)
    assert _contents(trident_cache) == stored
    for door in ("jit", "backend", "config"):
        assert (second[door]["traces"], second[door]["compiles"]) == (0, 0), door
        assert (second[door]["hits"], second[door]["misses"], second[door]["fallbacks"]) == \
            hits[door], door
    # Note [Stored module names]: each module found by its recorded name, none rendered: every
    # stage 0, wall and CPU (Note [Compile stages])
    assert set(times.values()) == {0}, times


# One jitted function; argv[1]: how many calls
RELU = textwrap.dedent('''
    import dataclasses, json, sys
    import torch, trident

    @trident.jit
    def f(x):
        return torch.relu(x) * 2

    x = torch.randn(8)
    for _ in range(int(sys.argv[1])):
        assert torch.equal(f(x), torch.relu(x) * 2)
    assert "scm_call" in f.source()  # shows the C: no compile stage (Note [Compile stages])
    print("STATS " + json.dumps(dataclasses.asdict(f.stats)))
    print("TIMES " + json.dumps({**trident.config.compile_times(), **{
        "cpu " + k: v for k, v in trident.config.compile_times(cpu=True).items()}}))
    print("MLIR " + json.dumps("torch_mlir" in sys.modules))
''')


def _records(cache) -> dict:
    """Note [Stored module names]: each module record of the cache, by file name."""
    return {p.name: json.loads(p.read_text())
            for p in sorted((cache / "functions").glob("*/modules/*.json"))}


def _damage_record(cache) -> None:
    (path,) = (cache / "functions").glob("*/modules/*.json")
    path.write_text("{not json")


def _record_another_module(cache) -> None:
    (path,) = (cache / "functions").glob("*/modules/*.json")
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "module": "trident_scm_" + "0" * 20}))


def _delete_record(cache) -> None:
    for path in (cache / "functions").glob("*/modules/*.json"):
        path.unlink()


def _delete_module(cache) -> None:
    for path in (cache / "functions").glob("*/trident_scm_*.so"):
        path.unlink()


def _truncate_module(cache) -> None:
    (path,) = (cache / "functions").glob("*/trident_scm_*.so")
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.parametrize("fault, builds", [
    (_damage_record, False), (_record_another_module, False), (_delete_record, False),
    (_delete_module, True), (_truncate_module, True)])
def test_a_module_record_that_fails_renders_as_before(tmp_path, subprocess_env, trident_cache,
                                                      fault, builds):
    """Note [Stored module names] in trident/frontend/modules.py: a new process loads the
    recorded module without rendering; where the record or its module fails it renders, finds
    (or builds) the module its source names, serves the calls, and records it again, so the
    next process renders nothing."""
    script = tmp_path / "relu.py"
    script.write_text(RELU)
    first, times = _run(subprocess_env, script, "2")
    assert (first["traces"], first["compiles"], first["hits"]) == (1, 1, 1)
    records = _records(trident_cache)
    (record,) = records.values()
    assert record["callbacks"] == record["cubins"] == []
    assert list((trident_cache / "functions").glob(f"*/{record['module']}.*.so"))
    fault(trident_cache)
    second, times = _run(subprocess_env, script, "2", forbid=not builds, traces=False)
    assert (second["traces"], second["compiles"], second["misses"], second["hits"]) == \
        (0, 0, 0, 2), second
    assert times["render"] > 0 and (times["C build"] > 0) == builds
    assert _records(trident_cache) == records  # recorded again, as it was
    third, times = _run(subprocess_env, script, "2", forbid=True)
    assert (third["traces"], third["compiles"], third["hits"]) == (0, 0, 2), third
    assert set(times.values()) == {0}, times  # source() rendered the C, not a stage


def test_a_module_record_goes_with_its_specialization(trident_cache):
    """Note [Stored module names]: the records are those of the stored specializations; one
    whose specialization the cache trims (its newest ``2 * max_specializations``) is deleted
    with it."""
    def make():
        def g(x):
            return x * 3
        return g

    for n in range(1, 5):  # a function object each (each its own limit), one folder (its code)
        g = make()
        jg = trident.jit(g, dynamic=False, max_specializations=1)  # the newest 2 stored
        x = torch.randn(n)
        assert torch.equal(jg(x), g(x))
        assert jg.stats.compiles == 1
    (folder,) = (trident_cache / "functions").glob("*")
    specs = sorted(p.stem.rpartition("-")[2] for p in folder.glob("specs/*.json"))
    assert len(specs) == 2
    records = sorted(p.stem.rpartition("-")[0] for p in folder.glob("modules/*.json"))
    assert records == specs
    modules = {json.loads(p.read_text())["module"] for p in folder.glob("modules/*.json")}
    assert modules <= {p.name.split(".")[0] for p in folder.glob("trident_scm_*.so")}


def test_a_forbidden_compile_raises_rather_than_running_eagerly(monkeypatch, trident_cache):
    monkeypatch.setenv("TRIDENT_FORBID_COMPILE", "1")

    @trident.jit
    def f(x):
        return x * 2

    with pytest.raises(CompileForbidden, match="TRIDENT_FORBID_COMPILE=1.*the miss: first call"):
        f(torch.ones(3))
    assert issubclass(CompileForbidden, TridentError)
    assert f.stats.fallbacks == 0
    assert not list((trident_cache / "functions").rglob("eager/*"))  # no decision stored
    monkeypatch.delenv("TRIDENT_FORBID_COMPILE")
    assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))
    assert f.stats.compiles == 1


def test_compile_times_count_each_stage(trident_cache, caplog, capfd):
    """Each stage is counted and logged (Note [Progress]); no progress line where stderr is
    not a terminal."""
    before = trident.config.compile_times()

    @trident.jit
    def g(x):
        return torch.sin(x) + 1

    with caplog.at_level(logging.INFO, logger="trident.recompiles"):
        assert torch.equal(g(torch.ones(4)), torch.sin(torch.ones(4)) + 1)
    after = trident.config.compile_times(reset=True)
    assert list(after) == ["trace", "order probe", "writes probe", "state", "import", "plan",
                           "buffers", "kernels", "guards", "render", "C build"]
    grew = {k for k in after if after[k] > before[k]}
    assert {"trace", "state", "import", "plan", "buffers", "guards", "render", "C build"} <= grew
    assert "kernels" not in grew  # no Triton kernel for CUDA here
    assert "order probe" not in grew  # no dict argument (Note [Dict orders])
    assert "writes probe" not in grew  # no object argument (Note [Writes probe])
    assert set(trident.config.compile_times().values()) == {0.0}
    stages = [re.fullmatch(r"\S+\.g: (\w+|C build) [\d.]+ s", m) for m in caplog.messages]
    assert [m[1] for m in stages if m] == ["trace", "state", "import", "plan", "buffers",
                                           "guards", "render", "C build"]
    # chronological: the miss, its stages as each ends, then the whole compile's line
    said = [m.split(": ", 1)[1] for m in caplog.messages]
    assert said[0] == "miss: first call" and said[-2].startswith("C build ")
    assert all(stages[1:-1]), said  # each stage's time once (no "import and plan" line too)
    total = float(re.fullmatch(r"compiled specialization \S*g\(x: float32\[4\] cpu\) in "
                               r"([\d.]+) s", said[-1])[1])
    # the stages cover the compile's time (issue: 35 s of 104 s were in no stage)
    assert total - sum(after[k] for k in after) < 0.1 * total + 0.05, (total, after)
    assert "trident: " not in capfd.readouterr().err


PROGRESS = textwrap.dedent('''
    import time
    from trident import config

    with config.progress("Block.forward"):
        with config.stage("trace"):
            time.sleep(2.5)
        with config.stage("C build"):
            time.sleep(1.2)
    print("done")
''')


def _on_a_terminal(script: str, env: dict) -> tuple[bytes, bytes]:
    """``(stdout, what stderr's terminal got)`` of ``python -c script`` whose stderr is a
    pseudo-terminal 100 columns wide."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=slave, env=env)
    os.close(slave)
    out, _ = child.communicate(timeout=120)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert child.returncode == 0, shown.decode()
    return out, shown


def _screen(shown: bytes) -> list[str]:
    """The lines a terminal shows for ``shown``: a carriage return goes back to the line's
    start, other characters overwrite (a pty's output turns each ``\\n`` into ``\\r\\n``)."""
    lines, line, column = [], [], 0
    for ch in shown.decode():
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, column = [], 0
        elif ch == "\r":
            column = 0
        else:
            line[column:column + 1] = [ch]
            column += 1
    return lines + ["".join(line).rstrip()]


def test_a_long_compile_shows_its_stages_on_a_terminal(subprocess_env):
    """Note [Progress]: the line shows once 2 s have passed, names the stage, and is cleared."""
    out, shown = _on_a_terminal(PROGRESS, subprocess_env)
    assert out == b"done\n"
    lines = [l.strip() for l in shown.decode().split("\r") if l.strip()]
    assert "trident: Block.forward [00:02, trace]" in lines
    assert lines[-1].startswith("trident: Block.forward [00:0") and "C build]" in lines[-1]
    assert shown.endswith(b"\r") and shown.decode().split("\r")[-2].strip() == ""  # cleared


ASIDE = textwrap.dedent('''
    import logging, sys, time, warnings
    from trident import config

    with config.progress("Block.forward"):
        with config.stage("trace"):
            time.sleep(2.5)
            warnings.warn("a warning of the traced code")
            print("a print to stderr", file=sys.stderr)
        with config.stage("C build"):
            time.sleep(1.5)
    logging.getLogger("trident.recompiles").info("after the compile")
    print("done")
''')


def test_output_while_the_progress_line_shows_starts_a_line_of_its_own(subprocess_env):
    """Note [Progress]: a log record of Trident (``TRIDENT_LOGS``: each stage's seconds, as the
    compile inside a ``generate`` wrote them), a warning and a write to ``sys.stderr`` while
    the line shows clear it first, so none goes on after it on its line (they did), and the
    line is drawn again after them and cleared at the end."""
    out, shown = _on_a_terminal(ASIDE, {**subprocess_env, "TRIDENT_LOGS": "recompiles"})
    assert out == b"done\n"
    screen = [l for l in _screen(shown) if l]
    assert re.fullmatch(r"<string>:\d+: UserWarning: a warning of the traced code", screen[0])
    assert screen[1:] == ["a print to stderr", screen[2], screen[3],
                          "[trident.recompiles] after the compile"], screen
    assert re.fullmatch(r"\[trident.recompiles\] Block.forward: trace [\d.]+ s", screen[2])
    assert re.fullmatch(r"\[trident.recompiles\] Block.forward: C build [\d.]+ s", screen[3])
    drawn = shown.decode().split("\r")
    assert "trident: Block.forward [00:02, trace]" in drawn  # shown before the warning
    assert any(re.fullmatch(r"trident: Block.forward \[00:0\d, C build\]", l)
               for l in drawn), shown  # drawn again after the stage's record


SLOW_ASIDE = textwrap.dedent('''
    import logging, sys, time
    from trident import config

    class Slow(logging.StreamHandler):  # the refresher ticks between the clear and the write
        def emit(self, record):
            time.sleep(1.5)
            super().emit(record)

    lg = config.logger("recompiles")
    lg.setLevel(logging.INFO)
    lg.propagate = False
    lg.addHandler(Slow(sys.stderr))
    with config.progress("Block.forward"):
        time.sleep(3.2)
        lg.info("a slow record")
        sys.stderr.write("half a line, ")
        time.sleep(1.5)
        sys.stderr.write("its end\\n")
        time.sleep(1.2)
    print("done")
''')


def test_a_tick_between_a_clear_and_its_output_waits_for_it(subprocess_env):
    """Note [Progress]: a record whose handler writes 1.5 s after the line was cleared, and a
    line of ``sys.stderr`` written in two parts 1.5 s apart, each start a line of their own and
    stay whole: the refresher's tick waits on the lock held until the record is out, and draws
    nothing until a written line ends (a tick 0.2 s after a clear drew the line between them)."""
    out, shown = _on_a_terminal(SLOW_ASIDE, subprocess_env)
    assert out == b"done\n"
    screen = [l for l in _screen(shown) if l]
    assert screen == ["a slow record", "half a line, its end"], (screen, shown)
    line = b"trident: Block.forward [00:0"
    assert shown.index(line) < shown.index(b"a slow record"), shown  # shown before the record
    assert shown.rindex(line) > shown.index(b"its end"), shown  # and drawn again after them


def test_a_trace_that_assigns_a_tensor_to_its_arguments_stops_early(trident_cache,
                                                                     monkeypatch):
    """Note [Early assignment check] (trident/lower/source_lines.py): the trace ends at the
    function's 32nd torch call, not after its 101; the call runs eagerly, as eager does."""
    traced = count_traced_calls(monkeypatch)

    def f(d, x):
        d["t"] = x + 1  # a new tensor in the argument's dict: cannot be compiled
        for _ in range(100):
            x = x * 1.5
        return x

    jf = trident.jit(f)
    d, x = {"t": torch.zeros(2)}, torch.ones(2)
    with pytest.warns(UserWarning, match=r"assigns to d\.t \(Python state of its arguments"):
        out = jf(d, x)
    assert sum(traced) == 32
    expected_d = {"t": torch.zeros(2)}
    assert torch.equal(out, f(expected_d, x)) and torch.equal(d["t"], expected_d["t"])
    assert (jf.stats.fallbacks, jf.stats.compiles) == (1, 0)


# Calls whose argument trees differ in an int attribute (a cache's length): the second makes
# ``c.n`` an int leaf (Note [Int leaves]), so the first one's specialization keeps it constant
INT_LEAVES = textwrap.dedent('''
    import dataclasses, json, sys
    import torch, trident

    class Cache:
        def __init__(self, n):
            self.n = n

    @trident.jit
    def f(x, c):
        return x[: c.n] * 2

    x32, x64 = torch.randn(8), torch.randn(8, dtype=torch.float64)
    calls = {"a": (x32, Cache(1)), "b": (x32, Cache(5)), "c": (x64, Cache(5))}
    for name in sys.argv[1]:
        x, c = calls[name]
        assert torch.equal(f(x, c), x[: c.n] * 2)
    print("STATS " + json.dumps(dataclasses.asdict(f.stats)))
    print("TIMES " + json.dumps({**trident.config.compile_times(), **{
        "cpu " + k: v for k, v in trident.config.compile_times(cpu=True).items()}}))
    print("MLIR " + json.dumps("torch_mlir" in sys.modules))
''')


def test_a_stored_specialization_the_limit_left_out_serves_a_new_process(
        tmp_path, subprocess_env, trident_cache):
    """More specializations stored than a new process installs (``max_specializations``): a
    call that a stored one accepts never traces, also where it was stored before its process
    made an int a leaf (Note [Stored int leaves] in trident/frontend/install.py), and the one
    installed from disk is the most recently used for the next process (a fresh user's
    finding: Llama's forward traced again after a warm restart)."""
    script = tmp_path / "int_leaves.py"
    script.write_text(INT_LEAVES)
    first, _ = _run(subprocess_env, script, "abc")
    assert (first["traces"], first["compiles"]) == (3, 3), first
    env = dict(subprocess_env, TRIDENT_MAX_SPECIALIZATIONS="2")  # installs b and c
    second, times = _run(env, script, "ab", forbid=True)
    assert (second["traces"], second["compiles"], second["misses"], second["hits"]) == \
        (0, 0, 2, 0), second
    assert times["trace"] == times["C build"] == 0
    third, _ = _run(env, script, "ab", forbid=True)  # installs the two it used: both hit
    assert (third["traces"], third["misses"], third["hits"]) == (0, 0, 2), third


# A kernel calling tl.sum, whose code reads triton's dtypes (tl.int32: a state guard named it
# by its address, so no new process found the stored specialization: a fresh user's finding);
# the launch is on CUDA only, its state guards are read on every device
TL_SUM = textwrap.dedent('''
    import dataclasses, json, sys
    import torch, trident, triton
    import triton.language as tl

    @triton.jit
    def scale_by_sum(x_ptr, BLOCK: tl.constexpr):
        v = tl.load(x_ptr + tl.arange(0, BLOCK)).to(tl.float32)
        tl.store(x_ptr + tl.arange(0, BLOCK), v * tl.sum(v, axis=0))

    @trident.jit
    def f(x):
        if x.is_cuda:
            scale_by_sum[(1,)](x, BLOCK=16)
        return x * 2 + 1

    x = torch.randn(16)
    assert torch.equal(f(x), x * 2 + 1)
    print("STATS " + json.dumps(dataclasses.asdict(f.stats)))
    print("TIMES " + json.dumps({**trident.config.compile_times(), **{
        "cpu " + k: v for k, v in trident.config.compile_times(cpu=True).items()}}))
    print("MLIR " + json.dumps("torch_mlir" in sys.modules))
''')


def test_a_kernel_using_tl_sum_restarts_warm(tmp_path, subprocess_env, trident_cache):
    """Note [Library state] in lower/state/library_steps.py: a library's value checked by identity
    (``tl.int32``) is named by its class and repr, not its address."""
    script = tmp_path / "tl_sum.py"
    script.write_text(TL_SUM)
    first, _ = _run(subprocess_env, script)
    assert (first["traces"], first["compiles"]) == (1, 1), first
    stored = _no_duplicates(trident_cache)
    second, times = _run(subprocess_env, script, forbid=True)
    assert (second["traces"], second["compiles"], second["misses"], second["hits"]) == \
        (0, 0, 0, 1), second
    assert _contents(trident_cache) == stored


# generate at each prompt length of argv: the second length makes the prefill symbolic, whose
# trace runs the __new__ of library namedtuples (torch._guards.ShapeGuard: code exec'd into a
# dict of its own, read as objects of the process: a fresh user's finding). Eager generates on
# a copy: generate sizes a static cache by the model's _previous_max_cache_length (the longest
# before): eager runs on the jitted model first would size each of its calls' caches by the
# last length, which then never changes within a process and stays a constant of every stored
# specialization (a new length in a new process, its cache longer, traced again rightly)
HF_LENGTHS = TINY_LLAMA_SCRIPT + textwrap.dedent('''
    import copy, sys

    reference, eager = copy.deepcopy(model), {}
    for n in map(int, sys.argv[1:]):
        ids = torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(n))
        eager[n] = reference.generate(ids, max_new_tokens=3, do_sample=False,
                                      cache_implementation="static", disable_compile=True)
    warnings.simplefilter("ignore")
    model.forward = trident.jit(model.forward)
    for n in map(int, sys.argv[1:]):
        ids = torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(n))
        assert torch.equal(model.generate(ids, max_new_tokens=3, do_sample=False,
                                          cache_implementation="static",
                                          disable_compile=True), eager[n])
    print("STATS " + json.dumps(dataclasses.asdict(model.forward.stats)))
    print("TIMES " + json.dumps({**trident.config.compile_times(), **{
        "cpu " + k: v for k, v in trident.config.compile_times(cpu=True).items()}}))
    print("MLIR " + json.dumps("torch_mlir" in sys.modules))
''')


def test_every_prompt_length_of_a_hugging_face_model_restarts_warm(tmp_path, subprocess_env,
                                                                   trident_cache):
    """Note [Reached roots] in lower/state/roots.py: each specialization the first process
    compiled (static and symbolic prefill and decode) serves the second, which traces and
    builds nothing, and the cache gains no file; a third at a length neither ran too (its
    static cache longer: the symbolic ones, whose int leaves Note [Stored int leaves] in
    install.py flattens the call with, accept it)."""
    script = tmp_path / "hf_lengths.py"
    script.write_text(HF_LENGTHS)
    first, _ = _run(subprocess_env, script, "6", "9")
    assert first["compiles"] >= 3, first  # a symbolic prefill among them
    stored = _no_duplicates(trident_cache)
    assert not [p for p in (trident_cache / "functions").rglob("specs/*.json")
                if '"object"' in p.read_text()]  # no chain rooted at an object's address
    second, times = _run(subprocess_env, script, "6", "9", forbid=True)
    assert (second["traces"], second["compiles"], second["misses"]) == (0, 0, 0), second
    assert times["trace"] == times["C build"] == 0
    assert _contents(trident_cache) == stored
    third, times = _run(subprocess_env, script, "13", forbid=True)
    assert (third["traces"], third["compiles"], third["misses"]) == (0, 0, 0), third
    assert third["hits"] == 3 and times["trace"] == times["C build"] == 0, third
    assert _contents(trident_cache) == stored


def _matmul_relu(x, y):
    return torch.relu(x @ y) + 1.0


def test_a_new_process_installs_only_the_stored_specializations_its_calls_need(trident_cache):
    """Note [Installing on demand] (trident/frontend/install.py): a new JitFunction over a
    function with ten stored specializations (as a new process has) installs, at its first
    call, the one whose guards accept it; a call of another stored one installs that one; a
    hit either way. What lists them installs them all, and a call none accepts compiles as
    before, its miss reason naming each one."""
    y = torch.randn(8, 8)
    first = trident.jit(_matmul_relu, dynamic=False, max_specializations=12)
    for n in range(1, 11):
        first(torch.randn(n, 8), y)
    assert first.stats.compiles == 10
    again = trident.jit(_matmul_relu, dynamic=False, max_specializations=12)
    for n, installed in ((5, 1), (5, 1), (7, 2)):
        x = torch.randn(n, 8)
        assert torch.equal(again(x, y), _matmul_relu(x, y))
        assert (len(again._specs), len(again._pending)) == (installed, 10 - installed)
    s = again.stats
    assert (s.hits, s.misses, s.compiles, s.traces) == (3, 0, 0, 0), s
    assert len(again.specializations) == 10 and not again._pending
    lazy = trident.jit(_matmul_relu, dynamic=False, max_specializations=12)
    x = torch.randn(11, 8)
    assert torch.equal(lazy(x, y), _matmul_relu(x, y))  # none accepts: all, then a compile
    s = lazy.stats
    assert (s.hits, s.misses, s.compiles) == (0, 1, 1), s
    assert len(re.findall(r"specialization \d+", s.miss_reasons[0])) == 10, s.miss_reasons


SCALE = 2.0


def _scaled(x):
    return x * SCALE


def test_a_pending_specialization_whose_state_changed_is_not_installed(trident_cache):
    """Note [Installing on demand]: the state guards of the specializations not installed yet
    are checked as the installed ones' are: a global that one of them read, changed before a
    call needs it, makes that call compile again with the new value (never serve the old)."""
    global SCALE
    first = trident.jit(_scaled, dynamic=False)
    first(torch.ones(2))
    first(torch.ones(3))
    again = trident.jit(_scaled, dynamic=False)
    assert torch.equal(again(torch.ones(2)), torch.full((2,), 2.0))
    assert len(again._specs) == 1 and len(again._pending) == 1
    try:
        SCALE = 3.0
        assert torch.equal(again(torch.ones(3)), torch.full((3,), 3.0))
        assert torch.equal(again(torch.ones(2)), torch.full((2,), 3.0))
    finally:
        SCALE = 2.0
    s = again.stats
    assert (s.hits, s.compiles) == (1, 2), s
