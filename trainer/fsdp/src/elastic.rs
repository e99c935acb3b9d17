//! What does not depend on the world size: the trainable parameters and their AdamW moments as
//! full tensors per parameter (a checkpoint that any W can load, re-sliced into its own shards,
//! as torch DCP's per-parameter state does), and a forward-only pass for evaluation.
use super::engine::Fsdp;
use super::flat_param::FlatBuffer;
use super::FsdpError;
use std::collections::BTreeMap;
use tch::Tensor;

/// Key of the optimizer's step count in [`Fsdp::full_state`].
pub const OPTIMIZER_STEP_KEY: &str = "optimizer.step";

/// The whole (unpadded) tensor behind this rank's shard: all-gathered over the ranks when the
/// buffers are sharded, the shard itself otherwise. Every rank must call it.
fn gather_full<C>(fsdp: &Fsdp<'_, C>, b: &FlatBuffer, shard: &Tensor) -> Result<Tensor, FsdpError> {
    if !fsdp.sharded() {
        return Ok(shard.shallow_clone());
    }
    let mut full = Tensor::empty([b.padded], (shard.kind(), shard.device()));
    fsdp.pg
        .all_gather_into(&mut full, shard, &b.unit_name)?
        .wait()?;
    Ok(full)
}

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
    /// The trainable parameters (`name`) and their AdamW moments (`name.exp_avg`,
    /// `name.exp_avg_sq`) as full tensors, plus [`OPTIMIZER_STEP_KEY`]; the same on every rank
    /// and at every world size. Every rank must call it (it all-gathers).
    pub fn full_state(&self) -> Result<BTreeMap<String, Tensor>, FsdpError> {
        let mut out = BTreeMap::new();
        for b in self.flat.buffers.iter().filter(|b| b.trainable) {
            for (name, view) in b.views(&gather_full(self, b, &b.shard)?) {
                out.insert(name, view.copy());
            }
        }
        for s in &self.optim.states {
            let b = &self.flat.buffers[s.buffer];
            for (suffix, moment) in [(".exp_avg", &s.exp_avg), (".exp_avg_sq", &s.exp_avg_sq)] {
                for (name, view) in b.views(&gather_full(self, b, moment)?) {
                    out.insert(format!("{name}{suffix}"), view.copy());
                }
            }
        }
        out.insert(OPTIMIZER_STEP_KEY.into(), Tensor::from(self.optim.step));
        Ok(out)
    }

    /// Restores what [`Fsdp::full_state`] returned, at any world size: each rank lays the full
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

    /// Forward only, no autograd and no gradients (evaluation): every unit that runs on the
    /// micro-batch, gathered one after the other. Returns this rank's summed token loss. All
    /// ranks must call it for micro-batches of the same kind (as for training).
    pub fn forward_loss(&mut self, ctx: &C, input: &Tensor) -> Result<f64, FsdpError> {
        let running = self.running_units(ctx)?;
        let Some(&last) = running.last() else {
            return Ok(0.0);
        };
        let sharded = self.sharded();
        let mut x = input.shallow_clone();
        for (p, &u) in running.iter().enumerate() {
            let name = self.units[u].name();
            self.gathered.ready(&self.flat, u, name, self.pg, sharded)?;
            let next = running.get(p + 1).copied();
            if let Some(next) = next.filter(|_| self.config.prefetch) {
                let next_name = self.units[next].name();
                self.gathered
                    .issue(&self.flat, next, next_name, self.pg, sharded)?;
            }
            let params = self.flat.param_map(u, &self.gathered.full);
            x = tch::no_grad(|| self.units[u].forward(&params, &x, ctx));
            let keep = next.map_or_else(Vec::new, |n| self.flat.unit_buffers[n].clone());
            self.gathered.release(&self.flat, u, &keep, sharded);
        }
        self.scalar(last, &x)
    }
}
