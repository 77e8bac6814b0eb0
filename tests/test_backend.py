"""torch.compile(fn, backend="trident") on CPU graphs of ATen ops."""

import dataclasses
import functools
import gc
import re
import types
import warnings

import pytest
import torch

import trident
from _trident_helpers import assert_same, passes_through, run_python


def compiled_graph_count() -> int:
    return sum(row["specializations"] for row in trident.list_cache())


def mlp(x, w, b):
    h = torch.relu(x @ w + b)
    return h.sum(-1) * 2, h


def fresh(fn):
    """``fn`` with a code object of its own: ``backend_stats`` counts per frame code, and the
    freed graphs of other tests' calls of ``fn`` still count (Note [Backend graphs])."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def test_backend_is_found_without_importing_trident(subprocess_env):
    code = ("import sys, torch\n"
            "f = torch.compile(lambda x: torch.relu(x) + 1, backend='trident')\n"
            "x = torch.randn(5)\n"
            "assert torch.equal(f(x), torch.relu(x) + 1)\n"
            "print('trident' in sys.modules)\n")
    out = run_python(subprocess_env, "-c", code)
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_values_and_one_specialization_per_graph():
    torch._dynamo.reset()
    f = torch.compile(mlp, backend="trident")
    x, w, b = torch.randn(4, 8), torch.randn(8, 16), torch.randn(16)
    for _ in range(3):
        assert_same(f(x, w, b), mlp(x, w, b))
    assert compiled_graph_count() == 1


def test_graph_breaks_compile_every_graph():
    def broken(x, w):
        y = torch.relu(x @ w)
        torch._dynamo.graph_break()
        return (y * 3).sum(0)

    torch._dynamo.reset()
    f = torch.compile(broken, backend="trident")
    x, w = torch.randn(4, 8), torch.randn(8, 5)
    for _ in range(2):
        assert_same(f(x, w), broken(x, w))
    assert compiled_graph_count() == 2


def test_dynamic_shapes_stay_exact():
    torch._dynamo.reset()
    f = torch.compile(mlp, backend="trident", dynamic=True)
    w, b = torch.randn(8, 16), torch.randn(16)
    for n in (2, 3, 5, 3):
        x = torch.randn(n, 8)
        assert_same(f(x, w, b), mlp(x, w, b))


def test_a_dim_dynamo_made_symbolic_is_symbolic_from_the_first_call():
    """Note [Graph dims]: a prefill-like graph whose input's length Dynamo made symbolic (and
    passes as an int too) compiles once, not once more at the second length on a guard that
    ties the int to the length traced static (``s27 >= 498``)."""
    def prefill(ids, n):
        return ids[:, :n].cumsum(1) + torch.arange(ids.shape[1])

    torch._dynamo.reset()
    f = torch.compile(fresh(prefill), backend="trident", dynamic=True)
    for n in (9, 7, 12, 5):
        ids = torch.arange(2 * n).reshape(2, n)
        assert_same(f(ids, n), prefill(ids, n))
    s = trident.backend_stats(f)
    assert (s.compiles, s.fallbacks, s.hits) == (1, 0, 3), s


def test_an_int_dynamo_made_symbolic_is_compiled_once():
    """Dynamo passes an int it saw change as a SymInt graph input: one specialization serves
    every later value (the fresh-user trial's DynamicCache: a recompile per token)."""
    def head(x, n):
        return x[:n] * n + torch.arange(n)

    torch._dynamo.reset()
    f = torch.compile(head, backend="trident")
    x = torch.randn(16)
    for n in range(3, 12):
        assert_same(f(x, n), head(x, n))
    s = trident.backend_stats(f)
    assert (s.compiles, s.fallbacks) == (2, 0), s  # n = 3 (a constant to Dynamo), then n as a symbol
    assert s.hits == 7, s


def test_no_grad_and_inference_mode():
    torch._dynamo.reset()
    f = torch.compile(mlp, backend="trident")
    x, w, b = torch.randn(4, 8), torch.randn(8, 16), torch.randn(16)
    with torch.no_grad():
        assert_same(f(x, w, b), mlp(x, w, b))
    with torch.inference_mode():
        got, want = f(x, w, b), mlp(x, w, b)
    for a, c in zip(got, want):
        assert torch.equal(a, c)


def test_autograd_graphs_run_eagerly_with_correct_gradients():
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: (torch.relu(x @ w) * 2).sum(), backend="trident")
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 3, requires_grad=True)
    with pytest.warns(UserWarning, match=r"runs eagerly: x requires grad"):  # (Note [Names of
        f(x, w).backward()  # graph inputs]: not L_x_)
    assert trident.backend_stats(f).miss_reasons == [
        "graph 0: eager: x requires grad: Trident serves inference; autograd runs eagerly"]
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    (torch.relu(x @ w) * 2).sum().backward()
    assert torch.equal(got[0], x.grad) and torch.equal(got[1], w.grad)


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, k=2):
        y = self.lin(x) * k
        torch._dynamo.graph_break()
        return y + 1


