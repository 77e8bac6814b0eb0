"""Faults the adversarial pass of session 38 found, each with a test of its whole kind: a hit
that returned an old result after a change of what the call reads, a stored specialization a new
process loaded for other state, and a call that raised where eager ran. Every call is compared
with eager (``torch.equal``), with exact compile, hit and fallback counts."""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import trident
from _trident_helpers import counts, fresh_imports


# ---- Note [Fake results and flags] (lower/decompositions.py) ----------------------------------
# A trace under other SDPA backends than the last trace's got that trace's fake result from
# FakeTensorMode's cache: the flash kernel's layout, where the math kernel's is contiguous.

def attention(q, k, v):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
    return o.transpose(1, 2).contiguous().reshape(q.shape[0], q.shape[2], -1)


def test_a_trace_under_other_sdpa_backends_lays_out_their_result():
    """transformers' attention (a query transposed from its projection, ``.transpose(1, 2)
    .contiguous()`` of the result, then ``reshape``): flash on the CPU returns the query's
    layout, math a contiguous one, so the copy is real under math only. Each backend set
    compiles once and every call equals eager's (a hit of the flash set again)."""
    q = torch.randn(1, 6, 4, 16).transpose(1, 2)
    k, v = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    jf = trident.jit(attention)
    backends = [None, [SDPBackend.MATH], None, [SDPBackend.MATH]]
    for n, chosen in enumerate(backends):
        with sdpa_kernel(chosen) if chosen else contextlib.nullcontext():
            for _ in range(2):
                assert torch.equal(jf(q, k, v), attention(q, k, v)), n
    assert counts(jf) == (2, 6, 0), jf.stats.miss_reasons


# ---- Note [Module dicts] (lower/state/chain.py) -----------------------------------------------
# A module's attributes are read from its dict, where ``__dict__`` is not: ``m.__dict__["K"]``
# read ``__dict__`` as an absent name, which held at every call.

K = 2.0
THIS = sys.modules[__name__]
MODULE_DICT_READS = {
    "m.__dict__[k]": (lambda x: x * THIS.__dict__["K"], "K"),
    "vars(m)[k]": (lambda x: x * vars(THIS)["K"], "K"),
    "m.__dict__.get(k)": (lambda x: x * THIS.__dict__.get("K", 1.0), "K"),
    "k in m.__dict__": (lambda x: x * (3.0 if "K2" in THIS.__dict__ else 1.0), "K2"),
    "sys.modules[m].__dict__[k]": (lambda x: x * sys.modules[__name__].__dict__["K"], "K"),
    "library module": (lambda x: x * math.__dict__["pi"], "pi"),
    "vars(library module)": (lambda x: x * vars(math)["e"], "e"),
}


@pytest.mark.parametrize("name", sorted(MODULE_DICT_READS))
def test_a_modules_dict_read_by_key_is_guarded(name):
    fn, key = MODULE_DICT_READS[name]
    owner = math if key in ("pi", "e") else THIS
    saved = owner.__dict__.get(key, None)
    x = torch.ones(3)
    jf = trident.jit(fn)
    try:
        for value in (None, 5.0, 7.0, None):
            if value is None:
                owner.__dict__.pop(key, None)
                if saved is not None:
                    setattr(owner, key, saved)
            else:
                setattr(owner, key, value)
            for _ in range(2):
                assert torch.equal(jf(x), fn(x)), (name, value)
    finally:
        owner.__dict__.pop(key, None)
        if saved is not None:
            setattr(owner, key, saved)
    # the first value, the two changes; the first again reinstalls its specialization
    assert counts(jf) == (3, 5, 0), (name, jf.stats.miss_reasons)


# ---- Note [Enum values] (identity.py) ---------------------------------------------------------
# An enum member was named by its class and name in every process, not its value: a source
# edited between two processes loaded the old value's specialization.

ENUM_SOURCE = textwrap.dedent('''
    import enum

    class Mode(enum.Enum):
        A = 2.0
        B = (1, "b")

    def by_value(x):
        return x * Mode.A.value

    def by_tuple_value(x):
        return x * Mode.B.value[0]

    def by_identity(x, mode=Mode.A):
        return x * (2.0 if mode is Mode.A else 3.0)
''')
ENUM_EDITS = [("A = 2.0", "A = 5.0"), ('B = (1, "b")', 'B = (4, "b")')]


def _run_enum_cases(folder) -> dict:
    x = torch.ones(3)
    out = {}
    with fresh_imports(folder):
        module = importlib.import_module("enum_user")
        for name in ("by_value", "by_tuple_value", "by_identity"):
            fn = getattr(module, name)
            jf = trident.jit(fn)
            got = [jf(x) for _ in range(2)]
            assert all(torch.equal(g, fn(x)) for g in got), name
            out[name] = (counts(jf), fn(x)[0].item())
    return out


