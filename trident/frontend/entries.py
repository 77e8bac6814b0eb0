"""The cache's entries as ``python -m trident list`` and ``clear`` see them: each function
folder's origin, stored signatures, size and last use (cache.py keeps and evicts them).

Note [Listing without torch]: ``list`` and ``clear`` read JSON and the folders only, so this
module imports no torch, and neither do ``trident``'s package and ``python -m trident``
(``trident/__init__.py`` imports the rest on first use): ``--help`` took 4.5 s, the import of
torch. The words of the guards that tell two alike signatures apart need the guard classes
(torch); they are imported only for a function with two alike signatures.
"""

from __future__ import annotations

import gzip
import inspect
import json
import os
import re
import shutil
import sys
import zlib
from pathlib import Path

from trident import config
from trident.frontend.graph_names import named


def entry_size(directory: Path) -> int:
    """The bytes of a function folder's entries: its files and those of ``specs/``, ``eager/``,
    ``trees/`` and ``modules/``; not a build in progress (cffi's temporary folder beside them), whose module
    counts once it is in place. Files that vanish meanwhile count 0."""
    size = 0
    for folder in (directory, directory / "specs", directory / "eager", directory / "trees",
                   directory / "modules"):
        try:
            for entry in os.scandir(folder):
                try:
                    if entry.is_file(follow_symlinks=False):
                        size += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
        except OSError:
            continue
    return size




def list_entries() -> list[dict]:
    """One row per cached function folder: ``path``, ``about`` (describe(); empty for folders
    made before Trident wrote it), ``signatures`` of its stored specializations in creation
    order, their number ``specializations``, ``bytes`` on disk, ``last_use`` (seconds since
    the epoch: Note [Cache size] in cache.py) and ``apart``: per signature, the words of the
    guards that tell it from the others of the same signature (the number of threads, grad
    mode, a value its trace read and branched on: ``f.py:3 (if x.sum() > 0:) read True``;
    empty where its signature is its own)."""
    root = config.cache_dir() / "functions"
    rows = []
    for d in sorted(root.glob("*")) if root.is_dir() else []:
        try:
            about = json.loads((d / "function.json").read_text())
        except (OSError, ValueError):
            about = {}
        signatures, stored = [], []
        for path in sorted(d.glob("specs/*.json")):
            try:
                data = json.loads(path.read_text())
                signatures.append(named(data["signature"], about.get("inputs") or {},
                                        about.get("symbolic_ints") or ()))
                stored.append(data)
            except (OSError, ValueError, KeyError, TypeError):
                signatures.append("(unreadable: dropped at the next load)")
                stored.append(None)
        try:
            last_use = d.stat().st_mtime
        except OSError:
            last_use = None
        rows.append({"path": str(d), "about": about, "signatures": signatures,
                     "specializations": len(signatures), "bytes": entry_size(d),
                     "last_use": last_use, "apart": _apart(signatures, stored, d)})
    _key_apart(rows)
    return rows


def _origin(about: dict) -> tuple:
    return tuple(about.get(k) for k in ("module", "qualname", "file", "line", "graph_of"))


def _key_apart(rows: list[dict]) -> None:
    """Sets each row's ``key_apart``: where other folders have the same origin (``list``
    shows them alike), the parts of its function key (Note [Key parts] in identity.py) that
    tell it from them, ``label: words``, the digest added where the words are alike; ``["its
    key's parts are not recorded (an older Trident's folder)"]`` where it or they lack them;
    else empty."""
    for row in rows:
        alike = [r for r in rows if r is not row and r["about"] and
                 _origin(r["about"]) == _origin(row["about"])]
        row["key_apart"] = []
        if not alike:
            continue
        mine = row["about"].get("key")
        if not isinstance(mine, dict) or not all(isinstance(r["about"].get("key"), dict)
                                                 for r in alike):
            row["key_apart"] = ["its key's parts are not recorded (an older Trident's folder)"]
            continue
        row["key_apart"] = [f"{label}: {words}" + f" #{digest[:8]}" * same_words
                            if label != "graph" else  # (a GraphModule's class: FX's own)
                            f"another graph of the function (its code #{digest[:8]})"
                            for label, words, digest, same_words in parts_apart(
                                mine, [r["about"]["key"] for r in alike])]
        row["key_apart"] += [f"{label}: absent" for label in sorted(
            {k for r in alike for k in r["about"]["key"]} - mine.keys())]


