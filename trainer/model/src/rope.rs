//! Rotary position embeddings as transformers' Qwen2, Qwen3 and Llama compute them (default
//! rope type): inv_freq = 1 / theta^(arange(0, hd, 2) / hd) in f32, emb = cat(freqs, freqs),
//! x' = x·cos + rotate_half(x)·sin, with rotate_half(x) = cat(−x[hd/2..], x[..hd/2]).
use tch::{Kind, Tensor};

/// Cos and sin tables for `positions` `[rows, len]` (i64): each `[rows, 1, len, head_dim]`, f32,
/// broadcasting over the head axis of `[rows, heads, len, head_dim]` queries and keys.
pub(super) fn rotary_tables(positions: &Tensor, head_dim: i64, theta: f64) -> (Tensor, Tensor) {
    let device = positions.device();
    let exponent = Tensor::arange_start_step(0, head_dim, 2, (Kind::Int64, device))
        .to_kind(Kind::Float)
        / head_dim as f64;
    let inv_freq = Tensor::pow_scalar(theta, &exponent).reciprocal();
    // [rows, len, 1] * [hd/2] -> [rows, len, hd/2]
    let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
    let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
    (emb.cos(), emb.sin())
}

/// cat(−x[hd/2..], x[..hd/2]), the halves taken with one `split` (its backward concatenates
/// the two gradients; a `narrow` per half would zero-fill a gradient of x's size for each).
fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let halves = x.split(half, -1);
    Tensor::cat(&[&halves[1].neg(), &halves[0]], -1)
}

/// Applies the rotation to `x` `[rows, heads, len, head_dim]`. The f32 tables are cast to x's
/// dtype first, as transformers does (`cos.to(x.dtype)`): a bf16 x stays bf16.
pub(super) fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let (cos, sin) = (cos.to_kind(x.kind()), sin.to_kind(x.kind()));
    x * cos + rotate_half(x) * sin
}
