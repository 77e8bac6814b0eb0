"""Library code's own reads (Note [Library code that ran] in lower/state/library.py): a library
function patched at its module after the first call (``F.layer_norm = ...``,
``mock.patch("torch.nn.functional.linear", ...)``, ``nn.Module.__call__``, liger-kernel's
``apply_liger_kernel_to_llama()`` rebinding ``modeling_llama.apply_rotary_pos_emb``) is what
the next call runs: a recompile, equal to eager; patched back, the first specialization is
served again. Every call is compared with eager (``torch.equal``), with exact counts."""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trident
from _trident_helpers import counts


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(self.lin(x))


def call(m, x):
    return m(x)


def _wrapped(old, after):
    return lambda *a, **k: after(old(*a, **k))


def _llama_rope():
    from transformers.models.llama import modeling_llama
    return mock.patch.object(modeling_llama, "apply_rotary_pos_emb", _wrapped(
        modeling_llama.apply_rotary_pos_emb, lambda qk: (qk[0] * 2, qk[1])))


def _llama_rotate_half():
    from transformers.models.llama import modeling_llama
    return mock.patch.object(modeling_llama, "rotate_half", _wrapped(
        modeling_llama.rotate_half, lambda y: y * 3))


# Each patch, as a context manager: entered, the library's code runs another function.
LIBRARY_PATCHES = {
    # a module attribute read through the library module's alias (nn.LayerNorm.forward's F)
    "F.layer_norm": lambda: mock.patch.object(F, "layer_norm", _wrapped(F.layer_norm,
                                                                        lambda y: y - 1)),
    # a builtin, patched by its dotted path as users do
    "torch.nn.functional.linear": lambda: mock.patch(
        "torch.nn.functional.linear", _wrapped(F.linear, lambda y: y.flip(-1))),
    # what F.layer_norm itself reads: torch.layer_norm
    "torch.layer_norm": lambda: mock.patch(
        "torch.layer_norm", _wrapped(torch.layer_norm, lambda y: y + 3)),
    # a type slot: what every module call runs
    "nn.Module.__call__": lambda: mock.patch.object(
        nn.Module, "__call__", _wrapped(nn.Module.__call__, lambda y: y * 2)),
    # what Module.__call__ calls through the module
    "nn.Module._call_impl": lambda: mock.patch.object(
        nn.Module, "_call_impl", _wrapped(nn.Module._call_impl, lambda y: y + 0.5)),
    # a global function of a library module, read by the library's own forward
    "modeling_llama.apply_rotary_pos_emb": _llama_rope,
    # a helper of that helper (library code two calls below the library's forward)
    "modeling_llama.rotate_half": _llama_rotate_half,
}


def _tiny_llama():
    import transformers
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1,
                                      vocab_size=64)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, torch.randint(0, 64, (1, 5))


def _logits(m, ids):
    return m(input_ids=ids).logits


def _case(patch: str):
    torch.manual_seed(0)
    if patch.startswith("modeling_llama"):
        m, x = _tiny_llama()
        return m, x, _logits
    return Norm().eval(), torch.randn(2, 4), call


@pytest.mark.parametrize("patch", sorted(LIBRARY_PATCHES))
def test_a_library_function_patched_after_the_first_call_is_seen(patch):
    m, x, fn = _case(patch)
    jf = trident.jit(fn)
    with torch.no_grad():
        before = fn(m, x)
        for _ in range(2):
            assert torch.equal(jf(m, x), before)
        assert counts(jf) == (1, 1, 0)
        with LIBRARY_PATCHES[patch]():
            eager = fn(m, x)
            assert not torch.equal(eager, before)  # (the patch changes the result)
            assert torch.equal(jf(m, x), eager)
            assert counts(jf) == (2, 1, 0)  # a recompile, not the old result
            assert torch.equal(jf(m, x), eager)
            assert counts(jf) == (2, 2, 0)
        assert torch.equal(jf(m, x), before)  # patched back: the first specialization again
        assert counts(jf) == (2, 3, 0)
        assert torch.equal(jf(m, x), before)
        assert counts(jf) == (2, 4, 0)


