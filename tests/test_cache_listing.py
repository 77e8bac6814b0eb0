"""`python -m trident list | clear [NAME]`: each entry names its function, clear says what it
deleted and can take one function."""

from __future__ import annotations

import importlib
import json
import inspect
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import trident
from _trident_helpers import passes_through, run_python
from trident import __main__ as cli


def listed_f(x):
    return x + 1


def listed_g(x, n):
    return x * n


def test_list_names_function_file_line_and_signatures(trident_cache, capsys):
    trident.jit(listed_f)(torch.ones(2))
    g = trident.jit(listed_g)
    g(torch.ones(2), 2)
    g(torch.ones(2), 3)
    rows = {r["about"]["qualname"]: r for r in trident.list_cache()}
    line = inspect.getsourcelines(listed_g)[1]
    assert {k: v for k, v in rows["listed_g"]["about"].items() if k != "key"} == \
        {"qualname": "listed_g", "module": __name__, "file": __file__, "line": line}
    assert rows["listed_g"]["signatures"] == ["listed_g(x: float32[2] cpu, n=2)",
                                              "listed_g(x: float32[2] cpu, n=3)"]
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    g_line = next(i for i, l in enumerate(out) if l.startswith(f"{__name__}.listed_g ("))
    assert out[g_line].startswith(f"{__name__}.listed_g ({__file__}:{line}): 2 specializations, ")
    assert out[g_line + 1:g_line + 4] == [
        "  0: listed_g(x: float32[2] cpu, n=2)", "  1: listed_g(x: float32[2] cpu, n=3)",
        f"  in {rows['listed_g']['path']}"]


@passes_through  # (its wrapper is in another file)
def listed_wrapped(x):
    return x * 3


def test_list_names_the_wrapped_function_not_its_decorator(trident_cache, capsys):
    """A function under a ``functools.wraps`` decorator is listed at its own ``def``; a Hugging
    Face model's ``forward`` (under ``@can_return_tuple``) at the model file's."""
    trident.jit(listed_wrapped)(torch.ones(2))
    (row,) = trident.list_cache()
    line = inspect.getsourcelines(listed_wrapped.__wrapped__)[1]
    assert row["about"]["line"] == line and row["about"]["file"] == __file__
    assert cli.main(["list"]) == 0
    assert f"{__name__}.listed_wrapped ({__file__}:{line}): 1 specialization" in \
        capsys.readouterr().out
    import transformers
    from trident.frontend.entries import describe

    forward = describe(transformers.LlamaForCausalLM.forward)
    inner = inspect.unwrap(transformers.LlamaForCausalLM.forward)
    assert inner is not transformers.LlamaForCausalLM.forward  # decorated in transformers 5
    assert forward == {"qualname": "LlamaForCausalLM.forward",
                       "module": "transformers.models.llama.modeling_llama",
                       "file": inspect.getsourcefile(inner),
                       "line": inspect.getsourcelines(inner)[1]}
    assert forward["file"].endswith("modeling_llama.py")


def listed_many(*xs):
    return sum(xs)


def test_list_cuts_long_signatures_unless_full(trident_cache, capsys):
    trident.jit(listed_many)(*[torch.ones(2) for _ in range(20)])  # a long signature
    assert cli.main(["list"]) == 0
    row = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("  0: listed_many"))
    assert len(row) <= 165 and row.endswith(" ...")
    assert cli.main(["list", "--full"]) == 0
    full = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("  0: listed_many"))
    assert len(full) > 165 and full[5:] == trident.list_cache()[0]["signatures"][0]


