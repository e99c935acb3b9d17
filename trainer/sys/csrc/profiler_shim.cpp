// libtorch's Kineto profiler (what torch.profiler drives) behind a C ABI, for
// `tessera train --profile N`: start before a step, stop after the N-th and save the Chrome
// trace (the JSON chrome://tracing, Perfetto and TensorBoard read). Errors follow
// shim_error.h: NULL on success, else a heap C string freed with tc_free_error.
#include <memory>
#include <set>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "shim_error.h"

using tessera_shim::guarded;

extern "C" {

// Starts recording this thread's ATen ops (and, with cuda != 0, CUDA kernels and copies).
char* tc_profiler_start(int cuda) {
  return guarded([&] {
    using torch::profiler::impl::ActivityType;
    using torch::profiler::impl::ProfilerConfig;
    using torch::profiler::impl::ProfilerState;
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda != 0) {
      activities.insert(ActivityType::CUDA);
    }
    const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  });
}

// Stops recording and writes the Chrome trace to `path`.
char* tc_profiler_stop(const char* path) {
  return guarded([&] {
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    TORCH_CHECK(result != nullptr, "the profiler was not running");
    result->save(path);
  });
}

}  // extern "C"
