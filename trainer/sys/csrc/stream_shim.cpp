// Host-to-device uploads on a side stream, for the trainer's next micro-batch while the current
// one computes: the uploads of a micro-batch are issued with a pool stream current, an event
// marks their end, and when the micro-batch is used the compute stream waits on that event and
// each uploaded tensor is recorded as in use on the compute stream (so the caching allocator
// does not hand its memory back to the side stream while compute kernels still read it).
//
// tch has no CUDA stream API. Only the `cuda` feature compiles the body; without it every entry
// point fails with a message, and Rust never calls them for CPU tensors. Errors follow
// shim_error.h.
#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include "shim_error.h"

#ifdef TESSERA_CUDA
#include <c10/core/Event.h>
#include <c10/cuda/CUDAStream.h>
#endif

struct tc_side_upload {
#ifdef TESSERA_CUDA
  c10::cuda::CUDAStream side;
  c10::cuda::CUDAStream previous;
  // c10's device-generic event (CUDA through c10_cuda's registered guard): no direct cudart
  // symbols in this object.
  c10::Event done{c10::DeviceType::CUDA};
  tc_side_upload(c10::cuda::CUDAStream side, c10::cuda::CUDAStream previous)
      : side(side), previous(previous) {}
#endif
};

namespace {

constexpr const char* kNoCuda = "tessera was built without the `cuda` feature: no CUDA streams";

}  // namespace

extern "C" {

// Makes a pool stream of CUDA device `device` current: the uploads issued until
// tc_side_upload_end run on it.
char* tc_side_upload_begin(int8_t device, tc_side_upload** out) {
  return tessera_shim::guarded([&] {
    *out = nullptr;
#ifdef TESSERA_CUDA
    const c10::DeviceIndex index = device;
    auto previous = c10::cuda::getCurrentCUDAStream(index);
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    *out = new tc_side_upload(side, previous);
    c10::cuda::setCurrentCUDAStream(side);
#else
    (void)device;
    TORCH_CHECK(false, kNoCuda);
#endif
  });
}

// Marks the end of the uploads with an event on the side stream and makes the previous stream
// current again.
char* tc_side_upload_end(tc_side_upload* upload) {
  return tessera_shim::guarded([&] {
#ifdef TESSERA_CUDA
    upload->done.record(upload->side);
    c10::cuda::setCurrentCUDAStream(upload->previous);
#else
    (void)upload;
    TORCH_CHECK(false, kNoCuda);
#endif
  });
}

// Makes the current stream wait for the uploads and records each of the `n` tensors as used
// on it. Call once, before the first kernel that reads them.
char* tc_side_upload_wait(tc_side_upload* upload, at::Tensor* const* tensors, int64_t n) {
  return tessera_shim::guarded([&] {
#ifdef TESSERA_CUDA
    auto current = c10::cuda::getCurrentCUDAStream(upload->side.device_index());
    upload->done.block(current);
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor& t = *tensors[i];
      if (t.defined() && t.is_cuda()) {
        t.record_stream(current);
      }
    }
#else
    (void)upload;
    (void)tensors;
    (void)n;
    TORCH_CHECK(false, kNoCuda);
#endif
  });
}

void tc_side_upload_free(tc_side_upload* upload) { delete upload; }

// A page-locked copy of host tensor `host` (for a non-blocking upload), as a new tensor tch
// owns. tch's `pin_memory` passes a device, which PyTorch 2.11 deprecates with a warning on
// every call (thousands a run); the device-less form pins for the current accelerator.
char* tc_pin_memory(const at::Tensor* host, at::Tensor** out) {
  return tessera_shim::guarded([&] {
    *out = nullptr;
    *out = new at::Tensor(host->pin_memory());
  });
}

}  // extern "C"
