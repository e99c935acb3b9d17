//! What FSDP holds and hands out: per-rank memory accounting, full parameters for export, and
//! the layout of each rank's shards + optimizer state for checkpoints.
use super::engine::{Fsdp, MemoryReport};
use super::optim::tensor_bytes;
use super::FsdpError;
use crate::unit::ParamMap;
use tch::Tensor;

impl<C> Fsdp<'_, C> {
    /// Bytes held at rest on this rank.
    pub fn memory(&self) -> MemoryReport {
        let bufs = &self.flat.buffers;
        MemoryReport {
            param_bytes: bufs.iter().map(|b| tensor_bytes(&b.shard)).sum(),
            trainable_param_bytes: bufs
                .iter()
                .filter(|b| b.trainable)
                .map(|b| tensor_bytes(&b.shard))
                .sum(),
            grad_bytes: self.grads.iter().flatten().map(tensor_bytes).sum(),
            optimizer_bytes: self.optim.bytes(),
        }
    }

    /// Full parameters by name on every rank (export, checkpoints); `trainable_only` skips frozen
    /// buffers. Every rank must call it (it all-gathers). Under expert parallelism a rank
    /// gets its own experts only.
    pub fn gather_params(&self, trainable_only: bool) -> Result<ParamMap, FsdpError> {
        let mut out = ParamMap::new();
        for b in self
            .flat
            .buffers
            .iter()
            .filter(|b| b.trainable || !trainable_only)
        {
            let (group, split) = self.groups().of(b);
            let full = if split {
                let mut full = Tensor::empty([b.padded], (b.shard.kind(), b.shard.device()));
                group
                    .all_gather_into(&mut full, &b.shard, &b.unit_name)?
                    .wait()?;
                full
            } else {
                b.shard.shallow_clone()
            };
            for (name, view) in b.views(&full) {
                out.insert(name, view.copy());
            }
        }
        Ok(out)
    }

    /// The gradients accumulated since the last [`Fsdp::step`], full, by parameter name (the
    /// trainable ones); every rank must call it (it all-gathers). What a test compares with a
    /// reference's autograd, and what a debugger inspects before the update.
    pub fn gather_grads(&self) -> Result<ParamMap, FsdpError> {
        let mut out = ParamMap::new();
        for (b, grad) in self.flat.buffers.iter().zip(&self.grads) {
            let Some(grad) = grad else { continue };
            let (group, split) = self.groups().of(b);
            let full = if split {
                let mut full = Tensor::empty([b.padded], (grad.kind(), grad.device()));
                group
                    .all_gather_into(&mut full, grad, &b.unit_name)?
                    .wait()?;
                full
            } else {
                grad.shallow_clone()
            };
            for (name, view) in b.views(&full) {
                out.insert(name, view.copy());
            }
        }
        Ok(out)
    }
}

/// Where one parameter sits in a trainable flat buffer (offsets do not depend on the world
/// size; only the padding after the last parameter does).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParamSlice {
    pub name: String,
    pub shape: Vec<i64>,
    pub offset: i64,
}

/// A trainable flat buffer as a sharded checkpoint records it: enough for a reader at any
/// world size to find element `i` of the buffer in writer rank `i / shard_len`'s file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BufferLayout {
    /// "layers.3.trainable": the buffer's tensors in a rank's file are `{key}.param`,
    /// `{key}.exp_avg` and `{key}.exp_avg_sq`.
    pub key: String,
    /// Elements before padding.
    pub numel: i64,
    /// Elements each writing rank holds (the last one's tail is padding).
    pub shard_len: i64,
    pub params: Vec<ParamSlice>,
    /// The job ranks whose files hold the buffer's shards, in shard order, when they are not
    /// ranks `0..` (an expert's buffer under expert parallelism: the ranks holding it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holders: Option<Vec<usize>>,
}

