// operators.cpp: the runtime's trident:: operators, which plans call: the random state steps
// and the bool results of equal and allclose.

#include "runtime_internal.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/library.h>

#include <mutex>
#include <optional>

namespace {

// Note [Random state steps] (trident/lower/rng.py): torch.manual_seed, torch.get_rng_state and
// torch.set_rng_state (and their torch.cuda twins) as operators a plan calls, on the default
// generators, at the point where the function called them. Each holds the generator's mutex, as
// torch's Python bindings do (Note [Acquire lock when using random generators] in ATen).
at::Generator default_generator(c10::Device device) {
  if (device.is_cuda() && !device.has_index())  // torch.cuda's "cuda": the current device
    device = c10::Device(c10::kCUDA, c10::impl::VirtualGuardImpl(c10::kCUDA).getDevice().index());
  return at::globalContext().defaultGenerator(device);
}

void seed_generator(at::Generator gen, int64_t seed) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(static_cast<uint64_t>(seed));  // torch's bindings take [-2^63, 2^64)
}

// device None: what torch.manual_seed seeds, every CUDA device's generator (rng.py compiles the
// call only where CUDA is absent or initialized, so torch.cuda.manual_seed_all seeds at once)
// and then the CPU's; a device: its generator (torch.cuda.manual_seed, manual_seed_all).
void op_manual_seed(int64_t seed, std::optional<c10::Device> device) {
  if (device) return seed_generator(default_generator(*device), seed);
  if (at::globalContext().hasCUDA())
    for (c10::DeviceIndex i = 0; i < c10::impl::VirtualGuardImpl(c10::kCUDA).deviceCount(); ++i)
      seed_generator(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, i)), seed);
  seed_generator(at::detail::getDefaultCPUGenerator(), seed);
}

at::Tensor op_get_rng_state(c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void op_set_rng_state(const at::Tensor& state, c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Note [Bool results] (trident/lower/capture.py): aten::equal and aten::allclose return a C++ bool,
// which a trace on fake tensors cannot know; as a 0-dim bool tensor it is a value of the plan,
// read by aten::_local_scalar_dense as `.item()` is.
at::Tensor op_equal(const at::Tensor& self, const at::Tensor& other) {
  return at::scalar_tensor(at::equal(self, other), at::kBool);
}

at::Tensor op_allclose(const at::Tensor& self, const at::Tensor& other, double rtol, double atol,
                       bool equal_nan) {
  return at::scalar_tensor(at::allclose(self, other, rtol, atol, equal_nan), at::kBool);
}

}  // namespace

TORCH_LIBRARY(trident, m) {
  // nondeterministic_seeded: they act on the random state, so no CUDA graph holds them
  // (graphs._draws_random) and a failure after them is not run again (plan.rerun_eagerly)
  const std::vector<at::Tag> rng = {at::Tag::nondeterministic_seeded};
  m.def("manual_seed(int seed, Device? device=None) -> ()", rng);
  m.def("get_rng_state(Device device) -> Tensor", rng);
  m.def("set_rng_state(Tensor state, Device device) -> ()", rng);
  m.def("equal(Tensor self, Tensor other) -> Tensor");
  m.def("allclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, "
        "bool equal_nan=False) -> Tensor");
}

// CompositeExplicitAutograd: one kernel for every backend, and for calls without a tensor
TORCH_LIBRARY_IMPL(trident, CompositeExplicitAutograd, m) {
  m.impl("manual_seed", &op_manual_seed);
  m.impl("get_rng_state", &op_get_rng_state);
  m.impl("set_rng_state", &op_set_rng_state);
  m.impl("equal", &op_equal);
  m.impl("allclose", &op_allclose);
}
