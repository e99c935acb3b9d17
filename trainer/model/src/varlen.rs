//! Packed-row attention as varlen kernels compute it (flash-attention's `cu_seqlens` API): the
//! rows' tokens flattened to `[total, heads, head_dim]`, every packed sample one causal
//! sequence and every padding token a sequence of its own (so it attends to itself only,
//! as [`super::attention::block_causal_mask`] lets it). On CUDA the shim
//! (`csrc/attention_shim.cpp`) runs ATen's flash kernel (bf16/f16) or its memory-efficient
//! kernel (f32) over these sequences: no `[len × len]` mask exists. Elsewhere
//! [`attend_varlen`] emulates the kernel sequence by sequence, from the same flattened
//! tensors and boundaries, which is what the CPU tests compare with the dense-mask path.
use super::attention::Span;
use super::error::Result;
use super::side_stream::upload;
use tch::{Device, Tensor};
use tessera_fsdp::ComputeError;
use tessera_switches::Switches;
use tessera_sys::kernels::tc_varlen_causal_attention;
use tessera_sys::{C_tensor, ShimError};

/// The packed rows' sequences as a varlen kernel takes them.
pub struct Varlen {
    /// Sequence boundaries over the flattened `[rows · len]` tokens: 0 first, total last.
    pub bounds: Vec<i64>,
    /// `bounds` as `[sequences + 1]` i32 on the device the kernel runs on.
    pub cu_seqlens: Tensor,
    /// The longest sequence.
    pub max_len: i64,
}

impl Varlen {
    /// Sequences of `spans` (each row's runs, end to end, rows of `row_len` tokens): a
    /// sample's run is one sequence, a padding run one sequence per token.
    pub fn from_spans(spans: &[Vec<Span>], row_len: i64, device: Device) -> Result<Self> {
        let mut bounds = vec![0i64];
        for (r, row) in spans.iter().enumerate() {
            let base = r as i64 * row_len;
            for s in row {
                if s.padding {
                    bounds.extend((1..=s.len).map(|i| base + s.start + i));
                } else {
                    bounds.push(base + s.start + s.len);
                }
            }
        }
        let max_len = bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let as_i32: Vec<i32> = bounds.iter().map(|&b| b as i32).collect();
        Ok(Varlen {
            cu_seqlens: upload(Tensor::from_slice(&as_i32), device)?,
            bounds,
            max_len,
        })
    }
}

/// Causal attention within each sequence of `varlen` for `q` `[rows, heads, len, hd]` and `k`,
/// `v` `[rows, kv_heads, len, hd]` (grouped-query: heads a multiple of kv_heads); returns
/// `[rows, heads, len, hd]`, what [`super::attention::attend`] gives with the block-causal mask.
pub fn attend_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    varlen: &Varlen,
) -> Result<Tensor, ComputeError> {
    let (rows, heads, len, hd) = q.size4()?;
    let flat = |t: &Tensor| t.transpose(1, 2).reshape([rows * len, t.size()[1], hd]);
    let (qf, kf, vf) = (flat(q), flat(k), flat(v));
    let scale = (hd as f64).powf(-0.5);
    let out = if q.device().is_cuda() {
        cuda_varlen(&qf, &kf, &vf, varlen, scale)?
    } else {
        emulate_varlen(&qf, &kf, &vf, &varlen.bounds, scale)
    };
    Ok(out.view([rows, len, heads, hd]).transpose(1, 2))
}

/// The shim's kernel call; a failure (an unsupported device, dtype or head size) comes back as
/// the kernel's message.
fn cuda_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    varlen: &Varlen,
    scale: f64,
) -> Result<Tensor, ShimError> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: every pointer is a live tch tensor borrowed for the call; on success the shim
    // hands over a heap `at::Tensor` that `Tensor::from_ptr` owns (and frees) from then on.
    unsafe {
        let err = tc_varlen_causal_attention(
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            varlen.cu_seqlens.as_ptr(),
            varlen.max_len,
            scale,
            &mut out,
        );
        tessera_sys::take_error(err, "varlen attention kernel")?;
        Ok(Tensor::from_ptr(out))
    }
}

/// What the kernel computes, one sequence at a time on any device: `q` `[total, heads, hd]`,
/// `k`, `v` `[total, kv_heads, hd]`, sequences `[bounds[i], bounds[i + 1])`.
pub fn emulate_varlen(q: &Tensor, k: &Tensor, v: &Tensor, bounds: &[i64], scale: f64) -> Tensor {
    let groups = q.size()[1] / k.size()[1];
    let heads = q.size()[1];
    let parts: Vec<Tensor> = bounds
        .windows(2)
        .map(|w| {
            let (start, len) = (w[0], w[1] - w[0]);
            // [len, h, hd] -> [1, h, len, hd]
            let seq = |t: &Tensor| t.narrow(0, start, len).transpose(0, 1).unsqueeze(0);
            let expand = |t: Tensor| {
                if groups > 1 {
                    t.repeat_interleave_self_int(groups, 1, heads)
                } else {
                    t
                }
            };
            let out = Tensor::scaled_dot_product_attention(
                &seq(q),
                &expand(seq(k)),
                &expand(seq(v)),
                None::<&Tensor>,
                0.0,
                true,
                scale,
                false,
            );
            out.squeeze_dim(0).transpose(0, 1)
        })
        .collect();
    if parts.is_empty() {
        return Tensor::zeros(q.size().as_slice(), (q.kind(), q.device()));
    }
    Tensor::cat(&parts, 0)
}

/// Whether packed rows on `device` run through the varlen kernels: CUDA, unless
/// `TESSERA_DENSE_ATTENTION=1` asks for the dense block-causal mask (to compare, or to fall
/// back where the kernels are unavailable).
pub(super) fn use_varlen(device: Device) -> bool {
    device.is_cuda() && !Switches::get().dense_attention
}
