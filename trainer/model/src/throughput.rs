//! Forward+backward throughput of a preset on the CPU, next to the machine's peak matmul
//! FLOP/s measured in the same run by a large libtorch matmul (the `benches/model.rs` bench).
//! The model runs as a full fine-tune of projector + LM (every LM weight trainable), so its
//! FLOPs are the textbook 6·N·T for the matmul weights plus the attention products. It runs in
//! f32 or in bf16 (every parameter bf16, the compute FSDP's bf16 precision runs), each next to
//! the peak matmul rate of its own dtype.
use super::error::Result;
use super::init::{random_params, Preset, INIT_STD};
use super::{LmFamily, Vlm, VlmOptions};
use crate::Dtype;
use std::time::Instant;
use tch::{Device, Kind, Tensor};
use tessera_batch::{MicroBatch, IGNORE_INDEX};

#[derive(Clone, Debug, serde::Serialize)]
pub struct ThroughputReport {
    pub preset: String,
    /// "f32" or "bf16": the parameters' and the peak matmul's dtype.
    pub dtype: String,
    pub threads: i32,
    pub tokens_per_step: usize,
    pub steps: usize,
    pub tokens_per_s: f64,
    pub model_flop_per_s: f64,
    pub peak_matmul_flop_per_s: f64,
    pub share_of_peak: f64,
}

/// Text micro-batch: `rows` rows of two packed samples each, every next token supervised.
fn packed_text_batch(rows: usize, row_len: usize, vocab: i64) -> MicroBatch {
    let half = row_len / 2;
    let mut mb = MicroBatch {
        kind: tessera_shards::Kind::Text,
        rows,
        row_len,
        input_ids: Vec::new(),
        labels: Vec::new(),
        positions: Vec::new(),
        segment_ids: Vec::new(),
        pixels: Vec::new(),
        num_images: 0,
        image_size: 0,
        image_tokens: 0,
        image_geometry: Vec::new(),
        sample_ids: Vec::new(),
        sample_sources: Vec::new(),
        real_tokens: rows * row_len,
        pad_tokens: 0,
        supervised_tokens: 0,
        zero_loss: false,
    };
    for r in 0..rows {
        for (seg, len) in [(0, half), (1, row_len - half)] {
            let ids: Vec<i64> = (0..len as i64)
                .map(|i| (r as i64 * 7919 + i * 104_729) % (vocab - 1000))
                .collect();
            mb.labels
                .extend(ids[1..].iter().copied().chain([IGNORE_INDEX]));
            mb.input_ids.extend(ids);
            mb.positions.extend(0..len as i64);
            mb.segment_ids.extend(std::iter::repeat_n(seg, len));
            mb.sample_ids.push(format!("bench-{r}-{seg}"));
        }
    }
    mb.supervised_tokens = mb.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
    mb
}

/// FLOPs of one forward+backward of `mb` with every LM matmul weight trainable.
fn step_flops(vlm: &Vlm, mb: &MicroBatch) -> f64 {
    let lm = &vlm.lm;
    let (d, hd) = (lm.hidden_size as f64, lm.head_dim() as f64);
    let (q, kv, ff) = (
        lm.num_attention_heads as f64 * hd,
        lm.kv_heads() as f64 * hd,
        lm.intermediate_size as f64,
    );
    let per_layer = d * q * 2.0 + d * kv * 2.0 + 3.0 * d * ff;
    let tokens = (mb.rows * mb.row_len) as f64;
    let layers = lm.num_hidden_layers as f64;
    let matmuls = 6.0 * per_layer * layers * tokens;
    // q·kᵀ and p·v over the full (masked) square, forward + backward (×3).
    let attention = 3.0 * layers * 2.0 * 2.0 * mb.rows as f64 * (mb.row_len as f64).powi(2) * q;
    let head = 6.0 * lm.vocab_size as f64 * d * mb.supervised_tokens as f64;
    matmuls + attention + head
}

/// Peak matmul FLOP/s of this machine in `kind`: `n`×`n` matmuls, best of `repeats`, through
/// the model's own product path (`gemm.rs`: on a CPU without bf16 arithmetic a bf16 product
/// runs on the f32 kernels, widening included in the time).
fn peak_matmul_flops(n: i64, repeats: usize, kind: Kind) -> f64 {
    let a = Tensor::randn([n, n], (Kind::Float, Device::Cpu)).to_kind(kind);
    let b = Tensor::randn([n, n], (Kind::Float, Device::Cpu)).to_kind(kind);
    let _ = super::gemm::matmul(&a, &b);
    let mut best = f64::MAX;
    for _ in 0..repeats {
        let start = Instant::now();
        let c = super::gemm::matmul(&a, &b);
        let _ = c.sum(Kind::Float).double_value(&[]);
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best
}

/// Measures `steps` forward+backward passes (after one warm-up) of `preset` on
/// `rows × row_len` tokens with `threads` intra-op threads, parameters in `dtype`.
pub fn measure_throughput(
    preset: Preset,
    threads: i32,
    rows: usize,
    row_len: usize,
    steps: usize,
    dtype: Dtype,
) -> Result<ThroughputReport> {
    let kind = dtype.kind();
    tch::set_num_threads(threads);
    let (vision, lm) = preset.configs(LmFamily::Qwen2);
    let vlm = Vlm::new(vision, lm, true, VlmOptions::default())?;
    let mut params = random_params(&vlm.param_specs(), 0, INIT_STD);
    for (name, t) in params.iter_mut() {
        *t = t.to_kind(kind);
        if !name.starts_with("vision_model.") {
            *t = t.detach().set_requires_grad(true);
        }
    }
    let mb = packed_text_batch(rows, row_len, vlm.lm.vocab_size);
    let run = |params: &tessera_fsdp::ParamMap| -> Result<()> {
        let (loss, _) = vlm.loss(params, &mb)?;
        loss.backward();
        for t in params.values() {
            let mut g = t.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        Ok(())
    };
    run(&params)?;
    let start = Instant::now();
    for _ in 0..steps {
        run(&params)?;
    }
    let secs = start.elapsed().as_secs_f64();
    let tokens = rows * row_len;
    let model_flop_per_s = step_flops(&vlm, &mb) * steps as f64 / secs;
    let peak = peak_matmul_flops(2048, 5, kind);
    Ok(ThroughputReport {
        preset: format!("{preset:?}"),
        dtype: dtype.name().into(),
        threads,
        tokens_per_step: tokens,
        steps,
        tokens_per_s: (tokens * steps) as f64 / secs,
        model_flop_per_s,
        peak_matmul_flop_per_s: peak,
        share_of_peak: model_flop_per_s / peak,
    })
}