def test_stats_and_explain_of_every_graph_of_a_compiled_function():
    """Note [Backend graphs]: the graphs of one compiled function, after a graph break too,
    counted together; explain reads each graph's inputs from the call's arguments."""
    torch._dynamo.reset()
    earlier = trident.backend_stats().compiles  # graphs of earlier tests, freed ones too
    own = fresh(mlp)
    f = torch.compile(own, backend="trident")
    x, w, b = torch.randn(4, 8), torch.randn(8, 16), torch.randn(16)
    for _ in range(3):
        assert_same(f(x, w, b), mlp(x, w, b))
    s = trident.backend_stats(f)
    assert (s.hits, s.misses, s.compiles, s.traces, s.fallbacks) == (2, 1, 1, 1, 0)
    assert s.miss_reasons == ["graph 0: first call"]
    assert trident.backend_stats(own) == s  # the compiled function, or what it compiled
    (graph,) = trident.backend_graphs(f)
    assert graph.stats == dataclasses.replace(s, miss_reasons=["first call"])
    lines = trident.backend_explain(f, x[:2], w, b).splitlines()
    assert lines[0].startswith("graph 0 (of mlp (") and lines[1].endswith(
        "x.size(0) == 4 expected, got 2")
    assert trident.backend_explain(f, x, w, b).endswith("accepts these arguments")

    m = Broken()
    g = torch.compile(m, backend="trident")
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(g(x[:, :4]), m(x[:, :4]))
    s = trident.backend_stats(g)
    assert (s.hits, s.misses, s.compiles, len(trident.backend_graphs(m))) == (2, 2, 2, 2)
    assert trident.backend_stats().compiles == earlier + 3  # every graph of the process
    with torch.no_grad():
        text = trident.backend_explain(g, x[:, :4]).splitlines()
    assert text[1].endswith("accepts these arguments")
    # Note [Graph origins]: a graph after the break is named by the module's class too
    line = Broken.forward.__code__.co_firstlineno  # the graphs' first ops: before, after the break
    assert text[0].startswith(f"graph 0 (of Broken.forward ({__file__}:{line + 1})")
    assert text[2].startswith(f"graph 1 (of Broken.forward ({__file__}:{line + 3})") and \
        text[2].endswith("after a graph break; its inputs are values of the frame at the "
                         "break, which explain() does not compute")


def test_a_new_number_of_threads_compiles_again():
    torch._dynamo.reset()
    f = torch.compile(fresh(mlp), backend="trident")
    x, w, b = torch.randn(4, 8), torch.randn(8, 16), torch.randn(16)
    threads = torch.get_num_threads()
    try:
        assert_same(f(x, w, b), mlp(x, w, b))
        torch.set_num_threads(threads + 1)
        assert_same(f(x, w, b), mlp(x, w, b))
    finally:
        torch.set_num_threads(threads)
    # Dynamo guards the number of threads: a second graph of the same nodes, served by the
    # first one's function (Note [Graphs of constants]), whose own guard compiles it again
    assert [g.stats.compiles for g in trident.backend_graphs(f)] == [2]
    assert trident.backend_stats(f).hits == 0
    # one graph's code, so one cache entry: its two specializations told apart by their guard
    (row,) = trident.list_cache()
    assert row["signatures"][0] == row["signatures"][1]
    assert row["apart"] == [[f"torch.get_num_threads() == {threads}"],
                            [f"torch.get_num_threads() == {threads + 1}"]]


