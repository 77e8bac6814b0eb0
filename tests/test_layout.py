"""The package's layout holds: every import (at module level or inside a function) points down
the pipeline, no two modules import each other in a loop, files stay small, and every
"Note [X] in path" points to a file that holds Note [X].

Layers, from the base up: errors, config and serials (Note [Identity serials]); identity, frames (Note [User code]), interrupts
and the native runtime's loader; ``ir`` (pure data); ``lower`` (from a call to a specialization); ``codegen`` (the one
writer of C); ``build``; ``frontend``; the package's face and its command line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from _trident_helpers import REPO

PACKAGE = REPO / "trident"
LAYERS = [
    ("trident.errors", "trident.config", "trident.serials"),
    ("trident.identity", "trident.frames", "trident.interrupts", "trident.runtime"),
    ("trident.ir",),
    ("trident.lower",),
    ("trident.codegen",),
    ("trident.build",),
    ("trident.frontend",),
    ("trident", "trident.__main__", "trident.demo", "trident.bench"),
]
MAX_PYTHON_LINES, MAX_C_LINES = 500, 800


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    assert best is not None, f"{module} belongs to no layer of tests/test_layout.py"
    return best[0]


def _imports() -> dict[str, set[str]]:
    """Each Trident module -> the Trident modules it imports, lazily or not."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        out[name] = found
    return out


def test_every_import_points_down_the_pipeline():
    wrong = [f"{a} imports {b}" for a, targets in _imports().items() for b in sorted(targets)
             if _layer(b) > _layer(a)]
    assert wrong == []


def test_no_import_circle():
    graph = _imports()
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_files_stay_small():
    big = [f"{p.relative_to(REPO)}: {n} lines"
           for p in sorted(PACKAGE.rglob("*")) if p.suffix in (".py", ".cpp", ".h")
           for n in [len(p.read_text().splitlines())]
           if n > (MAX_PYTHON_LINES if p.suffix == ".py" else MAX_C_LINES)]
    assert big == []


# a line break inside a comment or docstring, with the next line's comment marker
_LINE_BREAK = re.compile(r"\s*\n\s*(?:#|//|\*|\{#)?\s*")
_NOTE_IN = re.compile(r"Note \[([^\]]+)\]\s+in\s+`?((?:[\w.-]+/)*[\w-]+\.(?:py|h|cpp|c|jinja|md))\b")


def test_note_references_point_to_their_notes():
    """``Note [X] in path`` in code, templates, tests and docs: ``path`` (from the repository's
    root, or its tail, e.g. ``frontend/batch.py``) names a file that holds ``Note [X]``.
    docs/benchmarks.md is left out: a record of past commits, its paths those of its time."""
    files = [p for p in (*PACKAGE.rglob("*"), *(REPO / "templates").rglob("*"),
                         *(REPO / "tests").glob("*.py"), *(REPO / "benchmarks").rglob("*.py"),
                         *(REPO / "docs").glob("*.md"), REPO / "README.md")
             if p.is_file() and p.suffix in (".py", ".h", ".cpp", ".c", ".jinja", ".md")
             and p.name != "benchmarks.md"]
    texts = {p.relative_to(REPO).as_posix(): _LINE_BREAK.sub(" ", p.read_text()) for p in files}
    stale = [f"{where}: Note [{name}] in {path}"
             for where, text in texts.items() for name, path in _NOTE_IN.findall(text)
             if not any(f"Note [{name}]" in texts[p] for p in texts
                        if p == path or p.endswith("/" + path))]
    assert stale == []
