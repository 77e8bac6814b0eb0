"""GPU benchmark (``python -m trident.bench gpu``): every contender in one process and run.

Cases:
  1. ``empty_like`` + one Triton add + ``relu`` (1,024 floats): host-bound.
  2. one launch of a Triton kernel with 20 arguments.
  3. decode steps of two Llama-style models built from Liger-Kernel Triton kernels (RMSNorm,
     RoPE, SwiGLU) and torch ops (linear, cat, SDPA, add), batch 1, bf16, KV length 256; the
     model follows ../shared/device/anchors_gpu.py.

Contenders: eager; torch.compile default and reduce-overhead; CUDA-graph replay of the eager
function (no guards: the floor); a raw cuLaunchKernel from a cffi function (cases 1-2: the floor
for one launch from Python); Trident (``trident``: CUDA graphs replayed after the guards, the
default; ``trident_steps``: the launch sequence step by step, ``cuda_graphs=False``);
``torch.compile(backend="trident")``. Times are per call (µs; the decode cases too), GPU
synchronized once per batch of calls; first-call compile times are in seconds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch

import trident
from benchmarks.demo import compare


def per_call(fn, n=2000, warm=50, reps=7) -> list[float]:
    """µs per call in each of ``reps`` batches of ``n`` calls, synchronized per batch."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / n * 1e6)
    return times


