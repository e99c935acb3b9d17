//! Kernels tch does not bind: varlen attention (`csrc/attention_shim.cpp`), the widened bf16
//! linear (`csrc/widened_linear.cpp`), ATen's fused AdamW (`csrc/fused_adamw.cpp`) and the
//! recomputing autograd function of selective recompute (`csrc/recomputed.cpp`).
use std::ffi::{c_char, c_void};
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

    /// Runs `call(closure, ..)` over `inputs` with autograd off inside a node that saves only
    /// the inputs and runs `call` again in backward. Owns `closure` from the call on: `drop`
    /// frees it with the node (or at once when no node keeps it).
    pub fn tc_recomputed(
        closure: *mut c_void,
        call: PieceFn,
        drop: PieceDrop,
        inputs: *const *const C_tensor,
        n_inputs: i64,
        outputs: *mut *mut C_tensor,
        n_outputs: i64,
    ) -> *mut c_char;
}

/// A piece of forward the recomputing node runs: writes `n_outputs` new heap tensors to
/// `outputs`, or returns false with a NUL-terminated message in `err` (`err_cap` bytes).
pub type PieceFn = unsafe extern "C" fn(
    closure: *mut c_void,
    inputs: *const *mut C_tensor,
    n_inputs: i64,
    outputs: *mut *mut C_tensor,
    n_outputs: i64,
    err: *mut c_char,
    err_cap: usize,
) -> bool;

/// Frees a piece's closure.
pub type PieceDrop = unsafe extern "C" fn(closure: *mut c_void);
