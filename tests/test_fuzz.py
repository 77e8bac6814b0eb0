"""Differential fuzzer: random programs over about 25 ATen ops, compiled by ``@trident.jit`` and
run against eager PyTorch on the same inputs.

A program is Python source (``def f(x, y, z, idx, perm): ...``) made of steps over a pool of
tensors of one shape: elementwise ops with tensors, Python scalars and 0-d tensors of every
dtype; reductions; matmul; the view family; in-place ops on inputs and on views; cat/stack;
index/gather/scatter; where. Inputs come in every dtype and layout (contiguous, transposed,
sliced, expanded, channels_last, overlapping), with sizes 0 and 1, sometimes the same tensor
twice. Each program is called several times while its inputs change (new values, then a new
layout); after every call the outputs and the arguments (in-place ops write them) must equal
eager's bit for bit (NaN-aware), or the call must raise eager's exception class. A threaded
variant calls one compiled program from several threads at once.

CI runs a bounded slice (hypothesis, derandomized). A long run counts programs, calls,
mismatches, fallbacks and crashes (docs/conformance.md has the last one)::

    TRIDENT_CACHE_DIR=/tmp/tc-fuzz python tests/test_fuzz.py --programs 500 [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import logging
import random
import re
import sys
import threading
import traceback
import warnings
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trident  # noqa: E402
from _trident_helpers import assert_same, fresh_cache  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.uint8, torch.bool]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "channels_last", "overlapping"]
UNARY = ["neg", "abs", "exp", "sin", "sigmoid", "relu", "sqrt", "bitwise_not"]
SCALARS = ["2", "-3", "0.5", "-1.25", "1e20", "True", "False", "float('nan')", "0"]
REASONS: collections.Counter = collections.Counter()  # why calls ran eagerly (long run)
CALLS = 4  # per program: three calls on new values, one on a new layout


class Draw:
    """The program generator's choices: from hypothesis (``data``) in the test, so that a
    failure shrinks, or from ``random.Random`` in the long run."""

    def __init__(self, data=None, rng: random.Random | None = None):
        self.data, self.rng = data, rng

    def choice(self, options):
        options = list(options)
        if self.data is not None:
            return self.data.draw(st.sampled_from(options))
        return self.rng.choice(options)

    def integer(self, lo: int, hi: int) -> int:
        if self.data is not None:
            return self.data.draw(st.integers(lo, hi))
        return self.rng.randint(lo, hi)


# ---- programs ----------------------------------------------------------------------------

def program(draw: Draw) -> dict:
    """A random program: its source, the shape and the inputs' dtypes and layouts."""
    rank = draw.choice([2, 2, 4])
    shape = tuple(draw.choice([0, 1, 2, 3, 5]) if i < 2 else draw.choice([1, 2])
                  for i in range(rank))
    inputs = {
        "x": (draw.choice(DTYPES), draw.choice(LAYOUTS)),
        "y": (draw.choice(DTYPES), draw.choice(LAYOUTS)),
        "z": (draw.choice(DTYPES), "scalar"),  # a 0-d tensor
    }
    same_twice = draw.integer(0, 5) == 0  # f(x, x, ...)
    pool = ["x", "y"]
    lines: list[str] = []
    for n in range(draw.integer(1, 6)):
        a, b = draw.choice(pool), draw.choice(pool)
        line = _step(draw, a, b, shape)
        name = f"v{n}"
        if line.startswith("!"):  # an in-place statement: no new value
            lines.append(line[1:])
        else:
            lines.append(f"{name} = {line}")
            pool.append(name)
    outs = sorted({draw.choice(pool) for _ in range(draw.integer(1, 3))})
    body = "\n".join(f"    {line}" for line in lines)
    source = (f"def f(x, y, z, idx, perm):\n{body}\n"
              f"    return {', '.join(outs)}{',' if len(outs) == 1 else ''}\n")
    return {"source": source, "shape": shape, "inputs": inputs, "same_twice": same_twice}


def _operand(draw: Draw, b: str) -> str:
    return draw.choice([b, b, "z", draw.choice(SCALARS)])