def parts_apart(mine: dict, others: list[dict]) -> list[tuple[str, str, str, bool]]:
    """Note [Key parts] in identity.py: the parts of the key ``mine`` (``label -> [words,
    digest]``, as ``function.json`` keeps it) that a key of ``others`` lacks or holds with
    another digest: ``(label, words, digest, same_words)``, ``same_words`` where such a part of
    another key has the same words (then only the digest tells them apart)."""
    apart = []
    for label, (words, digest) in mine.items():
        other = [t for t in (o.get(label) for o in others) if t is None or t[1] != digest]
        if other:
            apart.append((label, words, digest,
                          any(t is not None and t[0] == words for t in other)))
    return apart


def _apart(signatures: list[str], stored: list, directory: Path) -> list[list[str]]:
    """Per signature, the words that tell it from the others of the same signature (Note
    [Listing without torch]: the guard classes are imported only where two are alike). Two
    that differ in their argument trees' keys are told apart by the first place where the
    trees differ (their stored words, Note [Stored trees] in ir/trees.py), not by the key."""
    if len(set(signatures)) == len(signatures):
        return [[] for _ in signatures]
    from trident.ir.guards import Guard

    words, states = [], []
    for data in stored:
        try:
            words.append([Guard.from_json(g).words(data["arg_names"]) for g in data["guards"]]
                         + _check_words(data.get("checks")))
        except (KeyError, TypeError, ValueError, AttributeError):
            words.append([])
        states.append(_state_words(data) if data is not None else [])
    apart = []
    for i, signature in enumerate(signatures):
        alike = [j for j in range(len(signatures)) if j != i and signatures[j] == signature]
        told = [w for w in words[i] if alike and any(w not in words[j] for j in alike)]
        if any(w.startswith("<call structure> == ") for w in told):
            told = _trees_apart(directory, stored, i, alike) + \
                [w for w in told if not w.startswith("<call structure> == ")]
        if alike and not told:  # the same guards: the state guards tell them apart
            told = [w for w in states[i] if any(w not in states[j] for j in alike)]
            if [w[:6] for w in told] == ["state "]:  # the same chains, other values
                read = [w[6:] for w in states[i] if w.startswith("reads ")]
                told = [f"{told[0]} of {', '.join(read[:3])}{' ...' * (len(read) > 3)}"]
        apart.append(told)
    return apart


def _check_words(checks: dict | None) -> list[str]:
    """A stored specialization's value checks (Note [Value checks] in codegen/checks.py) as
    ``list`` tells them: ``edge.py:27 (if x.sum() > 0:) read True``, one per value its trace
    read; empty where it has none."""
    if not checks:
        return []
    lines = checks.get("lines") or []
    return [f"{lines[k][0]} ({lines[k][1]}) read {value!r}" if k < len(lines) else
            f"value {k} read {value!r}" for k, value in enumerate(checks.get("values") or [])]


def _trees_apart(directory: Path, stored: list, i: int, alike: list[int]) -> list[str]:
    """What specialization ``i``'s argument tree holds where it first departs from each alike
    one's tree of another key (``c.mode: str 'fast'``), or the key where a tree's words are
    not stored."""
    mine = stored_tree(directory, stored[i]["tree"])
    told = []
    for j in alike:
        if stored[j] is None or stored[j]["tree"] == stored[i]["tree"]:
            continue
        theirs = stored_tree(directory, stored[j]["tree"])
        words = mine.held_apart(theirs) if mine and theirs else \
            f"argument tree {stored[i]['tree']} (its words are not stored)"
        if words not in told:
            told.append(words)
    return told


def stored_tree(directory: Path, key: int):
    """The stored words (``TreeWords``) of the argument tree ``key`` in a function's folder
    (Note [Stored trees] in ir/trees.py), or None (none stored, deleted meanwhile, damaged)."""
    from trident.ir.trees import TreeWords  # (imports torch: explain, and list's alike ones)

    try:
        return TreeWords.from_json(json.loads(gzip.decompress(
            (directory / "trees" / f"{key}.json.gz").read_bytes())), key)
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError):
        return None


