"""Dynamic dims: symbolic sizes through Torch-MLIR, the plan and the generated C (Note [Symbolic
sizes], Note [Symbolic guards], Note [Automatic dynamic]). Every call is compared with eager
PyTorch bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import trident

H, D = 4, 16


def decode_step(x, kc, vc, wq, wk, wv, wo):
    q = (x @ wq).view(1, 1, H, D).transpose(1, 2)
    k = (x @ wk).view(1, 1, H, D).transpose(1, 2)
    v = (x @ wv).view(1, 1, H, D).transpose(1, 2)
    kc = torch.cat([kc, k], dim=2)
    vc = torch.cat([vc, v], dim=2)
    a = F.scaled_dot_product_attention(q, kc, vc)
    return a.transpose(1, 2).reshape(1, 1, H * D) @ wo, kc, vc


def model(seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(H * D, H * D, generator=g) / 8 for _ in range(4)]
    kc, vc = torch.randn(1, H, 1, D, generator=g), torch.randn(1, H, 1, D, generator=g)
    return g, weights, kc, vc


def test_decode_loop_of_512_steps_compiles_twice_and_equals_eager():
    f = trident.jit(decode_step)
    g, weights, kc, vc = model()
    ekc, evc = kc, vc
    for step in range(512):  # KV length 1, 2, ..., 512
        x = torch.randn(1, 1, H * D, generator=g)
        out, kc, vc = f(x, kc, vc, *weights)
        want, ekc, evc = decode_step(x, ekc, evc, *weights)
        assert torch.equal(out, want) and torch.equal(kc, ekc) and torch.equal(vc, evc), step
    s = f.stats
    assert (s.compiles, s.misses, s.hits) == (2, 2, 510)
    assert "kc.size(2) == 1 expected, got 2" in s.miss_reasons[1]
    # kc and vc: [?, 4, ?, 16], x: [?, 1, 64]; the batch of one is a symbol (Note [Batch dims]
    # in trident/frontend/batch.py) that the view of one row guards == 1
    assert f.specializations[1].count("?") == 5


def test_static_and_dynamic_specializations_coexist():
    f = trident.jit(decode_step)
    g, weights, kc, vc = model()
    x = torch.randn(1, 1, H * D, generator=g)
    f(x, kc, vc, *weights)  # length 1: static
    long_k, long_v = torch.randn(1, H, 9, D), torch.randn(1, H, 9, D)
    f(x, long_k, long_v, *weights)  # length 9: dynamic
    assert f._select(x, kc, vc, *weights) == 0
    assert f._select(x, long_k[:, :, :5].contiguous(), long_v[:, :, :5].contiguous(),
                    *weights) == 1
    for n in (1, 3, 30):
        k, v = torch.randn(1, H, n, D), torch.randn(1, H, n, D)
        got, want = f(x, k, v, *weights), decode_step(x, k, v, *weights)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert f.stats.compiles == 2


def test_dynamic_true_traces_symbolic_sizes_from_the_first_call():
    f = trident.jit(dynamic=True)(decode_step)
    g, weights, _, _ = model()
    x = torch.randn(1, 1, H * D, generator=g)
    for n in (5, 6, 17):
        k, v = torch.randn(1, H, n, D), torch.randn(1, H, n, D)
        got, want = f(x, k, v, *weights), decode_step(x, k, v, *weights)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert f.stats.compiles == 1 and "?" in f.specializations[0]


def decode_step_again(x, kc, vc, wq, wk, wv, wo):  # its own cache entry
    return decode_step(x, kc, vc, wq, wk, wv, wo)


def test_per_argument_hint_and_mark_dynamic():
    g, weights, _, _ = model()
    x = torch.randn(1, 1, H * D, generator=g)
    hinted = trident.jit(dynamic={"kc": [2], "vc": [2]})(decode_step)
    marked = trident.jit(decode_step_again)
    for n in (4, 7, 12):
        k, v = torch.randn(1, H, n, D), torch.randn(1, H, n, D)
        want = decode_step(x, k, v, *weights)
        assert all(torch.equal(a, b) for a, b in zip(hinted(x, k, v, *weights), want))
        torch._dynamo.mark_dynamic(k, 2)
        torch._dynamo.mark_dynamic(v, 2)
        assert all(torch.equal(a, b) for a, b in zip(marked(x, k, v, *weights), want))
    assert (hinted.stats.compiles, marked.stats.compiles) == (1, 1)
    assert "kc: float32[1, 4, ?, 16]" in hinted.specializations[0]


def test_dynamic_false_specializes_every_size():
    f = trident.jit(dynamic=False)(decode_step)
    g, weights, _, _ = model()
    x = torch.randn(1, 1, H * D, generator=g)
    for n in (2, 3, 4):
        f(x, torch.randn(1, H, n, D), torch.randn(1, H, n, D), *weights)
    assert f.stats.compiles == 3 and "?" not in "".join(f.specializations)


def size_arithmetic(x):
    rows = x.shape[0] * 2
    halves = x.reshape(rows, x.shape[1] // 2)
    return halves.sum(0) + torch.zeros(x.shape[0] - 1).sum(), halves.new_ones(rows // 4 + 1)


def test_size_arithmetic_runs_in_c():
    f = trident.jit(dynamic=True)(size_arithmetic)
    for n in (4, 5, 9, 40):
        x = torch.randn(n, 6)
        got, want = f(x), size_arithmetic(x)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert f.stats.compiles == 1
    source = f.source()
    assert "s[0] = TRT_I(a[1].sizes[0]);" in source  # x.shape[0], read from the argument
    assert "trt_floordiv_ck(" in source and "TRT_IL(il" in source  # rows // 4, checked (Note
    # [Checked size steps]); a computed list


def branches_on_size(x):
    if x.shape[0] > 8:
        return x * 2
    return x * 3


def test_guards_keep_what_the_trace_assumed():
    f = trident.jit(dynamic=True)(branches_on_size)
    for n in (12, 20, 4, 9, 8, 3):
        x = torch.randn(n, 3)
        assert torch.equal(f(x), branches_on_size(x))
    assert f.stats.compiles == 2  # one per branch, each guarded by its condition
    assert any("> 8" in s or "<= 8" in s or "8 <" in s or "< 9" in s or ">= 9" in s
               for s in f.stats.miss_reasons), f.stats.miss_reasons


def test_size_one_is_specialized():
    f = trident.jit(dynamic=True)(decode_step)
    g, weights, kc, vc = model()
    x = torch.randn(1, 1, H * D, generator=g)
    got, want = f(x, kc, vc, *weights), decode_step(x, kc, vc, *weights)  # length 1
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    kc_shape = f.specializations[0].split("kc: float32[")[1].split("]")[0].split(", ")
    assert kc_shape[2] == "1"  # the length-1 dim is static; the others are symbolic


triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def triton_on_dynamic_size(x):
    out = torch.empty_like(x)
    double_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out + 1


def test_triton_launch_over_a_dynamic_size_computes_its_arguments_in_c():
    """Note [Symbolic launches]: ``n`` and the grid follow the size; one dynamic
    specialization serves every size whose ``n % 16`` is nonzero, as Triton's binder would."""
    f = trident.jit(triton_on_dynamic_size)
    for n in (10, 11, 12, 13, 35):
        x = torch.randn(n)
        assert torch.equal(f(x), x * 2 + 1)  # the kernel runs in Triton's interpreter
    assert (f.stats.compiles, f.stats.hits, f.stats.fallbacks) == (2, 3, 0)
    assert f.specializations[1] == "triton_on_dynamic_size(x: float32[?] cpu)"


