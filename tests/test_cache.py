"""The on-disk cache: reuse across processes, concurrent compiles, listing and clearing."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

import trident
from trident.identity import function_key
from _trident_helpers import (TINY_LLAMA_SCRIPT, as_in_a_new_process, fresh_imports,
                              run_python)

MODULE = textwrap.dedent('''
    import torch
    import trident

    @trident.jit
    def model(x, w, n):
        h = torch.relu(x @ w) * n
        return h.sum(-1), [h[:, :2], None], n + 1

    def check(calls):
        """``calls`` calls of ``model``, each against eager: its stats."""
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(4, 8, generator=gen), torch.randn(8, 6, generator=gen)
        want = model.__wrapped__(x, w, 3)
        for _ in range(calls):
            got = model(x, w, 3)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1][0], want[1][0])
            assert got[1][1] is None and got[2] == 4
        return model.stats
''')

SCRIPT = textwrap.dedent('''
    import dataclasses, json, sys
    sys.path.insert(0, sys.argv[1])
    from cached_mod import check

    print("STATS " + json.dumps(dataclasses.asdict(check(int(sys.argv[2])))))
''')


def write_module(tmp_path: Path) -> Path:
    d = tmp_path / "mod"
    d.mkdir(exist_ok=True)
    (d / "cached_mod.py").write_text(MODULE)
    (d / "run_model.py").write_text(SCRIPT)
    return d


def run_script(d: Path, env: dict, n: int) -> dict:
    p = subprocess.run([sys.executable, str(d / "run_model.py"), str(d), str(n)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    return parse_stats(p.stdout)


def call_model(d: Path, n: int) -> dict:
    """``SCRIPT``'s calls in this process, on a fresh import of the module: its stats."""
    with fresh_imports(d):
        return dataclasses.asdict(importlib.import_module("cached_mod").check(n))


def parse_stats(stdout: str) -> dict:
    line = [l for l in stdout.splitlines() if l.startswith("STATS ")]
    assert line, stdout
    return json.loads(line[-1][len("STATS "):])


def test_second_process_reuses_the_cache(tmp_path, subprocess_env, trident_cache):
    d = write_module(tmp_path)
    first = run_script(d, subprocess_env, 5)
    assert (first["traces"], first["compiles"], first["misses"], first["fallbacks"]) == (1, 1, 1, 0)
    assert first["hits"] == 4
    second = run_script(d, subprocess_env, 7)
    assert (second["traces"], second["compiles"], second["misses"], second["fallbacks"]) == \
        (0, 0, 0, 0)
    assert second["hits"] == 7
    assert second["miss_reasons"] == []
    # exactly one function, one specialization, one built module
    funcs = list((trident_cache / "functions").iterdir())
    assert len(funcs) == 1 and funcs[0].name.startswith("model-")
    assert len(list((funcs[0] / "specs").glob("*.json"))) == 1
    assert len([p for p in funcs[0].glob("trident_scm_*") if p.suffix not in (".c", ".lock",
                                                                            ".sha256")]) == 1


def test_changed_source_gets_a_new_cache_entry(tmp_path, trident_cache):
    d = write_module(tmp_path)
    assert call_model(d, 2)["compiles"] == 1
    assert call_model(d, 2)["compiles"] == 0  # the same source: its entry
    (d / "cached_mod.py").write_text(MODULE.replace("* n", "* n * 1"))
    stats = call_model(d, 2)
    assert stats["compiles"] == 1 and stats["misses"] == 1
    assert len(list((trident_cache / "functions").iterdir())) == 2


