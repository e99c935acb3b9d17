// ATen's fused AdamW (`torch._fused_adamw_`, what `torch.optim.AdamW(fused=True)` runs) for one
// parameter slice, over the C ABI: tch 0.24 generates no binding for `_fused_adam*`.
//
// Tensors cross as `torch::Tensor*` (what a tch Tensor wraps). Errors follow shim_error.h.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>

#include "shim_error.h"

extern "C" {

// One AdamW step, in place, of `param` with `grad`, moments `exp_avg` / `exp_avg_sq` and
// `step` (a f32 scalar tensor on the parameter's device holding the step count after this
// update, as torch.optim passes `state_steps`). Decoupled weight decay, bias-corrected moments,
// no amsgrad, no maximize, no grad scaling.
char* tc_fused_adamw(at::Tensor* param, at::Tensor* grad, at::Tensor* exp_avg,
                     at::Tensor* exp_avg_sq, at::Tensor* step, double lr, double beta1,
                     double beta2, double weight_decay, double eps) {
  return tessera_shim::guarded([&] {
    at::_fused_adamw_({*param}, {*grad}, {*exp_avg}, {*exp_avg_sq}, {}, {*step}, lr, beta1,
                      beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
  });
}

}  // extern "C"
