"""The native read of a tensor leaf (read_arg in runtime/args.cpp) against the Python reference
(guards.first_failure over the leaves' facts), for the tensor kinds test_guards.py's generator
does not make. Each tensor below is called after a plain tensor's specialization of the same
dtype and shape exists: one the runtime leaves to Python (a key bit of its own, another layout
or device, a forward-AD dual) must not be accepted natively, and one it reads (an inference
tensor, one that requires grad, a Parameter, a misaligned view, an empty tensor) must be
accepted exactly where the Python reference accepts it. Every result is eager's."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

import trident
from trident.ir.guards import first_failure


def probe(x):
    return x * 2


def native(jf, args) -> int:
    return jf._select(*args)


def reference(jf, args) -> int:
    try:
        call = jf._flatten(args, {})
    except trident.TridentError:
        return -1
    for i, spec in enumerate(jf._specs):
        if spec.tree == call.tree.key and first_failure(spec.guards, call.leaves) is None:
            return i
    return -1


def _compiled(*bases):
    jf = trident.jit(probe)
    for x in bases:
        jf(x)
    assert jf.stats.compiles == len(bases) and jf.stats.fallbacks == 0
    for i, x in enumerate(bases):
        assert native(jf, (x,)) == reference(jf, (x,)) == i
    return jf


def test_tensors_left_to_python_are_never_accepted_natively():
    jf = _compiled(torch.ones(3), torch.ones(3, dtype=torch.complex64), torch.ones(2, 2))
    left = {
        "negative view": torch.ones(3)._neg_view(),
        "ZeroTensor": torch._efficientzerotensor(3),
        "conjugate view": torch.ones(3, dtype=torch.complex64).conj(),
        "sparse": torch.ones(2, 2).to_sparse(),
        "meta": torch.ones(3, device="meta"),
        "nested": torch.nested.nested_tensor([torch.ones(3), torch.ones(3)]),
    }
    for name, x in left.items():
        assert native(jf, (x,)) == -1, name
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.ones(3), torch.ones(3))
        assert native(jf, (dual,)) == -1
        with torch.no_grad():
            got = jf(dual)
        assert torch.equal(fwAD.unpack_dual(got).tangent, torch.full((3,), 2.0))
    for name, x in left.items():
        if name != "meta":
            want, got = probe(x), jf(x)
            assert type(got) is type(want) and got.layout == want.layout, name
            if not x.is_nested:
                assert torch.equal(got.to_dense() if got.is_sparse else got,
                                   want.to_dense() if want.is_sparse else want), name
    assert jf.stats.compiles == 3


def test_tensors_read_natively_agree_with_the_reference():
    with torch.inference_mode():
        inference = torch.ones(3)
    jf = _compiled(torch.ones(3), inference, torch.nn.Parameter(torch.ones(3), requires_grad=False))
    with_attribute = torch.ones(3)
    with_attribute.scale = 2.0
    calls = [torch.ones(3), inference, torch.nn.Parameter(torch.ones(3), requires_grad=False),
             torch.ones(3, requires_grad=True), torch.nn.Parameter(torch.ones(3)),
             torch.ones(4)[1:], torch.ones(0), with_attribute, torch.ones(3, dtype=torch.float64),
             torch.ones(2, 3).t()[0], torch.ones(6)[::2]]
    for x in calls:
        assert native(jf, (x,)) == reference(jf, (x,)), x
    assert [native(jf, (x,)) for x in calls[:5]] == [0, 1, 2, -1, -1]
    with torch.no_grad():
        for x in calls:
            assert torch.equal(jf(x), probe(x))


def scaled(x, use: bool):
    return x * getattr(x, "scale", 1.0) if use else x * 2


def test_attributes_are_read_where_any_installed_specialization_guards_them():
    """Note [Attribute reads] in runtime/args.cpp: the first specialization does not guard its
    tensor's attributes, the second does; a tensor that gains one is read as having it."""
    jf = trident.jit(scaled)
    x = torch.ones(3)
    assert torch.equal(jf(x, False), scaled(x, False))
    assert torch.equal(jf(x, True), scaled(x, True))
    assert jf.stats.compiles == 2
    y = torch.ones(3)
    y.scale = 3.0
    assert native(jf, (y, False)) == 0 and native(jf, (y, True)) == reference(jf, (y, True)) == -1
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(jf(y, True), scaled(y, True))
            assert torch.equal(jf(y, False), scaled(y, False))