def _state_words(data: dict) -> list[str]:
    """What ``list`` says of a stored specialization's state guards (Note [State guards]):
    each chain it reads (``reads torch.get_num_threads``), and the digest of their values
    then (``state 1c40227b``), which tells apart two that read the same chains."""
    from trident.lower.state.chain import Read

    state = data.get("state") or {}
    out = []
    for r in state.get("reads", []):
        read = Read.from_json(r)
        text = read.root[1] if read.root[0] in ("module", "object") else read.root[0]
        for step in read.steps:
            text += {"attr": f".{step[-1]}", "cell": ".cell_contents",
                     "call": "()"}.get(step[0], f"[{step[-1]!r}]")
        out.append(f"reads {text}")
    return out + [f"state {str(state.get('digest'))[:8]}"]



def describe(fn) -> dict:
    """What ``python -m trident list`` says of a function: ``qualname``, ``module``, ``file``
    and ``line`` (of its ``def``: of the innermost function of its ``__wrapped__`` chain, so a
    Hugging Face model's ``forward`` under ``@can_return_tuple`` is the model file's, not the
    decorator's); for the ``forward`` of a graph that ``torch.compile`` handed to Trident's
    backend, those of the function the graph came from and ``graph_of`` (Note [Graph
    origins]), which ``trident_backend`` put in the GraphModule's ``meta``."""
    owner = getattr(fn, "__self__", None)
    origin = getattr(owner, "meta", None)
    if isinstance(origin, dict) and isinstance(origin.get("trident_origin"), dict):
        return dict(origin["trident_origin"])
    code = getattr(_unwrapped(fn), "__code__", None)
    return {"qualname": getattr(fn, "__qualname__", type(fn).__qualname__),
            "module": getattr(fn, "__module__", None),
            "file": code.co_filename if code else None,
            "line": code.co_firstlineno if code else None}


def compiled_from(frame, code) -> bool:
    """Dynamo compiled ``frame`` from ``code``: it is ``code``, or a resume function Dynamo
    made of it after a graph break, named ``torch_dynamo_resume_in_{name}_at_{line}`` (torch
    2.11-2.13) with the break's line inside ``code``: a name alone is every ``forward``'s of
    the file."""
    if frame is code:
        return True
    found = re.search(rf"_resume_in_{re.escape(code.co_name)}_at_(\d+)$", frame.co_name)
    if found is None or frame.co_filename != code.co_filename:
        return False
    lines = [line for *_, line in code.co_lines() if line is not None]
    return bool(lines) and min(lines) <= int(found[1]) <= max(lines)


def frame_module(f_locals) -> object | None:
    """The module a frame of Dynamo's runs a method of: its ``self``, or, in a decorator's
    ``wrapped_func(*args, **kwargs)`` frame (transformers decorates ``forward``), ``args[0]``
    where that is an ``nn.Module``; None for any other frame. The decorator's code is one code
    object for every model it wraps, so this, not the code, tells their graphs apart."""
    nn = sys.modules["torch"].nn
    locals_ = f_locals if isinstance(f_locals, dict) else {}
    root = locals_.get("self")
    if root is None:
        args = locals_.get("args")
        root = args[0] if isinstance(args, tuple) and args else None
        root = root if isinstance(root, nn.Module) else None
    return root