def test_another_global_of_a_library_module_changing_keeps_the_hits():
    """A library module's dict changed where the trace read nothing (a new global): its
    version tag moves, the names the specialization read are read again and hold: hits."""
    from transformers.models.llama import modeling_llama

    m, x, fn = _case("modeling_llama")
    jf = trident.jit(fn)
    with torch.no_grad():
        want = fn(m, x)
        assert torch.equal(jf(m, x), want)
        with mock.patch.object(modeling_llama, "TRIDENT_TEST_UNREAD", 1, create=True), \
                mock.patch.object(F, "TRIDENT_TEST_UNREAD", 2, create=True):
            for _ in range(3):
                assert torch.equal(jf(m, x), want)
        assert torch.equal(jf(m, x), want)
    assert counts(jf) == (1, 4, 0)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="no dict version tags: every node")
def test_library_reads_cost_a_hit_no_check_of_their_own():
    """Note [Library code that ran]: the library's loads are lookups in its modules' dicts,
    proven by their version tags (a module class's ``__call__`` too, where ``type.__call__``
    loses to the class's own: Note [Quiet state]): more library code run adds state tree
    nodes, and no node that a hit checks."""
    def checked(m):
        jf = trident.jit(call)
        x = torch.randn(2, 4)
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(jf(m, x), call(m, x))
        made, proofs, checked, _, _ = jf._quiet_state()
        assert made == 1 and proofs > 0 and counts(jf) == (1, 2, 0), jf._quiet_state()
        return checked, len(jf._state.nodes)

    few = checked(nn.Sequential(nn.Linear(4, 4)).eval())
    more = checked(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.GELU(), nn.Softmax(-1),
                                 nn.Dropout(0.1)).eval())
    assert more[0] == few[0] and more[1] > few[1] + 10, (few, more)


def test_a_library_helper_called_from_user_code_reads_are_seen():
    """The library code the function's own code calls directly (not through a module): F.gelu
    reads nothing patched, but ``F.silu``'s body reads ``torch._C._nn.silu``."""
    def f(x):
        return F.silu(x) + 1

    jf = trident.jit(f)
    x = torch.randn(5)
    assert torch.equal(jf(x), f(x))
    with mock.patch("torch._C._nn.silu", _wrapped(torch._C._nn.silu, lambda y: y * 3)):
        assert torch.equal(jf(x), f(x))
        assert counts(jf) == (2, 0, 0)
    assert torch.equal(jf(x), f(x))
    assert counts(jf) == (2, 1, 0)


# ---- liger-kernel on the GPU ------------------------------------------------------------------

@contextlib.contextmanager
def _restored(*modules):
    """Every global and class attribute of ``modules`` set back on leaving (liger-kernel's
    patches are for good)."""
    saved = []
    for mod in modules:
        saved.append((mod, dict(vars(mod))))
        saved += [(c, dict(vars(c))) for c in vars(mod).values()
                  if isinstance(c, type) and c.__module__ == mod.__name__]
    try:
        yield
    finally:
        for owner, before in saved:
            for name, value in before.items():
                if vars(owner).get(name) is not value and name not in ("__dict__",
                                                                       "__weakref__"):
                    setattr(owner, name, value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_liger_patched_after_the_first_call_is_seen():
    """``apply_liger_kernel_to_llama()`` after a jitted Llama's first calls: its rope is what
    the model's attention runs from then on (``modeling_llama.apply_rotary_pos_emb``, read by
    ``LlamaAttention.forward``): a recompile, equal to eager."""
    pytest.importorskip("liger_kernel")
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    with _restored(modeling_llama):
        m, ids = _tiny_llama()
        m, ids = m.to("cuda", torch.bfloat16), ids.cuda()
        jf = trident.jit(_logits)
        with torch.no_grad():
            before = _logits(m, ids)
            for _ in range(2):
                assert torch.equal(jf(m, ids), before)
            apply_liger_kernel_to_llama(rope=True, rms_norm=False, swiglu=False,
                                        cross_entropy=False, fused_linear_cross_entropy=False)
            assert modeling_llama.apply_rotary_pos_emb.__module__.startswith("liger_kernel")
            eager = _logits(m, ids)
            for _ in range(2):
                assert torch.equal(jf(m, ids), eager)
        assert counts(jf) == (2, 2, 0)
