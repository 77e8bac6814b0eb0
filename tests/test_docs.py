"""Every code block of README.md and docs/*.md that is meant to run, run as the page shows it.

Fence convention (also in docs/design.md, "Docs"), by the fence's info string:

* ``python``: runs on the CPU here;
* ``python gpu``: runs only where CUDA is available (the page's ``gpu``-marked test);
* ``python no-run``: shown, never run; only for what cannot run (a fragment);
* anything else (``sh``, ``c``, ``text``, none): shown, never run.

The blocks of one page run in order in one namespace: a page is a tutorial. The CPU test of a
page runs its ``python`` blocks; its GPU test runs its ``python`` and ``python gpu`` blocks.
A ``text`` block directly after a runnable python block and preceded by the HTML comment
``<!-- output -->`` is that block's expected stdout, compared with ``doctest``'s checker with
ELLIPSIS (``...`` stands for any text, e.g. a number that varies) and NORMALIZE_WHITESPACE.

Pages are collected automatically: a new docs/*.md is run without touching this file.
Blocks are compiled with the page as their file name and their own line numbers, so a
traceback, ``inspect.getsource`` and Trident's source comments point into the page.
"""

from __future__ import annotations

import contextlib
import dataclasses
import doctest
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from markdown_it import MarkdownIt

from _trident_helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_INFOS = {"python": "cpu", "python gpu": "gpu", "python no-run": None}
OUTPUT_MARK = "<!-- output -->"
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclasses.dataclass
class Block:
    path: Path
    line: int            # 1-based line of the block's first code line in the page
    info: str            # the fence's info string, whitespace-normalised
    source: str
    expected: str | None = None   # the <!-- output --> block that follows, if any

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def parse(path: Path) -> list[Block]:
    """The fenced blocks of a page, in order, with their expected outputs attached."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    blocks: list[Block] = []
    for i, tok in enumerate(tokens):
        if tok.type != "fence":
            continue
        block = Block(path, tok.map[0] + 2, " ".join(tok.info.split()), tok.content)
        # an output block: a text fence right after the comment, right after a python fence
        if (block.info == "text" and i >= 2 and tokens[i - 1].type == "html_block"
                and tokens[i - 1].content.strip() == OUTPUT_MARK and tokens[i - 2].type == "fence"
                and blocks[-1].info.startswith("python")):
            blocks[-1].expected = block.source
        blocks.append(block)
    return blocks


def run_page(path: Path, where: set[str]) -> None:
    """Run the page's blocks whose kind is in ``where`` ({"cpu"} or {"cpu", "gpu"}), in order, in
    one namespace; check each printed output that the page shows. Dynamo starts empty, as in
    the reader's new process: its ``recompile_limit`` (8 graphs per code object) counts the
    graphs earlier tests of this worker left of transformers' one ``forward`` wrapper."""
    torch._dynamo.reset()
    namespace = {"__name__": f"docs:{path.name}"}
    for block in parse(path):
        if RUN_INFOS.get(block.info) not in where:
            continue
        # pad with newlines so the code keeps the page's line numbers
        code = compile("\n" * (block.line - 1) + block.source, str(path), "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
        got = out.getvalue()
        if block.expected is not None and not _CHECKER.check_output(block.expected, got, _FLAGS):
            example = doctest.Example(block.source, block.expected)
            pytest.fail(f"{block.where}: printed output differs from the page\n"
                        + _CHECKER.output_difference(example, got, _FLAGS))


def _pages_with(kind: str) -> list:
    return [pytest.param(p, id=str(p.relative_to(REPO))) for p in PAGES
            if any(RUN_INFOS.get(b.info) == kind for b in parse(p))]


@pytest.mark.parametrize("page", _pages_with("cpu"))
def test_page_runs_on_cpu(page):
    run_page(page, {"cpu"})


@pytest.mark.gpu
@pytest.mark.parametrize("page", _pages_with("gpu"))
def test_page_runs_on_gpu(page):
    assert torch.cuda.is_available()
    run_page(page, {"cpu", "gpu"})


def test_fences_follow_the_convention():
    """Every python-ish fence has one of the three info strings, and every output comment is
    followed by a text block that belongs to a runnable python block (else it would be skipped
    silently)."""
    problems = []
    for page in PAGES:
        marks = sum(t.type == "html_block" and t.content.strip() == OUTPUT_MARK
                    for t in MarkdownIt("commonmark").parse(page.read_text()))
        blocks = parse(page)
        for b in blocks:
            if b.info.split(" ")[0] in ("python", "py", "python3", "pycon") and \
                    b.info not in RUN_INFOS:
                problems.append(f"{b.where}: unknown info string {b.info!r}")
            if b.expected is not None and RUN_INFOS.get(b.info) is None:
                problems.append(f"{b.where}: output shown for a block that never runs")
        attached = sum(b.expected is not None for b in blocks)
        if marks != attached:
            problems.append(f"{page.relative_to(REPO)}: {marks} output comments, {attached} "
                            "attached to a python block")
    assert not problems, "\n".join(problems)


def test_collector(tmp_path, monkeypatch):
    """The parser and runner on a synthetic page: order, one namespace, outputs, no-run."""
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "# T", "", "```python", "x = 2", "print(x * 21)", "```", "", OUTPUT_MARK, "", "```text",
        "42", "```", "", "```python no-run", "undefined_name", "```", "", "```python gpu",
        "x = 'gpu'", "```", "", "```python", "print(x, 0.1 + 0.2)", "```", OUTPUT_MARK,
        "```text", "2 0.3...", "```", "", "```sh", "false", "```", ""]))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    blocks = parse(page)
    assert [(b.info, b.line) for b in blocks] == [
        ("python", 4), ("text", 11), ("python no-run", 15), ("python gpu", 19),
        ("python", 23), ("text", 27), ("sh", 31)]
    assert [b.expected for b in blocks if b.info == "python"] == ["42\n", "2 0.3...\n"]
    run_page(page, {"cpu"})  # the gpu block is skipped, so x is still 2
    with pytest.raises(pytest.fail.Exception, match="page.md:23"):
        run_page(page, {"cpu", "gpu"})  # the gpu block runs: x is 'gpu'
    page.write_text(page.read_text().replace("2 0.3...", "2 0.4"))
    with pytest.raises(pytest.fail.Exception, match="(?s)page.md:23.*2 0.4"):
        run_page(page, {"cpu"})


def test_ci_runs_the_readme_test_command():
    """.ci/run executes the README's second ```sh block, exactly (checked with --dry-run)."""
    sh = [b.source.strip() for b in parse(REPO / "README.md") if b.info == "sh"]
    done = subprocess.run(["bash", str(REPO / ".ci" / "run"), "--dry-run"], capture_output=True,
                          text=True, check=True)
    assert done.stdout == f"+ {sh[1]}\n"
    assert "pytest" in sh[1] and not sh[1].startswith("$")