def graph_origin(gm, code, f_locals, f_globals) -> dict:
    """Note [Graph origins]: a graph of the torch.compile doors is a function of its own, whose
    code FX names ``<eval_with_key>.N`` (a counter of the process that made it, shared by
    graphs of other models made by other processes), so ``python -m trident list`` names it
    by the function Dynamo compiled it from: ``code``, the frame's code (a resume function's
    after a graph break), whose ``f_locals`` and ``f_globals`` Dynamo keeps. A frame of a
    module's ``forward`` (its ``__wrapped__`` chain included: transformers decorates
    ``forward``, and the frame Dynamo sees is the decorator's ``wrapped_func(*args,
    **kwargs)``, its module ``args[0]``), or of its ``__call__`` (which transformers'
    ``CompileConfig`` compiles), is named by the module's class: ``qualname``
    ``LlamaForCausalLM.forward``, ``module`` the class's, ``file`` and ``line`` the unwrapped
    ``forward``'s ``def``. Any other frame is named by its own code; a resume function by the
    function it resumes (Dynamo names it ``Broken.torch_dynamo_resume_in_forward_at_134``).
    ``graph_of`` is the name with the file and line of the graph's first op in that function
    (Dynamo's ``stack_trace`` node metadata: the outermost frame in the function's file;
    ``graph_line`` that line), which ``explain`` heads a graph's block with and ``list`` shows
    after the function. The key of the graph's folder is its code and nothing of this (Note
    [Function key] in identity.py)."""
    torch = sys.modules["torch"]
    stack = next((n.meta["stack_trace"] for n in gm.graph.nodes
                  if n.meta.get("stack_trace")), "")
    frames = [(m[1], int(m[2])) for m in re.finditer(r'File "([^"]+)", line (\d+), in \S+',
                                                       stack)]
    root = frame_module(f_locals)
    origin = None
    if isinstance(root, torch.nn.Module) and code is not None:
        chain, fn = [], type(root).forward
        while fn is not None and len(chain) < 32:
            inner = getattr(getattr(fn, "__func__", fn), "__code__", None)
            chain += [inner] if inner is not None else []
            fn = getattr(fn, "__wrapped__", None)
        calls = {getattr(torch.nn.Module, name).__code__  # (transformers' CompileConfig
                 for name in ("_wrapped_call_impl", "_call_impl")}  # compiles __call__)
        if chain and any(compiled_from(code, c) for c in [*chain, *calls]):
            inner = chain[-1]
            origin = {"qualname": f"{type(root).__qualname__}.{inner.co_name}",
                      "module": type(root).__module__, "file": inner.co_filename,
                      "line": inner.co_firstlineno}
    if origin is None and code is not None:
        origin = {"qualname": re.sub(r"torch_dynamo_resume_in_(\w+?)_at_\d+$", r"\1",
                                     getattr(code, "co_qualname", code.co_name)),
                  "module": (f_globals or {}).get("__name__"), "file": code.co_filename,
                  "line": code.co_firstlineno}
    if origin is None:  # called outside Dynamo: the graph's own forward
        origin = describe(gm.forward)
    first = next((line for file, line in frames if file == origin["file"]),
                 frames[0][1] if frames else origin["line"])
    return {**origin, "graph_of": f"{origin['qualname']} ({origin['file']}:{first})",
            "graph_line": first}


def _unwrapped(fn):
    """``fn`` past its ``__wrapped__`` chain (``inspect.unwrap``), or ``fn`` where the chain
    loops."""
    try:
        return inspect.unwrap(fn)
    except ValueError:  # a cycle of __wrapped__
        return fn



def full_name(about: dict) -> str | None:
    """``module.qualname`` of a cached function (``describe()``), as ``list`` names it."""
    if not about.get("qualname"):
        return None
    return f"{about['module']}.{about['qualname']}" if about.get("module") else about["qualname"]


def clear(name: str | None = None) -> list[str]:
    """Delete the cache entries of the function ``name`` names, or, without a name, every cached
    function and runtime build. ``name`` is a folder name, ``module.qualname`` as ``list`` shows
    it (``app.model.Block.forward``), a bare qualified name (``Block.forward``) when one
    function has it, or either after its file and a colon (``serve.py:f``, ``/srv/serve.py:
    __main__.f``: the file as ``list`` shows it, or its last parts), which tells apart two
    scripts' ``__main__.f``; entries of one function made by earlier versions of its code go
    with it. A graph of the torch.compile doors is named by the function it came from (Note
    [Graph origins]: ``LlamaForCausalLM.forward`` picks the graphs of that model's
    ``forward``); its folder name picks it alone. Returns the deleted folders.

    Raises:
        ValueError: ``name`` fits functions of several modules or files (its text lists them,
            each with the name that picks it alone); nothing is deleted."""
    root = config.cache_dir()
    if name is not None:
        rows = _named(list_entries(), name)
        origins = {_function_of(r) for r in rows}
        if len(origins) > 1:  # one line per function, not per entry (its earlier code's)
            firsts = {}
            for r in sorted(rows, key=lambda r: (full_name(r["about"]),
                                                 str(r["about"].get("file")))):
                firsts.setdefault(_function_of(r), r)
            earlier = f" ({len(rows)} cache entries: {_why_entries(rows)})" \
                if len(rows) > len(origins) else ""
            raise ValueError(f"{name!r} names {len(origins)} functions{earlier}; pick one by "
                             "the name after its colon:\n" + "\n".join(
                                 f"  {full_name(r['about'])} ({r['about'].get('file')}): "
                                 f"{_selector(r, rows)}" for r in firsts.values()))
        doomed = [Path(r["path"]) for r in rows]
    else:
        functions, runtime = root / "functions", root / "runtime"
        doomed = sorted(functions.iterdir()) if functions.is_dir() else []
        if runtime.is_symlink():  # a shared build (the test suite's): drop the link only
            doomed.append(runtime)
        elif runtime.is_dir():
            doomed += sorted(runtime.iterdir())
    for d in doomed:
        if d.is_symlink():
            d.unlink()
        else:
            shutil.rmtree(d, ignore_errors=True)
    if name is None:
        for sub in ("functions", "runtime", "locks"):
            shutil.rmtree(root / sub, ignore_errors=True)
    return [str(d) for d in doomed]