def first_call(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def cuda_graph(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def same(a, b) -> bool:
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---- kernels -------------------------------------------------------------------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


@triton.jit
def args20_kernel(o, a0, a1, a2, a3, a4, a5, a6, a7, a8, s0, s1, s2, s3, s4, s5, s6, s7, s8,
                  n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    acc = tl.load(a0 + offs, mask=m) * s0 + tl.load(a1 + offs, mask=m) * s1
    acc += tl.load(a2 + offs, mask=m) * s2 + tl.load(a3 + offs, mask=m) * s3
    acc += tl.load(a4 + offs, mask=m) * s4 + tl.load(a5 + offs, mask=m) * s5
    acc += tl.load(a6 + offs, mask=m) * s6 + tl.load(a7 + offs, mask=m) * s7
    acc += tl.load(a8 + offs, mask=m) * s8
    tl.store(o + offs, acc, mask=m)


def add_relu(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return torch.relu(out)


def add_relu_into(x, y, out):
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    torch.relu_(out)


def launch20(o, a0, a1, a2, a3, a4, a5, a6, a7, a8):
    args20_kernel[(1,)](o, a0, a1, a2, a3, a4, a5, a6, a7, a8, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                        o.numel(), BLOCK=1024)


RAW_C = r"""
#include <stdint.h>
#include <dlfcn.h>
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void*, void**, void**);
static launch_t launch_kernel;
int raw_init(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  launch_kernel = h ? (launch_t)dlsym(h, "cuLaunchKernel") : 0;
  return launch_kernel ? 0 : -1;
}
int raw_launch(uint64_t fn, uint64_t stream, uint64_t x, uint64_t y, uint64_t o, int32_t n,
               unsigned grid, unsigned threads, unsigned shared) {
  uint64_t global_scratch = 0, profile_scratch = 0;
  void* params[] = {&x, &y, &o, &n, &global_scratch, &profile_scratch};
  return launch_kernel((void*)fn, grid, 1, 1, threads, 1, 1, shared, (void*)stream, params, 0);
}
"""


def raw_launcher():
    """cuLaunchKernel of the compiled add kernel from a cffi function: the one-launch floor."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("int raw_init(void); int raw_launch(uint64_t, uint64_t, uint64_t, uint64_t, "
             "uint64_t, int32_t, unsigned, unsigned, unsigned);")
    ffi.set_source("_trident_bench_raw", RAW_C, libraries=["dl"])
    tmp = tempfile.mkdtemp()
    ffi.compile(tmpdir=tmp)
    sys.path.insert(0, tmp)
    import _trident_bench_raw

    lib = _trident_bench_raw.lib
    assert lib.raw_init() == 0
    return lib


# ---- cases ---------------------------------------------------------------------------------


def contenders(name, fn, args, results, n=2000, reps=7,
               compile_modes=("default", "reduce-overhead")):
    """Time eager, torch.compile, CUDA graph and Trident on ``fn(*args)``; check equality."""
    row = results.setdefault(name, {})
    row["samples"] = {}

    def timed(f):  # the median per call; every batch's time in row["samples"]
        samples = per_call(f, n=n, warm=max(3, n // 40), reps=reps)
        return statistics.median(samples), samples

    print(f"{name}: eager", flush=True)
    ref = fn(*args)
    row["eager"], row["samples"]["eager"] = timed(lambda: fn(*args))
    print(f"{name}: trident", flush=True)
    jitted = trident.jit(fn, fallback=False)
    row["trident_first_call_s"], out = first_call(lambda: jitted(*args))
    row["trident_equal"] = same(jitted(*args), ref) if ref is not None else True
    row["trident"], row["samples"]["trident"] = timed(lambda: jitted(*args))
    row["trident_stats"] = str(jitted.stats)
    print(f"{name}: trident without CUDA graphs", flush=True)
    steps = trident.jit(fn, fallback=False, cuda_graphs=False)
    steps(*args)
    row["trident_steps"], row["samples"]["trident_steps"] = timed(lambda: steps(*args))
    for mode in compile_modes:
        print(f"{name}: torch.compile {mode}", flush=True)
        try:
            torch._dynamo.reset()
            compiled = torch.compile(fn, mode=mode)
            row[f"compile_{mode}_first_call_s"], _ = first_call(lambda: compiled(*args))
            for _ in range(3):
                compiled(*args)
            row[f"compile_{mode}"], row["samples"][f"compile_{mode}"] = timed(
                lambda: compiled(*args))
        except Exception:
            row[f"compile_{mode}_error"] = traceback.format_exc()[-600:]
    print(f"{name}: torch.compile backend=trident", flush=True)
    try:
        torch._dynamo.reset()
        backend = torch.compile(fn, backend="trident")
        row["trident_backend_first_call_s"], out = first_call(lambda: backend(*args))
        row["trident_backend_equal"] = same(backend(*args), ref) if ref is not None else True
        row["trident_backend"], row["samples"]["trident_backend"] = timed(
            lambda: backend(*args))
    except Exception:
        row["trident_backend_error"] = traceback.format_exc()[-600:]
    try:
        graph, _ = cuda_graph(lambda: fn(*args))
        row["cuda_graph"], row["samples"]["cuda_graph"] = timed(graph.replay)
    except Exception:
        row["cuda_graph_error"] = traceback.format_exc()[-600:]
    print(name, {k: v for k, v in row.items() if not k.endswith("error")}, flush=True)
    return row


def micro(results):
    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    row = contenders("empty_like + triton add + relu (us)", add_relu, (x, y), results)
    # where the graph path's time goes: the same kernels writing into an argument (no output
    # to allocate and copy out), replayed by Trident, and the raw replay of that graph
    out = torch.empty_like(x)
    into = trident.jit(add_relu_into)
    into(x, y, out)
    into(x, y, out)
    row["trident_no_output"] = statistics.median(per_call(lambda: into(x, y, out)))
    row["trident_no_output_stats"] = str(into.stats)
    out = torch.empty_like(x)
    compiled = add_kernel[(1,)](x, y, out, x.numel(), BLOCK=1024)
    lib = raw_launcher()
    stream = torch.cuda.current_stream().cuda_stream
    raw = (compiled.function, stream, x.data_ptr(), y.data_ptr(), out.data_ptr(), x.numel(), 1,
           32 * compiled.metadata.num_warps, compiled.metadata.shared)
    row["raw_cffi_launch_add_only"] = statistics.median(per_call(lambda: lib.raw_launch(*raw)))
    row["triton_jit_add_only"] = statistics.median(per_call(
        lambda: add_kernel[(1,)](x, y, out, x.numel(), BLOCK=1024)))

    row["trident_hit_parts"] = hit_parts(add_relu, (x, y))

    tensors = [torch.randn(1024, device="cuda") for _ in range(10)]
    row20 = contenders("one launch, 20 arguments (us)", launch20, tuple(tensors), results)
    row20["raw_cffi_launch_4_args"] = row["raw_cffi_launch_add_only"]
    row20["trident_hit_parts"] = hit_parts(launch20, tuple(tensors))


def hit_parts(fn, args) -> dict:
    """A hit of ``trident.jit(fn)`` split into its parts (``Dispatcher._hit_profile``, µs per
    call, the fastest of 5 rounds of 2,000 calls), with the state memo's counters (Note
    [Quiet state]: times made, proofs, nodes checked at each call, re-reads)."""
    jf = trident.jit(fn)
    for _ in range(5):  # traced, then a graph captured and replayed
        jf(*args)
    best: dict = {}
    for _ in range(5):
        torch.cuda.synchronize()
        for k, v in jf._hit_profile(args, None, 2000).items():
            best[k] = min(best.get(k, v), v)
    torch.cuda.synchronize()
    best = {k: round(v, 3) for k, v in best.items()}
    best["quiet_state"] = jf._quiet_state()
    best["stats"] = str(jf.stats).split(", miss_reasons")[0]
    return best


CONFIGS = {
    "llama-3.2-1b-like": dict(D=2048, H=32, KV=8, HD=64, I=8192, L=16),
    "qwen2.5-0.5b-like": dict(D=896, H=14, KV=2, HD=64, I=4864, L=24),
}
PER_LAYER = ("ln1", "ln2", "wq", "wk", "wv", "wo", "wg", "wu", "wd", "kc", "vc")


def build_model(cfg, ctx=256, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    D, H, KV, HD, I, L = (cfg[k] for k in ("D", "H", "KV", "HD", "I", "L"))

    def w(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.02).to(dtype)

    weights = []
    for _ in range(L):
        weights += [torch.ones(D, device="cuda", dtype=dtype),
                    torch.ones(D, device="cuda", dtype=dtype),
                    w(H * HD, D), w(KV * HD, D), w(KV * HD, D), w(D, H * HD),
                    w(I, D), w(I, D), w(D, I), w(1, KV, ctx, HD), w(1, KV, ctx, HD)]
    cos = torch.randn(1, 1, HD, device="cuda", dtype=dtype)
    sin = torch.randn(1, 1, HD, device="cuda", dtype=dtype)
    return weights, cos, sin


def _decoder_layer(cfg, all_reduce=None):
    """One Llama-style layer of Liger kernels and ATen ops for a one-token step:
    ``layer(h, p, cos, sin, k_past, v_past) -> (h, k_cache, v_cache)``, where ``p`` maps
    PER_LAYER names to weights and the caches are ``k_past``/``v_past`` plus this position.
    ``all_reduce``: for a tensor-parallel shard (``cfg`` holds this rank's heads and
    intermediate size; benchmarks/bench_tp.py), called in place on the outputs of o_proj and down
    before each residual add."""
    from liger_kernel.transformers import functional as liger
    F = torch.nn.functional
    H, KV, HD = cfg["H"], cfg["KV"], cfg["HD"]

    def layer(h, p, cos, sin, k_past, v_past):
        r = h
        x = liger.liger_rms_norm(h, p["ln1"], 1e-6)
        q = F.linear(x, p["wq"]).view(1, 1, H, HD).transpose(1, 2)
        k = F.linear(x, p["wk"]).view(1, 1, KV, HD).transpose(1, 2)
        v = F.linear(x, p["wv"]).view(1, 1, KV, HD).transpose(1, 2)
        q, k = liger.liger_rope(q.contiguous(), k.contiguous(), cos, sin)
        kc = torch.cat([k_past, k], dim=2)
        vc = torch.cat([v_past, v], dim=2)
        a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        o = F.linear(a.transpose(1, 2).reshape(1, 1, H * HD), p["wo"])
        if all_reduce is not None:
            all_reduce(o)
        h = r + o
        x = liger.liger_rms_norm(h, p["ln2"], 1e-6)
        d = F.linear(liger.liger_swiglu(F.linear(x, p["wg"]), F.linear(x, p["wu"])), p["wd"])
        if all_reduce is not None:
            all_reduce(d)
        h = h + d
        return h, kc, vc

    return layer


def make_decode_step(cfg, all_reduce=None):
    """The decode step over fixed-length KV caches (they are weights: PER_LAYER's kc, vc; each
    step drops the oldest position and appends the new one). ``all_reduce``: see
    ``_decoder_layer``."""
    layer = _decoder_layer(cfg, all_reduce)

    def decode_step(h, cos, sin, *weights):
        for i in range(0, len(weights), len(PER_LAYER)):
            p = dict(zip(PER_LAYER, weights[i:i + len(PER_LAYER)]))
            h, _, _ = layer(h, p, cos, sin, p["kc"][:, :, 1:], p["vc"][:, :, 1:])
        return h

    return decode_step


def make_growing_step(cfg):
    """The decode step with the KV caches as arguments: each step appends one position, so the
    caches' length grows by one per token (Note [Automatic dynamic] in trident/frontend/policy.py).
    Arguments: h, cos, sin, the per-layer weights (PER_LAYER without kc, vc), then the L key
    caches and the L value caches; returns h and the new caches."""
    layer = _decoder_layer(cfg)
    L = cfg["L"]
    per_layer = len(PER_LAYER) - 2

    def growing_step(h, cos, sin, *params):
        weights, kcs, vcs = params[:per_layer * L], params[per_layer * L:-L], params[-L:]
        new_k, new_v = [], []
        for i in range(L):
            p = dict(zip(PER_LAYER, weights[i * per_layer:(i + 1) * per_layer]))
            h, kc, vc = layer(h, p, cos, sin, kcs[i], vcs[i])
            new_k.append(kc)
            new_v.append(vc)
        return (h, *new_k, *new_v)

    return growing_step


def growing_model(cfg):
    """(weights without the caches, cos, sin) for ``make_growing_step``."""
    weights, cos, sin = build_model(cfg, ctx=1)
    keep = len(PER_LAYER) - 2
    return [w for i, w in enumerate(weights) if i % len(PER_LAYER) < keep], cos, sin


def initial_caches(cfg, length=1, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(2)
    shape = (1, cfg["KV"], length, cfg["HD"])
    return [(torch.randn(*shape, device="cuda", generator=g) * 0.02).to(dtype)
            for _ in range(2 * cfg["L"])]


def growing_kv(results, name="llama-3.2-1b-like", steps=512, save=lambda: None):
    """Decode ``steps`` tokens with the KV length growing 1 -> ``steps``: per contender, the
    median ms per token, the whole loop's seconds (compiles included) and whether the final
    hidden state equals eager's. Eager runs twice: on the H200 (torch 2.11, cuDNN attention)
    eager does not repeat itself bit for bit beyond a KV length of about 270, so Trident's
    equality is only meaningful when ``eager_repeats`` is true."""
    cfg = CONFIGS[name]
    weights, cos, sin = growing_model(cfg)
    step = make_growing_step(cfg)
    g = torch.Generator(device="cuda").manual_seed(3)
    tokens = [torch.randn(1, 1, cfg["D"], device="cuda", dtype=torch.bfloat16, generator=g)
              for _ in range(steps)]
    row = results.setdefault(f"{name} growing-KV decode, {steps} steps (ms/token)", {})

    def run(label, fn):
        print(f"growing KV: {label}", flush=True)
        caches = initial_caches(cfg)
        times = []
        start = time.perf_counter()
        with torch.no_grad():
            for h in tokens:
                t = time.perf_counter()
                out, *caches = fn(h, cos, sin, *weights, *caches)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
        total = time.perf_counter() - start
        row[label] = statistics.median(times) * 1e3
        row[f"{label}_loop_s"] = total
        return out

    try:
        want = run("eager", step)
        row["eager_repeats"] = torch.equal(run("eager_rerun", step), want)
        # Note [Graphs per size]: the first pass runs each length step by step, the second
        # captures it, the third replays it (a graph per length: 512 of them)
        jitted = trident.jit(step, fallback=False, cuda_graph_sizes=steps)
        row["trident_equal"] = torch.equal(run("trident", jitted), want)
        row["trident_pass2_equal"] = torch.equal(run("trident_pass2", jitted), want)
        row["trident_pass3_equal"] = torch.equal(run("trident_pass3", jitted), want)
        row["trident_stats"] = str(jitted.stats)
        steps_only = trident.jit(step, fallback=False, cuda_graphs=False)
        row["trident_steps_equal"] = torch.equal(run("trident_steps", steps_only), want)
        row["trident_steps_stats"] = str(steps_only.stats)
        for label, kwargs in (("compile_dynamic", dict(dynamic=True)),
                              ("compile_reduce-overhead", dict(mode="reduce-overhead",
                                                               dynamic=True))):
            torch._dynamo.reset()
            try:
                run(label, torch.compile(step, **kwargs))
            except Exception:
                row[f"{label}_error"] = traceback.format_exc()[-600:]
            save()
    except Exception:
        row["error"] = traceback.format_exc()[-1500:]
    print(row, flush=True)
    save()


def models(results, names, compile_modes=("default", "reduce-overhead"), save=lambda: None):
    for name in names:
        cfg = CONFIGS[name]
        weights, cos, sin = build_model(cfg)
        h = torch.randn(1, 1, cfg["D"], device="cuda", dtype=torch.bfloat16)
        step = make_decode_step(cfg)
        args = (h, cos, sin, *weights)
        with torch.no_grad():
            row = contenders(f"{name} decode step (us)", step, args, results, n=20, reps=5,
                             compile_modes=compile_modes)
        try:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step(*args)
                torch.cuda.synchronize()
            events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            row["gpu_kernels_per_step"] = len(events)
            row["gpu_busy_us"] = sum(e.device_time for e in events)
        except Exception:
            row["profile_error"] = traceback.format_exc()[-400:]
        try:
            row["host_profile_steps"] = host_profile(
                trident.jit(step, fallback=False, cuda_graphs=False), args)
        except Exception:
            row["host_profile_error"] = traceback.format_exc()[-400:]
        save()


def host_profile(fn, args, calls=5) -> dict:
    """Where the host's time goes in ``fn``'s step-by-step calls: the torch profiler's CPU
    events over ``calls`` calls (after two), per event name: calls per step and self CPU µs
    per event, the largest first; and the GPU kernels per step. The profiler adds its own cost
    to every event (a few hundred ns), so the wall time per step is given beside it."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(2):
            fn(*args)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) / calls * 1e6
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*args)
            torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    return {"wall_us_per_step": wall_us, "gpu_kernels_per_step": kernels / calls,
            "events": [(e.key, e.count / calls, e.self_cpu_time_total / max(e.count, 1))
                       for e in rows]}


def table(results) -> str:
    """Markdown table: time per contender, and eager's, torch.compile's and the CUDA graph's
    time over Trident's, each with its range over the batches and the verdict
    (:func:`benchmarks.demo.compare`: a win only where the batches' min-max ranges do not overlap)."""
    cols = ["eager", "compile_default", "compile_reduce-overhead", "cuda_graph", "trident",
            "trident_steps", "trident_backend"]
    versus = ["eager", "compile_default", "cuda_graph"]
    lines = ["| case | " + " | ".join(cols) + " | eager/Trident | compile/Trident | "
             "graph/Trident |", "|---" * (len(cols) + 4) + "|"]
    for name, row in results.items():
        samples = row.get("samples", {})

        def cell(c):
            return f"{row[c]:.1f}" if isinstance(row.get(c), float) else "-"

        def ratio(c):
            if c in samples and "trident" in samples:
                return str(compare(samples[c], samples["trident"]))
            return "-"

        lines.append(f"| {name} | " + " | ".join(cell(c) for c in cols) + " | " +
                     " | ".join(ratio(c) for c in versus) + " |")
    return "\n".join(lines)


def main(json_path: str | None = None, model_names=tuple(CONFIGS),
         model_compile_modes=("default", "reduce-overhead"), micro_cases=True,
         growing_steps: int = 512) -> dict:
    results: dict = {}
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": triton.__version__, "python": sys.version.split()[0]}
    print(json.dumps(env))
    def save():
        if json_path:
            with open(json_path, "w") as f:
                json.dump({"env": env, "results": results}, f, indent=1, default=str)

    parts = ([micro] if micro_cases else []) + [
        lambda r: models(r, model_names, model_compile_modes, save)] + (
        [lambda r: growing_kv(r, steps=growing_steps, save=save)] if growing_steps else [])
    for part in parts:
        try:
            part(results)
        except Exception:
            results.setdefault("errors", {})[str(part)] = traceback.format_exc()[-2000:]
            print(traceback.format_exc())
        save()
    print(table({k: v for k, v in results.items() if k != "errors" and "growing" not in k}))
    for k, v in results.items():
        if "growing" in k:
            print(k, json.dumps(v, default=str))
    return results


if __name__ == "__main__":
    main(os.environ.get("OUT") and os.path.join(os.environ["OUT"], "bench_gpu.json"))