def test_concurrent_processes_compile_the_same_function(tmp_path, subprocess_env, trident_cache):
    d = write_module(tmp_path)
    cmd = [sys.executable, str(d / "run_model.py"), str(d), "3"]
    procs = [subprocess.Popen(cmd, env=subprocess_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-4000:]
        stats = parse_stats(out)
        assert stats["fallbacks"] == 0
        assert stats["hits"] + stats["misses"] == 3
    # a third process finds a consistent cache
    third = run_script(d, subprocess_env, 2)
    assert (third["traces"], third["compiles"], third["misses"], third["hits"]) == (0, 0, 0, 2)
    leftovers = [p for p in (trident_cache / "functions").rglob("*") if p.suffix == ".tmp"]
    assert leftovers == []


def test_in_process_reload_from_disk():
    """A second JitFunction of the same code (as in a new process) loads the stored module."""
    def f(x):
        return x * 3 - 1

    a = trident.jit(f)
    x = torch.randn(5)
    a(x)
    b = trident.jit(f)
    assert torch.equal(b(x), x * 3 - 1)
    assert (b.stats.traces, b.stats.compiles, b.stats.misses, b.stats.hits) == (0, 0, 0, 1)
    assert b.specializations == a.specializations


def cache_f(x):
    return x + 1


def cache_g(x, n):
    return x * n


def test_list_cache_and_clear_cache(trident_cache):
    assert trident.list_cache() == []
    trident.jit(cache_f)(torch.ones(2))
    jg = trident.jit(cache_g)
    jg(torch.ones(2), 2)
    jg(torch.ones(2), 3)
    rows = trident.list_cache()
    assert len(rows) == 2
    by_name = {Path(r["path"]).name.split("-")[0]: r for r in rows}
    assert set(by_name) == {"cache_f", "cache_g"}
    assert by_name["cache_f"]["specializations"] == 1
    assert by_name["cache_g"]["specializations"] == 2
    for r in rows:
        assert Path(r["path"]).is_dir() and Path(r["path"]).parent == trident_cache / "functions"
        assert r["bytes"] == sum(p.stat().st_size for p in Path(r["path"]).rglob("*")
                                 if p.is_file()) and r["bytes"] > 0
    trident.clear_cache()
    assert trident.list_cache() == []
    assert not (trident_cache / "functions").exists()


def test_clear_cache_removes_runtime_builds(tmp_path, monkeypatch):
    # a separate folder with a stand-in runtime build (the shared one must survive)
    d = tmp_path / "other-cache"
    (d / "runtime" / "abc").mkdir(parents=True)
    (d / "runtime" / "abc" / "trident_rt.so").write_bytes(b"x")
    (d / "functions" / "f-123" / "specs").mkdir(parents=True)
    (d / "unrelated.txt").write_text("keep")
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(d))
    assert len(trident.list_cache()) == 1
    trident.clear_cache()
    assert not (d / "runtime").exists() and not (d / "functions").exists()
    assert (d / "unrelated.txt").read_text() == "keep"


def test_command_line_list_clear_and_cache_dir(tmp_path, subprocess_env, trident_cache, capsys):
    from trident.__main__ import main  # `list` and `clear` run in this process

    d = write_module(tmp_path)
    call_model(d, 1)
    p = subprocess.run([sys.executable, "-m", "trident", "cache-dir"], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == str(trident_cache)
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith(f"cached_mod.model ({d / 'cached_mod.py'}:5): 1 specialization, ")
    (row,) = trident.list_cache()
    used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["last_use"]))
    assert lines[0].endswith(f" KiB, last used {used}")
    assert lines[1].startswith("  0: model(x: float32[4, 8] cpu")
    assert lines[2].startswith(f"  in {trident_cache / 'functions'}/model-")
    assert row["bytes"] < 2**20  # a small entry's total in KiB (a new user read "0.0 MiB")
    assert lines[3] == (f"1 entry, {row['bytes'] / 1024:.1f} KiB of the bound of 2048.0 MiB "
                        "(TRIDENT_CACHE_SIZE)")
    assert main(["clear"]) == 0
    out = capsys.readouterr().out
    assert str(trident_cache) in out and f"deleted {lines[2][len('  in '):]}" in out.splitlines()
    assert not (trident_cache / "functions").exists()
    assert trident.list_cache() == []


