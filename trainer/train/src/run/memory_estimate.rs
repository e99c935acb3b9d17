//! What one micro-batch adds to a rank's memory under each recompute policy, from the model's
//! shapes alone (`--recompute auto` compares it with the memory at hand before the first step).
//!
//! The activations a unit keeps follow autograd's rules for the ops tessera runs: a matmul
//! keeps its input only when its weight trains (LoRA: when an adapter sits on it); RMSNorm keeps
//! the f32 copy of its input (the input itself in f32) and the normed activation when its
//! weight trains; the attention kernel keeps its queries, the repeated keys and values, its
//! output and log-sum-exp; the SwiGLU activation keeps `gate`, `silu(gate)` and `up`.
//! `selective` (see tessera-model's `selective.rs`) keeps its norms' inputs and `gate`, `up`
//! instead. A recomputed unit keeps its input only, and rebuilds its whole graph in backward,
//! one unit at a time.
//!
//! Per micro-batch the peak is the kept activations plus the larger of the head's loss
//! transient (chunked logits) and one recomputed unit's graph. Checked against measured peaks
//! by `tests/recompute_auto.rs`.
use tessera_fsdp::Recompute;
use tessera_model::{LmConfig, VisionConfig};

/// What the kept activations cost beyond the tensors the rules above count, measured on the
/// CPU (glibc, the trainer's allocator settings): the many small tensors of span-by-span
/// attention and the heap's fragmentation around them. Stage 1 f32, W=1, peak RSS over the
/// counted bytes: 1.14-1.22x at the small preset's shape (2,048-4,096 tokens), 1.33x at
/// Qwen2.5-0.5B's and 1.55x at Qwen3-0.6B's (1,536 tokens; docs/performance-notes.md,
/// "Memory").
const KEPT_OVERHEAD: f64 = 1.4;

/// What the first step adds whatever the policy, measured on the CPU (small preset, stage 1,
/// 2,048-4,096 tokens: 300-400 MiB beyond the terms above): libtorch's and oneDNN's
/// workspaces, the loader's threads and their buffers, the heap around them.
const RUNTIME_OVERHEAD: f64 = 350.0 * (1u64 << 20) as f64;

/// `auto` takes a policy when this many times its estimate fits: the estimate has come out up
/// to 24% low (`none` at 8,192 tokens of the small preset, where span-by-span attention leaves
/// the heap most fragmented).
pub(crate) const FIT_MARGIN: f64 = 1.25;

/// What trains, as the memory model needs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trains {
    /// The LM's own weights (full-parameter stage 2).
    pub lm: bool,
    /// LoRA adapters on the LM's linears.
    pub lora: bool,
    /// The tower's layers (any of them).
    pub vision: bool,
}

/// One micro-batch's shapes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MicroBatchShape {
    /// LM tokens (the token budget, padding included).
    pub tokens: f64,
    /// Tower tokens of the micro-batch's images (patches and prefix tokens).
    pub vision_tokens: f64,
    /// Bytes per element of the compute dtype (4 f32, 2 bf16).
    pub bytes: f64,
    /// Supervised positions the head computes the loss over at once (its chunk).
    pub head_chunk: f64,
}

/// Full parameter bytes of each kind of unit a rank gathers under FULL_SHARD-style sharding
/// (all zero when nothing is gathered: W=1, NO_SHARD, SHARD_GRAD_OP keeps them anyway).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Gathered {
    pub vision_layer: f64,
    pub projector: f64,
    pub embed: f64,
    pub lm_layer: f64,
    pub head: f64,
}