def _step(draw: Draw, a: str, b: str, shape: tuple) -> str:
    rank = len(shape)
    d = draw.integer(0, rank - 1)
    s = _operand(draw, b)
    kind = draw.choice([
        "add", "sub", "mul", "div", "maximum", "where", "unary", "clamp", "reduce", "cumsum",
        "matmul", "view", "inplace", "inplace_view", "cat", "stack", "gather", "scatter",
        "index", "masked_fill", "to", "compare"])
    if kind in ("add", "sub", "mul"):
        sign = dict(add="+", sub="-", mul="*")[kind]
        return draw.choice([f"{a} {sign} {s}", f"torch.{kind}({a}, {s})", f"{s} {sign} {a}"])
    if kind == "div":
        return draw.choice([f"{a} / {s}", f"torch.div({a}, {b}, rounding_mode='floor')"])
    if kind == "maximum":
        return f"torch.{draw.choice(['maximum', 'minimum'])}({a}, {b})"
    if kind == "where":
        return f"torch.where({a} > {draw.choice(['0', b])}, {a}, {s})"
    if kind == "unary":
        return f"torch.{draw.choice(UNARY)}({a})"
    if kind == "clamp":
        return f"{a}.clamp(min={draw.choice(['0', '-1.5', '2'])})"
    if kind == "reduce":
        op = draw.choice(["sum", "amax", "mean", "prod", "amin"])
        return f"{a} - {a}.{op}({d}, keepdim=True)"
    if kind == "cumsum":
        return f"{a}.cumsum({d})"
    if kind == "matmul":
        return f"({a} @ {a}.transpose(-1, -2)) @ {b}.to({a}.dtype)"
    if kind == "view":
        return draw.choice([
            f"{a}.transpose(0, -1).contiguous().transpose(0, -1)", f"{a}.reshape(-1).view({shape})",
            f"{a}.unsqueeze(0)[0]", f"{a}.flip({d})", f"{a}.narrow({d}, 0, {shape[d]})",
            f"{a}.permute(*reversed(range({rank}))).permute(*reversed(range({rank})))",
            f"{a}.expand({shape})", f"{a}[...]", f"{a}.t().t()" if rank == 2 else f"{a}.detach()"])
    if kind == "inplace":
        return "!" + draw.choice([f"{a}.add_({s})", f"{a}.mul_({s})", f"{a}.copy_({b})",
                                  f"{a}.clamp_(max=1)", f"{a}.neg_()", f"{a}.zero_()"])
    if kind == "inplace_view":
        view = draw.choice([f"{a}.transpose(0, -1)", f"{a}.narrow({d}, 0, {min(shape[d], 1)})",
                            f"{a}.view(-1)" if draw.integer(0, 1) else f"{a}.reshape(-1)",
                            f"{a}[..., ::2]",
                            f"{a}.diagonal()" if rank == 2 else f"{a}.select(-1, 0)"])
        return "!" + f"{view}.{draw.choice(['add_(1)', 'mul_(-2)', 'fill_(0.5)', 'sub_(z)'])}"
    if kind == "cat":
        return f"torch.cat([{a}, {b}], {d}).narrow({d}, {shape[d]}, {shape[d]})"
    if kind == "stack":
        return f"torch.stack([{a}, {b}], {d}).sum({d})"
    if kind == "gather":
        return f"{a}.gather(-1, idx)"
    if kind == "scatter":
        src = f"{b}.to({a}.dtype)"
        return draw.choice([f"{a}.scatter(-1, idx, {src})", f"{a}.scatter_add(-1, idx, {src})",
                            f"{a}.scatter(-1, idx, {draw.choice(['1.5', '-2'])})"])
    if kind == "index":
        return draw.choice([f"{a}[perm]", f"{a}.index_select(0, perm)",
                            f"{a}.index_add(0, perm, {b}.to({a}.dtype))",
                            f"{a}.index_put((perm,), {b}[perm].to({a}.dtype))"])
    if kind == "masked_fill":
        return f"{a}.masked_fill({b} > 0, {draw.choice(SCALARS)})"
    if kind == "to":
        return f"{a}.to({draw.choice(DTYPES)})"
    return f"({a} {draw.choice(['==', '<', '>=', '!='])} {s})"


# ---- inputs ------------------------------------------------------------------------------

def _values(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen, dtype=torch.float64) * 4
        flat = t.view(-1)
        for i, v in enumerate([0.0, -0.0, float("nan"), float("inf")][:max(0, flat.numel() - 2)]):
            flat[i] = v
        return t.to(dtype)
    lo = 0 if dtype == torch.uint8 else -20
    return torch.randint(lo, 20, shape, generator=gen, dtype=dtype)


