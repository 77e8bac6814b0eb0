"""A module of several translation units (Note [Parallel C build] in build.py): the guards and
the launch sequence in parts, compiled in parallel and linked into one extension module.

``codegen.units.PART_STEPS`` and ``GUARD_PART_CHECKS`` are set small here so that a few-step
function is several parts; the module's name (Note [Build key]) covers every unit, so a change
to one part builds the module again.
"""

from __future__ import annotations

import pytest
import torch

import trident
from trident import build, runtime
from trident.codegen import render as codegen, units
from trident.errors import TridentError

from _trident_helpers import assert_same


def chain(x, w, n: int):
    """Eleven-odd steps: matmuls into reused buffers, views computed in C, size arithmetic,
    an error caught by the user (the steps inside ``try`` leave through the eager label)."""
    h = torch.relu(x @ w)
    h = h.t().contiguous() * 2
    k = h.shape[0] // n
    y = h[:k].sum(0) + torch.sigmoid(h).mean()
    try:
        y = y.pow(2) + 1
    except RuntimeError:
        y = y - 1
    return y, h.t()[0], k


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(units, "PART_STEPS", 3)
    monkeypatch.setattr(units, "GUARD_PART_CHECKS", 10)


def test_a_module_of_several_parts_gives_eager_results(small_parts, trident_cache):
    jf = trident.jit(fallback=False)(chain)
    x, w = torch.randn(6, 4), torch.randn(4, 8)
    for args in ((x, w, 2), (x, w, 2), (torch.randn(6, 4), w, 2)):
        assert_same(jf(*args), chain(*args))
    (spec,) = jf._specs
    sources = codegen.render(spec, "chain").sources
    guards = sum("TRT_SHARED int guards" in s for s in sources[1:])  # (headers packed: fewer)
    parts = len(sources) - 1 - guards  # the main unit first
    assert guards >= 3 and parts >= 3 and sources[0].count("goto release;") == parts
    assert all(f"TRT_SHARED int guards{i}(" in sources[i] for i in range(1, guards + 1))
    assert all(f"TRT_SHARED int part{i}(" in sources[guards + i] for i in range(1, parts + 1))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.fallbacks) == (1, 2, 0)
    # the cache keeps each unit's C next to the module
    (folder,) = (trident_cache / "functions").iterdir()
    (module,) = folder.glob("trident_scm_*.so")
    name = module.name.split(".")[0]
    kept = [folder / f"{name}.c"] + [folder / f"{name}.{i}.c" for i in range(1, len(sources))]
    assert [p.read_text() for p in kept] == list(sources)
    assert "\n".join(sources) == jf.source()
    # a guard of a later part fails (x.size(0), past the first ten checks): a miss
    assert spec.guards.index(next(g for g in spec.guards if "x.size(0)" in g.words(
        spec.arg_names))) >= 10
    other = (torch.randn(8, 4), w, 2)
    assert_same(jf(*other), chain(*other))
    assert (jf.stats.compiles, jf.stats.hits, jf.stats.misses) == (2, 2, 2)


def test_a_changed_part_builds_the_module_again(small_parts, tmp_path):
    x, w = torch.randn(6, 4), torch.randn(4, 8)
    jf = trident.jit(fallback=False)(chain)
    jf(x, w, 2)
    sources = list(codegen.render(jf._specs[0], "chain").sources)
    first = build.build(sources, tmp_path)
    assert first.lib.scm_init(runtime.load().api_address()) == 0
    assert build.build(sources, tmp_path) is first  # built once
    names = {build.module_name(sources)}
    for unit in range(1, len(sources)):  # each unit's text is in the key
        changed = sources.copy()
        changed[unit] += "/* changed */\n"
        names.add(build.module_name(changed))
    # so are the units' boundaries: the same text cut elsewhere is another module
    moved = sources[:2] + [sources[2] + sources[3]] + sources[4:]
    names.add(build.module_name(moved))
    assert len(names) == len(sources) + 1
    changed = sources.copy()
    changed[-1] = changed[-1].replace("return 0;", "return 0;  /* the last part, changed */")
    again = build.build(changed, tmp_path)
    assert again is not first and again.__name__ == build.module_name(changed)
    assert len(list(tmp_path.glob("trident_scm_*.so"))) == 2


def test_a_part_that_does_not_compile_names_the_compilers_words(tmp_path):
    x, w = torch.randn(6, 4), torch.randn(4, 8)
    jf = trident.jit(fallback=False)(chain)
    jf(x, w, 2)
    sources = list(codegen.render(jf._specs[0], "chain").sources)
    sources[-1] += "int broken(void) { return undeclared_name; }\n"
    with pytest.raises(TridentError, match="undeclared_name"):
        build.build(sources, tmp_path)
    assert not list(tmp_path.glob("trident_scm_*.so"))


def test_the_build_of_a_module_warns_of_nothing(small_parts, caplog):
    """The compiler's output (``TRIDENT_LOGS=cache``) of a module of several parts is empty:
    the header's static helpers that a unit does not call are ``static inline``, which GCC's
    ``-Wunused-function`` leaves alone."""
    with caplog.at_level("INFO", logger="trident.cache"):
        jf = trident.jit(fallback=False)(chain)
        jf(torch.randn(6, 4), torch.randn(4, 8), 2)
    built = [r.getMessage() for r in caplog.records if r.getMessage().startswith("built ")]
    output = [r.getMessage() for r in caplog.records if "C compiler output" in r.getMessage()]
    assert len(built) == 1 and output == []
