//! What the loop drives: an [`Engine`] runs a micro-batch forward and backward (accumulating
//! gradients), takes the optimizer step across ranks, and saves / restores its state.
//!
//! [`ReplicatedEngine`] keeps every parameter on every rank and all-reduces the trainable
//! gradients (NO_SHARD, i.e. DDP; with one rank it is plain training). The trainable part of a
//! LLaVA run (projector, LoRA) is small, so this is also the reference the sharded strategies
//! must match.
use super::adamw::AdamW;
use super::error::TrainError;
use super::export::TRAINABLE_FILE;
use crate::dist::ProcessGroup;
use crate::model::{weights, Vlm};
use crate::unit::ParamMap;
use pipeline::MicroBatch;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tch::Tensor;

/// Seconds spent per unit kind ("vision", "projector", "lm", "backward").
pub type UnitTimes = BTreeMap<String, f64>;

pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

pub trait Engine {
    /// Forward and backward of one micro-batch; gradients of `loss_sum * loss_scale` accumulate.
    /// Returns the micro-batch's summed token loss (unscaled).
    fn forward_backward(
        &mut self,
        mb: &MicroBatch,
        loss_scale: f64,
        times: &mut UnitTimes,
    ) -> Result<f64, TrainError>;
    /// Reduces gradients across ranks, clips the global norm to `max_norm` (0 = off), updates at
    /// each parameter's peak rate times `lr_factor`, clears gradients. Returns the norm before
    /// clipping.
    fn optimizer_step(&mut self, lr_factor: f64, max_norm: f64) -> Result<f64, TrainError>;
    /// Full trainable tensors by Hugging Face key (every rank calls it: it may communicate).
    fn trainable(&self) -> Result<ParamMap, TrainError>;
    /// Writes this rank's parameters and optimizer state into `dir`.
    fn save(&self, dir: &Path) -> Result<(), TrainError>;
    /// Restores what `save` wrote, the optimizer having taken `steps` updates.
    fn load(&mut self, dir: &Path, steps: u64) -> Result<(), TrainError>;
}

/// Kind of a unit for timing: vision, projector, or lm (embeddings, layers, head).
pub fn unit_kind(name: &str) -> &'static str {
    match name {
        "vision" => "vision",
        "projector" => "projector",
        _ => "lm",
    }
}

/// Every parameter on every rank; trainable gradients all-reduced (sum) before the step.
pub struct ReplicatedEngine {
    vlm: Arc<Vlm>,
    params: ParamMap,
    trainable: Vec<String>,
    peak_lr: BTreeMap<String, f64>,
    adam: AdamW,
    pg: Arc<ProcessGroup>,
}

impl ReplicatedEngine {
    /// `params` holds every parameter (on the training device); `peak_lr` gives the peak rate
    /// of each trainable parameter.
    pub fn new(
        vlm: Arc<Vlm>,
        mut params: ParamMap,
        peak_lr: BTreeMap<String, f64>,
        weight_decay: f64,
        pg: Arc<ProcessGroup>,
    ) -> Result<Self, TrainError> {
        vlm.mark_trainable(&mut params);
        let trainable: Vec<String> = vlm
            .param_specs()
            .into_iter()
            .filter(|s| s.trainable)
            .map(|s| s.name)
            .collect();
        if let Some(missing) = trainable
            .iter()
            .find(|n| !params.contains_key(*n) || !peak_lr.contains_key(*n))
        {
            return Err(TrainError::Invalid(format!(
                "trainable parameter `{missing}` has no tensor or learning rate"
            )));
        }
        let trainable_map: ParamMap = trainable
            .iter()
            .map(|n| (n.clone(), params[n].shallow_clone()))
            .collect();
        let adam = AdamW::new(&trainable_map, weight_decay);
        Ok(ReplicatedEngine {
            vlm,
            params,
            trainable,
            peak_lr,
            adam,
            pg,
        })
    }

