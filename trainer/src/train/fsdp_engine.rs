//! The [`Engine`] for FULL_SHARD and SHARD_GRAD_OP: `crate::fsdp::Fsdp` over the VLM's unit
//! chain. Each rank saves its own shards and optimizer moments (`fsdp_shard.safetensors`).
use super::config::{Recompute, Stage, Strategy, TrainConfig};
use super::engine::{Engine, UnitTimes};
use super::error::TrainError;
use crate::dist::ProcessGroup;
use crate::fsdp::{self, AdamWConfig, Fsdp, FsdpConfig, FsdpError, ParamGroup};
use crate::model::{Vlm, VlmCtx};
use crate::unit::ParamMap;
use pipeline::MicroBatch;
use std::path::Path;
use tch::Tensor;

pub const SHARD_FILE: &str = "fsdp_shard.safetensors";

impl From<FsdpError> for TrainError {
    fn from(e: FsdpError) -> Self {
        TrainError::Invalid(format!("fsdp: {e}"))
    }
}

pub struct FsdpEngine<'a> {
    vlm: &'a Vlm,
    fsdp: Fsdp<'a, VlmCtx>,
    device: tch::Device,
}

impl<'a> FsdpEngine<'a> {
    /// Shards `params` (every parameter, full) over `pg` with the run's strategy, learning
    /// rates (stage 2: the projector in its own group), weight decay and clipping.
    pub fn new(
        cfg: &TrainConfig,
        vlm: &'a Vlm,
        pg: &'a ProcessGroup,
        params: &ParamMap,
        device: tch::Device,
    ) -> Result<Self, TrainError> {
        let strategy = match cfg.strategy {
            Strategy::FullShard => fsdp::Strategy::FullShard,
            Strategy::ShardGradOp => fsdp::Strategy::ShardGradOp,
            Strategy::NoShard => fsdp::Strategy::NoShard,
        };
        let mut groups = Vec::new();
        if cfg.stage == Stage::Finetune {
            groups.push(ParamGroup {
                name: "projector".into(),
                unit_prefixes: vec!["projector".into()],
                name_contains: Vec::new(),
                lr: cfg.projector_lr,
                weight_decay: cfg.weight_decay,
            });
        }
        let config = FsdpConfig {
            strategy,
            adamw: AdamWConfig {
                lr: cfg.lr,
                weight_decay: cfg.weight_decay,
                groups,
                ..AdamWConfig::default()
            },
            max_grad_norm: (cfg.grad_clip > 0.0).then_some(cfg.grad_clip),
            device,
            recompute: match cfg.recompute {
                Recompute::All => fsdp::Recompute::All,
                Recompute::None => fsdp::Recompute::None,
            },
            ..FsdpConfig::default()
        };
        let fsdp = Fsdp::new(vlm.units(), pg, params, config)?;
        Ok(FsdpEngine { vlm, fsdp, device })
    }
}

impl Engine for FsdpEngine<'_> {
    fn forward_backward(
        &mut self,
        mb: &MicroBatch,
        loss_scale: f64,
        times: &mut UnitTimes,
    ) -> Result<f64, TrainError> {
        let ctx = VlmCtx::new(mb, self.vlm, self.device)?;
        let loss = self
            .fsdp
            .forward_backward(&ctx, &ctx.first_input(), loss_scale)?;
        for (component, secs) in self.fsdp.take_times() {
            *times.entry(component).or_default() += secs;
        }
        Ok(loss)
    }

    fn optimizer_step(&mut self, lr_factor: f64, _max_norm: f64) -> Result<f64, TrainError> {
        // Clipping was configured at construction (`max_grad_norm`).
        Ok(self.fsdp.step(lr_factor)?.grad_norm)
    }

    fn trainable(&self) -> Result<ParamMap, TrainError> {
        Ok(self.fsdp.gather_params(true)?)
    }

    fn save(&self, dir: &Path) -> Result<(), TrainError> {
        let state: Vec<(String, Tensor)> = self.fsdp.shard_state().into_iter().collect();
        Tensor::write_safetensors(&state, dir.join(SHARD_FILE))?;
        Ok(())
    }

    fn load(&mut self, dir: &Path, _steps: u64) -> Result<(), TrainError> {
        let state = Tensor::read_safetensors(dir.join(SHARD_FILE))?
            .into_iter()
            .collect();
        self.fsdp.load_shard_state(&state)?;
        Ok(())
    }
}
