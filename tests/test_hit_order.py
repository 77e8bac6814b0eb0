"""The order in which a hit checks its argument trees (Note [Unchanged subtrees] in
trident/runtime/tree_eval.cpp): a call of one structure checks a model's subtree once, not
once per installed tree tried before its own.

A decode step of a Hugging Face forward has two trees installed, the prefill's and its own;
each was a full check of the model (its unchanged pass) before the one that held."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trident
from _trident_helpers import python_calls

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    def forward(self, *args, **kwargs):  # as transformers 5's forward: keywords in a new dict
        x = kwargs["x"]
        if "mask" in kwargs:
            x = x * kwargs["mask"]
        for b in self.blocks:
            x = b(x)
        return x


def with_mask(m, x, mask=None):
    x = m.blocks[0](x)
    return x if mask is None else x * mask


def checks_of(jf, path: str) -> int:
    return sum(jf.tree_passes()[path])


@pytest.mark.parametrize("device", DEVICES)
def test_a_new_kwargs_structure_fails_at_its_shell_before_the_model(device):
    """self, the model, comes before **kwargs among the roots; the shell's keys are checked
    first, so a decode step (no mask) does not check the model in the prefill's tree."""
    torch.manual_seed(0)
    m = Net().to(device).eval()
    x, mask = torch.randn(2, 4, device=device), torch.rand(4, device=device)
    eager = m.forward
    jf = trident.jit(m.forward)
    with torch.no_grad():
        for _ in range(3):  # the prefill's tree first, then the decode step's (on CUDA: captured)
            assert torch.equal(jf(x=x, mask=mask), eager(x=x, mask=mask))
            assert torch.equal(jf(x=x), eager(x=x))
        before = checks_of(jf, "self")
        for _ in range(5):
            assert torch.equal(jf(x=x), eager(x=x))
        assert checks_of(jf, "self") - before == 5, jf.tree_passes()
        assert python_calls(jf, (), 3, x=x) == []
    assert jf.stats.compiles == 2 and jf.stats.fallbacks == 0, jf.stats


@pytest.mark.parametrize("device", DEVICES)
def test_the_tree_that_held_last_is_tried_first(device):
    """Two trees that differ after the model (mask None or a tensor): the second structure's
    calls check the model once each, in the tree that held at the last call; a change of
    structure still finds the other tree, and a change of the model is still seen."""
    torch.manual_seed(0)
    m = Net().to(device).eval()
    x, mask = torch.randn(2, 4, device=device), torch.rand(4, device=device)
    jf = trident.jit(with_mask)
    with torch.no_grad():
        for _ in range(3):  # compiled, warmed up, and on CUDA captured
            assert torch.equal(jf(m, x), with_mask(m, x))
            assert torch.equal(jf(m, x, mask), with_mask(m, x, mask))
        before = checks_of(jf, "m")
        for _ in range(5):
            assert torch.equal(jf(m, x, mask), with_mask(m, x, mask))
        assert checks_of(jf, "m") - before == 5, jf.tree_passes()
        assert torch.equal(jf(m, x), with_mask(m, x))  # the other tree, found after this one
        assert torch.equal(jf(m, x), with_mask(m, x))
        m.blocks[0].weight.add_(1.0)  # an in-place edit: seen in either tree
        assert torch.equal(jf(m, x, mask), with_mask(m, x, mask))
        m.blocks[0] = nn.Linear(4, 4).to(device)  # a submodule swapped
        for _ in range(2):  # on CUDA its weights moved: the graph is warmed up and recaptured
            assert torch.equal(jf(m, x), with_mask(m, x))
            assert torch.equal(jf(m, x, mask), with_mask(m, x, mask))
        assert python_calls(jf, (m, x, mask), 3) == []
    assert jf.stats.fallbacks == 0, jf.stats.miss_reasons
