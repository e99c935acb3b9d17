//! Sum of token cross-entropy over supervised positions, computed in chunks of tokens so the
//! `[tokens × vocab]` logits never exist at once (Qwen's vocabulary is 151,936: one 8,192-token
//! micro-batch would need 5 GB of f32 logits).
//!
//! Autograd would keep every chunk's logits alive until backward, so the gradients are
//! computed chunk by chunk here, in the forward pass, from softmax − one-hot:
//! dL/dh = (p − y)·W and dL/dW = (p − y)ᵀ·h. The returned scalar is
//! `loss + s − s.detach()` with `s = Σ h·dL/dh + Σ W·dL/dW`: its value is the loss, and
//! back-propagating through it delivers exactly those gradients to `h` and `W` (scaled by the
//! upstream gradient), whatever comes before `h` (the final norm, the decoder). Only the
//! gradients that are needed are computed (a frozen `W` gets none).
use super::gemm::CpuBf16Gemm;
use tch::{Kind, Tensor};

/// Chunk length keeping one chunk's logits near 64 Mi elements (256 MB in f32).
pub(super) fn default_chunk(vocab: i64) -> i64 {
    ((1i64 << 26) / vocab.max(1)).max(1)
}

thread_local! {
    /// The last call's f32 logits buffer, for the next call on this thread: allocated afresh
    /// at every micro-batch, it sometimes no longer fitted the hole the previous one left
    /// (small tensors kept across steps land in it), and the process grew by a chunk's logits
    /// (256 MB) at a random step.
    static LOGITS_BUFFER: std::cell::RefCell<Option<Tensor>> = const { std::cell::RefCell::new(None) };
}

/// A `[rows, vocab]` f32 buffer on `device`: the kept one when it is large enough.
fn logits_buffer(rows: i64, vocab: i64, device: tch::Device) -> Tensor {
    let kept = LOGITS_BUFFER.with(|b| b.borrow_mut().take());
    match kept {
        Some(t) if t.device() == device && t.size()[1] == vocab && t.size()[0] >= rows => t,
        _ => Tensor::empty([rows, vocab], (Kind::Float, device)),
    }
}

/// Keeps `buffer` for the next [`logits_buffer`] on this thread.
fn keep_logits_buffer(buffer: Tensor) {
    LOGITS_BUFFER.with(|b| *b.borrow_mut() = Some(buffer));
}

/// Σ_t CE(h_t Wᵀ, target_t) for `hidden` `[n, D]`, `weight` `[V, D]` and `targets` `[n]`
/// (every target supervised, none `IGNORE_INDEX`).
#[cfg(feature = "testing")]
pub fn chunked_cross_entropy_sum(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    chunk: i64,
) -> Tensor {
    chunked_cross_entropy(hidden, weight, targets, chunk, false).0
}