def _why_entries(rows: list[dict]) -> str:
    """Why ``rows`` are more cache entries than functions (``clear``'s message): graphs of the
    torch.compile doors (each its own entry: Note [Graph origins]) beside ``trident.jit``
    entries, and a function's several ``trident.jit`` entries, made by its earlier code or by
    other versions of what its key names (``function.json``'s ``key``: torch, globals)."""
    graphs = sum(1 for r in rows if r["about"].get("graph_of"))
    jits = len(rows) - graphs
    keys: dict[tuple, list[dict]] = {}
    for r in rows:
        if not r["about"].get("graph_of"):
            keys.setdefault(_function_of(r), []).append(r["about"].get("key") or {})
    differ = sorted({part for found in keys.values() if len(found) > 1
                     for part in set().union(*found) if len({json.dumps(k.get(part))
                                                             for k in found}) > 1})
    why = ["a function's earlier code has its own" if "code" in differ or not differ else
           f"a function's entries of other {', '.join(differ)} have their own"] \
        if any(len(found) > 1 for found in keys.values()) else []
    if graphs:
        why.insert(0, f"{graphs} torch.compile graph{'s' * (graphs != 1)}, an entry each, and "
                      f"{jits} trident.jit entr{'y' if jits == 1 else 'ies'}")
    return "; ".join(why)


def _named(rows: list[dict], name: str) -> list[dict]:
    """The rows ``name`` selects (``clear``'s forms)."""
    by_folder = [r for r in rows if Path(r["path"]).name == name]
    if by_folder:
        return by_folder
    file, _, function = name.rpartition(":")
    if file:
        rows = [r for r in rows if _same_file(r["about"].get("file"), file)]
    return [r for r in rows if function in (r["about"].get("qualname"), full_name(r["about"]))]


def _same_file(recorded: str | None, given: str) -> bool:
    """``given`` is the recorded file, or its last parts (``serve.py``, ``app/serve.py``)."""
    if not recorded:
        return False
    parts, tail = Path(recorded).parts, Path(given).parts
    return Path(given).is_absolute() and Path(recorded) == Path(given) or \
        (not Path(given).is_absolute() and parts[-len(tail):] == tail)


def _function_of(row: dict) -> tuple:
    """What tells ``row``'s function from another of its name: its module and file. A graph of
    the torch.compile doors is its origin's (Note [Graph origins]): the graphs of one model's
    ``forward`` (its prefill and decode step, each size's) are one function's; one whose
    origin was not recorded (an older Trident's, named by FX's code file ``<eval_with_key>.N``,
    a counter of the process that made it, which graphs of other models made by other
    processes share) is each its own."""
    about = row["about"]
    if about.get("graph_of") and str(about.get("file")).startswith("<"):
        return about.get("module"), about.get("file"), Path(row["path"]).name
    return about.get("module"), about.get("file")


def _selector(row: dict, rows: list[dict]) -> str:
    """The shortest name ``clear`` takes that selects ``row``'s function alone among
    ``rows``: its module.qualname, then after its file's last parts, else its folder."""
    about = row["about"]
    mine = {_function_of(row)}
    qualname = full_name(about) or "?"
    candidates = [qualname]
    if about.get("file"):
        parts = Path(about["file"]).parts
        candidates += [f"{Path(*parts[-n:])}:{qualname}" for n in range(1, len(parts) + 1)]
    for candidate in candidates:
        if {_function_of(r) for r in _named(rows, candidate)} == mine:
            return candidate
    return Path(row["path"]).name
