"""torch.compile(fn, backend="trident") on CPU graphs of ATen ops."""

import torch

import trident
from _trident_helpers import assert_same, run_python


def compiled_graph_count() -> int:
    return sum(row["specializations"] for row in trident.list_cache())


def mlp(x, w, b):
    h = torch.relu(x @ w + b)
    return h.sum(-1) * 2, h


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
    f(x, w).backward()
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    (torch.relu(x @ w) * 2).sum().backward()
    assert torch.equal(got[0], x.grad) and torch.equal(got[1], w.grad)