def test_an_enum_value_edited_between_processes_is_another_state(tmp_path):
    """Each process is a fresh import of the module (``fresh_imports``): one compiles, the
    source's values are edited, the next must compile again, and a third with the first
    source hits the first process's specializations."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "enum_user.py").write_text(ENUM_SOURCE)
    first = _run_enum_cases(folder)
    edited = ENUM_SOURCE
    for old, new in ENUM_EDITS:
        edited = edited.replace(old, new)
    (folder / "enum_user.py").write_text(edited)
    second = _run_enum_cases(folder)
    (folder / "enum_user.py").write_text(ENUM_SOURCE)
    third = _run_enum_cases(folder)
    for name in first:
        assert first[name][0] == (1, 1, 0), (name, first[name])
        assert third[name] == ((0, 2, 0), first[name][1]), (name, third[name])
    assert second["by_value"] == ((1, 1, 0), 5.0)
    assert second["by_tuple_value"] == ((1, 1, 0), 4.0)


# ---- Note [Module forwards] (lower/state/roots.py) --------------------------------------------
# Module.__call__ finds forward through the module's class; a library class's forward was read
# by no chain, so one patched on the class after the trace was never run by a hit.

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.norm = Norm(4)

    def forward(self, x):
        return self.norm(self.lin(x))


class Norm(torch.nn.LayerNorm):  # a user class whose forward is the library's
    pass


def _doubled(forward):
    def patched(self, x):
        return forward(self, x) * 2
    return patched


@pytest.mark.parametrize("owner", [torch.nn.Linear, torch.nn.LayerNorm, Norm])
def test_a_forward_patched_on_a_modules_class_after_the_trace_is_run(owner):
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 4)
    jf = trident.jit(net)
    had = "forward" in vars(owner)
    original = owner.forward
    try:
        with torch.no_grad():
            for patch in (False, True, False):
                if patch:
                    owner.forward = _doubled(original)
                elif had:
                    owner.forward = original
                else:
                    vars(owner).get("forward") and delattr(owner, "forward")
                for _ in range(2):
                    assert torch.equal(jf(x), net(x)), (owner, patch)
    finally:
        if had:
            owner.forward = original
        elif "forward" in vars(owner):
            delattr(owner, "forward")
    # unpatched, patched, unpatched again (its specialization reinstalled)
    assert counts(jf) == (2, 4, 0), jf.stats.miss_reasons


def test_a_transformers_layer_class_patched_between_generates_is_run():
    """A kernel library's way: ``LlamaRMSNorm.forward`` replaced on the class after the first
    generate (``model.forward = trident.jit(model.forward)``, static cache); every token and
    logit as eager's, and the restored class hits the first specializations."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    forward = model.forward
    jf = trident.jit(forward)
    ids = torch.randint(0, 96, (1, 6))
    kw = dict(max_new_tokens=3, do_sample=False, cache_implementation="static",
              output_logits=True, return_dict_in_generate=True, disable_compile=True)
    original = modeling_llama.LlamaRMSNorm.forward
    try:
        for patch in (False, True, False):
            modeling_llama.LlamaRMSNorm.forward = _doubled(original) if patch else original
            model.forward = forward
            ref = model.generate(ids, **kw)
            model.forward = jf
            out = model.generate(ids, **kw)
            assert torch.equal(out.sequences, ref.sequences), patch
            assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits)), patch
    finally:
        modeling_llama.LlamaRMSNorm.forward = original
    # the prefill and the decode step per state; the restored class hits
    assert counts(jf) == (4, 5, 0), jf.stats.miss_reasons


# ---- Note [Object roots] (lower/state/chain.py): a property's getter ---------------------------
# A function that ran is read by a path from its module; a property's getter (qualname
# ``C.prop``, whose path finds the property) had none: its specialization served its process
# only, and every new process compiled it again (issue 27).

PROPERTY_SOURCE = textwrap.dedent('''
    import typing

    class Knobs:
        @property
        def scale(self):
            return 2.0

    class Pair(typing.NamedTuple):
        a: float = 2.0

    def by_property(knobs, x):
        return x * knobs.scale

    def by_namedtuple_default(x):
        return x * Pair().a
''')


def _run_warm(folder, name: str) -> tuple:
    x = torch.ones(3)
    with fresh_imports(folder):
        module = importlib.import_module("warm_user")
        fn = getattr(module, name)
        args = (module.Knobs(), x) if name == "by_property" else (x,)
        jf = trident.jit(fn)
        for _ in range(2):
            assert torch.equal(jf(*args), fn(*args)), name
        return counts(jf), fn(*args)[0].item()


@pytest.mark.parametrize("name", [
    "by_property",
    "by_namedtuple_default",  # (Note [Reached roots]: m.Pair.__new__, by its name there)
])
def test_a_new_process_hits_what_a_user_class_serves(tmp_path, name):
    """The second process hits the first's specialization; an edit of the value the class
    serves compiles again, with eager's result."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "warm_user.py").write_text(PROPERTY_SOURCE)
    assert _run_warm(folder, name) == ((1, 1, 0), 2.0)
    assert _run_warm(folder, name) == ((0, 2, 0), 2.0)
    (folder / "warm_user.py").write_text(PROPERTY_SOURCE.replace("2.0", "5.0"))
    assert _run_warm(folder, name) == ((1, 1, 0), 5.0)


# ---- a user function that library code finds in library state ---------------------------------

def _attention_plain(module, q, k, v, mask, **kw):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, q, k, v, mask, **kw)


def _attention_doubled(module, q, k, v, mask, **kw):
    out, weights = _attention_plain(module, q, k, v, mask, **kw)
    return out * 2, weights


def test_an_attention_function_registered_again_under_its_name_is_run():
    """A user function that transformers finds in its AttentionInterface registry (library
    state): registering another under the same name is seen, and compiles again."""
    transformers = pytest.importorskip("transformers")
    from transformers import AttentionInterface

    plain, doubled = _attention_plain, _attention_doubled
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    AttentionInterface.register("break38", plain)
    model.config._attn_implementation = "break38"
    jf = trident.jit(model)
    ids = torch.randint(0, 96, (1, 6))
    try:
        with torch.no_grad():
            for attn in (plain, doubled):
                AttentionInterface.register("break38", attn)
                for _ in range(2):
                    assert torch.equal(jf(ids).logits, model(ids).logits), attn.__name__
    finally:
        AttentionInterface._global_mapping.pop("break38", None)
    # Note [Library registries] (lower/state/roots.py): the registry is read whole
    assert counts(jf) == (2, 2, 0), jf.stats.miss_reasons