/// This rank's state of one trainable buffer, as views: writing into them writes the state.
pub struct ShardView {
    pub key: String,
    /// First element of this rank's shard within the buffer.
    pub start: i64,
    pub numel: i64,
    /// `(suffix, tensor)`: "param" (the f32 master), "exp_avg", "exp_avg_sq".
    pub tensors: Vec<(&'static str, Tensor)>,
    /// Whether this rank writes it to a checkpoint ([`Fsdp::writes_buffer`]).
    pub written: bool,
}

impl<C> Fsdp<'_, C> {
    /// Whether this rank writes a shards file into a checkpoint: every rank of a sharded
    /// strategy, rank 0 alone when every rank holds the whole state (NO_SHARD, W=1), under
    /// hybrid strategies the first node's ranks only (the others hold copies), and under
    /// expert parallelism every rank (each writes the buffers [`Self::writes_buffer`] names).
    pub fn writes_shards(&self) -> bool {
        self.experts.is_some() || self.writes_dense_shards()
    }

    /// Whether this rank writes its shards of the buffers sharded over the whole group.
    fn writes_dense_shards(&self) -> bool {
        let first_replica = self.replicas.is_none_or(|r| r.rank() == 0);
        first_replica && (self.sharded() || self.pg.rank() == 0)
    }

    /// Whether this rank writes trainable buffer `b`'s shard: for an expert's buffer, every
    /// holder when it is split over them, else its first holder.
    pub fn writes_buffer(&self, b: usize) -> bool {
        let buf = &self.flat.buffers[b];
        match buf.expert {
            Some(_) => {
                let (group, split) = self.groups().of(buf);
                split || group.rank() == 0
            }
            None => self.writes_dense_shards(),
        }
    }

    /// How many ranks write shards (ranks `0..n` of the job: the first node's under hybrid,
    /// all of them under expert parallelism).
    pub fn shard_writers(&self) -> usize {
        if self.experts.is_some() {
            self.world.world_size()
        } else if self.sharded() {
            self.pg.world_size()
        } else {
            1
        }
    }

    /// Whether some of this rank's buffers hold experts (expert parallelism).
    pub fn has_expert_buffers(&self) -> bool {
        self.flat.buffers.iter().any(|b| b.expert.is_some())
    }

    /// The trainable buffers' layout at this world size, in buffer order.
    pub fn trainable_layout(&self) -> Vec<BufferLayout> {
        self.flat
            .buffers
            .iter()
            .filter(|b| b.trainable)
            .map(|b| BufferLayout {
                holders: b.expert.map(|_| {
                    if self.groups().of(b).1 {
                        self.expert_ranks.clone()
                    } else {
                        self.expert_ranks.iter().take(1).copied().collect()
                    }
                }),
                key: b.key(),
                numel: b.numel,
                shard_len: b.shard_len,
                params: b
                    .entries
                    .iter()
                    .map(|e| ParamSlice {
                        name: e.name.clone(),
                        shape: e.shape.clone(),
                        offset: e.offset,
                    })
                    .collect(),
            })
            .collect()
    }

    /// This rank's trainable shards and their AdamW moments, in [`Self::trainable_layout`]'s
    /// order, as views (no copy).
    pub fn shard_views(&self) -> Vec<ShardView> {
        self.optim
            .states
            .iter()
            .map(|s| {
                let b = &self.flat.buffers[s.buffer];
                ShardView {
                    key: b.key(),
                    start: b.shard_start,
                    numel: b.numel,
                    written: self.writes_buffer(s.buffer),
                    tensors: vec![
                        ("param", b.shard.shallow_clone()),
                        ("exp_avg", s.exp_avg.shallow_clone()),
                        ("exp_avg_sq", s.exp_avg_sq.shallow_clone()),
                    ],
                }
            })
            .collect()
    }

    /// AdamW updates taken so far (its bias correction's step).
    pub fn optimizer_step(&self) -> i64 {
        self.optim.step
    }

    /// Sets AdamW's step count (a resumed run continues its bias correction).
    pub fn set_optimizer_step(&mut self, step: i64) {
        self.optim.step = step;
    }
}
