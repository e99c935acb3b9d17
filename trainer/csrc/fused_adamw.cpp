// ATen's fused AdamW (`torch._fused_adamw_`, what `torch.optim.AdamW(fused=True)` runs) for one
// parameter slice, over the C ABI: tch 0.24 generates no binding for `_fused_adam*`.
//
// Tensors cross as `torch::Tensor*` (what a tch Tensor wraps). Returns NULL on success, else a
// heap C string that Rust frees with tc_fused_adamw_free_error.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>

namespace {

char* dup_message(const std::string& msg) {
  char* out = static_cast<char*>(std::malloc(msg.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, msg.c_str(), msg.size() + 1);
  }
  return out;
}

}  // namespace

extern "C" {

void tc_fused_adamw_free_error(char* err) { std::free(err); }

// One AdamW step, in place, of `param` with `grad`, moments `exp_avg` / `exp_avg_sq` and
// `step` (a f32 scalar tensor on the parameter's device holding the step count after this
// update, as torch.optim passes `state_steps`). Decoupled weight decay, bias-corrected moments,
// no amsgrad, no maximize, no grad scaling.
char* tc_fused_adamw(at::Tensor* param, at::Tensor* grad, at::Tensor* exp_avg,
                     at::Tensor* exp_avg_sq, at::Tensor* step, double lr, double beta1,
                     double beta2, double weight_decay, double eps) {
  try {
    at::_fused_adamw_({*param}, {*grad}, {*exp_avg}, {*exp_avg_sq}, {}, {*step}, lr, beta1,
                      beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
    return nullptr;
  } catch (const c10::Error& e) {
    return dup_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return dup_message(e.what());
  } catch (...) {
    return dup_message("unknown C++ exception");
  }
}

}  // extern "C"
