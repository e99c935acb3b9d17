// libtorch's Kineto profiler (what torch.profiler drives) behind a C ABI, for
// `tessera train --profile N`: start before a step, stop after the N-th and save the Chrome
// trace (the JSON chrome://tracing, Perfetto and TensorBoard read). Same error convention as
// c10d_shim.cpp: NULL on success, else a heap C string freed with tc_free_error.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <string>

#include <torch/csrc/autograd/profiler_kineto.h>

namespace {

char* profiler_error(const std::string& msg) {
  char* out = static_cast<char*>(std::malloc(msg.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, msg.c_str(), msg.size() + 1);
  }
  return out;
}

template <typename F>
char* profiler_guarded(F body) {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return profiler_error(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return profiler_error(e.what());
  } catch (...) {
    return profiler_error("unknown C++ exception");
  }
}

}  // namespace

extern "C" {

// Starts recording this thread's ATen ops (and, with cuda != 0, CUDA kernels and copies).
char* tc_profiler_start(int cuda) {
  return profiler_guarded([&] {
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
  return profiler_guarded([&] {
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    TORCH_CHECK(result != nullptr, "the profiler was not running");
    result->save(path);
  });
}

}  // extern "C"
