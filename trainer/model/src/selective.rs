//! Selective activation recompute (`--recompute selective`): the decoder layers keep their
//! autograd graphs, as with `none`, except for the cheap element-wise pieces, which save only
//! their inputs and run again in backward (`csrc/recomputed.cpp`):
//!
//! - every RMSNorm (input, post-attention, Qwen3's per-head query and key norms, the final
//!   norm): keeps its input (the residual stream, or a projection's output, kept anyway) instead
//!   of the f32 copy and the normed activation;
//! - the SwiGLU activation `silu(gate) · up` (dense MLPs and every expert): keeps the two
//!   projections' outputs instead of `silu(gate)` as well.
//!
//! Kept as with `none`: the outputs of every matmul (q, k, v, o, gate, up, down, the head), the
//! attention kernel's output and log-sum-exp, RoPE's cast tables. The towers' LayerNorm and
//! GELU are ATen kernels whose backward reads only their input, which the next matmul keeps
//! anyway, so a tower layer keeps what it keeps under `none`.
//!
//! The gradient is autograd's over the same ops, run twice: equal to `none`'s.
use super::decoder::rms_norm;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tch::{TchError, Tensor};
use tessera_sys::kernels::tc_recomputed;
use tessera_sys::{C_tensor, ShimError};

/// How the decoder runs its cheap pieces: plainly (`recomputed: false`), or inside a node that
/// recomputes them in backward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CheapOps {
    pub recomputed: bool,
}

impl CheapOps {
    /// RMSNorm of `x` with `weight` (see [`rms_norm`]).
    pub(crate) fn rms_norm(
        self,
        x: &Tensor,
        weight: &Tensor,
        eps: f64,
    ) -> Result<Tensor, ShimError> {
        if !self.wraps(&[x, weight]) {
            return Ok(rms_norm(x, weight, eps));
        }
        one(recomputed(
            "recomputed RMSNorm",
            &[x, weight],
            1,
            move |t| Ok(vec![rms_norm(&t[0], &t[1], eps)]),
        )?)
    }

    /// `silu(gate) · up`.
    pub(crate) fn swiglu(self, gate: &Tensor, up: &Tensor) -> Result<Tensor, ShimError> {
        if !self.wraps(&[gate, up]) {
            return Ok(gate.silu() * up);
        }
        one(recomputed("recomputed SwiGLU", &[gate, up], 1, |t| {
            Ok(vec![t[0].silu() * &t[1]])
        })?)
    }

    /// Whether a piece over `inputs` goes through the recomputing node: only when something
    /// it reads has a gradient to receive (a node over none would save inputs for nothing).
    fn wraps(self, inputs: &[&Tensor]) -> bool {
        self.recomputed && inputs.iter().any(|t| t.requires_grad())
    }
}

fn one(mut outputs: Vec<Tensor>) -> Result<Tensor, ShimError> {
    outputs.pop().ok_or(ShimError {
        op: "recomputed piece",
        message: "no output".into(),
    })
}

/// Runs `piece` over `inputs` inside the recomputing autograd node: with autograd off now,
/// again with autograd on in backward. `piece` must be a pure function of its inputs and
/// return `n_outputs` new tensors (not views of its inputs).
pub(crate) fn recomputed<F>(
    op: &'static str,
    inputs: &[&Tensor],
    n_outputs: usize,
    piece: F,
) -> Result<Vec<Tensor>, ShimError>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>, TchError> + Send + Sync + 'static,
{
    let closure = Box::into_raw(Box::new(piece)).cast::<c_void>();
    let pointers: Vec<*const C_tensor> = inputs.iter().map(|t| t.as_ptr()).collect();
    let mut outputs = vec![std::ptr::null_mut::<C_tensor>(); n_outputs];
    // SAFETY: the shim owns `closure` from here (it frees it through `drop_piece::<F>`), reads
    // the inputs, and on success writes `n_outputs` new heap tensors.
    let err = unsafe {
        tc_recomputed(
            closure,
            call_piece::<F>,
            drop_piece::<F>,
            pointers.as_ptr(),
            pointers.len() as i64,
            outputs.as_mut_ptr(),
            n_outputs as i64,
        )
    };
    // SAFETY: `err` is what the shim just returned.
    unsafe { tessera_sys::take_error(err, op) }?;
    // SAFETY: each output is a fresh heap tensor, owned from here.
    Ok(outputs
        .into_iter()
        .map(|t| unsafe { Tensor::from_ptr(t) })
        .collect())
}

