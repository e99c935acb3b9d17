//! AdamW over this rank's trainable shards (decoupled weight decay, bias-corrected moments),
//! with learning-rate groups chosen by unit-name prefix or parameter-name substring (stage 2
//! trains the projector at a lower lr than LoRA), and global grad-norm clipping.
use super::flat_param::FlatBuffer;
use super::fused_adamw::{fused_adamw_, FusedHyper};
use tch::Tensor;
use tessera_sys::ShimError;

/// AdamW hyper-parameters; `lr` and `weight_decay` apply to parameters no group claims.
/// Weight decay skips every parameter of fewer than two dimensions (biases and norm weights),
/// as transformers' Trainer does.
#[derive(Clone, Debug)]
pub struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub groups: Vec<ParamGroup>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            groups: Vec::new(),
        }
    }
}

/// A learning-rate group: a parameter joins the first group whose unit prefix matches its unit's
/// name or whose substring occurs in its name.
#[derive(Clone, Debug)]
pub struct ParamGroup {
    pub name: String,
    pub unit_prefixes: Vec<String>,
    pub name_contains: Vec<String>,
    pub lr: f64,
    pub weight_decay: f64,
}

/// A run of shard elements that share a group.
struct Segment {
    start: i64,
    len: i64,
    lr: f64,
    weight_decay: f64,
}

/// Moments for one trainable buffer's shard.
pub(crate) struct ShardState {
    pub buffer: usize,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
    segments: Vec<Segment>,
}

/// AdamW state of every trainable shard on this rank.
pub(super) struct ShardedAdamW {
    pub config: AdamWConfig,
    pub step: i64,
    pub(crate) states: Vec<ShardState>,
}

impl ShardedAdamW {
    pub(super) fn new(config: AdamWConfig, buffers: &[FlatBuffer]) -> Self {
        let mut states = Vec::new();
        for (index, b) in buffers.iter().enumerate().filter(|(_, b)| b.trainable) {
            states.push(ShardState {
                buffer: index,
                exp_avg: b.shard.zeros_like(),
                exp_avg_sq: b.shard.zeros_like(),
                segments: segments(&config, b),
            });
        }
        ShardedAdamW {
            config,
            step: 0,
            states,
        }
    }

    /// Bytes of optimizer state held on this rank.
    pub(super) fn bytes(&self) -> u64 {
        self.states
            .iter()
            .map(|s| tensor_bytes(&s.exp_avg) + tensor_bytes(&s.exp_avg_sq))
            .sum()
    }

    /// One update of every shard from `grads` (indexed like the buffers); the learning rates are
    /// the configured ones times `lr_factor` (the schedule). Through ATen's fused kernel on
    /// every device: one pass over parameter, gradient and moments instead of the elementwise
    /// ops' dozen (docs/performance-notes.md, "Where the full-parameter step goes").
    pub(super) fn update(
        &mut self,
        buffers: &[FlatBuffer],
        grads: &[Option<Tensor>],
        lr_factor: f64,
    ) -> Result<(), ShimError> {
        self.step += 1;
        self.update_fused(buffers, grads, lr_factor)
    }

    /// The same update as elementwise ops, the formula written out: the reference the tests
    /// check the fused kernel against.
    #[cfg(test)]
    pub(super) fn update_elementwise(
        &mut self,
        buffers: &[FlatBuffer],
        grads: &[Option<Tensor>],
        lr_factor: f64,
    ) {
        self.step += 1;
        let (b1, b2) = self.config.betas;
        let bias1 = 1.0 - b1.powi(self.step as i32);
        let bias2 = 1.0 - b2.powi(self.step as i32);
        let eps = self.config.eps;
        tch::no_grad(|| {
            for s in &mut self.states {
                let Some(grad) = &grads[s.buffer] else {
                    continue;
                };
                let param = &buffers[s.buffer].shard;
                let _ = s.exp_avg.g_mul_scalar_(b1).g_add_(&(grad * (1.0 - b1)));
                let _ = s
                    .exp_avg_sq
                    .g_mul_scalar_(b2)
                    .g_add_(&(grad * grad * (1.0 - b2)));
                for seg in &s.segments {
                    let lr = seg.lr * lr_factor;
                    let mut p = param.narrow(0, seg.start, seg.len);
                    let m = s.exp_avg.narrow(0, seg.start, seg.len);
                    let v = s.exp_avg_sq.narrow(0, seg.start, seg.len);
                    if seg.weight_decay != 0.0 {
                        let _ = p.g_mul_scalar_(1.0 - lr * seg.weight_decay);
                    }
                    let denom = (v / bias2).sqrt() + eps;
                    let _ = p.g_sub_(&((m / bias1) / denom * lr));
                }
            }
        });
    }

    /// The same update through `_fused_adamw_`, one call per segment (its own lr and decay).
    /// Padding elements, which no segment covers, keep zero moments either way.
    fn update_fused(
        &mut self,
        buffers: &[FlatBuffer],
        grads: &[Option<Tensor>],
        lr_factor: f64,
    ) -> Result<(), ShimError> {
        for s in &self.states {
            let Some(grad) = &grads[s.buffer] else {
                continue;
            };
            let param = &buffers[s.buffer].shard;
            let step = Tensor::from(self.step as f32).to_device(param.device());
            for seg in &s.segments {
                let slice = |t: &Tensor| t.narrow(0, seg.start, seg.len);
                let hyper = FusedHyper {
                    lr: seg.lr * lr_factor,
                    betas: self.config.betas,
                    weight_decay: seg.weight_decay,
                    eps: self.config.eps,
                };
                fused_adamw_(
                    &slice(param),
                    &slice(grad),
                    &slice(&s.exp_avg),
                    &slice(&s.exp_avg_sq),
                    &step,
                    hyper,
                )?;
            }
        }
        Ok(())
    }
}

fn segments(config: &AdamWConfig, b: &FlatBuffer) -> Vec<Segment> {
    let (lo, hi) = (b.shard_start, b.shard_start + b.shard_len);
    let mut out: Vec<Segment> = Vec::new();
    for e in &b.entries {
        let (a, z) = (e.offset.max(lo), (e.offset + e.numel).min(hi));
        if a >= z {
            continue;
        }
        let group = config.groups.iter().find(|g| {
            g.unit_prefixes
                .iter()
                .any(|p| b.unit_name.starts_with(p.as_str()))
                || g.name_contains.iter().any(|s| e.name.contains(s.as_str()))
        });
        let (lr, weight_decay) =
            group.map_or((config.lr, config.weight_decay), |g| (g.lr, g.weight_decay));
        let weight_decay = if e.shape.len() < 2 { 0.0 } else { weight_decay };
        match out.last_mut() {
            Some(last)
                if last.start + last.len == a - lo
                    && last.lr == lr
                    && last.weight_decay == weight_decay =>
            {
                last.len += z - a
            }
            _ => out.push(Segment {
                start: a - lo,
                len: z - a,
                lr,
                weight_decay,
            }),
        }
    }
    out
}

pub(crate) fn tensor_bytes(t: &Tensor) -> u64 {
    (t.numel() * t.kind().elt_size_in_bytes()) as u64
}
