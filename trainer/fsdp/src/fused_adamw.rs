//! ATen's fused AdamW kernel (`_fused_adamw_`, what `torch.optim.AdamW(fused=True)` runs), bound
//! through `csrc/fused_adamw.cpp` (tch generates no binding for it). [`super::optim`] uses it on
//! every device, where it replaces a dozen elementwise kernels per parameter slice with one.
use tch::Tensor;
use tessera_sys::kernels::tc_fused_adamw;
use tessera_sys::ShimError;

/// AdamW hyper-parameters of one fused call.
#[derive(Clone, Copy, Debug)]
pub(super) struct FusedHyper {
    pub lr: f64,
    pub betas: (f64, f64),
    pub weight_decay: f64,
    pub eps: f64,
}

/// One in-place AdamW step of `param` (and its moments) from `grad`; `step` is a f32 scalar on
/// the parameter's device holding the step count including this update.
pub(super) fn fused_adamw_(
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    step: &Tensor,
    h: FusedHyper,
) -> Result<(), ShimError> {
    // SAFETY: tch tensors wrap `torch::Tensor*`; the kernel updates the storages in place
    // (which the shallow handles here share) and keeps no reference after returning.
    let err = unsafe {
        tc_fused_adamw(
            param.as_ptr() as *mut _,
            grad.as_ptr() as *mut _,
            exp_avg.as_ptr() as *mut _,
            exp_avg_sq.as_ptr() as *mut _,
            step.as_ptr() as *mut _,
            h.lr,
            h.betas.0,
            h.betas.1,
            h.weight_decay,
            h.eps,
        )
    };
    // SAFETY: `err` is what the shim just returned.
    unsafe { tessera_sys::take_error(err, "_fused_adamw_") }
}
