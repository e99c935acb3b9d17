//! Scaled dot-product attention shared by SigLIP (full, non-causal) and the LM (block-diagonal
//! causal over packed rows, grouped-query). Packed rows run either with a dense mask
//! ([`block_causal_mask`], [`attend`]) or span by span ([`attend_spans`]): each packed sample
//! as its own causal attention, which never builds the `[len × len]` mask and lets SDPA skip
//! every block above the diagonal and outside the sample (the varlen computation, on CPU).
use tch::{Kind, Tensor};

/// A run of one packed row: a sample's tokens, or padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: i64,
    pub len: i64,
    /// Padding tokens (segment -1): each attends to itself only.
    pub padding: bool,
}

/// The spans of each row of `segment_ids` (`[rows][len]`): maximal runs of one segment id.
/// Packed samples are contiguous in their row, so each run is one sample (or padding).
// Public for `testing` (the kernels the tests compare with), crate-wide otherwise.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn row_spans(segment_ids: &[i32], rows: usize, row_len: usize) -> Vec<Vec<Span>> {
    segment_ids
        .chunks(row_len.max(1))
        .take(rows)
        .map(|row| {
            let mut spans: Vec<Span> = Vec::new();
            for (t, &id) in row.iter().enumerate() {
                match spans.last_mut() {
                    Some(s) if row[s.start as usize] == id => s.len += 1,
                    _ => spans.push(Span {
                        start: t as i64,
                        len: 1,
                        padding: id < 0,
                    }),
                }
            }
            spans
        })
        .collect()
}

/// Attention mask for packed rows, `[rows, 1, len, len]` bool, true where attention is allowed:
/// query t sees key s when both belong to the same packed sample (equal, non-negative
/// `segment_ids`) and s <= t. Padding tokens (segment -1) see only themselves, so no softmax
/// row is empty (an empty row would be NaN, and NaN·0 leaks into real tokens' values).
// Public for `testing` (the kernels the tests compare with), crate-wide otherwise.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn block_causal_mask(segment_ids: &Tensor) -> Tensor {
    let len = segment_ids.size()[1];
    let device = segment_ids.device();
    let q = segment_ids.unsqueeze(2);
    let k = segment_ids.unsqueeze(1);
    let same = q.eq_tensor(&k).logical_and(&q.ge(0));
    let causal = Tensor::ones([len, len], (Kind::Bool, device)).tril(0);
    let diagonal = Tensor::eye(len, (Kind::Bool, device));
    same.logical_and(&causal).logical_or(&diagonal).unsqueeze(1)
}

/// `k`, `v` `[b, kv_heads, len, hd]` repeated (repeat_interleave) to q's head count.
fn repeat_kv(q: &Tensor, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
    let heads = q.size()[1];
    let kv_heads = k.size()[1];
    if heads != kv_heads {
        let groups = heads / kv_heads;
        (
            k.repeat_interleave_self_int(groups, 1, heads),
            v.repeat_interleave_self_int(groups, 1, heads),
        )
    } else {
        (k.shallow_clone(), v.shallow_clone())
    }
}

fn scale(q: &Tensor) -> f64 {
    (q.size()[3] as f64).powf(-0.5)
}

/// `softmax(q kᵀ · head_dim^-0.5 + mask) v` for `q` `[b, heads, len, hd]` and `k`, `v`
/// `[b, kv_heads, len, hd]`; kv heads are repeated (repeat_interleave) to match q's heads.
// Public for `testing` (the kernels the tests compare with), crate-wide otherwise.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Tensor {
    let (k, v) = repeat_kv(q, k, v);
    Tensor::scaled_dot_product_attention(q, &k, &v, mask, 0.0, false, scale(q), false)
}

/// What [`attend`] computes with [`block_causal_mask`], one span at a time: causal attention
/// within each sample's span, and padding tokens' own values (a padding token attends to
/// itself only). `spans[r]` covers row r of `q` `[rows, heads, len, hd]` end to end.
///
/// Rows and spans are cut with `split` rather than `narrow`: in backward a split's pieces are
/// concatenated once, where each narrow would zero-fill a gradient of the whole tensor and copy
/// its piece in (a sixth of a Qwen3-0.6B stage-1 step went to those fills and copies).
// Public for `testing` (the kernels the tests compare with), crate-wide otherwise.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn attend_spans(q: &Tensor, k: &Tensor, v: &Tensor, spans: &[Vec<Span>]) -> Tensor {
    let (k, v) = repeat_kv(q, k, v);
    let scale = scale(q);
    let (q_rows, k_rows, v_rows) = (q.split(1, 0), k.split(1, 0), v.split(1, 0));
    let rows: Vec<Tensor> = spans
        .iter()
        .enumerate()
        .map(|(r, row)| {
            let lens: Vec<i64> = row.iter().map(|s| s.len).collect();
            let pieces = |t: &Tensor| t.split_with_sizes(&lens, 2);
            let (qs, ks, vs) = (pieces(&q_rows[r]), pieces(&k_rows[r]), pieces(&v_rows[r]));
            let parts: Vec<Tensor> = row
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    if s.padding {
                        vs[i].shallow_clone()
                    } else {
                        Tensor::scaled_dot_product_attention(
                            &qs[i],
                            &ks[i],
                            &vs[i],
                            None::<&Tensor>,
                            0.0,
                            true,
                            scale,
                            false,
                        )
                    }
                })
                .collect();
            Tensor::cat(&parts, 2)
        })
        .collect();
    Tensor::cat(&rows, 0)
}