def test_corrupt_spec_files_are_ignored(trident_cache):
    def f(x):
        return x - 2

    jf = trident.jit(f)
    jf(torch.ones(3))
    spec_dir = next((trident_cache / "functions").iterdir()) / "specs"
    (stored_path,) = spec_dir.glob("*.json")
    stored = json.loads(stored_path.read_text())  # with an operand of no kind
    stored["plan"]["steps"][0]["args"][0]["k"] = "tensor_v0"
    (spec_dir / "0-garbage.json").write_text("{not json")
    (spec_dir / "1-partial.json").write_text(json.dumps({"signature": "x"}))
    (spec_dir / "2-unknown-operand.json").write_text(json.dumps(stored))
    again = trident.jit(f)
    assert torch.equal(again(torch.ones(3)), torch.full((3,), -1.0))
    assert again.stats.compiles == 0 and again.stats.hits == 1
    assert len(again.specializations) == 1
    assert [p.name for p in spec_dir.glob("*.json")] == [p.name for p in spec_dir.glob("*-*.json")
                                                         if "garbage" not in p.name
                                                         and "partial" not in p.name
                                                         and "unknown" not in p.name]  # dropped


def test_specialization_limit_counts_this_process_compiles(trident_cache):
    """Note [Specialization limit]: specializations stored by earlier runs do not use up the
    limit; the module installs the newest of them."""
    def scale(x, k):
        return x * k

    x = torch.arange(3.0)
    first = trident.jit(scale, max_specializations=2)
    first(x, 1)
    first(x, 2)
    as_in_a_new_process()
    later = trident.jit(scale, max_specializations=2)
    assert torch.equal(later(x, 3), x * 3) and torch.equal(later(x, 2), x * 2)
    assert (later.stats.compiles, later.stats.fallbacks, later.stats.hits) == (1, 0, 1)
    assert [s.split("k=")[1] for s in later.specializations] == ["2)", "3)"]
    # k=1 is on disk but not installed: installed again, not compiled again
    assert torch.equal(later(x, 1), x) and later.stats.compiles == 1
    assert [s.split("k=")[1] for s in later.specializations] == ["3)", "1)"]


def test_cache_dir_is_created_on_demand(tmp_path, monkeypatch):
    from trident import config

    d = tmp_path / "nested" / "cache"
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(d))
    assert config.cache_dir() == d and d.is_dir()


CONFIG_MODULE = textwrap.dedent('''
    import os, types
    import torch
    import trident

    CFG = types.SimpleNamespace(k=float(os.environ["TRIDENT_TEST_K"]))

    @trident.jit
    def scaled(x):
        return x * CFG.k
''')

def _run_config(d: Path, monkeypatch, k: str) -> tuple[str, int]:
    """``scaled`` of a fresh import of ``config_mod`` with ``TRIDENT_TEST_K=k`` (as in a new
    process started with that variable): its results and eager's, and how many compiles."""
    monkeypatch.setenv("TRIDENT_TEST_K", k)
    with fresh_imports(d):
        scaled = importlib.import_module("config_mod").scaled
        x = torch.ones(2)
        return (f"RESULT {scaled(x).tolist()} {scaled.__wrapped__(x).tolist()}",
                scaled.stats.compiles)


def test_global_object_attributes_are_part_of_the_cache_key(tmp_path, monkeypatch):
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "config_mod.py").write_text(CONFIG_MODULE)
    assert _run_config(d, monkeypatch, "2") == ("RESULT [2.0, 2.0] [2.0, 2.0]", 1)
    assert _run_config(d, monkeypatch, "3") == ("RESULT [3.0, 3.0] [3.0, 3.0]", 1)
    assert _run_config(d, monkeypatch, "2") == ("RESULT [2.0, 2.0] [2.0, 2.0]", 0)


GLOBAL_DICT_MODULE = CONFIG_MODULE.replace(
    'types.SimpleNamespace(k=float(os.environ["TRIDENT_TEST_K"]))',
    '{"k": float(os.environ["TRIDENT_TEST_K"])}').replace("CFG.k", 'CFG["k"]')