/// Bytes one micro-batch adds at its peak under `policy`: what the units backward runs
/// through keep until then (a kept graph holds the parameters it read, so under FULL_SHARD
/// those stay gathered), plus the larger of the head's transient and one recomputed unit's
/// graph, plus two units' gathered parameters (the one running and the one prefetched).
pub(crate) fn micro_batch_peak(
    policy: Recompute,
    lm: &LmConfig,
    vision: &VisionConfig,
    trains: Trains,
    mb: MicroBatchShape,
    gathered: Gathered,
) -> f64 {
    // The units backward runs through, in chain order: (kept graph, input, gathered bytes).
    let mut units: Vec<(f64, f64, f64)> = Vec::new();
    let selective = policy.recomputes_cheap_ops();
    if trains.vision {
        for _ in 0..vision.num_hidden_layers {
            units.push((
                tower_layer_kept(vision, mb),
                mb.vision_tokens * vision.hidden_size as f64 * mb.bytes,
                gathered.vision_layer,
            ));
        }
    }
    let image_tokens = mb.tokens;
    // Several feature layers widen what the projector reads (their concatenation).
    let projector_in = image_tokens * vision.feature_size() as f64 * mb.bytes;
    let projector = projector_in + 2.0 * image_tokens * lm.hidden_size as f64 * mb.bytes;
    units.push((projector, projector_in, gathered.projector));
    // The embedding: its backward needs only the ids.
    units.push((0.0, 0.0, gathered.embed));
    let lm_input = mb.tokens * lm.hidden_size as f64 * mb.bytes;
    for i in 0..lm.num_hidden_layers {
        let kept = lm_layer_kept(lm, lm.is_sparse_layer(i), trains, mb, selective);
        units.push((kept, lm_input, gathered.lm_layer));
    }
    let mut kept = 0.0;
    let mut params_kept = 0.0;
    let mut largest_recomputed: f64 = 0.0;
    for (i, &(graph, input, params)) in units.iter().enumerate() {
        if policy.recomputes(i) {
            kept += input;
            largest_recomputed = largest_recomputed.max(graph);
        } else {
            kept += graph;
            params_kept += params;
        }
    }
    let kept = kept * KEPT_OVERHEAD + params_kept;
    let largest_unit = units.iter().map(|u| u.2).fold(gathered.head, f64::max);
    // Backward through a unit holds its graph and the gradients it forms, about as large:
    // twice a recomputed unit's graph, once more a kept one's.
    let largest_graph = units.iter().map(|u| u.0).fold(0.0, f64::max);
    let backward = if largest_recomputed > 0.0 {
        2.0 * largest_recomputed * KEPT_OVERHEAD
    } else {
        largest_graph * KEPT_OVERHEAD
    };
    RUNTIME_OVERHEAD + kept + head_transient(lm, trains, mb).max(backward) + 2.0 * largest_unit
}

/// What one decoder layer's graph keeps for `mb` (its input included).
fn lm_layer_kept(
    lm: &LmConfig,
    sparse: bool,
    trains: Trains,
    mb: MicroBatchShape,
    selective: bool,
) -> f64 {
    let (t, b) = (mb.tokens, mb.bytes);
    let h = lm.hidden_size as f64;
    let q = (lm.num_attention_heads * lm.head_dim()) as f64;
    let kv = (lm.kv_heads() * lm.head_dim()) as f64;
    let heads = lm.num_attention_heads as f64;
    let weights = trains.lm;
    let linear_inputs = trains.lm || trains.lora;
    let f32_copy = if b < 4.0 { 4.0 } else { 0.0 };
    let mut per_token = h * b; // the layer's input, read again by backward
                               // Input norm: the f32 copy of the input (the input itself in f32), rstd, the normed
                               // activation when the norm's weight trains.
    if !selective {
        per_token += h * f32_copy + 4.0;
        if weights {
            per_token += h * b;
        }
    }
    if linear_inputs {
        per_token += h * b; // q, k, v's input
    }
    if lm.qk_norm() {
        per_token += if selective {
            (q + kv) * b
        } else {
            (q + kv) * 4.0 + if weights { (q + kv) * b } else { 0.0 }
        };
    }
    // Attention: queries, repeated keys and values, output, log-sum-exp.
    let kv_kept = if kv < q { q } else { kv };
    per_token += (2.0 * q + 2.0 * kv_kept) * b + heads * 4.0;
    if linear_inputs {
        per_token += q * b; // o_proj's input
    }
    // Post-attention norm: its input's f32 copy (or itself), rstd, the normed activation.
    per_token += if selective {
        h * b
    } else {
        h * 4.0 + 4.0 + if weights { h * b } else { 0.0 }
    };
    if linear_inputs {
        per_token += h * b; // gate and up's input
    }
    let (rows, width) = if sparse {
        (
            lm.experts_per_token() as f64,
            lm.moe_intermediate_size() as f64,
        )
    } else {
        (1.0, lm.intermediate_size as f64)
    };
    // SwiGLU: gate, up and silu(gate) (selective: gate and up); down's input when it trains.
    let act = if selective { 2.0 } else { 3.0 };
    per_token += rows * width * b * act;
    if linear_inputs {
        per_token += rows * width * b;
    }
    if sparse {
        // Each routed copy's expert output, kept by its routing weight's product, and the
        // routed input when the experts' weights train.
        per_token += rows * h * b * if weights { 2.0 } else { 1.0 };
    }
    t * per_token
}

