//! Scaled dot-product attention shared by SigLIP (full, non-causal) and Qwen2 (block-diagonal
//! causal over packed rows, grouped-query).
use tch::{Kind, Tensor};

/// Attention mask for packed rows, `[rows, 1, len, len]` bool, true where attention is allowed:
/// query t sees key s when both belong to the same packed sample (equal, non-negative
/// `segment_ids`) and s <= t. Padding tokens (segment -1) see only themselves, so no softmax
/// row is empty (an empty row would be NaN, and NaN·0 leaks into real tokens' values).
pub(super) fn block_causal_mask(segment_ids: &Tensor) -> Tensor {
    let len = segment_ids.size()[1];
    let device = segment_ids.device();
    let q = segment_ids.unsqueeze(2);
    let k = segment_ids.unsqueeze(1);
    let same = q.eq_tensor(&k).logical_and(&q.ge(0));
    let causal = Tensor::ones([len, len], (Kind::Bool, device)).tril(0);
    let diagonal = Tensor::eye(len, (Kind::Bool, device));
    same.logical_and(&causal).logical_or(&diagonal).unsqueeze(1)
}

/// `softmax(q kᵀ · head_dim^-0.5 + mask) v` for `q` `[b, heads, len, hd]` and `k`, `v`
/// `[b, kv_heads, len, hd]`; kv heads are repeated (repeat_interleave) to match q's heads.
pub(super) fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Tensor {
    let heads = q.size()[1];
    let kv_heads = k.size()[1];
    let (k, v) = if heads != kv_heads {
        let groups = heads / kv_heads;
        (
            k.repeat_interleave_self_int(groups, 1, heads),
            v.repeat_interleave_self_int(groups, 1, heads),
        )
    } else {
        (k.shallow_clone(), v.shallow_clone())
    };
    let head_dim = q.size()[3];
    let scale = (head_dim as f64).powf(-0.5);
    Tensor::scaled_dot_product_attention(q, &k, &v, mask, 0.0, false, scale, false)
}