    fn grads_flat(&self) -> Tensor {
        let parts: Vec<Tensor> = self
            .trainable
            .iter()
            .map(|n| {
                let p = &self.params[n];
                let g = p.grad();
                if g.defined() {
                    g.view([-1])
                } else {
                    p.detach().zeros_like().view([-1])
                }
            })
            .collect();
        Tensor::cat(&parts, 0)
    }
}

impl Engine for ReplicatedEngine {
    fn forward_backward(
        &mut self,
        mb: &MicroBatch,
        loss_scale: f64,
        times: &mut UnitTimes,
    ) -> Result<f64, TrainError> {
        let ctx = self.vlm.ctx(&self.params, mb)?;
        let mut x = ctx.first_input();
        for unit in self.vlm.units() {
            if unit.runs_on(&ctx) {
                let start = Instant::now();
                x = unit.forward(&self.params, &x, &ctx);
                *times.entry(unit_kind(unit.name()).into()).or_default() +=
                    start.elapsed().as_secs_f64();
            }
        }
        let loss_sum = x.double_value(&[]);
        if !loss_sum.is_finite() {
            return Err(TrainError::Invalid(format!(
                "loss is {loss_sum} on the micro-batch of samples {:?}",
                mb.sample_ids
            )));
        }
        let start = Instant::now();
        if x.requires_grad() {
            (x * loss_scale).backward();
        }
        *times.entry("backward".into()).or_default() += start.elapsed().as_secs_f64();
        Ok(loss_sum)
    }

    fn optimizer_step(&mut self, lr_factor: f64, max_norm: f64) -> Result<f64, TrainError> {
        let mut flat = self.grads_flat();
        if self.pg.world_size() > 1 {
            self.pg.all_reduce_sum(&mut flat, "gradients")?.wait()?;
        }
        let norm = flat.norm().double_value(&[]);
        let coef = if max_norm > 0.0 {
            (max_norm / (norm + 1e-6)).min(1.0)
        } else {
            1.0
        };
        let mut grads = ParamMap::new();
        let mut offset = 0i64;
        for name in &self.trainable {
            let p = &self.params[name];
            let n = p.numel() as i64;
            grads.insert(name.clone(), (flat.narrow(0, offset, n) * coef).view_as(p));
            offset += n;
        }
        let peak = &self.peak_lr;
        self.adam.step(&mut self.params, &grads, &|name| {
            peak.get(name).copied().unwrap_or(0.0) * lr_factor
        });
        for name in &self.trainable {
            let mut p = self.params[name].shallow_clone();
            p.zero_grad();
        }
        Ok(norm)
    }

    fn trainable(&self) -> Result<ParamMap, TrainError> {
        Ok(self
            .trainable
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    self.params[n].detach().to_device(tch::Device::Cpu),
                )
            })
            .collect())
    }

    fn save(&self, dir: &Path) -> Result<(), TrainError> {
        // Every rank holds the same values; each writes its own copy so its folder is complete.
        weights::save(&dir.join(TRAINABLE_FILE), &self.trainable()?)?;
        self.adam.save(&dir.join(OPTIMIZER_FILE))?;
        Ok(())
    }

    fn load(&mut self, dir: &Path, steps: u64) -> Result<(), TrainError> {
        let saved = weights::load_all(&dir.join(TRAINABLE_FILE))?;
        let _guard = tch::no_grad_guard();
        for name in &self.trainable {
            let src = saved.get(name).ok_or_else(|| {
                TrainError::Invalid(format!(
                    "{}: tensor `{name}` is missing",
                    dir.join(TRAINABLE_FILE).display()
                ))
            })?;
            let mut p = self.params[name].shallow_clone();
            if p.size() != src.size() {
                return Err(TrainError::Invalid(format!(
                    "{}: tensor `{name}` has shape {:?}, the model {:?}",
                    dir.join(TRAINABLE_FILE).display(),
                    src.size(),
                    p.size()
                )));
            }
            p.copy_(src);
        }
        self.adam.load(&dir.join(OPTIMIZER_FILE), steps)?;
        Ok(())
    }
}