@passes_through
def _decorated(ids, scale=2):
    return torch.relu(ids) * scale


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * 2


def test_reasons_and_signatures_name_the_users_arguments_and_dims():
    """Note [Names of graph inputs]: the door's miss reasons, explain and signatures name a
    graph input by its source in Python (``x``, ``self.lin.weight``, ``x.size(0)``), as
    ``trident.jit``'s do, not by Dynamo's parameter names (``L_x_``, ``s77``)."""
    torch._dynamo.reset()
    m = _Lin()
    f = torch.compile(m, backend="trident")
    misaligned = torch.randn(29)[1:].view(7, 4)  # Trident guards 16-byte alignment; Dynamo not
    with torch.no_grad():
        for x in (torch.randn(3, 4), torch.randn(5, 4), misaligned):
            assert torch.equal(f(x), m(x))
        explained = trident.backend_explain(f, torch.randn(2, 4)).splitlines()
    s = trident.backend_stats(f)
    assert s.miss_reasons == ["graph 0: first call", "graph 1: first call",
                              "graph 1: x.data_ptr() % 16 == 0 expected, got False "
                              "(specialization 0)"], s.miss_reasons
    assert explained[1].endswith("x.size(0) == 3 expected, got 2"), explained
    (first, symbolic) = trident.backend_graphs(f)
    text = "\n".join(explained + symbolic.specializations + first.specializations)
    assert "self.lin.weight: float32" in text and "x.size(0)=5, x: float32[?, 4] cpu" in text
    assert not re.search(r"\bL_|\bs\d+\b|L\[", text), text


def test_a_dynamo_source_in_python():
    """Note [Names of graph inputs]: the forms of Dynamo's source text (torch 2.11-2.13)."""
    from trident.frontend.graph_names import user_name

    assert [user_name(s) for s in (
        "L['x']", "L['self']._modules['layers']._modules['0']._parameters['weight']",
        "L['self']._buffers['mask']", "L['x'].size()[0]", "L['x'].stride()[1]", "G['W']",
        "L['kwargs']['input_ids']", "L['self'].cfg.n", "L['x'].storage_offset()", None)] == [
        "x", "self.layers[0].weight", "self.mask", "x.size(0)", "x.stride(1)", "W",
        "kwargs['input_ids']", "self.cfg.n", "x.storage_offset()", None]


def test_backend_explain_takes_arguments_either_way_through_a_decorator():
    """A decorator's ``wrapper(*args, **kwargs)`` is the frame Dynamo compiles: a graph
    compiled from a keyword call reads ``L['kwargs']['ids']``; explain with the same argument
    by position (or the other way round) answers for that graph, with no KeyError."""
    x = torch.randn(4)
    f = torch.compile(_decorated, backend="trident")
    assert torch.equal(f(ids=x), _decorated(ids=x))
    for args, kwargs, accepts in (((x,), {}, True), ((), {"ids": x}, True),
                                  ((x[:2],), {}, False)):
        text = trident.backend_explain(_decorated, *args, **kwargs).splitlines()
        assert text[0].startswith("graph 0 (of ") and "KeyError" not in "\n".join(text)
        assert text[1].endswith("accepts these arguments") == accepts, text


