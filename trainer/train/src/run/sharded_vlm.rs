//! What the loop drives on this rank: the VLM's unit chain sharded by [`Fsdp`] (every
//! strategy; NO_SHARD, i.e. DDP, is its unsharded mode). [`ShardedVlm`] runs a micro-batch's
//! forward and backward (accumulating gradients), takes the optimizer step across ranks, and
//! saves / restores the trainable parameters and optimizer moments per parameter (any world
//! size), and evaluates a micro-batch forward only.
use crate::checkpoint::sharded_state::{self, ShardedState};
use crate::config::{RecomputeSetting, Stage, TrainConfig};
use crate::error::TrainError;
use std::collections::BTreeMap;
use tessera_fsdp::dist::{Mesh, ProcessGroup};
use tessera_fsdp::ParamSource;
use tessera_fsdp::{AdamWConfig, Fsdp, FsdpConfig, ParamGroup};
use tessera_model::{Vlm, VlmCtx};
use tessera_pipeline::MicroBatch;

/// Seconds spent per part of the step: `Fsdp::take_times`' components plus "optimizer".
pub(crate) type UnitTimes = BTreeMap<String, f64>;

/// What [`ShardedVlm::forward_backward`] reports of one micro-batch.
pub(crate) struct MicroBatchLoss {
    /// The summed token loss (unscaled).
    pub(crate) loss_sum: f64,
    /// That sum by source (a mixture's, in source order, up to the highest source of the
    /// micro-batch; empty for one shard set).
    pub(crate) by_source: Vec<f64>,
    /// An MoE LM's balance loss and expert loads.
    pub(crate) router: Option<tessera_model::RouterStats>,
}

/// The groups a rank's model is sharded over.
pub(crate) struct Groups<'a> {
    /// Every rank of the job.
    pub(crate) pg: &'a ProcessGroup,
    /// HYBRID_SHARD's node and replica groups.
    pub(crate) mesh: Option<&'a Mesh>,
    /// `--expert-parallel`: the ranks holding this rank's experts, and their job ranks.
    pub(crate) expert_replicas: Option<&'a (ProcessGroup, Vec<usize>)>,
}

/// The VLM sharded over the ranks of `pg`, with its optimizer.
pub(crate) struct ShardedVlm<'a> {
    vlm: &'a Vlm,
    fsdp: Fsdp<'a, VlmCtx>,
    device: tch::Device,
}

impl<'a> ShardedVlm<'a> {
    /// Shards the parameters over `pg` (this rank reads from `init` only its shards' slices)
    /// with the run's strategy, learning rates, weight decay and clipping. Learning-rate
    /// groups: the projector at `projector_lr` (stage 2), the LM's own weights at `lm_lr`, the
    /// vision tower at `vision_lr`; LoRA adapters (and stage 1's projector) at `lr`.
    pub(crate) fn new(
        cfg: &TrainConfig,
        vlm: &'a Vlm,
        groups: Groups<'a>,
        init: &dyn ParamSource,
        device: tch::Device,
    ) -> Result<Self, TrainError> {
        let Groups {
            pg,
            mesh,
            expert_replicas,
        } = groups;
        let group = |name: &str, prefixes: &[&str], lr: f64| ParamGroup {
            name: name.into(),
            unit_prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            name_contains: Vec::new(),
            lr,
            weight_decay: cfg.weight_decay,
        };
        let mut groups = Vec::new();
        if cfg.stage == Stage::Finetune {
            groups.push(group("projector", &["projector"], cfg.projector_lr));
        }
        if cfg.train.lm {
            groups.push(group("lm", &["embed", "layers.", "head"], cfg.lm_lr));
        }
        groups.push(group("vision", &["vision."], cfg.vision_lr));
        let config = FsdpConfig {
            strategy: cfg.strategy,
            // `auto` is settled once the shards are built (`recompute_choice.rs`).
            recompute: match cfg.recompute {
                RecomputeSetting::Fixed(policy) => policy,
                RecomputeSetting::Auto => tessera_fsdp::Recompute::All,
            },
            adamw: AdamWConfig {
                lr: cfg.lr,
                weight_decay: cfg.weight_decay,
                groups,
                ..AdamWConfig::default()
            },
            max_grad_norm: (cfg.grad_clip > 0.0).then_some(cfg.grad_clip),
            compute_kind: cfg.precision.kind(),
            reduce_kind: cfg.reduce_dtype.kind(),
            device,
            ..FsdpConfig::default()
        };
        let fsdp = match (mesh, expert_replicas) {
            (Some(m), _) => Fsdp::new_hybrid(vlm.units(), pg, &m.node, &m.replicas, init, config)?,
            (None, Some((replicas, ranks))) => {
                Fsdp::new_expert_parallel(vlm.units(), pg, replicas, ranks, init, config)?
            }
            (None, None) => Fsdp::new(vlm.units(), pg, init, config)?,
        };
        Ok(ShardedVlm { vlm, fsdp, device })
    }

