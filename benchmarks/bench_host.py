"""The host floor of a step-by-step decode step (GPU machine only).

A step that runs without a CUDA graph issues every kernel from the host, and the libraries
issue some of them at a host cost of their own: cuBLAS picks its kernel for each GEMM call, cuDNN
looks its attention plan up, ATen checks and allocates. This measures, in one process and in C++
(no Python in the timed loops), what each of those calls costs on this machine, counts the calls
a Trident step-by-step step makes (torch profiler), and prints their sum, the floor under any
executor that keeps each op's kernel, beside the step's own time (per step over 20 steps in a
row, and the host time of one step issued to an idle GPU):

    python3 -c "from benchmarks import bench_host; bench_host.main()"

Needs nvcc and the CUDA headers (``torch.utils.cpp_extension.load_inline(with_cuda=True)``).
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import time

import torch

import trident
from benchmarks import bench_gpu

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>
#include <chrono>

using Clock = std::chrono::steady_clock;

template <class F> double us_per_call(int64_t n, F f) {
  auto start = Clock::now();
  for (int64_t i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / n;
}

// out (1, N) = x (1, K) @ w.t() for w (N, K) contiguous: cuBLAS's own call, on ATen's handle.
double cublas_gemm(at::Tensor x, at::Tensor w, at::Tensor out, int64_t n) {
  int64_t K = x.size(1), N = w.size(0);
  float alpha = 1.f, beta = 0.f;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  return us_per_call(n, [&] {
    cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, 1, K, &alpha, w.data_ptr(), CUDA_R_16BF, K,
                 x.data_ptr(), CUDA_R_16BF, K, &beta, out.data_ptr(), CUDA_R_16BF, N,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
  });
}
double aten_mm_out(at::Tensor x, at::Tensor w, at::Tensor out, int64_t n) {
  at::Tensor wt = w.t();
  return us_per_call(n, [&] { at::mm_out(out, x, wt); });
}
double aten_sdpa(at::Tensor q, at::Tensor k, at::Tensor v, int64_t n) {
  return us_per_call(n, [&] {
    at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, {}, true);
  });
}
double aten_cat(at::Tensor a, at::Tensor b, int64_t n) {
  return us_per_call(n, [&] { at::cat({a, b}, 2); });
}
double aten_add(at::Tensor a, at::Tensor b, int64_t n) {
  return us_per_call(n, [&] { at::add(a, b); });
}
double aten_empty(int64_t size, int64_t n) {
  auto options = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  return us_per_call(n, [&] { at::empty({1, size}, options); });
}
double launch_empty_kernel(int64_t n);
"""

_CUDA_SOURCE = r"""
#include <chrono>
#include <cuda_runtime.h>
__global__ void empty_kernel() {}
double launch_empty_kernel(int64_t n) {
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) empty_kernel<<<1, 1>>>();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
             .count() / n;
}
"""


def _median(fn, *args, calls=200, reps=7) -> float:
    """Median over ``reps`` loops of ``calls`` calls, µs per call; the GPU drained before each
    loop, so a loop whose kernels run faster than the host issues them times the host."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        times.append(fn(*args, calls))
    torch.cuda.synchronize()
    return sorted(times)[reps // 2]


def _gemms(cfg) -> dict:
    """{projection: (in features, out features)}: the seven GEMMs of a layer."""
    D, H, KV, HD, I = (cfg[k] for k in ("D", "H", "KV", "HD", "I"))
    return {"q": (D, H * HD), "k": (D, KV * HD), "v": (D, KV * HD), "o": (H * HD, D),
            "gate": (D, I), "up": (D, I), "down": (I, D)}


def library_costs(ext, cfg) -> dict:
    """µs of host time per library call of one decode step of ``cfg`` (bench_gpu.CONFIGS)."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    D, H, KV, HD = (cfg[k] for k in ("D", "H", "KV", "HD"))
    gemm, aten_mm, equal = {}, {}, True
    for role, (K, N) in _gemms(cfg).items():
        x, w = torch.randn(1, K, **bf16), torch.randn(N, K, **bf16) * 0.02
        out, want = torch.empty(1, N, **bf16), torch.mm(x, w.t())
        gemm[role] = _median(ext.cublas_gemm, x, w, out)
        aten_mm[role] = _median(ext.aten_mm_out, x, w, out)
        ext.cublas_gemm(x, w, out, 1)
        equal = equal and torch.equal(out, want)  # cuBLAS's kernel, as ATen calls it
    q = torch.randn(1, H, 1, HD, **bf16)
    k, v = torch.randn(1, KV, 256, HD, **bf16), torch.randn(1, KV, 256, HD, **bf16)
    h = torch.randn(1, 1, D, **bf16)
    return {"cublasGemmEx": gemm, "aten::mm_out": aten_mm, "gemm_equal_to_aten": equal,
            "aten::scaled_dot_product_attention": _median(ext.aten_sdpa, q, k, v),
            "aten::cat": _median(ext.aten_cat, k, k[:, :, :1]),
            "aten::add": _median(ext.aten_add, h, h),
            "aten::empty": _median(ext.aten_empty, D),
            "kernel launch": _median(ext.launch_empty_kernel)}


