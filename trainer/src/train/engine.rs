//! What the loop drives: an [`Engine`] runs a micro-batch forward and backward (accumulating
//! gradients), takes the optimizer step across ranks, and saves / restores its state.
//! `FsdpEngine` (fsdp_engine.rs) implements it for all three strategies.
use super::error::TrainError;
use crate::unit::ParamMap;
use pipeline::MicroBatch;
use std::collections::BTreeMap;
use std::path::Path;

/// Seconds spent per unit kind ("vision", "projector", "lm", "backward").
pub type UnitTimes = BTreeMap<String, f64>;

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
