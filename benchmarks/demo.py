"""``python -m trident.demo``: one transformer block, eager vs torch.compile vs Trident.

The block is a plain function (RMSNorm, fused QKV projection, causal softmax attention, output
projection, residual, SwiGLU MLP) run at batch 1 on decode-sized inputs; its RMSNorm is a Triton
kernel on CUDA and torch ops on the CPU. It traces to about 70 small operators, so the host work
around them shows in a call. The demo

1. runs the block eagerly and through ``trident.jit`` and checks the results agree bit for bit;
2. times a call of eager PyTorch, ``torch.compile`` (default mode) and Trident in one process,
   and calls a ratio a win only where the timed loops' min-max ranges do not overlap
   (:func:`compare`), else "no measurable difference";
3. prints Trident's first-call time and the function's ``stats``.

It uses CUDA when ``torch.cuda.is_available()``, else the CPU. ``python -m trident.bench`` runs
this block among other cases and can write JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import statistics
import tempfile
import time
import warnings
from typing import Callable

import torch
import torch.nn.functional as F


# ---- the function ---------------------------------------------------------------------------

import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    """One row per program: ``out = x / sqrt(mean(x^2) + eps) * w``."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim: a Triton kernel on CUDA tensors, torch ops on the CPU (where
    Triton only has its interpreter, too slow to time)."""
    if not x.is_cuda:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    x = x.contiguous()
    out = torch.empty_like(x)
    n_cols = x.shape[-1]
    rms_norm_kernel[(x.numel() // n_cols,)](x, weight, out, n_cols, eps,
                                            BLOCK=triton.next_power_of_2(n_cols))
    return out


def transformer_block(x, norm1, w_qkv, w_out, norm2, w_gate, w_up, w_down, n_heads: int):
    """A pre-norm transformer block: ``x + attn(norm(x))``, then ``x + swiglu(norm(x))``.

    ``x`` is ``[batch, seq, hidden]``; weights are ``[out, in]`` as ``F.linear`` takes them.
    Attention is written out (scores, causal mask, softmax, weighted sum).
    """
    b, s, d = x.shape
    head_dim = d // n_heads

    h = rms_norm(x, norm1)
    q, k, v = F.linear(h, w_qkv).split(d, dim=-1)
    q = q.view(b, s, n_heads, head_dim).transpose(1, 2)
    k = k.view(b, s, n_heads, head_dim).transpose(1, 2)
    v = v.view(b, s, n_heads, head_dim).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (head_dim ** -0.5)
    causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    attn = (probs @ v).transpose(1, 2).reshape(b, s, d)
    x = x + F.linear(attn, w_out)

    h = rms_norm(x, norm2)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    hidden: int
    seq: int
    heads: int
    ffn: int
    batch: int = 1
    dtype: torch.dtype = torch.float32

    def describe(self) -> str:
        return (f"batch {self.batch}, seq {self.seq}, hidden {self.hidden}, {self.heads} heads, "
                f"SwiGLU {self.hidden}->{self.ffn}->{self.hidden}, "
                f"{str(self.dtype).replace('torch.', '')}")


# Decode-sized on both: small enough that launching the ops is a large share of the time.
CPU_CONFIG = BlockConfig(hidden=256, seq=16, heads=4, ffn=512)
CUDA_CONFIG = BlockConfig(hidden=1024, seq=16, heads=8, ffn=2048)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_config(device: torch.device) -> BlockConfig:
    return CUDA_CONFIG if device.type == "cuda" else CPU_CONFIG


def set_cpu_threads(threads: int | None) -> int:
    """Intra-op threads for the run (default 1: see docs/benchmarks.md, "Method").

    Decode-sized ops gain little from intra-op parallelism, and on a small shared machine an
    OpenMP team whose second core is busy elsewhere makes timings swing by 10-100x.
    """
    torch.set_num_threads(threads or 1)
    return torch.get_num_threads()


def make_inputs(device: torch.device, cfg: BlockConfig, seed: int = 0) -> tuple:
    """Arguments of :func:`transformer_block` (random, fixed seed)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, offset=0.0):
        t = torch.randn(*shape, generator=gen) * scale + offset
        return t.to(device=device, dtype=cfg.dtype)

    d, f = cfg.hidden, cfg.ffn
    return (
        rand(cfg.batch, cfg.seq, d),                     # x
        rand(d, scale=0.1, offset=1.0),                  # norm1
        rand(3 * d, d, scale=d ** -0.5),                 # w_qkv
        rand(d, d, scale=d ** -0.5),                     # w_out
        rand(d, scale=0.1, offset=1.0),                  # norm2
        rand(f, d, scale=d ** -0.5),                     # w_gate
        rand(f, d, scale=d ** -0.5),                     # w_up
        rand(d, f, scale=f ** -0.5),                     # w_down
        cfg.heads,                                       # n_heads
    )