def make_input(shape, dtype, layout, seed) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` laid out as ``layout``, its values from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    if layout == "scalar":
        return _values((), dtype, gen)
    if layout == "transposed":
        return _values(shape[::-1], dtype, gen).permute(*reversed(range(len(shape))))
    if layout == "sliced":
        return _values((*shape[:-1], shape[-1] * 2), dtype, gen)[..., ::2]
    if layout == "expanded":
        return _values((1, *shape[1:]), dtype, gen).expand(shape)
    if layout == "channels_last" and len(shape) == 4:
        return _values(shape, dtype, gen).contiguous(memory_format=torch.channels_last)
    if layout == "overlapping" and 0 not in shape:  # rows overlap: stride 1 along every dim
        base = _values((sum(shape),), dtype, gen)
        return base.as_strided(shape, (1,) * len(shape))
    return _values(shape, dtype, gen)


def make_args(prog: dict, seed: int, layouts: dict | None = None) -> tuple:
    shape = prog["shape"]
    args = {}
    for name, (dtype, layout) in prog["inputs"].items():
        args[name] = make_input(shape, dtype, (layouts or {}).get(name, layout),
                                seed * 7 + len(args))
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, max(shape[-1], 1), shape, generator=gen)
    perm = torch.randperm(shape[0], generator=gen)
    y = args["x"] if prog["same_twice"] else args["y"]
    return args["x"], y, args["z"], idx, perm


def compile_program(source: str):
    namespace = {"torch": torch}
    code = compile(source, f"<fuzz {abs(hash(source)) % 10**8}>", "exec")
    exec(code, namespace)  # noqa: S102 - the fuzzer's own generated program
    return namespace["f"]


# ---- one program -------------------------------------------------------------------------

def _call(fn, args):
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - compared with eager's
        return None, e


def run_program(prog: dict, counts: collections.Counter) -> list[str]:
    """Run ``prog`` eagerly and compiled for ``CALLS`` calls; the faults found (as text)."""
    fn = compile_program(prog["source"])
    jf = trident.jit(fn)
    faults = []
    other = {"x": "contiguous" if prog["inputs"]["x"][1] != "contiguous" else "transposed"}
    for n in range(CALLS):
        layouts = other if n == CALLS - 1 else None
        want_args, got_args = make_args(prog, n, layouts), make_args(prog, n, layouts)
        want, want_error = _call(fn, want_args)
        fallbacks = jf.stats.fallbacks
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, got_error = _call(jf, got_args)
        counts["calls"] += 1
        counts["eager errors"] += want_error is not None
        # a call that ran eagerly though eager itself succeeds (not an error eager raises too)
        counts["fallbacks where eager works"] += (jf.stats.fallbacks > fallbacks
                                                  and want_error is None)
        if want_error is not None or got_error is not None:
            # Trident's errors name the step and subclass eager's class (errors.py)
            if want_error is None or not isinstance(got_error, type(want_error)):
                counts["crashes"] += 1
                faults.append(f"call {n}: eager {type(want_error).__name__}: {want_error}; "
                              f"trident {type(got_error).__name__}: {got_error}")
            continue
        try:
            assert_same(got, want)
            assert_same(got_args, want_args, path="args")
        except AssertionError as e:
            counts["mismatches"] += 1
            faults.append(f"call {n}: {str(e)[:500]}")
    counts["programs"] += 1
    counts["fallbacks"] += jf.stats.fallbacks
    for reason in jf.stats.miss_reasons:
        if reason.startswith("eager: "):
            REASONS[re.sub(r"<fuzz \d+>:\d+ \(\): ", "", reason.split(": ", 1)[1])[:100]] += 1
    counts["hits"] += jf.stats.hits
    return faults


def run_threads(prog: dict, threads: int = 4, calls: int = 5) -> list[str]:
    """One compiled program called from ``threads`` threads at once on their own inputs."""
    fn = compile_program(prog["source"])
    jf = trident.jit(fn)
    wants = {}
    for seed in range(threads * calls):
        wants[seed] = (_call(fn, make_args(prog, seed)), make_args(prog, seed))
    faults: list[str] = []
    barrier = threading.Barrier(threads)

    def worker(k):
        barrier.wait()
        for seed in range(k * calls, (k + 1) * calls):
            args = make_args(prog, seed)
            got, error = _call(jf, args)
            (want, want_error), _ = wants[seed]
            try:
                if want_error is not None or error is not None:
                    assert want_error is not None and isinstance(error, type(want_error)), \
                        (error, want_error)
                else:
                    want_args = list(make_args(prog, seed))
                    _call(fn, want_args)
                    assert_same(got, want)
                    assert_same(args, tuple(want_args), path="args")
            except AssertionError as e:
                faults.append(f"thread {k} seed {seed}: {str(e)[:300]}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    return faults


# ---- the bounded CI slice ----------------------------------------------------------------

FUZZ = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.data())
def test_random_programs_equal_eager(data):
    prog = program(Draw(data))
    with fresh_cache():
        faults = run_program(prog, collections.Counter())
    assert not faults, prog["source"] + "\n".join(faults)


@settings(FUZZ, max_examples=4)
@given(st.data())
def test_random_programs_from_threads(data):
    prog = program(Draw(data))
    with fresh_cache():
        faults = run_threads(prog)
    assert not faults, prog["source"] + "\n".join(faults)


# ---- the long run ------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads-every", type=int, default=10,
                        help="every Nth program also runs from 4 threads")
    parsed = parser.parse_args()
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    counts: collections.Counter = collections.Counter()
    rng = random.Random(parsed.seed)
    for i in range(parsed.programs):
        prog = program(Draw(rng=rng))
        try:
            faults = run_program(prog, counts)
            if parsed.threads_every and i % parsed.threads_every == 0:
                counts["thread programs"] += 1
                thread_faults = run_threads(prog)
                counts["thread mismatches"] += len(thread_faults)
                faults += thread_faults
        except Exception:  # noqa: BLE001 - a defect of the fuzzer itself: report and go on
            faults = [traceback.format_exc()]
            counts["harness errors"] += 1
        if faults:
            print(f"--- program {i}: {prog['inputs']} {prog['shape']} twice="
                  f"{prog['same_twice']}\n{prog['source']}" + "\n".join(faults), flush=True)
        if i % 20 == 19:
            print(dict(counts), flush=True)
    print(dict(counts))
    for reason, n in REASONS.most_common():
        print(f"{n:5} {reason}")


if __name__ == "__main__":
    main()