def test_global_plain_values_are_part_of_the_cache_key(tmp_path, monkeypatch):
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "config_mod.py").write_text(GLOBAL_DICT_MODULE)
    assert _run_config(d, monkeypatch, "2") == ("RESULT [2.0, 2.0] [2.0, 2.0]", 1)
    assert _run_config(d, monkeypatch, "3") == ("RESULT [3.0, 3.0] [3.0, 3.0]", 1)
    assert _run_config(d, monkeypatch, "2") == ("RESULT [2.0, 2.0] [2.0, 2.0]", 0)


_NAMES_MODULE = """
import torch
t = k = os = None  # module globals named like the function's attribute, method and import names
K = 2.0


def f(x, m):
    import os
    return x.t() * m.k * K + len(os.sep)
"""


def test_a_global_named_like_an_attribute_is_not_part_of_the_cache_key():
    """Note [Function key]: the globals the code reads are keyed (``K``), not module globals that
    share a name with its attribute, method or import names (``x.t()``, ``m.k``, ``import
    os``): a global ``t = time.perf_counter()`` made every new process's key new, so a
    restarted process compiled again (found by a new user)."""
    ns: dict = {}
    exec(compile(_NAMES_MODULE, "trident_names_mod.py", "exec"), ns)
    f, key = ns["f"], function_key(ns["f"])
    for name, value in [("t", 1.5), ("k", object()), ("os", "text")]:
        ns[name] = value
        assert function_key(f) == key, name
    ns["K"] = 3.0
    assert function_key(f) != key


def test_a_closure_over_a_module_builtin_has_a_key_of_every_process():
    """Note [Builtins by name]: a builtin that its module holds under its name is keyed by that
    name (a pybind11 function's repr shows an address, and it was keyed by identity: a key of
    one process only); a builtin method bound to an object stays keyed by its object."""
    from trident.identity import key_parts

    def closure(fn):
        return lambda x: fn(x)

    for builtin in (torch._C._is_tracing, torch._C._get_tracing_state, torch.sin):
        parts = key_parts(closure(builtin))
        assert not [w for w, _ in parts.values() if "this process only" in w], builtin
        assert function_key(closure(builtin)) == function_key(closure(builtin))
    assert function_key(closure(torch.sin)) != function_key(closure(torch.cos))
    (bound,) = [w for label, (w, _) in key_parts(closure([].append)).items()
                if label.startswith("closure")]
    assert "this process only" in bound


def test_the_cache_log_says_what_keys_a_function_apart_from_its_other_folders(trident_cache,
                                                                              caplog):
    # a restart that compiles again tells why the stored folders did not serve it
    caplog.set_level(logging.INFO, logger="trident.cache")
    folders = []
    for k in (2.0, 3.0):
        ns: dict = {"__name__": "trident_keymod"}
        exec(compile(_NAMES_MODULE.replace("K = 2.0", f"K = {k}"), "trident_keymod.py", "exec"),
             ns)
        jf = trident.jit(ns["f"])
        m, x = types.SimpleNamespace(k=1.0), torch.ones(2, 2)
        assert torch.equal(jf(x, m), ns["f"](x, m))
        folders.append(jf._cache.directory.name)
    said = [r.getMessage() for r in caplog.records if "nothing stored" in r.getMessage()]
    assert said == [f"f: nothing stored under its key; its other folders: {folders[0]} "
                    "(differs in global K, here 3.0)"], said


