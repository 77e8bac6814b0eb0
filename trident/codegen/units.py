"""The translation units of a Specialization Cache Module (Note [Parallel C build] in
build.py): the rendered module (``Rendered``), and how render.py cuts the guards and the launch
sequence into parts, each a unit of its own."""

from __future__ import annotations

from typing import NamedTuple

from trident.codegen.cprint import c_comment
from trident.codegen.target import CStep


class Rendered(NamedTuple):
    """A specialization's module: the C sources of its translation units (the main one first,
    then the guards' parts and the steps': Note [Parallel C build] in build.py); per callback
    slot, the index of the step it launches; per kernel of the module, its cubin
    (``scm_set_cubin`` hands it over at install: the source names only its size and SHA-256)."""

    sources: tuple[str, ...]
    callbacks: list[int]
    cubins: list[bytes]

    @property
    def source(self) -> str:
        """The module's C, its translation units one after another."""
        return "\n".join(self.sources)


# Note [Parallel C build] in build.py: steps per part of a launch sequence, and checks per
# part of the guards (built at -O1: Note [Optimized guards]), each part a translation unit of
# about the same compile time (a tenth of a second of GCC on a laptop core).
PART_STEPS = 128
GUARD_PART_CHECKS = 768


def guard_parts(guards: list[tuple[str, str]]) -> list[dict]:
    """Note [Parallel C build] in build.py: the guards (C expression, comment) in parts of
    ``GUARD_PART_CHECKS``, checked one part after another in guard order (Note [Guard order]);
    at least one part."""
    return [{"name": f"guards{k + 1}", "number": k + 1,
             "guards": guards[start:start + GUARD_PART_CHECKS]}
            for k, start in enumerate(range(0, max(len(guards), 1), GUARD_PART_CHECKS))]


def step_parts(steps: list[CStep], statics: list[list[str]]) -> list[dict]:
    """Note [Parallel C build] in build.py: the steps in parts of ``PART_STEPS``, each with the
    module-level declarations its steps use (constant arrays, reused buffers) and a comment
    naming the source lines of its first and last steps. A launch sequence without steps has
    one empty part."""
    parts = []
    for start in range(0, max(len(steps), 1), PART_STEPS):
        chunk = steps[start:start + PART_STEPS]
        lines = f"{chunk[0].where} to {chunk[-1].where}" if chunk else "no steps"
        parts.append({
            "name": f"part{len(parts) + 1}", "number": len(parts) + 1, "steps": chunk,
            "statics": [line for s in statics[start:start + PART_STEPS] for line in s],
            "comment": c_comment(f"steps {start + 1} to {start + len(chunk)}: {lines}"),
            "eager": any(step.on_error == "eager" for step in chunk)})
    return parts