/// What one trained tower layer's graph keeps (its input included).
fn tower_layer_kept(vision: &VisionConfig, mb: MicroBatchShape) -> f64 {
    let d = vision.hidden_size as f64;
    let i = vision.intermediate_size as f64;
    // input, q/k/v input, q, k, v, attention output, o_proj input, second norm's input,
    // fc1 input, the GELU's input and output.
    mb.vision_tokens * (9.0 * d + 2.0 * i) * mb.bytes
}

/// The head's working set during its forward: one chunk's logits, turned into their gradient
/// in place (one f32 buffer; bf16 runs add the rounded copies: 10 bytes an element in all),
/// plus the output matrix's f32 gradient when it trains.
fn head_transient(lm: &LmConfig, trains: Trains, mb: MicroBatchShape) -> f64 {
    let vocab = lm.vocab_size as f64;
    let chunk = mb.head_chunk.min(mb.tokens);
    let grad = if trains.lm {
        vocab * lm.hidden_size as f64 * 4.0
    } else {
        0.0
    };
    let per_logit = if mb.bytes < 4.0 { 10.0 } else { 4.0 };
    chunk * vocab * per_logit + grad
}

/// The policies `auto` weighs, fastest first.
pub(crate) const FASTEST_FIRST: [Recompute; 4] = [
    Recompute::None,
    Recompute::Selective,
    Recompute::Every(2),
    Recompute::All,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The policies order as they should: none keeps the most, all the least, selective and
    /// every:2 in between. Stage 1 f32 at Qwen2.5-0.5B's shape and 1,536 tokens: a run's peak
    /// resident set rose 4.3 GB above what it held before its first step (8,086 MiB against
    /// about 4,000, AMD EPYC; docs/performance-notes.md, "Memory").
    #[test]
    fn policies_order_by_what_they_keep() {
        let (vision, lm) =
            tessera_model::Preset::Qwen05bShape.configs(tessera_model::LmFamily::Qwen2);
        let trains = Trains {
            lm: false,
            lora: false,
            vision: false,
        };
        let mb = MicroBatchShape {
            tokens: 1536.0,
            vision_tokens: 1458.0,
            bytes: 4.0,
            head_chunk: 441.0,
        };
        let peak = |p| micro_batch_peak(p, &lm, &vision, trains, mb, Gathered::default());
        let (none, sel, every, all) = (
            peak(Recompute::None),
            peak(Recompute::Selective),
            peak(Recompute::Every(2)),
            peak(Recompute::All),
        );
        assert!(
            none > sel && sel > every && every > all,
            "{none} {sel} {every} {all}"
        );
        assert!((3.9e9..4.9e9).contains(&none), "none {none}");
    }
}
