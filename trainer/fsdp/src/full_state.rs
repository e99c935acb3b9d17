//! Restoring the trainable parameters and their AdamW moments from full tensors per parameter
//! (checkpoint format 3), which any world size re-slices into its own shards; format 4 is read
//! by `tessera-train`'s `sharded_state.rs`.
use super::engine::Fsdp;
use super::flat_param::FlatBuffer;
use super::FsdpError;
use std::collections::BTreeMap;
use tch::Tensor;

/// Key of the optimizer's step count in a format-3 checkpoint's full state.
pub const OPTIMIZER_STEP_KEY: &str = "optimizer.step";

/// Builds buffer `b`'s full flat tensor from per-parameter tensors named `name{suffix}` and
/// returns this rank's slice of it (its shard).
fn shard_of(
    b: &FlatBuffer,
    state: &BTreeMap<String, Tensor>,
    suffix: &str,
    like: &Tensor,
) -> Result<Tensor, FsdpError> {
    let full = Tensor::zeros([b.padded], (like.kind(), like.device()));
    for e in &b.entries {
        let key = format!("{}{suffix}", e.name);
        let t = state.get(&key).ok_or_else(|| FsdpError::State {
            key: key.clone(),
            message: "missing".into(),
        })?;
        if t.size() != e.shape {
            return Err(FsdpError::State {
                key,
                message: format!("shape {:?} but the model's is {:?}", t.size(), e.shape),
            });
        }
        let src = t
            .reshape([-1])
            .to_kind(like.kind())
            .to_device(like.device());
        tch::no_grad(|| full.narrow(0, e.offset, e.numel).copy_(&src));
    }
    Ok(full.narrow(0, b.shard_start, b.shard_len))
}

impl<C> Fsdp<'_, C> {
    /// Restores a format-3 checkpoint's full state (parameters `name`, moments `name.exp_avg`
    /// and `name.exp_avg_sq`, [`OPTIMIZER_STEP_KEY`]), at any world size: each rank lays the full
    /// tensors out in its flat buffers and keeps its slice. Frozen buffers keep what they were
    /// built from.
    pub fn load_full_state(&mut self, state: &BTreeMap<String, Tensor>) -> Result<(), FsdpError> {
        for b in self.flat.buffers.iter().filter(|b| b.trainable) {
            let shard = shard_of(b, state, "", &b.shard)?;
            tch::no_grad(|| b.shard.shallow_clone().copy_(&shard));
        }
        for s in &mut self.optim.states {
            let b = &self.flat.buffers[s.buffer];
            let m = shard_of(b, state, ".exp_avg", &s.exp_avg)?;
            let v = shard_of(b, state, ".exp_avg_sq", &s.exp_avg_sq)?;
            tch::no_grad(|| {
                s.exp_avg.copy_(&m);
                s.exp_avg_sq.copy_(&v);
            });
        }
        let step = state
            .get(OPTIMIZER_STEP_KEY)
            .ok_or_else(|| FsdpError::State {
                key: OPTIMIZER_STEP_KEY.into(),
                message: "missing".into(),
            })?;
        self.optim.step = step.int64_value(&[]);
        Ok(())
    }
}