def step_calls(fn, args) -> dict:
    """Calls per step of ``fn`` (after two warm-up calls), from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn(*args)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return collections.Counter(e.name for e in prof.events())


def main(json_path: str | None = None, names=tuple(bench_gpu.CONFIGS)) -> dict:
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("trident_bench_host", _SOURCE, cuda_sources=_CUDA_SOURCE,
                      functions=["cublas_gemm", "aten_mm_out", "aten_sdpa", "aten_cat",
                                 "aten_add", "aten_empty", "launch_empty_kernel"],
                      extra_ldflags=["-lcublas"], with_cuda=True)
    results = {}
    for name in names:
        cfg = bench_gpu.CONFIGS[name]
        weights, cos, sin = bench_gpu.build_model(cfg)
        h = torch.randn(1, 1, cfg["D"], device="cuda", dtype=torch.bfloat16)
        args = (h, cos, sin, *weights)
        step = trident.jit(bench_gpu.make_decode_step(cfg), fallback=False, cuda_graphs=False)
        with torch.no_grad():
            calls = step_calls(step, args)
            in_a_row = bench_gpu.per_call(lambda: step(*args), n=20, warm=2, reps=5)
            alone = []
            for _ in range(15):  # one step issued to an idle GPU: the host's time alone
                torch.cuda.synchronize()
                start = time.perf_counter()
                step(*args)
                alone.append((time.perf_counter() - start) * 1e6)
        cost = library_costs(ext, cfg)
        L, n = cfg["L"], calls.__getitem__
        gemms = n("aten::mm") + n("aten::bmm")
        assert gemms == 7 * L, calls  # the seven projections of each layer, one GEMM each
        floor = {  # µs per step: each call at its cost measured above
            "GEMMs (cuBLAS's own calls)": L * sum(cost["cublasGemmEx"].values()),
            "attention (ATen's cuDNN call)": L * cost["aten::scaled_dot_product_attention"],
            "cat": n("aten::cat") * cost["aten::cat"],
            "add": n("aten::add") * cost["aten::add"],
            "allocation": (n("aten::empty") + n("aten::empty_strided")) * cost["aten::empty"],
            # cuBLAS launches its sm90 kernels with cuLaunchKernelEx too, counted in its calls;
            # a Triton launch is costed as a runtime launch of an empty kernel
            "Triton launches": max(n("cuLaunchKernelEx") - gemms, 0) * cost["kernel launch"],
        }
        results[name] = {"trident_steps_us": statistics.median(in_a_row),
                         "one_step_issued_to_an_idle_gpu_us": sorted(alone)[7],
                         "floor_us": sum(floor.values()),
                         "floor_parts_us": floor, "costs_us": cost,
                         "calls_per_step": {k: calls[k] for k in sorted(calls) if k.startswith(
                             ("aten::mm", "aten::bmm", "aten::cat", "aten::add", "aten::empty",
                              "cuLaunchKernel", "cudaLaunchKernel", "aten::_cudnn"))}}
        print(name, json.dumps(results[name], indent=1), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(os.environ.get("OUT") and os.path.join(os.environ["OUT"], "bench_host.json"))