def _model_forward(fn):
    """One wrapper code for both models below, as transformers' decorators of every model's
    ``forward`` (``passes_through``'s code is other tests' too, whose freed graphs count)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class _Scaled(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((4,), float(scale)), requires_grad=False)

    @_model_forward
    def forward(self, x):
        return torch.relu(x) * self.scale


class _Shifted(_Scaled):
    @_model_forward
    def forward(self, x):
        return torch.relu(x) + self.scale


def test_graphs_of_decorated_forwards_are_each_their_models():
    """CI at ``6e7676d``: transformers decorates every model's ``forward`` with one wrapper,
    whose code Dynamo compiles for each; a frame without ``self`` (the module is the wrapper's
    ``args[0]``) matched every model, so ``backend_explain(qwen, ...)`` named a Llama graph
    that an earlier test kept alive. Each graph is its own module's (``frame_module``), while
    the other model's graph still lives. Nor is the graph after a break in another class's
    ``forward`` of this file theirs, once its module is freed (``compiled_from``: Dynamo's
    name of a resume function, ``torch_dynamo_resume_in_forward_at_N``, is every
    ``forward``'s; its line is one function's)."""
    torch._dynamo.reset()
    x = torch.randn(4)
    models = {"_Scaled": _Scaled(2), "_Shifted": _Shifted(3)}
    with torch.no_grad():
        broken = Broken()
        torch.compile(broken, backend="trident")(x)
        del broken
        gc.collect()
        for m in models.values():
            assert torch.equal(torch.compile(m.forward, backend="trident")(x), m(x))
    for name, m in models.items():
        (graph,) = trident.backend_graphs(m)
        s = trident.backend_stats(m)
        assert (s.misses, s.compiles, s.fallbacks) == (1, 1, 0), (name, s)
        with torch.no_grad():
            text = trident.backend_explain(m, x).splitlines()
        assert len(text) == 2 and text[0].startswith(f"graph 0 (of {name}.forward ("), text
        assert text[1].endswith("accepts these arguments"), text
    torch._dynamo.reset()


def test_stats_count_what_ran_before_a_dynamo_reset():
    """Note [Backend graphs]: ``torch._dynamo.reset()`` frees the graphs (docs/huggingface.md
    calls it between doors); their counters still count in ``backend_stats``, of the function
    and of the process, and the next graphs' counts add to them."""
    torch._dynamo.reset()
    own = fresh(mlp)
    f = torch.compile(own, backend="trident")
    x, w, b = torch.randn(4, 8), torch.randn(8, 16), torch.randn(16)
    for _ in range(3):
        assert_same(f(x, w, b), mlp(x, w, b))
    before, process = trident.backend_stats(f), trident.backend_stats()
    assert (before.hits, before.misses, before.compiles, before.fallbacks) == (2, 1, 1, 0)
    torch._dynamo.reset()
    gc.collect()
    assert trident.backend_graphs(f) == []
    after = trident.backend_stats(f)
    assert after == dataclasses.replace(before, miss_reasons=["dropped: first call"])
    assert trident.backend_stats().hits == process.hits
    f = torch.compile(own, backend="trident")
    for _ in range(2):
        assert_same(f(x, w, b), mlp(x, w, b))
    s = trident.backend_stats(own)
    # the new graph's first call loads the freed one's specialization from the cache: a hit
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (4, 1, 1, 0), s


def test_the_batch_goes_symbolic_with_the_lengths():
    """Note [Door batch dims]: a server's step of a batch of tokens and a mask; the second graph
    Dynamo traces (at a new length) has the batch symbolic too, so a new batch is served by it:
    two graphs, two compiles (three before: static, the length symbolic, then the batch). A
    batch of one, which Dynamo gives a graph of its own, is served by the symbolic graph's
    function (Note [Graphs of constants]): the same nodes, the batch symbol's input its size."""
    def step(ids, mask):
        return (ids * mask).cumsum(1) + ids.shape[1]

    torch._dynamo.reset()
    f = torch.compile(fresh(step), backend="trident")
    for batch, n in [(2, 5), (2, 7), (4, 9), (3, 4), (2, 5), (1, 6), (1, 3)]:
        ids, mask = torch.arange(batch * n).reshape(batch, n), torch.ones(batch, n, dtype=torch.long)
        assert_same(f(ids, mask), step(ids, mask))
    s = trident.backend_stats(f)
    assert (len(trident.backend_graphs(f)), s.compiles, s.fallbacks, s.hits) == (2, 2, 0, 5), s


def masked_step(ids, mask=None):
    """A server's step whose padded batches pass a mask (a new input, tied to ``ids``'
    length) and whose unpadded ones pass none."""
    out = ids.cumsum(1)
    if mask is not None:
        out = out * mask
    return out + ids.shape[1]