    /// Validates `mb` and uploads it to the device; on CUDA the uploads run on a side stream
    /// until [`Self::forward_backward`] uses the context, so the trainer prepares micro-batch
    /// k+1 before it runs k and the copies overlap k's compute.
    pub(crate) fn prepare(&self, mb: &MicroBatch) -> Result<VlmCtx, TrainError> {
        Ok(VlmCtx::prepare(mb, &self.vlm.batch_spec(), self.device)?)
    }

    /// Forward and backward of one prepared micro-batch; gradients of `loss_sum * loss_scale`
    /// (plus, for an MoE LM, the context's share of the balance loss) accumulate. Returns the
    /// micro-batch's summed token loss (unscaled), that sum split by source when the
    /// micro-batch comes from a mixture, and an MoE LM's routing.
    pub(crate) fn forward_backward(
        &mut self,
        mut ctx: VlmCtx,
        loss_scale: f64,
        times: &mut UnitTimes,
    ) -> Result<MicroBatchLoss, TrainError> {
        ctx.ready()?;
        ctx.set_recompute_cheap_ops(self.fsdp.recompute().recomputes_cheap_ops());
        let loss = self
            .fsdp
            .forward_backward(&ctx, &ctx.first_input(), loss_scale)?;
        for (component, secs) in self.fsdp.take_times() {
            *times.entry(component).or_default() += secs;
        }
        Ok(MicroBatchLoss {
            loss_sum: loss.sum,
            by_source: loss.parts,
            router: ctx.router_log.stats(),
        })
    }

    /// Sets the recompute policy (before the first step).
    pub(crate) fn set_recompute(&mut self, policy: tessera_fsdp::Recompute) {
        self.fsdp.set_recompute(policy);
    }

    /// The model this rank trains.
    pub(crate) fn vlm(&self) -> &Vlm {
        self.vlm
    }

    /// Reduces gradients across ranks, clips the global norm to the run's `grad_clip`, updates
    /// at each parameter's peak rate times `lr_factor`, clears gradients. Returns the norm
    /// before clipping.
    pub(crate) fn optimizer_step(
        &mut self,
        lr_factor: f64,
    ) -> Result<tessera_fsdp::StepStats, TrainError> {
        Ok(self.fsdp.step(lr_factor)?)
    }

    /// This rank's part of a checkpoint (its shards and moments, on rank 0 the
    /// layout): no gather, every rank writes its own. `copy`: see [`sharded_state::snapshot`].
    pub(crate) fn snapshot_sharded(
        &self,
        rank: usize,
        world_size: usize,
        copy: bool,
    ) -> sharded_state::StateSnapshot {
        sharded_state::snapshot(&self.fsdp, rank, world_size, copy)
    }