/// [`chunked_cross_entropy_sum`], and with `per_token` each token's cross-entropy too
/// (`[n]` f32, detached): what splitting the loss by source sums up.
pub(crate) fn chunked_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    chunk: i64,
    per_token: bool,
) -> (Tensor, Option<Tensor>) {
    let n = hidden.size()[0];
    let need_h = hidden.requires_grad();
    let need_w = weight.requires_grad();
    let (loss, grad_h, grad_w, tokens) = tch::no_grad(|| {
        // bf16 hidden states and weights: the logits come out of the matmul in bf16 and are
        // upcast, so the softmax, the loss and its gradient accumulate in f32 (transformers'
        // `logits.float()`); the gradients go back to bf16 for their matmuls, as autograd would.
        let compute = hidden.kind();
        // On a CPU without bf16 arithmetic (see `gemm`) the bf16 operands are widened once,
        // here, and every product below runs on the f32 kernels over bf16 values, rounded to
        // bf16 where a bf16 product would be.
        let wide = CpuBf16Gemm::current().widens(hidden);
        let operand = |t: &Tensor| {
            if wide {
                t.detach().to_kind(Kind::Float)
            } else {
                t.detach()
            }
        };
        let (h_all, w) = (operand(hidden), operand(weight));
        let mut loss = Tensor::zeros([], (Kind::Float, hidden.device()));
        let grad_h = need_h.then(|| hidden.detach().zeros_like());
        // Summed over chunks, so kept in f32 whatever the compute dtype; the first chunk's
        // product is the sum's start (a zero-filled [V, D] is 545 MB to write at Qwen's size).
        let mut grad_w: Option<Tensor> = None;
        let mut tokens = Vec::new();
        // f32 products land in one buffer of a chunk's logits, reused by every chunk: a fresh
        // one per chunk left the heap fragmented by the small tensors allocated between
        // them (glibc carved them out of the freed block), so the next chunk's did not fit
        // and each chunk grew the process by its logits (268 MB at Qwen's vocabulary).
        let f32_logits = wide || compute == Kind::Float;
        let buffer =
            f32_logits.then(|| logits_buffer(chunk.min(n).max(0), w.size()[0], hidden.device()));
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let h = h_all.narrow(0, start, len);
            let t = targets.narrow(0, start, len).unsqueeze(1);
            let mut logits = match &buffer {
                Some(buffer) => h.matmul_out(&buffer.narrow(0, 0, len), &w.tr()),
                None => h.matmul(&w.tr()),
            };
            if wide {
                logits = logits.to_kind(compute);
            }
            let mut logits = logits.to_kind(Kind::Float);
            // log-sum-exp in place over the chunk's logits (ATen's `logsumexp` would allocate
            // a second chunk-sized tensor for `logits - max`): they become exp(logit - max),
            // the softmax once divided by their sum.
            let target_logit = logits.gather(1, &t, false);
            let max = logits.amax([-1], true);
            let _ = logits.g_sub_(&max).exp_();
            let sum = logits.sum_dim_intlist([-1i64].as_slice(), true, Kind::Float);
            let lse = &max + sum.log();
            let token_loss = &lse - target_logit;
            loss += token_loss.sum(Kind::Float);
            if per_token {
                tokens.push(token_loss.view([-1]));
            }
            if need_h || need_w {
                // softmax - one_hot, in place over the chunk's logits
                let _ = logits.g_div_(&sum);
                let _ = logits.scatter_add_(
                    1,
                    &t,
                    &Tensor::full([len, 1], -1.0, (Kind::Float, h.device())),
                );
                // The products take the gradient in the compute dtype; widened runs keep it in
                // f32 (their products are f32 anyway: one rounding less, two passes over the
                // chunk's logits fewer).
                let dlogits = if wide {
                    logits
                } else {
                    logits.to_kind(compute)
                };
                if let Some(g) = &grad_h {
                    // Copied into the bf16 gradient: rounded as a bf16 product would be.
                    g.narrow(0, start, len).copy_(&dlogits.matmul(&w));
                }
                if need_w {
                    // f32 products go straight into the f32 sum (widened bf16 runs skip the
                    // per-chunk bf16 rounding of a native run: slightly more exact).
                    let f32_product = dlogits.kind() == Kind::Float;
                    match &mut grad_w {
                        Some(g) if f32_product => {
                            let _ = g.addmm_(&dlogits.tr(), &h);
                        }
                        Some(g) => {
                            let _ = g.g_add_(&dlogits.tr().matmul(&h).to_kind(Kind::Float));
                        }
                        None => {
                            grad_w = Some(dlogits.tr().matmul(&h).to_kind(Kind::Float));
                        }
                    }
                }
            }
            start += len;
        }
        if let Some(buffer) = buffer {
            keep_logits_buffer(buffer);
        }
        let grad_w =
            grad_w.or_else(|| need_w.then(|| Tensor::zeros(w.size(), (Kind::Float, w.device()))));
        let tokens = per_token.then(|| {
            if tokens.is_empty() {
                Tensor::zeros([0], (Kind::Float, hidden.device()))
            } else {
                Tensor::cat(&tokens, 0)
            }
        });
        (loss, grad_h, grad_w, tokens)
    });
    let zero = || Tensor::zeros([], (Kind::Float, hidden.device()));
    let from_h = grad_h.map_or_else(zero, |g| (hidden * g).sum(Kind::Float));
    let from_w = grad_w.map_or_else(zero, |g| dot_surrogate(weight, &g));
    let surrogate = from_h + from_w;
    let zero_valued = &surrogate - surrogate.detach();
    (loss + zero_valued, tokens)
}

/// Σ weight·g, whose gradient with respect to `weight` is `g`. Same dtypes: a `dot` of the
/// flattened pair, which writes no `[V, D]` product (545 MB at Qwen2.5-0.5B's size, 0.9 s a
/// step in a full fine-tune); a bf16 weight against the f32 sum keeps the product, so its
/// gradient is rounded to bf16 once, as before.
fn dot_surrogate(weight: &Tensor, g: &Tensor) -> Tensor {
    if weight.kind() == g.kind() {
        weight
            .reshape([-1])
            .dot(&g.reshape([-1]))
            .to_kind(Kind::Float)
    } else {
        (weight * g).sum(Kind::Float)
    }
}

/// The plain computation (full logits, one cross-entropy), what the tests compare the chunked
/// loss with.
#[cfg(feature = "testing")]
pub fn full_cross_entropy_sum(hidden: &Tensor, weight: &Tensor, targets: &Tensor) -> Tensor {
    hidden.matmul(&weight.tr()).cross_entropy_loss::<Tensor>(
        targets,
        None,
        tch::Reduction::Sum,
        tessera_batch::IGNORE_INDEX,
        0.0,
    )
}