def test_damaged_module_in_the_cache_is_built_again(tmp_path, subprocess_env, trident_cache):
    """A truncated SCM would crash ``dlopen`` (SIGBUS); its SHA-256 no longer matches, so the
    next process builds it again and serves the stored specialization."""
    d = write_module(tmp_path)
    run_script(d, subprocess_env, 2)
    (module,) = [p for p in (trident_cache / "functions").glob("*/trident_scm_*")
                 if p.suffix not in (".c", ".lock", ".sha256")]
    module.write_bytes(module.read_bytes()[: module.stat().st_size // 2])
    second = run_script(d, subprocess_env, 3)
    assert (second["traces"], second["compiles"], second["hits"]) == (0, 0, 3)


def test_objects_without_attributes_do_not_share_a_key():
    """Note [Function key]: a value with neither ``__dict__`` nor its own repr is keyed by
    identity, so two closures over two such objects never load each other's specializations."""

    class Scale:
        __slots__ = ("k",)

        def __init__(self, k):
            self.k = k

    def make(scale):
        return trident.jit(lambda x: x * scale.k)

    x = torch.ones(3)
    assert torch.equal(make(Scale(2.0))(x), x * 2)
    assert torch.equal(make(Scale(3.0))(x), x * 3)


def test_bound_methods_key_their_object():
    class Model:
        def __init__(self, k):
            self.k = k

        def forward(self, x):
            return x * self.k

    x = torch.ones(3)
    assert torch.equal(trident.jit(Model(2.0).forward)(x), x * 2)
    assert torch.equal(trident.jit(Model(3.0).forward)(x), x * 3)


def test_cache_key_covers_the_pipeline_and_not_the_benchmarks():
    from trident.identity import keyed_sources

    names = {p.name for p in keyed_sources()}
    assert {"capture.py", "render.py", "jit.py", "runtime.cpp", "scm.c.jinja"} <= names
    # benchmarks/ (outside the package), the package's thin entries to it, the command line
    assert not names & {"bench.py", "bench_gpu.py", "bench_hf.py", "demo.py", "__main__.py"}


# ---- reuse across processes: what the keys hold (issue #27) ------------------------------------

HF_SCRIPT = TINY_LLAMA_SCRIPT + textwrap.dedent('''
    def generate():
        return model.generate(ids, max_new_tokens=4, do_sample=False,
                              cache_implementation="static", disable_compile=True)

    eager = generate()
    if sys.argv[1:] == ["config"]:  # a CompileConfig's compile first: Dynamo's wrapper of
        config = transformers.CompileConfig(backend="eager")  # the call is left on the model
        config._compile_all_devices = True  # (transformers compiles on GPUs only by default)
        model.generation_config.compile_config = config
        model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static")
        assert callable(model.__dict__["_compiled_call"])
    model.forward = trident.jit(model.forward)
    out = generate()
    print("EQUAL", torch.equal(out, eager))
    print("STATS " + json.dumps(dataclasses.asdict(model.forward.stats)))
''')


@pytest.mark.parametrize("before", ["", "config"])
def test_a_second_process_generates_from_the_cache_without_tracing(tmp_path, subprocess_env,
                                                                   before):
    """A Hugging Face model's argument tree holds nothing of one process (the jitted forward in
    the model's ``__dict__``, GenerationConfig's per-process hash, the wrapper of Dynamo's that
    a ``CompileConfig`` leaves in ``_compiled_call``: Note [Builtins by name] in
    trident/identity.py): the second process neither traces nor compiles, and serves the
    prefill (whose attribute writes the specialization holds: Note [Attribute writes] in
    trident/lower/writes.py) and every decode step."""
    script = tmp_path / "hf_generate.py"
    script.write_text("import sys\n" + HF_SCRIPT)
    runs = []
    for _ in range(2):
        out = run_python(subprocess_env, str(script), *[before] * bool(before)).stdout
        assert "EQUAL True" in out.splitlines()
        runs.append(parse_stats(out))
    first, second = runs
    # the prefill is probed on fake tensors for its writes (Note [Writes probe] in
    # trident/frontend/tracing.py), then traced once with the static cache's capacity ints as
    # leaves (Note [Capacities of written state] in trident/frontend/ints.py)
    assert (first["traces"], first["compiles"], first["fallbacks"]) == (2, 2, 0)
    assert (second["traces"], second["compiles"], second["fallbacks"], second["misses"],
            second["hits"]) == (0, 0, 0, 0, 4)


class _Net(torch.nn.Module):
    def forward(self, x):
        return x + 1


def _description(*args) -> list[str]:
    from trident.lower.flatten import flatten_call
    from trident.ir.trees import Binding

    return flatten_call(Binding.of(lambda m: None), args, {})[0].description


def test_a_jitted_method_is_described_by_its_function_and_the_object_it_is_bound_to():
    from trident.identity import PROCESS as _PROCESS

    a, b, c = _Net(), _Net(), _Net()
    a.forward = trident.jit(a.forward)
    b.forward = trident.jit(b.forward)
    c.forward = trident.jit(a.forward.__wrapped__)  # bound to another object than c
    (words_a,) = [d for d in _description(a) if "|'forward'|" in d]
    assert "trident.jit of function test_cache._Net.forward " in words_a
    assert words_a.endswith(" bound to the object at m") and _PROCESS not in words_a
    assert _description(a) == _description(b)
    (words_c,) = [d for d in _description(c) if "|'forward'|" in d]
    assert _PROCESS in words_c and _description(c) != _description(a)


def test_the_per_process_hash_of_a_generation_config_is_not_in_the_tree():
    import transformers

    config = transformers.GenerationConfig(max_new_tokens=3)
    config._original_object_hash = hash(config)  # as from_model_config sets it
    before = _description(config)
    config._original_object_hash += 1  # another process's value
    assert _description(config) == before
    assert not any("|'_original_object_hash'|" in d for d in before)
    config.max_new_tokens = 4  # the fields it hashes are checked one by one
    assert _description(config) != before


def test_an_enum_member_is_described_by_its_class_and_name():
    import enum

    from trident.identity import PROCESS as _PROCESS

    class Mode(enum.Enum):
        FAST = 1
        SLOW = 2

    class Holder:
        def __init__(self, mode):
            self.mode = mode

    (fast,) = [d for d in _description(Holder(Mode.FAST)) if "|'mode'|" in d]
    # its value too (Note [Enum values] in identity.py), by a hash the same in every process
    assert f"enum {__name__}.{Mode.__qualname__}.FAST = " in fast and _PROCESS not in fast
    assert _description(Holder(Mode.SLOW)) != _description(Holder(Mode.FAST))


def branchy(x):
    if float(x.sum()) > 0:  # a float taken from values: cannot be traced (Note [Value reads])
        return x + 1
    return x - 1


def test_a_failed_trace_is_stored_and_not_traced_again(trident_cache):
    """Note [Stored eager decisions]: a signature whose trace failed runs eagerly in a later
    process without a trace, and says so; a damaged entry is dropped with a warning."""
    x = torch.ones(3)
    first = trident.jit(branchy)
    with pytest.warns(UserWarning, match="runs eagerly"):
        assert torch.equal(first(x), x + 1)
    assert (first.stats.traces, first.stats.fallbacks) == (1, 1)
    (stored,) = (trident_cache / "functions").glob("branchy-*/eager/*.json")
    as_in_a_new_process()
    later = trident.jit(branchy)
    with pytest.warns(UserWarning, match="as an earlier process found"):
        assert torch.equal(later(x), x + 1)
    with pytest.raises(trident.TridentError, match="cannot trace branchy"):
        trident.jit(branchy, fallback=False)(x)  # reads no stored decision: raises
    y = torch.ones(4)  # another signature: traced (and failing) again
    assert torch.equal(later(y), y + 1)
    assert (later.stats.traces, later.stats.fallbacks, later.stats.compiles) == (1, 2, 0)
    stored.write_text("{not json")
    as_in_a_new_process()
    again = trident.jit(branchy)
    with pytest.warns(UserWarning, match="dropped the damaged cache entry"):
        assert torch.equal(again(x), x + 1)
    assert torch.equal(again(y), y + 1)
    assert (again.stats.traces, again.stats.fallbacks) == (1, 2)  # x's entry was the damaged one


BACKEND_SCRIPT = textwrap.dedent('''
    import torch

    def block(x, y):
        return torch.relu(x) * y

    f = torch.compile(block, backend="trident")
    x, y = torch.randn(8), torch.randn(8)
    for _ in range(2):
        assert torch.equal(f(x, y), block(x, y))
    import dataclasses, json, trident
    print("STATS " + json.dumps(dataclasses.asdict(trident.backend_stats(f))))
''')


def test_backend_graphs_are_reused_by_later_processes(tmp_path, subprocess_env, trident_cache):
    """Note [Function key]: a torch.compile graph is keyed by its code, not by Dynamo's
    per-process metadata: identical runs add no cache entries."""
    script = tmp_path / "backend_block.py"
    script.write_text(BACKEND_SCRIPT)
    counts, stats = [], []
    for _ in range(3):
        stats.append(parse_stats(run_python(subprocess_env, str(script)).stdout))
        counts.append(sorted(p.relative_to(trident_cache) for p in
                             (trident_cache / "functions").rglob("*") if p.is_file()))
    assert counts[0] == counts[1] == counts[2]
    assert [(s["traces"], s["compiles"], s["misses"], s["hits"]) for s in stats] == \
        [(1, 1, 1, 1), (0, 0, 0, 2), (0, 0, 0, 2)]
    assert len(list((trident_cache / "functions").iterdir())) == 1


class _Scaled(torch.nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.register_buffer("k", torch.full((3,), k))

    def forward(self, x):
        return x * self.k


def test_a_graph_module_is_keyed_by_the_constants_its_nodes_read():
    from trident.identity import function_key

    graph = torch.fx.symbolic_trace(_Scaled(1.0))
    before = function_key(graph.forward)
    graph.k.fill_(2.0)  # what the get_attr node reads
    assert function_key(graph.forward) != before
    graph.meta["backend_id"] = "another process"  # Dynamo's metadata: not in the key
    graph.k.fill_(1.0)
    assert function_key(graph.forward) == before


# ---- a bounded cache (Note [Cache size]) -------------------------------------------------------

SIZED_SCRIPT = textwrap.dedent('''
    import json, pathlib, shutil, sys, time, warnings
    import torch, trident
    from trident import build

    folder, i, mode = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sys.path.insert(0, str(folder))
    f = trident.jit(__import__(f"fn_{i}").f)
    # a module is loaded by its recorded name (Note [Stored module names]) or built (or
    # found built) from its rendered source: both are where the process loads
    real = {"build": build.build, "load_built": build.load_built}

    def hooked(name):
        def hold(source, directory):  # "hold": load while the test says so (its lock held)
            (folder / f"loading_{i}").write_text("")
            while not (folder / f"go_{i}").exists():
                time.sleep(0.05)
            return real[name](source, directory)

        def delete(source, directory):  # "delete": another hand deletes the entry meanwhile
            shutil.rmtree(directory)
            build.build, build.load_built = real["build"], real["load_built"]
            return real[name](source, directory)

        return {"hold": hold, "delete": delete}.get(mode, real[name])

    build.build, build.load_built = hooked("build"), hooked("load_built")
    x = torch.arange(-3.0, 3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        same = all(torch.equal(f(x), torch.relu(x) + i) for _ in range(3))
    print("RESULT " + json.dumps({
        "same": same, "traces": f.stats.traces, "compiles": f.stats.compiles,
        "hits": f.stats.hits, "fallbacks": f.stats.fallbacks,
        "warnings": [str(w.message) for w in caught if "trident" in str(w.message)]}))
''')


def _sized(tmp_path: Path, env: dict, *runs: tuple[int, str], size: int | None = None,
           wait: bool = True):
    """Start ``SIZED_SCRIPT`` once per ``(i, mode)`` at once (its function ``fn_i.f`` returns
    ``relu(x) + i``), under ``TRIDENT_CACHE_SIZE=size``: their results, or the processes."""
    folder = tmp_path / "sized"
    folder.mkdir(exist_ok=True)
    (folder / "sized.py").write_text(SIZED_SCRIPT)
    env = dict(env, **({"TRIDENT_CACHE_SIZE": str(size)} if size is not None else {}))
    procs = []
    for i, mode in runs:
        (folder / f"fn_{i}.py").write_text(
            f"import torch\n\ndef f(x):\n    return torch.relu(x) + {i}\n")
        procs.append(subprocess.Popen([sys.executable, str(folder / "sized.py"), str(folder),
                                       str(i), mode], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    if not wait:
        return procs
    return [_result(p) for p in procs]


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def _entries(cache: Path) -> dict[str, int]:
    """Function folder name -> bytes."""
    return {r["path"].rsplit("/", 1)[1]: r["bytes"] for r in trident.list_cache()}


def test_twenty_processes_keep_the_cache_under_its_bound(tmp_path, subprocess_env,
                                                          trident_cache):
    (first,) = _sized(tmp_path, subprocess_env, (0, "plain"))
    assert first["same"] and first["compiles"] == 1 and first["warnings"] == []
    entry = sum(_entries(trident_cache).values())
    bound = int(3.5 * entry)  # three entries fit
    for wave in range(1, 20, 4):  # four processes at a time: they evict concurrently
        for result in _sized(tmp_path, subprocess_env, *[(i, "plain") for i in range(
                wave, min(wave + 4, 20))], size=bound):
            assert result["same"] and result["compiles"] == 1 and result["warnings"] == []
        sizes = _entries(trident_cache)
        assert sum(sizes.values()) <= bound and len(sizes) == 3, sizes
    # the least recently used went first: the last wave's three stay
    names = {r["about"]["module"] for r in trident.list_cache()}
    assert names == {"fn_17", "fn_18", "fn_19"}


def test_eviction_skips_an_entry_another_process_is_loading(tmp_path, subprocess_env,
                                                            trident_cache):
    _sized(tmp_path, subprocess_env, (0, "plain"))
    (held,) = _entries(trident_cache)
    (loader,) = _sized(tmp_path, subprocess_env, (0, "hold"), wait=False)
    folder = tmp_path / "sized"
    while not (folder / "loading_0").exists():
        assert loader.poll() is None, loader.communicate()
        time.sleep(0.05)
    # a bound smaller than two entries: evicting fn_0's entry would make it fit
    bound = int(1.5 * _entries(trident_cache)[held])
    (other,) = _sized(tmp_path, subprocess_env, (1, "plain"), size=bound)
    assert other["same"] and other["warnings"] == [] and held in _entries(trident_cache)
    (folder / "go_0").write_text("")
    loaded = _result(loader)
    assert loaded["same"] and (loaded["traces"], loaded["compiles"], loaded["hits"]) == (0, 0, 3)
    assert loaded["warnings"] == []
    # no longer in use: the next compile evicts it (and fn_1's, older than its own)
    (third,) = _sized(tmp_path, subprocess_env, (2, "plain"), size=bound)
    assert third["same"] and third["warnings"] == []
    assert [r["about"]["module"] for r in trident.list_cache()] == ["fn_2"]


def test_an_entry_deleted_while_a_process_loads_it(tmp_path, subprocess_env, trident_cache):
    _sized(tmp_path, subprocess_env, (0, "plain"))
    (result,) = _sized(tmp_path, subprocess_env, (0, "delete"))
    assert result["same"] and (result["traces"], result["compiles"], result["hits"]) == (0, 0, 3)
    assert len(result["warnings"]) == 1 and "was deleted while this process loaded it" in \
        result["warnings"][0]


def test_a_bound_smaller_than_one_entry(tmp_path, subprocess_env, trident_cache):
    """The entry just stored stays (with a warning) until another compile evicts it."""
    for i in range(2):
        (result,) = _sized(tmp_path, subprocess_env, (i, "plain"), size=1)
        assert result["same"] and result["compiles"] == 1
        assert len(result["warnings"]) == 1 and "bound of 1 bytes" in result["warnings"][0]
        assert [r["about"]["module"] for r in trident.list_cache()] == [f"fn_{i}"]
    (again,) = _sized(tmp_path, subprocess_env, (1, "plain"), size=1)
    assert again["same"] and (again["traces"], again["compiles"], again["warnings"]) == (0, 0, [])