def test_clear_one_function_says_what_it_deleted(trident_cache, capsys):
    trident.jit(listed_f)(torch.ones(2))
    trident.jit(listed_g)(torch.ones(2), 2)
    paths = {r["about"]["qualname"]: r["path"] for r in trident.list_cache()}
    assert cli.main(["clear", "listed_g"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"deleted {paths['listed_g']}", f"cleared 1 entry in {trident_cache}"]
    assert [r["about"]["qualname"] for r in trident.list_cache()] == ["listed_f"]
    assert (trident_cache / "runtime").exists()
    assert cli.main(["clear", "no_such_function"]) == 1
    assert "no cached function named 'no_such_function'" in capsys.readouterr().out
    assert len(trident.list_cache()) == 1


def test_clear_takes_the_module_when_a_name_is_in_several(trident_cache, capsys, tmp_path,
                                                           monkeypatch):
    """`clear f` with an `f` in two modules deletes nothing and names both; `clear moda.f`
    (as `list` shows it) deletes that one; `f` then names one function."""
    for name, body in (("moda", "x + 1"), ("modb", "x + 2")):
        (tmp_path / f"{name}.py").write_text(f"def f(x):\n    return {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mods = [importlib.import_module(name) for name in ("moda", "modb")]
    for mod in mods:
        trident.jit(mod.f)(torch.ones(2))
    paths = {r["about"]["module"]: r["path"] for r in trident.list_cache()}
    assert cli.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert f"moda.f ({tmp_path / 'moda.py'}:1)" in listed and "modb.f (" in listed
    assert cli.main(["clear", "f"]) == 2
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "'f' names 2 functions; pick one by the name after its colon:",
        f"  moda.f ({tmp_path / 'moda.py'}): moda.f", f"  modb.f ({tmp_path / 'modb.py'}): modb.f"]
    assert len(trident.list_cache()) == 2
    assert cli.main(["clear", "moda.f"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"deleted {paths['moda']}"
    assert [r["about"]["module"] for r in trident.list_cache()] == ["modb"]
    assert cli.main(["clear", "f"]) == 0 and trident.list_cache() == []


def test_clear_lists_each_function_once_with_its_earlier_code(trident_cache, capsys, tmp_path,
                                                               monkeypatch):
    """`clear f` where one `f` has entries of two versions of its code lists each function on
    one line (the new-user trial saw one line per entry, the same name repeated)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    # (the two versions' sizes differ: no stale .pyc when both are written within one second)
    for name, bodies in (("modc", ("x + 1", "x + 30")), ("modd", ("x + 2",))):
        for body in bodies:
            (tmp_path / f"{name}.py").write_text(f"def f(x):\n    return {body}\n")
            sys.modules.pop(name, None)
            trident.jit(importlib.import_module(name).f)(torch.ones(2))
    assert cli.main(["clear", "f"]) == 2
    assert capsys.readouterr().out.splitlines() == [
        "'f' names 2 functions (3 cache entries: a function's earlier code has its own); pick "
        "one by the name after its colon:",
        f"  modc.f ({tmp_path / 'modc.py'}): modc.f", f"  modd.f ({tmp_path / 'modd.py'}): modd.f"]
    assert len(trident.list_cache()) == 3


def test_clear_tells_two_scripts_main_f_apart_by_file(trident_cache, capsys, tmp_path):
    """Two scripts' ``__main__.f`` (run as ``python a.py``): ``clear __main__.f`` names each
    with what picks it alone, its file's name before the colon (``a.py:__main__.f``), which
    deletes that one; an absolute path and a folder name pick one too."""
    for name, body in (("a", "x + 1"), ("b", "x + 2")):
        path = tmp_path / name / "serve.py" if name == "b" else tmp_path / "serve.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"def f(x):\n    return {body}\n")
        script = {"__name__": "__main__"}  # as runpy runs a script
        exec(compile(path.read_text(), str(path), "exec"), script)
        trident.jit(script["f"])(torch.ones(2))
    paths = {r["about"]["file"]: r["path"] for r in trident.list_cache()}
    assert cli.main(["clear", "f"]) == 2
    assert sorted(capsys.readouterr().out.splitlines()[1:]) == [
        f"  __main__.f ({tmp_path / 'b' / 'serve.py'}): b/serve.py:__main__.f",
        f"  __main__.f ({tmp_path / 'serve.py'}): {tmp_path.name}/serve.py:__main__.f"]
    assert cli.main(["clear", "serve.py:f"]) == 2 and len(trident.list_cache()) == 2
    capsys.readouterr()
    assert cli.main(["clear", "b/serve.py:__main__.f"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        f"deleted {paths[str(tmp_path / 'b' / 'serve.py')]}"
    assert cli.main(["clear", f"{tmp_path / 'serve.py'}:f"]) == 0
    assert trident.list_cache() == []


def test_help_list_and_clear_import_no_torch(trident_cache, subprocess_env):
    """Note [Listing without torch] in trident/frontend/entries.py: ``python -m trident
    --help``, ``list`` and ``clear NAME`` start without torch (its import was most of
    ``--help``'s 4.5 s), over a cache with an entry; the listing is the one this process makes."""
    trident.jit(listed_f)(torch.ones(2))
    code = ("import contextlib, io, sys\n"
            "from trident.__main__ import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--help'])\n"
            "main(['list'])\n"
            "main(['clear', 'no_such_function'])\n"
            "print('torch' in sys.modules)\n")
    out = run_python(subprocess_env, "-c", code).stdout.splitlines()
    assert out[-1] == "False"
    assert out[0].startswith(f"{__name__}.listed_f (") and out[-2].startswith("no cached function")
    help_ = run_python(subprocess_env, "-m", "trident", "--help").stdout
    assert help_.startswith("usage: trident") and "clear" in help_


def test_clear_everything_lists_each_entry(trident_cache, capsys):
    trident.jit(listed_f)(torch.ones(2))
    path = trident.list_cache()[0]["path"]
    assert cli.main(["clear"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"deleted {path}", f"deleted {trident_cache / 'runtime'}",
        f"cleared 2 entries in {trident_cache}"]
    assert trident.list_cache() == [] and not (trident_cache / "runtime").exists()


def listed_eager(x):
    if float(x.sum()) > 0:  # a float read of a value (Note [Value reads]): every call eager
        return x + 1
    return x - 1


def test_a_function_that_only_ran_eagerly_is_listed_by_name(trident_cache, capsys):
    jf = trident.jit(listed_eager)
    with pytest.warns(UserWarning, match="runs eagerly"):
        assert torch.equal(jf(torch.ones(2)), listed_eager(torch.ones(2)))
    assert jf.stats.fallbacks == 1, jf.stats
    (row,) = trident.list_cache()
    assert row["about"]["qualname"] == "listed_eager"
    assert cli.main(["clear", "listed_eager"]) == 0
    assert trident.list_cache() == []


def test_folders_without_metadata_are_listed(trident_cache, capsys):
    (trident_cache / "functions" / "old-0123" / "specs").mkdir(parents=True)
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(
        "(made by an older Trident: origin not recorded): 0 specializations, 0.0 KiB, "
        "last used ")


def listed_h(x):
    return torch.relu(x) + 1


def test_list_names_the_guards_that_tell_alike_signatures_apart(trident_cache, capsys,
                                                                 monkeypatch):
    """``torch.set_num_threads`` is guarded: a new number of threads compiles again, and the
    two specializations' signatures alike, the listing names the guard that differs; the
    bound and each entry's last use are shown (Note [Cache size])."""
    h = trident.jit(listed_h)
    x = torch.randn(4)
    threads = torch.get_num_threads()
    try:
        assert torch.equal(h(x), torch.relu(x) + 1)
        torch.set_num_threads(threads + 1)
        assert torch.equal(h(x), torch.relu(x) + 1)
    finally:
        torch.set_num_threads(threads)
    assert (h.stats.compiles, h.stats.misses) == (2, 2)
    assert h.stats.miss_reasons[1] == (f"torch.get_num_threads() == {threads} expected, got "
                                       f"{threads + 1} (specialization 0)")
    (row,) = trident.list_cache()
    assert row["apart"] == [[f"torch.get_num_threads() == {threads}"],
                            [f"torch.get_num_threads() == {threads + 1}"]]
    assert abs(row["last_use"] - time.time()) < 60
    monkeypatch.setenv("TRIDENT_CACHE_SIZE", "1.5G")
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == [
        f"  0: listed_h(x: float32[4] cpu) [torch.get_num_threads() == {threads}]",
        f"  1: listed_h(x: float32[4] cpu) [torch.get_num_threads() == {threads + 1}]"]
    assert out[-1].endswith(" KiB of the bound of 1536.0 MiB (TRIDENT_CACHE_SIZE)")


def test_backend_graph_names_the_compiled_function(trident_cache, capsys):
    """Note [Graph origins] in trident/frontend/entries.py: a graph is listed as the function
    Dynamo compiled it from (its qualified name, module, file and ``def`` line), with the line
    of the graph's first op."""
    def block(x):
        return torch.relu(x) * 2

    f = torch.compile(block, backend="trident")
    x = torch.randn(4)
    assert torch.equal(f(x), block(x))
    (row,) = trident.list_cache()
    line = inspect.getsourcelines(block)[1]
    assert row["about"] == {
        "qualname": block.__qualname__, "module": __name__, "file": __file__, "line": line,
        "graph_of": f"{block.__qualname__} ({__file__}:{line + 1})", "graph_line": line + 1,
        "inputs": {"L_x_": "x"}, "symbolic_ints": [], "key": row["about"]["key"]}
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().out.startswith(
        f"{__name__}.{block.__qualname__} ({__file__}:{line}, a torch.compile graph from line "
        f"{line + 1}): 1 specialization, ")
    assert trident.backend_explain(f, x).startswith(f"graph 0 (of {block.__qualname__} (")


def test_list_names_the_model_each_graph_came_from(trident_cache, capsys):
    """The new-user trial: graphs of the torch.compile doors were listed by FX's name of their
    code (``<eval_with_key>.N``) and the first frame of Dynamo's stack trace (transformers'
    deprecation wrapper), alike for every model. Note [Graph origins]: each is named by its
    module's class and ``forward``, through ``torch.compile(model.forward)`` (door 2) and
    through ``model.__call__``, which transformers' ``CompileConfig`` compiles (door 3,
    ``get_compiled_call``); ``clear`` takes that name and deletes that model's graphs only."""
    import transformers

    models, rows = {}, {}
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(0))
    for family in ("Llama", "Qwen2"):
        config = getattr(transformers, f"{family}Config")(
            hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=96)
        torch.manual_seed(0)
        models[family] = model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
        with torch.no_grad():
            eager = model(ids).logits
            torch._dynamo.reset()
            door2 = torch.compile(model.forward, backend="trident")(ids).logits
            torch._dynamo.reset()
            compiled = model.get_compiled_call(transformers.CompileConfig(backend="trident"))
            door3 = compiled(ids).logits
        assert torch.equal(door2, eager) and torch.equal(door3, eager), family
        assert trident.backend_stats(model).fallbacks == 0
        assert trident.backend_explain(model, ids).startswith(
            f"graph 0 (of {family}ForCausalLM.forward (")
        torch._dynamo.reset()
    for row in trident.list_cache():  # both doors: one graph's code, one folder per model
        rows.setdefault(row["about"]["qualname"], []).append(row)
    assert sorted(rows) == ["LlamaForCausalLM.forward", "Qwen2ForCausalLM.forward"], rows
    listed = []
    for family, model in models.items():
        forward = inspect.unwrap(type(model).forward)
        (row,) = rows[f"{family}ForCausalLM.forward"]
        about = row["about"]
        assert (about["module"], about["file"], about["line"]) == (
            type(model).__module__, inspect.getsourcefile(forward),
            inspect.getsourcelines(forward)[1])
        first = about["graph_line"]  # the line of forward that calls the decoder
        assert about["graph_of"] == f"{family}ForCausalLM.forward ({about['file']}:{first})"
        assert "self.model(" in inspect.getsource(forward).splitlines()[
            first - about["line"]], about
        listed.append(f"{type(model).__module__}.{family}ForCausalLM.forward ({about['file']}:"
                      f"{about['line']}, a torch.compile graph from line {first}): 1 "
                      "specialization, ")
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    heads = [l for l in out if not l.startswith(" ")][:2]
    assert sorted(w for w in listed if any(h.startswith(w) for h in heads)) == sorted(listed)
    assert cli.main(["clear", "LlamaForCausalLM.forward"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        f"deleted {rows['LlamaForCausalLM.forward'][0]['path']}"
    assert [r["about"]["qualname"] for r in trident.list_cache()] == ["Qwen2ForCausalLM.forward"]
    assert cli.main(["clear", "modeling_qwen2.py:Qwen2ForCausalLM.forward"]) == 0
    assert trident.list_cache() == []


def test_clear_takes_the_graphs_of_one_function_from_two_processes(
        trident_cache, subprocess_env, tmp_path, capsys):
    """Note [Graph origins]: graphs made by two processes from two versions of one function
    (FX names both codes ``<eval_with_key>.0``, a counter of each process) are that
    function's, as ``trident.jit``'s folders of a function's earlier code are: its name
    deletes both; another function's graph keeps its own. A folder an older Trident made
    (its origin FX's file name) is each its own: its name lists both, deletes nothing."""
    for body in ("x + 1", "x * 3"):
        script = tmp_path / "door2.py"
        script.write_text(textwrap.dedent(f'''
            import torch, trident

            def block(x):
                return torch.relu({body})

            def other(x):
                return torch.sigmoid(x)

            x = torch.randn(4)
            assert torch.equal(torch.compile(block, backend="trident")(x), block(x))
            assert torch.equal(torch.compile(other, backend="trident")(x), other(x))
        '''))
        run_python(subprocess_env, str(script))
    rows = trident.list_cache()
    assert sorted(r["about"]["qualname"] for r in rows) == ["block", "block", "other"], rows
    assert {r["about"]["file"] for r in rows} == {str(script)}
    assert cli.main(["clear", "door2.py:__main__.block"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3  # two deleted, the count
    (kept,) = trident.list_cache()
    assert kept["about"]["qualname"] == "other"
    shutil.rmtree(kept["path"])
    for n in range(2):  # as an older Trident recorded a graph
        folder = trident_cache / "functions" / f"forward-{n:020d}"
        folder.mkdir(parents=True)
        (folder / "function.json").write_text(json.dumps({
            "qualname": "forward", "module": None, "file": "<eval_with_key>.0", "line": 4,
            "graph_of": f"block ({script}:5)"}))
    assert cli.main(["clear", "<eval_with_key>.0:forward"]) == 2
    assert capsys.readouterr().out.splitlines()[0].startswith(
        "'<eval_with_key>.0:forward' names 2 functions")
    assert cli.main(["clear", "forward-" + "0" * 20]) == 0
    assert [Path(r["path"]).name for r in trident.list_cache()] == [f"forward-{1:020d}"]


class ListedKnobs:
    scale = 2.0


def listed_k(x):
    return x * ListedKnobs.scale


def test_list_names_the_state_that_tells_alike_specializations_apart(trident_cache,
                                                                     monkeypatch):
    """Two specializations with the same signature and guards, compiled for two values of a
    class attribute (their state guards, Note [State guards]): the listing names the state's
    digest and the chain it reads."""
    k = trident.jit(listed_k)
    x = torch.randn(4)
    assert torch.equal(k(x), x * 2.0)
    monkeypatch.setattr(ListedKnobs, "scale", 3.0)
    assert torch.equal(k(x), x * 3.0)
    assert k.stats.compiles == 2
    (row,) = trident.list_cache()
    assert row["signatures"][0] == row["signatures"][1]
    first, second = row["apart"]
    assert first != second
    for told in (first, second):
        assert len(told) == 1 and told[0].startswith("state ")
        assert f" of {__name__}.ListedKnobs.scale" in told[0]


def listed_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def test_list_names_the_value_checks_that_tell_alike_specializations_apart(trident_cache,
                                                                          capsys):
    """Two specializations of one signature, traced through the two sides of ``if x.sum() >
    0:`` (their value checks, Note [Value checks]): ``list`` names the line and the value each
    read (the new-user trial of session 50 saw both listed alike, nothing apart)."""
    b = trident.jit(listed_branch)
    for x in (torch.ones(3), -torch.ones(3)):
        assert torch.equal(b(x), listed_branch(x))
    assert b.stats.compiles == 2
    (row,) = trident.list_cache()
    assert row["signatures"] == ["listed_branch(x: float32[3] cpu)"] * 2
    line = inspect.getsourcelines(listed_branch)[1] + 1
    where = f"test_cache_listing.py:{line} (if x.sum() > 0:)"
    assert sorted(row["apart"]) == [[f"{where} read False"], [f"{where} read True"]]
    assert cli.main(["list"]) == 0
    assert f"listed_branch(x: float32[3] cpu) [{where} read True]" in capsys.readouterr().out


class ListedConfig:
    pass


def listed_mode(x, c):
    return x * 2 if c.mode == "fast" else x * 3


def test_list_names_where_alike_specializations_argument_trees_differ(trident_cache, capsys):
    """Two specializations of one signature whose argument trees differ (a str attribute the
    function branches on): the listing names the first path where the trees differ and each
    one's value there (Note [Stored trees]), not the trees' keys."""
    m = trident.jit(listed_mode)
    x = torch.randn(4)
    for mode in ("fast", "slow", "fast"):
        c = ListedConfig()
        c.mode = mode
        assert torch.equal(m(x, c), listed_mode(x, c))
    assert (m.stats.compiles, m.stats.hits) == (2, 1)
    (row,) = trident.list_cache()
    assert row["apart"] == [["c.mode: str 'fast'"], ["c.mode: str 'slow'"]]
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == ["  0: listed_mode(x: float32[4] cpu) [c.mode: str 'fast']",
                        "  1: listed_mode(x: float32[4] cpu) [c.mode: str 'slow']"]
    for tree in (trident_cache / "functions").glob("*/trees/*.json.gz"):
        tree.unlink()  # words not stored (deleted, or an older Trident's): the key is named
    first, second = trident.list_cache()[0]["apart"]
    assert first[0].startswith("argument tree ") and first[0].endswith(
        " (its words are not stored)") and first != second


LISTED_SCALE = 2.0
LISTED_HELD = None


def listed_key(x, n=1):
    return x * LISTED_SCALE + n


def _key_apart(name: str) -> list[list[str]]:
    """Each folder of ``name``'s key parts that tell it apart, in creation order."""
    rows = [r for r in trident.list_cache() if r["about"].get("qualname") == name]
    return [r["key_apart"] for r in sorted(rows, key=lambda r: r["last_use"])]


def test_list_names_the_key_parts_that_tell_alike_folders_apart(trident_cache, capsys,
                                                                monkeypatch):
    """Note [Key parts]: two folders of one function (its key's inputs differ: a global's
    value, a default, a version) are listed alike but for the parts that differ, each named
    with its words (with its digest where the words are alike), and only those (issue 27's
    trial); with three alike folders, the parts that tell one from any other."""
    import trident.identity as identity

    x = torch.randn(4)
    trident.jit(listed_key)(x)
    base = {r["path"] for r in trident.list_cache()}
    versions = dict(identity.version_parts())
    for attribute, value, told, base_told in (
            ("LISTED_SCALE", 3.0, "global LISTED_SCALE: 3.0", "global LISTED_SCALE: 2.0"),
            ("__defaults__", (5,), "default 0: 5", "default 0: 1"),
            ("version_parts", dict(versions, torch="9.9.9"), "torch: 9.9.9",
             f"torch: {torch.__version__}"),
            ("version_parts", dict(versions, python=versions["python"] + " (another build)"),
             None, None)):
        with monkeypatch.context() as m:
            owner = {"__defaults__": listed_key, "version_parts": identity}.get(
                attribute, sys.modules[__name__])
            m.setattr(owner, attribute, (lambda v=value: v) if owner is identity else value)
            y = trident.jit(listed_key)(x)
            assert torch.equal(y, listed_key(x))
        if told is None:  # alike words: told by their digests
            python = versions["python"].split()[0]
            (first,), (second,) = _key_apart("listed_key")
            assert first.startswith(f"python: {python} #") and \
                second.startswith(f"python: {python} #") and first != second
        else:
            assert _key_apart("listed_key") == [[base_told], [told]]
            assert cli.main(["list"]) == 0
            assert f"  apart from the alike: {told}" in capsys.readouterr().out.splitlines()
        (new,) = {r["path"] for r in trident.list_cache()} - base
        shutil.rmtree(new)
    monkeypatch.setattr(sys.modules[__name__], "LISTED_SCALE", 3.0)
    trident.jit(listed_key)(x)
    monkeypatch.setattr(listed_key, "__defaults__", (5,))
    trident.jit(listed_key)(x)
    assert _key_apart("listed_key") == [  # (2.0, 1), (3.0, 1), (3.0, 5)
        ["default 0: 1", "global LISTED_SCALE: 2.0"], ["default 0: 1", "global LISTED_SCALE: 3.0"],
        ["default 0: 5", "global LISTED_SCALE: 3.0"]]


def listed_by_identity(x):
    return x + (LISTED_HELD is None)


def test_a_key_part_of_an_object_of_this_process_only_says_so(trident_cache, monkeypatch):
    """An object with nothing to hash but its identity (Note [Identity serials]) makes a new
    folder in every process: its part says so; a folder of an older Trident, without parts, is
    named as such."""
    x = torch.randn(4)
    for _ in range(2):  # two objects of this process, as two processes would make
        monkeypatch.setattr(sys.modules[__name__], "LISTED_HELD", object())
        f = trident.jit(listed_by_identity)  # (an object it cannot guard: eager, its folder
        with pytest.warns(UserWarning, match="cannot guard"):  # keeps the decision)
            assert torch.equal(f(x), x)
    (first,), (second,) = _key_apart("listed_by_identity")
    assert first != second  # alike words: their digests added
    for told in (first, second):
        assert re.fullmatch(r"global LISTED_HELD: builtins\.object \(this process only\) #\w{8}",
                            told), told
    (old,) = [r for r in trident.list_cache()][:1]
    about = json.loads((Path(old["path"]) / "function.json").read_text())
    del about["key"]
    (Path(old["path"]) / "function.json").write_text(json.dumps(about))
    assert [r["key_apart"] for r in trident.list_cache()] == \
        [["its key's parts are not recorded (an older Trident's folder)"]] * 2


def test_list_names_triton_interpret_apart(trident_cache, subprocess_env, tmp_path, capsys):
    """Issue 27's trial: one script run with and without ``TRITON_INTERPRET=1`` made two
    folders listed alike; the listing names the kernel's type in each."""
    script = tmp_path / "interp.py"
    script.write_text(textwrap.dedent('''
        import torch, trident
        from _triton_kernels import add_kernel

        def add(x, y):
            out = torch.empty_like(x)
            add_kernel[(1,)](x, y, out, x.numel(), BLOCK=128)
            return out

        x = torch.randn(100)
        assert torch.equal(trident.jit(add)(x, x), x + x)
    '''))
    env = dict(subprocess_env, PYTHONPATH=f"{Path(__file__).parent}:{subprocess_env['PYTHONPATH']}")
    env.pop("TRITON_INTERPRET", None)
    run_python(env, str(script))
    run_python(dict(env, TRITON_INTERPRET="1"), str(script))
    assert _key_apart("add") == [["global add_kernel: triton.runtime.jit.JITFunction"],
                                 ["global add_kernel: triton.runtime.interpreter.InterpretedFunction"]]


def test_the_cache_bound_setting(monkeypatch):
    """Note [Cache size]: TRIDENT_CACHE_SIZE in bytes or with a binary suffix, 2 GiB by
    default; trident.config.CACHE_SIZE over it; a value that is no size is warned about and
    the default kept (issue 27, bad input)."""
    from trident import config

    monkeypatch.delenv("TRIDENT_CACHE_SIZE", raising=False)
    assert config.cache_size() == 2 * 2**30
    for text, size in (("123", 123), ("512M", 512 * 2**20), ("1.5GiB", 3 * 2**29),
                       ("2 kb", 2048)):
        monkeypatch.setenv("TRIDENT_CACHE_SIZE", text)
        assert config.cache_size() == size, text
    monkeypatch.setattr(config, "CACHE_SIZE", 1000)
    assert config.cache_size() == 1000
    monkeypatch.setattr(config, "CACHE_SIZE", None)
    monkeypatch.setenv("TRIDENT_CACHE_SIZE", "lots")
    with pytest.warns(UserWarning, match="TRIDENT_CACHE_SIZE='lots' is not a size"):
        assert config.cache_size() == 2 * 2**30


def test_clear_says_the_extra_entries_are_graphs(trident_cache, capsys, tmp_path, monkeypatch):
    """`clear f` where one `f` was jitted and another compiled by torch.compile (two graphs:
    a graph break) counts the extra entries as what they are: the graphs and the trident.jit
    entry, not a function's earlier code (the new-user trial of session 50 was told "a
    function's earlier code has its own")."""
    (tmp_path / "mode.py").write_text("def f(x):\n    return x + 1\n")
    (tmp_path / "modf.py").write_text("import torch\n\ndef f(x):\n    y = x + 2\n"
                                      "    torch._dynamo.graph_break()\n    return y * 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mode, modf = (importlib.import_module(name) for name in ("mode", "modf"))
    trident.jit(mode.f)(torch.ones(2))
    compiled = torch.compile(modf.f, backend="trident")
    assert torch.equal(compiled(torch.ones(2)), modf.f(torch.ones(2)))
    assert cli.main(["clear", "f"]) == 2
    assert capsys.readouterr().out.splitlines()[0] == (
        "'f' names 2 functions (3 cache entries: 2 torch.compile graphs, an entry each, and 1 "
        "trident.jit entry); pick one by the name after its colon:")
    assert len(trident.list_cache()) == 3


def listed_gate(x, w):
    return torch.nn.functional.silu(x @ w.t()) * 0.5


def test_list_names_graph_inputs_and_symbolic_sizes_as_the_user_reads_them(trident_cache,
                                                                          capsys):
    """Note [Names of graph inputs]: torch.compile (``dynamic=None``) compiles a static graph
    at the first size and a graph with a symbolic size at the second, which serves any size;
    ``list`` names their inputs as the user's (``x``, not ``L_x_``), the symbolic size as
    ``x.size(0)=?`` (not ``s77=8``, its first value: the new-user trial of session 50), and
    tells the two graphs' folders apart as graphs, not by FX's class name."""
    compiled = torch.compile(listed_gate, backend="trident")
    w = torch.randn(8, 16)
    for n in (4, 6, 7):
        x = torch.randn(n, 16)
        assert torch.equal(compiled(x, w), listed_gate(x, w))
    rows = sorted(trident.list_cache(), key=lambda r: len(r["signatures"][0]))
    assert [r["signatures"] for r in rows] == [
        ["forward(w: float32[8, 16] cpu, x: float32[4, 16] cpu)"],
        ["forward(w: float32[8, 16] cpu, x.size(0)=?, x: float32[?, 16] cpu)"]]
    for row in rows:
        assert [w for w in row["key_apart"] if w.startswith("another graph of the function "
                                                            "(its code #")] != [], row
        assert not any("GraphModuleImpl" in w for w in row["key_apart"]), row