    /// Bytes a checkpoint of this model takes on disk, all ranks together (the layout's
    /// estimate: shards and moments of every writing rank).
    pub(crate) fn checkpoint_bytes(&self) -> u64 {
        sharded_state::checkpoint_bytes(&self.fsdp)
    }

    /// Restores a checkpoint at this run's world size (each rank reads its slices).
    pub(crate) fn load_sharded(&mut self, state: &ShardedState) -> Result<(), TrainError> {
        Ok(sharded_state::load(&mut self.fsdp, state)?)
    }

    /// Bytes of trainable state this rank holds at rest: f32 masters, gradients and AdamW
    /// moments of its shards.
    pub(crate) fn training_state_bytes(&self) -> tessera_fsdp::MemoryReport {
        self.fsdp.memory()
    }

    /// The summed token loss of one micro-batch, forward only (no autograd, no gradients):
    /// validation. Every rank calls it with a micro-batch of the same kind.
    pub(crate) fn eval_loss(&mut self, mb: &MicroBatch) -> Result<f64, TrainError> {
        let ctx = VlmCtx::new(mb, &self.vlm.batch_spec(), self.device)?;
        let loss = self.fsdp.forward_loss(&ctx, &ctx.first_input())?;
        self.fsdp.take_times();
        Ok(loss)
    }
}

/// What one step's micro-batches add up to on a rank (then, all-reduced, over all ranks).
/// Counts are f64 so one all-reduce carries them with the loss.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct StepTotals {
    /// Summed token loss (unscaled).
    pub(crate) loss_sum: f64,
    /// Token slots (rows x row length), padding included.
    pub(crate) tokens: f64,
    /// Tokens that are not padding.
    pub(crate) real_tokens: f64,
    pub(crate) images: f64,
    pub(crate) supervised_tokens: f64,
    /// The part of `loss_sum` and `supervised_tokens` from image micro-batches (the rest is
    /// from text-only ones).
    pub(crate) image_loss_sum: f64,
    pub(crate) image_supervised_tokens: f64,
}

impl StepTotals {
    /// Adds micro-batch `mb`, whose summed token loss was `loss_sum`.
    pub(crate) fn add_batch(&mut self, mb: &MicroBatch, loss_sum: f64) {
        self.loss_sum += loss_sum;
        self.tokens += (mb.rows * mb.row_len) as f64;
        self.real_tokens += mb.real_tokens as f64;
        self.images += mb.num_images as f64;
        self.supervised_tokens += mb.supervised_tokens as f64;
        if mb.kind == tessera_shards::Kind::Image {
            self.image_loss_sum += loss_sum;
            self.image_supervised_tokens += mb.supervised_tokens as f64;
        }
    }

    /// Mean token loss of the image micro-batches and of the text-only ones; `None` for a
    /// type without supervised tokens.
    pub(crate) fn loss_by_kind(&self) -> (Option<f64>, Option<f64>) {
        let mean = |sum: f64, tokens: f64| (tokens > 0.0).then(|| sum / tokens);
        (
            mean(self.image_loss_sum, self.image_supervised_tokens),
            mean(
                self.loss_sum - self.image_loss_sum,
                self.supervised_tokens - self.image_supervised_tokens,
            ),
        )
    }

    /// How many values [`StepTotals::to_array`] gives.
    pub(crate) const LEN: usize = 7;

    /// The order the all-reduce carries them in; [`StepTotals::from_slice`] reads it back.
    pub(crate) fn to_array(self) -> [f64; Self::LEN] {
        [
            self.loss_sum,
            self.tokens,
            self.real_tokens,
            self.images,
            self.supervised_tokens,
            self.image_loss_sum,
            self.image_supervised_tokens,
        ]
    }

    pub(crate) fn from_slice(v: &[f64]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        StepTotals {
            loss_sum: at(0),
            tokens: at(1),
            real_tokens: at(2),
            images: at(3),
            supervised_tokens: at(4),
            image_loss_sum: at(5),
            image_supervised_tokens: at(6),
        }
    }
}