/// The shim's call into a piece: runs it, hands its outputs over, reports an error or a panic
/// as a message (neither may cross the C++ frames).
unsafe extern "C" fn call_piece<F>(
    closure: *mut c_void,
    inputs: *const *mut C_tensor,
    n_inputs: i64,
    outputs: *mut *mut C_tensor,
    n_outputs: i64,
    err: *mut c_char,
    err_cap: usize,
) -> bool
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>, TchError> + Send + Sync + 'static,
{
    let run = || -> Result<Vec<Tensor>, String> {
        // SAFETY: `closure` is the box `recomputed` made for this F, alive while its node is.
        let piece = unsafe { &*closure.cast::<F>() };
        let inputs: Vec<Tensor> = (0..n_inputs.max(0) as usize)
            // SAFETY: the shim passes `n_inputs` live tensors; each is shallow-copied here.
            .map(|i| unsafe { Tensor::clone_from_ptr(*inputs.add(i)) })
            .collect();
        let out = piece(&inputs).map_err(|e| e.to_string())?;
        if out.len() != n_outputs as usize {
            return Err(format!(
                "the piece returned {} tensors, {n_outputs} expected",
                out.len()
            ));
        }
        Ok(out)
    };
    let message = match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(out)) => {
            for (i, mut t) in out.into_iter().enumerate() {
                // SAFETY: `outputs` has room for `n_outputs`; the C++ side deletes each.
                unsafe { *outputs.add(i) = t.as_mut_ptr() };
                std::mem::forget(t);
            }
            return true;
        }
        Ok(Err(message)) => message,
        Err(panic) => match panic.downcast_ref::<String>() {
            Some(s) => s.clone(),
            None => panic
                .downcast_ref::<&str>()
                .map_or_else(|| "the piece panicked".to_string(), |s| s.to_string()),
        },
    };
    let bytes = message.as_bytes();
    let n = bytes.len().min(err_cap.saturating_sub(1));
    // SAFETY: `err` has `err_cap` bytes; n + 1 <= err_cap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
    false
}

/// Frees a piece's box (called once, by the node's owner tensor).
unsafe extern "C" fn drop_piece<F>(closure: *mut c_void) {
    // SAFETY: `closure` came from `Box::into_raw` of a Box<F> and is freed only here.
    drop(unsafe { Box::from_raw(closure.cast::<F>()) });
}

#[cfg(test)]
mod tests {
    use super::CheapOps;
    use tch::{Kind, Tensor};

    fn grads(recomputed: bool) -> (Tensor, Tensor, Tensor, Tensor) {
        tch::manual_seed(7);
        let x = Tensor::randn([3, 5, 16], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let w = Tensor::randn([16], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let up = Tensor::randn([3, 5, 16], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let ops = CheapOps { recomputed };
        let normed = ops.rms_norm(&x, &w, 1e-6).expect("norm");
        let y = ops.swiglu(&normed, &up).expect("swiglu");
        let loss = (&y * &y).sum(Kind::Float);
        let g = Tensor::run_backward(&[&loss], &[&x, &w, &up], false, false);
        (
            loss.detach(),
            g[0].shallow_clone(),
            g[1].shallow_clone(),
            g[2].shallow_clone(),
        )
    }

    /// The recomputing node gives the value and the gradients autograd gives over the same
    /// ops, bit for bit on one machine.
    #[test]
    fn recomputed_pieces_give_plain_autograds_values_and_gradients() {
        let plain = grads(false);
        let recomputed = grads(true);
        assert!(plain.0.equal(&recomputed.0));
        assert!(plain.1.equal(&recomputed.1), "dx differs");
        assert!(plain.2.equal(&recomputed.2), "dw differs");
        assert!(plain.3.equal(&recomputed.3), "dup differs");
    }

    /// A piece that fails in backward reports its message through the backward call.
    #[test]
    fn a_failing_piece_reports_its_error() {
        let x = Tensor::ones([4], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let err = super::recomputed("test piece", &[&x], 2, |t| Ok(vec![&t[0] * 2.0]))
            .expect_err("one output where two are expected");
        assert!(err.to_string().contains("1 tensors, 2 expected"), "{err}");
    }
}
