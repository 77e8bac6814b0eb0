"""Never stale (issue 28), session 39: the forward of a module class a factory made, patched
after the trace (Note [Module forwards] in lower/state/roots.py). Every call is compared with
eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import pytest
import torch

import trident
from _trident_helpers import as_in_a_new_process, counts

kernels_layer = pytest.importorskip("kernels._internals.layer.layer")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")

SILU = kernels_layer._create_func_module(torch.nn.functional.silu)()  # a factory's class,
# held by this module


def rope(q, k, cos, sin):
    q, k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    return q + k


def silu(x):
    return SILU(x) + 1


def _tripled(forward):
    def patched(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        return tuple(o * 3 for o in out) if isinstance(out, tuple) else out * 3
    return patched


def _args(name):
    torch.manual_seed(0)
    if name == "rope":
        return rope, (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 3, 4),
                      torch.randn(1, 3, 4))
    return silu, (torch.randn(5),)


@pytest.mark.parametrize("name", ["rope", "silu"])
def test_a_forward_patched_on_a_class_a_factory_made_is_run(name):
    """transformers binds ``apply_rotary_pos_emb`` to an instance of a class that kernels'
    ``_create_func_module`` makes (qualname ``_create_func_module.<locals>.Func``): its forward
    is read through that instance (a path the same in every process); a factory's class whose
    instance only the user's module holds is read by the class itself (this process only).
    Either way a forward patched on the class after the trace is what the next call runs."""
    fn, args = _args(name)
    owner = type(modeling_llama.apply_rotary_pos_emb if name == "rope" else SILU)
    original = owner.forward
    jf = trident.jit(fn)
    try:
        for patch in (False, True, False):
            owner.forward = _tripled(original) if patch else original
            for _ in range(2):
                assert torch.equal(jf(*args), fn(*args)), (name, patch)
    finally:
        owner.forward = original
    # unpatched, patched, unpatched again (its specialization reinstalled)
    assert counts(jf) == (2, 4, 0), jf.stats.miss_reasons


def test_a_factory_class_held_by_its_module_is_served_in_a_new_process():
    """The path through the module's instance holds in another process: a new process's first
    call loads the stored specialization (issue 27)."""
    fn, args = _args("rope")
    jf = trident.jit(fn)
    assert torch.equal(jf(*args), fn(*args))
    assert counts(jf) == (1, 0, 0), jf.stats
    as_in_a_new_process()
    again = trident.jit(fn)
    assert torch.equal(again(*args), fn(*args))
    assert (again.stats.traces, again.stats.hits) == (0, 1), again.stats


# ---- Note [Identity serials] (serials.py): one table, its strong references bounded ----------

def test_one_table_names_objects_for_keys_and_roots_and_bounds_what_it_holds():
    """A function key's words and a chain's object root name an object by the same serial; of
    the objects that take no weak reference the table holds the most recently named
    ``_STRONG_BOUND``: one named again and again stays, one dropped gets a new serial (a new
    name: never an old specialization's) and its old root no longer evaluates."""
    from trident import serials
    from trident.lower.state import chain

    kept, dropped = {}, {}
    serial = serials.object_serial(kept)
    root = chain._root_of_dict(dropped)
    assert root == ("object", f"dict#{serials.object_serial(dropped)}")
    assert chain._resolve_root(root, None) is dropped
    others = [{} for _ in range(serials._STRONG_BOUND)]
    for n, other in enumerate(others):
        serials.object_serial(other)
        if n % 100 == 0:
            assert serials.object_serial(kept) == serial  # (named again: most recent)
    assert len(serials._STRONG) == serials._STRONG_BOUND
    assert serials.object_serial(kept) == serial and serials.serial_object(serial) is kept
    assert chain._resolve_root(root, None) is chain._MISSING  # dropped: its root is gone
    again = chain._root_of_dict(dropped)
    assert again != root and chain._resolve_root(again, None) is dropped
