//! Kernels tch does not bind: varlen attention (`csrc/attention_shim.cpp`), the widened bf16
//! linear (`csrc/widened_linear.cpp`) and ATen's fused AdamW (`csrc/fused_adamw.cpp`).
use std::ffi::c_char;
use torch_sys::C_tensor;

extern "C" {
    pub fn tc_varlen_causal_attention(
        q: *const C_tensor,
        k: *const C_tensor,
        v: *const C_tensor,
        cu_seqlens: *const C_tensor,
        max_len: i64,
        scale: f64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;

    pub fn tc_widened_linear(
        x: *const C_tensor,
        w: *const C_tensor,
        b: *const C_tensor,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;

    pub fn tc_fused_adamw(
        param: *mut C_tensor,
        grad: *mut C_tensor,
        exp_avg: *mut C_tensor,
        exp_avg_sq: *mut C_tensor,
        step: *mut C_tensor,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> *mut c_char;
}