def halves(x):
    return x.view(x.shape[0] // 2, -1) * 2


def test_size_arithmetic_with_max_and_miss_reasons_name_the_sizes():
    """``view(n // 2, -1)`` guards ``Max(1, ...)``, rendered to C; a dynamic specialization's
    miss reason names the sizes its failed guard read."""
    f = trident.jit(halves)
    for n in (4, 6, 8, 10):
        x = torch.randn(n, 3)
        assert torch.equal(f(x), halves(x))
    assert (f.stats.compiles, f.stats.hits) == (2, 2)
    assert "Max" not in f.source() and "? (" in f.source()
    g = trident.jit(lambda x: x * 2, dynamic=True)
    g(torch.ones(1, 8))
    g(torch.ones(3, 8))
    assert g.stats.miss_reasons[-1].startswith("x.size(0) == 1 is false (x.size(0) = 3)")


def test_dynamic_false_keeps_to_static_specializations():
    """A jit with ``dynamic=False`` does not serve calls from a symbolic specialization that
    another jit of the same function stored in the cache."""
    def double(x):
        return x * 2

    auto = trident.jit(double)
    for n in (3, 4):
        auto(torch.ones(n))
    static = trident.jit(double, dynamic=False)
    for n in (5, 6):
        assert torch.equal(static(torch.ones(n)), torch.full((n,), 2.0))
    assert [s[s.index("(x"):] for s in static.specializations] == [
        "(x: float32[3] cpu)", "(x: float32[5] cpu)", "(x: float32[6] cpu)"]


def test_strided_views_trace_with_symbolic_strides_and_offsets():
    """A view's strides and storage offset may be symbols of their own (``stride(0) = s37*s49``
    read before ``stride(1) = s37``); every symbol is sourced before any guard reads it."""
    f = trident.jit(lambda x: x * 2, dynamic=True)
    base = torch.randn(9, 8)
    for x in (base[1:, ::2], base[2:, ::2], base[1:7, 1::3]):
        assert torch.equal(f(x), x * 2)
    # the second view hits the first's specialization; the third has another stride relation
    assert (f.stats.compiles, f.stats.hits, f.stats.fallbacks) == (2, 1, 0)
    assert all("?" in s for s in f.specializations)


def test_dynamic_dict_is_checked():
    with pytest.raises(trident.TridentError, match="'kv', which is not a parameter"):
        trident.jit(lambda x: x + 1, dynamic={"kv": [0]})
    with pytest.raises(trident.TridentError, match=r"dynamic\['x'\] must be a list of dims"):
        trident.jit(lambda x: x + 1, dynamic={"x": 0})
    f = trident.jit(lambda x: x + 1, dynamic={"x": [3]})
    with pytest.warns(UserWarning, match=r"dynamic dims \[3\] of x, which has 2 dims"):
        assert torch.equal(f(torch.ones(2, 2)), torch.full((2, 2), 2.0))  # eagerly
    with pytest.raises(trident.TridentError, match=r"dynamic dims \[3\] of x, which has 2 dims"):
        trident.jit(lambda x: x + 1, dynamic={"x": [3]}, fallback=False)(torch.ones(2, 2))



class _Counter:
    """An object holding ints, as a transformers cache holds ``max_cache_len``."""

    def __init__(self, n: int, limit: int = 100):
        self.n, self.limit = n, limit


def test_int_attributes_become_symbols_after_one_change():
    """Note [Int leaves] (trident/frontend/policy.py): an int attribute that changed is a leaf
    traced as a symbol; a branch on it is a guard, an int never read is not guarded, and one
    the graph takes as a value (a slice bound) is read in C as a size is."""
    @trident.jit
    def branch(x, c):
        return x - 1 if c.n > c.limit else x + c.limit

    @trident.jit
    def unread(x, c):
        return x * 2 + c.limit

    @trident.jit
    def sliced(x, c):
        return x[: c.n] * 2

    x = torch.randn(300)
    for f in (branch, unread, sliced):
        for n in (3, 4, 5, 6, 200, 7):
            assert torch.equal(f(x, _Counter(n)), f.__wrapped__(x, _Counter(n)))
    # n: its value (3), then a symbol with n <= 100, then n > 100
    assert (branch.stats.compiles, branch.stats.hits) == (3, 3), branch.stats
    assert "c.n <= 100 is false (c.n = 200)" in branch.stats.miss_reasons[-1]
    # n is never read by unread: its tree never holds it
    assert (unread.stats.compiles, unread.stats.hits) == (1, 5), unread.stats
    # sliced: the symbolic trace takes n as a value (a slice bound), computed in C; past the
    # tensor's end the slice stops at 300, as eager's (a guard on n's side of 300)
    assert (sliced.stats.compiles, sliced.stats.traces) == (2, 2), sliced.stats
    for n in (400, 8):
        assert torch.equal(sliced(x, _Counter(n)), sliced.__wrapped__(x, _Counter(n)))
    assert (sliced.stats.compiles, sliced.stats.hits) == (3, 5), sliced.stats
    assert branch.explain(x, _Counter(300)).count("c.n") >= 1


def test_a_new_structure_after_a_change_traces_the_changed_ints_sizes_symbolic():
    """Note [Ints by path] (trident/frontend/ints.py): a prefill that allocates a cache of
    ``c.n`` rows, then a decode step that reads the cache (another argument structure, met
    only after ``c.n`` changed): its tensor dims of the size of an int that changed (``keys``'
    dim 0, ``c.n`` rows) are symbolic from its first compile, as a static cache's keys are,
    so the decode step compiles once, not at ``c.n``'s size first and symbolic after."""
    @trident.jit
    def step(x, c, keys=None):
        if keys is None:  # the prefill
            out = x.new_zeros(c.n, 4)
            out[: x.shape[0]] = x
            return out
        return keys * 2 + x

    calls = [(torch.randn(5, 4), _Counter(6), None), (torch.randn(3, 4), _Counter(9), None),
             (torch.randn(1, 4), _Counter(9), torch.randn(9, 4)),
             (torch.randn(1, 4), _Counter(12), torch.randn(12, 4)),
             (torch.randn(7, 4), _Counter(11), None),
             (torch.randn(1, 4), _Counter(11), torch.randn(11, 4))]
    for x, c, keys in calls:
        assert torch.equal(step(x, c, keys), step.__wrapped__(x, c, keys))
    # the prefill at its sizes, then symbolic; the decode step symbolic at once
    s = step.stats
    assert (s.compiles, s.hits, s.fallbacks) == (3, 3, 0), s.miss_reasons
    assert "keys: float32[?, 4]" in step.specializations[2], step.specializations[2]


def test_a_batch_of_one_shares_the_attention_traced_for_other_batches():
    """Note [Kept attention] (trident/lower/decompositions.py): a decode step's attention with
    a boolean mask of the batch, at batches 2, then 4 (the batch symbolic), then 1: torch
    2.11's SDPA body checks the mask's batch against 1, which no longer guards the batch of
    the kept op, so the batch of one hits; every output equals eager's."""
    @trident.jit
    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    for batch in (2, 4, 1):
        q, k, v = (torch.randn(batch, 4, n, 16) for n in (1, 9, 9))
        mask = torch.rand(batch, 1, 1, 9) > 0.3
        assert torch.equal(attend(q, k, v, mask), attend.__wrapped__(q, k, v, mask))
    assert (attend.stats.compiles, attend.stats.hits, attend.stats.fallbacks) == (2, 1, 0), \
        attend.stats