# ---- timing ---------------------------------------------------------------------------------

def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _loop_ns(fn: Callable, args: tuple, n: int, sync: Callable[[], None]) -> int:
    sync()
    start = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    sync()
    return time.perf_counter_ns() - start


def calibrate(fn: Callable, args: tuple, sync: Callable[[], None], target_s: float,
              warmup: int = 20) -> int:
    """Warm ``fn`` up and pick a loop length whose loop takes about ``target_s``."""
    _loop_ns(fn, args, warmup, sync)
    n = 1
    while True:
        elapsed = _loop_ns(fn, args, n, sync)
        if elapsed >= target_s * 1e9 / 5 or n >= 1_000_000:
            return max(1, int(n * target_s * 1e9 / max(elapsed, 1)))
        n *= 4


def time_contenders(contenders: dict[str, Callable], args: tuple, device: torch.device,
                    repeats: int = 7, target_s: float = 0.05) -> dict[str, dict]:
    """Per-call time of each contender, in µs.

    Each contender gets its own loop length (about ``target_s`` per loop); then ``repeats``
    rounds each time one loop of every contender, interleaved, so that drift of the machine
    hits all of them alike. Returns ``{name: {"us": median, "samples_us": [...], "n": N}}``.
    """
    sync = synchronizer(device)
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            loops = {name: calibrate(fn, args, sync, target_s) for name, fn in contenders.items()}
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(repeats):
                for name, fn in contenders.items():
                    ns = _loop_ns(fn, args, loops[name], sync)
                    samples[name].append(ns / loops[name] / 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: {"us": statistics.median(s), "samples_us": s, "n": loops[name]}
            for name, s in samples.items()}


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``other / Trident`` of per-call times over repeated timed loops (µs, any unit).

    ``median`` is the ratio of the medians; ``low``-``high`` the range the loops allow: the
    other's fastest loop over Trident's slowest, and the other's slowest over Trident's fastest;
    ``fastest`` the ratio of the fastest loops (the least disturbed by other work on the
    machine; None where not known).
    """
    median: float
    low: float
    high: float
    fastest: float | None = None

    @property
    def noisy(self) -> bool:
        """The loops' range allows Trident both twice as fast and half as fast (``low < 0.5 <
        2 < high``): the machine's other work, not the code, decided the loops' times (a
        new user's busy 2-core machine gave 0.04-115.61)."""
        return self.low < 0.5 and self.high > 2

    @property
    def verdict(self) -> str:
        """The criterion of the demo and the benchmarks: a win only when the min-max ranges of
        the loops do not overlap (Trident's slowest loop beat the other's fastest: ``low > 1``),
        a loss only when the reverse holds (``high < 1``); where they overlap, "no measurable
        difference", or, where the range is too wide to tell (:attr:`noisy`), that the machine
        was too noisy, with the fastest loops' ratio."""
        if self.low > 1:
            return "Trident faster"
        if self.high < 1:
            return "Trident slower"
        if self.noisy:
            best = "" if self.fastest is None else f"; fastest loops' ratio {self.fastest:.2f}"
            return f"the machine was too noisy to tell (run again on an idle machine{best})"
        return "no measurable difference"

    def __str__(self) -> str:
        return f"{self.median:.2f} ({self.low:.2f}-{self.high:.2f}): {self.verdict}"


def compare(other: list[float], trident: list[float]) -> Ratio:
    """``other / Trident`` from each contender's per-call time in every timed loop.

    Raises ``ValueError`` if either list is empty or holds a time that is not positive.
    """
    if not other or not trident or min(other) <= 0 or min(trident) <= 0:
        raise ValueError(f"compare needs positive times, got {other!r} and {trident!r}")
    return Ratio(statistics.median(other) / statistics.median(trident),
                 min(other) / max(trident), max(other) / min(trident),
                 min(other) / min(trident))


def timed_first_call(fn: Callable, args: tuple, device: torch.device):
    """``(result, seconds)`` of one call, synchronized."""
    sync = synchronizer(device)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        out = fn(*args)
    sync()
    return out, time.perf_counter() - start


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


@contextlib.contextmanager
def empty_trident_cache():
    """Give the functions whose first call happens inside an empty temporary Trident cache.

    Trident's native runtime is built once per torch and loaded when ``trident.jit`` makes a
    function, so make the function first: only its Specialization Cache Module is then built
    from scratch. (A function keeps the folder its first call picked.)
    """
    old = os.environ.get("TRIDENT_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="trident-cold-") as folder:
        os.environ["TRIDENT_CACHE_DIR"] = folder
        try:
            yield folder
        finally:
            if old is None:
                os.environ.pop("TRIDENT_CACHE_DIR", None)
            else:
                os.environ["TRIDENT_CACHE_DIR"] = old


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:160]


def run_case(fn: Callable, args: tuple, device: torch.device, *, use_compile: bool = True,
             cold: bool = False, repeats: int = 7, log: Callable[[str], None] = print) -> dict:
    """Check and time ``fn(*args)`` under eager PyTorch, ``torch.compile`` and Trident.

    Correctness comes first: Trident must equal eager bit for bit (``torch.equal``), or the case
    is not timed. ``torch.compile`` is compared with eager and timed either way (Inductor may
    reorder floating-point math). With ``cold``, Trident's first call builds its module in an
    empty cache and Inductor runs with its caches off, so first-call times are compile times.

    Returns a JSON-able dict: per contender ``first_call_s`` (not for eager), ``us`` (median per
    call), ``samples_us``, ``calls_per_loop``; ``error`` for a contender that could not run; and
    Trident's ``how``, ``bit_exact`` and ``stats``.
    """
    import trident

    result: dict = {"eager": {}, "torch.compile": {}, "Trident": {}}
    with torch.no_grad():
        expected = fn(*args)

    # Trident.
    jitted = trident.jit(fn)  # loads (first time ever: builds) Trident's native runtime
    with (empty_trident_cache() if cold else contextlib.nullcontext()):
        got, first_s = timed_first_call(jitted, args, device)
    first = jitted.stats
    how = ("traced and compiled" if first.compiles else
           "fell back to eager PyTorch" if first.fallbacks else
           "loaded from the disk cache")
    exact = torch.equal(got, expected)
    result["Trident"].update(first_call_s=first_s, how=how, bit_exact=exact)
    log(f"  Trident first call: {first_s * 1e3:.1f} ms ({how}); bit for bit vs eager: "
        f"{'yes' if exact else 'NO'}")
    if first.fallbacks:
        result["Trident"]["error"] = "fell back to eager PyTorch: " + "; ".join(
            first.miss_reasons[-1:])
    if not exact:
        result["Trident"]["error"] = (f"result differs from eager (max |difference| "
                                      f"{max_abs_diff(got, expected):.3g})")
    contenders: dict[str, Callable] = {"eager": fn}

    # torch.compile, default mode.
    if not use_compile:
        result["torch.compile"]["error"] = "skipped (--no-compile)"
    else:
        log("  torch.compile (default mode): compiling; on a CPU the first call takes "
            "seconds to a minute ...")
        try:
            compiled = torch.compile(fn)
            import torch._inductor.config as inductor_config

            with inductor_config.patch(force_disable_caches=cold), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
                out, compile_s = timed_first_call(compiled, args, device)
            diff = max_abs_diff(out, expected)
            result["torch.compile"].update(first_call_s=compile_s, bit_exact=torch.equal(
                out, expected), max_abs_diff_vs_eager=diff)
            log(f"  torch.compile first call: {compile_s:.1f} s; vs eager: "
                f"{'bit for bit' if diff == 0 else f'max |difference| {diff:.2g}'}")
            contenders["torch.compile"] = compiled
        except Exception as e:  # noqa: BLE001 - any failure: report it and carry on
            result["torch.compile"]["error"] = "unavailable: " + _one_line(e)
            log(f"  torch.compile {result['torch.compile']['error']}")

    if "error" not in result["Trident"]:
        contenders["Trident"] = jitted
    timings = time_contenders(contenders, args, device, repeats=repeats)
    for _ in range(2):  # a busy machine: more interleaved rounds (Ratio.noisy), twice at most
        if "Trident" not in timings or not any(compare(
                timings[name]["samples_us"], timings["Trident"]["samples_us"]).noisy
                for name in timings if name != "Trident"):
            break
        log(f"  the machine is busy (the loops' times differ by over 2x): {repeats} more "
            "rounds")
        for name, t in time_contenders(contenders, args, device, repeats=repeats).items():
            samples = timings[name]["samples_us"] + t["samples_us"]
            timings[name] = {"us": statistics.median(samples), "samples_us": samples,
                             "n": t["n"]}
    for name, t in timings.items():
        result[name].update(us=t["us"], samples_us=t["samples_us"], calls_per_loop=t["n"])
    result["Trident"]["stats"] = dataclasses.asdict(jitted.stats)
    if "us" in result["Trident"]:  # each contender / Trident, with its range and verdict
        ratios = {name: compare(result[name]["samples_us"], result["Trident"]["samples_us"])
                  for name in ("eager", "torch.compile") if "us" in result[name]}
        result["ratios"] = {name: {**dataclasses.asdict(r), "verdict": r.verdict}
                            for name, r in ratios.items()}
    return result


def format_table(result: dict, indent: str = "  ") -> str:
    """Per-call times (median, and the range of the timed loops), then each contender against
    Trident: the ratio of medians, its range over the loops, and the verdict (:class:`Ratio`)."""
    rows = [f"{'':<15}{'per call (µs)':>14}{'loops min-max':>18}{'first call':>12}", "-" * 59]
    # (the median of the loops; on a busy machine the fastest loop, the min, is the least
    # disturbed: Ratio.noisy's verdict gives the fastest loops' ratio)
    for name in ("eager", "torch.compile", "Trident"):
        r = result[name]
        if "us" not in r:
            rows.append(f"{name:<15}  {r.get('error', 'not run')}")
            continue
        low, high = min(r["samples_us"]), max(r["samples_us"])
        first = r.get("first_call_s")
        first = "-" if first is None else (f"{first:.1f} s" if first >= 1 else
                                           f"{first * 1e3:.0f} ms")
        rows.append(f"{name:<15}{r['us']:>14.1f}{f'{low:.1f}-{high:.1f}':>18}{first:>12}")
    if "us" in result["Trident"]:
        rows.append("")
        for name in ("eager", "torch.compile"):
            if "us" in result[name]:
                ratio = compare(result[name]["samples_us"], result["Trident"]["samples_us"])
                rows.append(f"{name} / Trident = {ratio}")
        rows.append("(a ratio is the median's; in parentheses its range over the loops; a side "
                    "wins only where the loops' ranges do not overlap; where the range allows "
                    "either side twice as fast, the machine was too noisy to tell)")
    return "\n".join(indent + row if row else row for row in rows)


def ready_line(seconds: float, built_now: bool) -> str:
    """What the demo says of Trident's start (the first ``trident.jit``): its native runtime
    built now (``built_now``: the cache held no intact build for this torch), or imported with
    Trident's modules, nothing built (a warm run printed "built once per torch version" where
    it had only loaded them)."""
    if built_now:
        return (f"  Trident ready in {seconds:.1f} s: built its native runtime for torch "
                f"{torch.__version__} (once per torch version and Python; later runs load it)")
    return (f"  Trident ready in {seconds:.1f} s: imported its modules and loaded its native "
            "runtime, built by an earlier run (nothing was built)")


# ---- main -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trident.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-compile", action="store_true",
                        help="skip torch.compile (its first compile can take a minute on a CPU)")
    parser.add_argument("--cold", action="store_true",
                        help="compile from scratch: an empty Trident cache for this run, "
                             "Inductor's caches off")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per contender")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads on the CPU (default 1)")
    opts = parser.parse_args(argv)

    import trident

    set_cpu_threads(opts.threads)
    device = default_device()
    cfg = default_config(device)
    args = make_inputs(device, cfg)
    where = (torch.cuda.get_device_name(device) if device.type == "cuda" else
             f"{torch.get_num_threads()} intra-op thread(s)")
    print(f"Trident {trident.__version__} demo: one transformer block, eager vs torch.compile "
          "vs Trident")
    print(f"  {cfg.describe()}")
    print(f"  device {device} ({where}), torch {torch.__version__}\n")

    from trident import runtime

    start, built = time.perf_counter(), runtime.built()
    trident.jit(transformer_block)  # loads Trident's native runtime (the first time: builds it)
    if time.perf_counter() - start > 1.0:
        print(ready_line(time.perf_counter() - start, not built))
    result = run_case(transformer_block, args, device, use_compile=not opts.no_compile,
                      cold=opts.cold, repeats=opts.repeats)
    if "error" in result["Trident"]:
        print(f"\nTrident: {result['Trident']['error']}")
        return 1
    sync_note = ", CUDA-synchronized" if device.type == "cuda" else ""
    print(f"\nper call: median of {len(result['Trident']['samples_us'])} timed loops "
          f"(time.perf_counter_ns{sync_note}), "
          "after warm-up\n")
    print(format_table(result))
    if result["Trident"]["how"] != "traced and compiled":
        print("  (Trident's first call found its module in the cache; --cold compiles anew)")
    stats = trident.Stats(**result["Trident"]["stats"])
    print(f"\nTrident stats: {stats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