def test_a_new_input_tied_to_a_symbolic_length_is_traced_symbolic():
    """Note [Tied dims] (trident/frontend/frame_state.py): after unmasked calls made the length
    symbolic, the first masked call's mask is a source Dynamo never saw, static, and its size
    replaced the length's symbol: a graph of that length (and batch) only, then the same
    graph again at the next length, symbolic (5 graphs, 5 compiles, 1 hit). The door records
    the mask's dim and the batch as dynamic and has Dynamo trace the frame again: the masked
    calls of other lengths and batches hit its one graph (4 graphs: the unmasked ones' exact,
    length-symbolic and, at a batch of 3, batch-symbolic graphs, and the masked one)."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    f = torch.compile(fresh(masked_step), backend="trident")
    before = counters["stats"]["unique_graphs"]
    for batch, n, with_mask in [(2, 1, False), (2, 5, False), (2, 7, True), (2, 9, True),
                                (4, 6, True), (3, 8, False)]:
        ids = torch.arange(batch * n).reshape(batch, n)
        args = (ids, torch.ones(batch, n, dtype=torch.long) if with_mask else None)
        assert_same(f(*args), masked_step(*args))
    s = trident.backend_stats(f)
    graphs = counters["stats"]["unique_graphs"] - before
    assert (graphs, s.compiles, s.fallbacks, s.hits) == (4, 4, 0, 2), (graphs, s)
    assert "?, ?" in trident.backend_graphs(f)[2].specializations[0]  # length and batch


def window(x, n):
    """A sliding window's offset and a clamped end, as transformers' ``get_mask_sizes`` takes
    them: Python's ``max`` and ``min`` of sizes."""
    offset = max(n - 4, 0)
    end = min(x.shape[0], n)
    return x[offset:end] * 2 + offset


def test_python_max_and_min_of_sizes_are_served_symbolic():
    """Note [Size choices in graphs]: Dynamo records ``max``/``min`` of symbolic sizes as
    ``torch.sym_max``/``torch.sym_min`` nodes, which Torch-MLIR cannot import: the symbolic
    trace failed and every size compiled again (a Gemma 2 decode step with the default cache
    reached the limit of 8; here 8 compiles, one per ``n``). Served: one specialization per
    choice eager makes (``n - 4 >= 0`` or not, ``n < x.size(0)`` or not), each hit by every
    later ``n`` that chooses alike."""
    torch._dynamo.reset()
    f = torch.compile(fresh(window), backend="trident", dynamic=True)
    x = torch.arange(40.)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (9, 11, 14, 20, 2, 3, 45, 50):  # 4 <= n < 40; then 2 <= n < 4; n > 40
            assert_same(f(x, n), window(x, n))
    assert not [w for w in caught if "trident" in str(w.message)]
    s = trident.backend_stats(f)
    assert (s.compiles, s.traces, s.fallbacks, s.hits) == (3, 3, 0, 5), s
    assert not any("dynamic dims" in r for r in s.miss_reasons), s.miss_reasons


def padded_length(x, n):
    """A length that is a sum of sizes: Python's ``sum`` of ints, which Dynamo records as one
    ``torch.sym_sum`` node (as it rebuilds a size such as a grown cache's ``1 + s60``)."""
    end = sum([x.shape[0], n, 1])
    return x.new_zeros(end) + end


def test_sums_of_sizes_are_served_symbolic():
    """Note [Size choices in graphs]: a ``torch.sym_sum`` node in Dynamo's graph, which
    Torch-MLIR cannot import: the symbolic trace failed and every ``n`` compiled again (4
    compiles here; a padded Qwen2 decode step with the default cache reached the limit of 16).
    Served: one specialization, hit by every later ``n`` and length of ``x``."""
    torch._dynamo.reset()
    f = torch.compile(fresh(padded_length), backend="trident", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for size, n in ((4, 3), (4, 5), (6, 7), (9, 2)):
            x = torch.arange(float(size))
            assert_same(f(x, n), padded_length(x, n))
    assert not [w for w in caught if "trident" in str(w.message)]
    s = trident.backend_stats(f)
    assert (s.compiles, s.traces, s.fallbacks, s.hits) == (1, 1, 0, 3), s
    assert not any("dynamic dims" in r for r in s.miss_reasons), s.miss_reasons
