"""``explain`` on specializations another process stored (issue 27, Note [Stored trees] in
trident/ir/trees.py): a process that had no call of a stored specialization's argument tree
names where a call departs from it, or its failing guards, as it does for its own. A second
``trident.jit`` object over the same function (``as_in_a_new_process``) stands for the new
process: it installs the stored specializations and knows none of their trees."""

from __future__ import annotations

import re
import shutil
import types
import warnings

import pytest
import torch

import trident
from _trident_helpers import as_in_a_new_process


class Box:
    def __init__(self, n: int):
        self.w = torch.ones(n)


def scale(x, box):
    return x * box.w


def test_a_stored_tree_is_named_path_by_path(trident_cache):
    first = trident.jit(scale)
    first(torch.ones(4), Box(4))
    folder = next((trident_cache / "functions").iterdir())
    assert len(list((folder / "trees").glob("*.json.gz"))) == 1
    as_in_a_new_process()
    again = trident.jit(scale)
    more = Box(4)
    more.bias = torch.zeros(4)
    assert again.explain(torch.ones(4), more) == (
        "specialization 0 (scale(x: float32[4] cpu, box.w: float32[4] cpu)): box: 'bias' added")
    assert again.explain(torch.ones(4), [torch.ones(4)]).endswith(
        "): box: builtins.list of 1 where test_explain_stored.Box with ['w'] was compiled")
    # the same structure: its guards, as before
    assert again.explain(torch.ones(8), Box(8)).endswith(
        "): x.size(0) == 4 expected, got 8; box.w.size(0) == 4 expected, got 8")
    assert again.explain(torch.ones(4), Box(4)).endswith("accepts these arguments")
    assert again.stats.compiles == again.stats.traces == 0  # explain compiles nothing
    shutil.rmtree(folder / "trees")  # an entry stored before the trees were: less said
    as_in_a_new_process()
    assert trident.jit(scale).explain(torch.ones(4), more).endswith(
        "): another argument structure")


def test_a_damaged_stored_tree_is_not_read(trident_cache):
    trident.jit(scale)(torch.ones(4), Box(4))
    stored = next((trident_cache / "functions").glob("*/trees/*.json.gz"))
    stored.write_bytes(stored.read_bytes()[:100])  # truncated
    as_in_a_new_process()
    more = Box(4)
    more.bias = torch.zeros(4)
    assert trident.jit(scale).explain(torch.ones(4), more).endswith(
        "): another argument structure")


def test_stored_trees_are_bounded_per_function(trident_cache):
    for n in range(6):  # six argument trees, each compiled by a process of its own
        box = Box(3)
        for i in range(n):
            setattr(box, f"extra{i}", i)
        as_in_a_new_process()
        trident.jit(scale, max_specializations=2)(torch.ones(3), box)
    folder = next((trident_cache / "functions").iterdir())
    assert len(list((folder / "trees").glob("*.json.gz"))) == 4  # as its specs: 2 * 2


TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=96)


def test_a_hugging_face_forward_loaded_from_disk(trident_cache):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    calls = []  # what generate passes forward, as docs/huggingface.md records it
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append((args, kwargs)),
                                    with_kwargs=True)
    forward = model.forward
    model.forward = trident.jit(forward)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.generate(torch.randint(0, 96, (1, 6)), max_new_tokens=2, do_sample=False,
                       cache_implementation="static", disable_compile=True)
    assert model.forward.stats.compiles == 2
    as_in_a_new_process()
    model.forward = again = trident.jit(forward)
    (prefill_args, prefill), (decode_args, decode) = calls[0], calls[1]
    with torch.no_grad():
        # the prefill's cache as it is now: generate's prefill gave its layers their sizes
        lines = again.explain(*prefill_args, **prefill).splitlines()
        # (transformers 5.17's StaticLayer also gets its 'dtype' there, and its forward names
        # the cache past_key_values; 5.25's has the dtype before and names it cache)
        assert lines[0].endswith("'device' added, 'batch_size' added, 'num_heads' added, "
                                 "'v_head_dim' added, 'k_head_dim' added")
        assert re.search(r"\): (cache|past_key_values)\.layers\[0\]: '", lines[0]), lines[0]
        lines += again.explain(*decode_args, **{**decode, "input_ids": decode["input_ids"].int()
                                                }).splitlines()
    print("\n".join(lines))
    assert lines[1].endswith("): keyword arguments: 'attention_mask' removed")  # the decode's
    assert lines[2].endswith("): keyword arguments: 'attention_mask' added")  # the prefill's
    assert lines[3].endswith("): input_ids.dtype == int64 expected, got 'int32'")
    assert again.stats.compiles == 0 and "another argument structure" not in "\n".join(lines)


def test_two_functions_of_one_argument_structure_store_no_identical_files(trident_cache):
    """No byte-identical files in the cache (issue 27): a tree's file names its function."""
    trident.jit(scale)(torch.ones(4), Box(4))
    trident.jit(lambda x, box: x + box.w)(torch.ones(4), Box(4))
    trees = sorted((trident_cache / "functions").glob("*/trees/*.json.gz"))
    assert len(trees) == 2 and trees[0].name == trees[1].name  # one tree key
    assert trees[0].read_bytes() != trees[1].read_bytes()


def test_a_new_processs_first_miss_of_another_structure_says_how_many_it_has(trident_cache):
    # the new-user trial read "a new argument structure" as a fault where it expected "first
    # call": the reason says that specializations exist and none has the call's structure
    more = Box(4)
    more.bias = torch.zeros(4)
    first = trident.jit(scale)
    first(torch.ones(4), Box(4))
    first(torch.ones(4), more)
    assert first.stats.compiles == 2
    as_in_a_new_process()
    again = trident.jit(scale)
    other = types.SimpleNamespace(w=torch.ones(4))
    assert torch.equal(again(torch.ones(4), other), scale(torch.ones(4), other))
    assert again.stats.miss_reasons == [
        "a new argument structure (none of its 2 specializations has it)"], again.stats
