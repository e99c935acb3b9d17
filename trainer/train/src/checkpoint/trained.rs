//! What a checkpoint trained, as tensors: [`TRAINABLE_FILE`] (format 3's one file of full
//! tensors in rank 0's folder) or format 4's shards, read one parameter at a time.
use super::format::{Checkpoint, CheckpointError};
use super::sharded_state::ShardedState;
use tch::{Kind, Tensor};
use tessera_fsdp::ParamMap;
use tessera_model::load_safetensors;

/// File (in rank 0's checkpoint folder) holding the full trainable tensors, by HF key.
pub(crate) const TRAINABLE_FILE: &str = "trainable.safetensors";

/// The trained tensors of a checkpoint: format 3's one file of full tensors, or format 4's
/// shards, read one parameter at a time (a full fine-tune is never whole in memory here).
pub enum TrainedTensors {
    Full(ParamMap),
    Sharded(ShardedState),
}

impl TrainedTensors {
    /// Opens what `ckpt` trained (verified against its manifests).
    pub fn open(ckpt: &Checkpoint) -> Result<Self, CheckpointError> {
        if ckpt.meta.format_version >= 4 {
            return Ok(TrainedTensors::Sharded(ShardedState::open(ckpt)?));
        }
        let dir = ckpt.rank_dir(0)?;
        let file = dir.join(TRAINABLE_FILE);
        let tensors = load_safetensors(&file).map_err(|e| CheckpointError::Unreadable {
            dir: ckpt.dir.clone(),
            file,
            source: Box::new(e),
        })?;
        Ok(TrainedTensors::Full(tensors))
    }

    /// Names of every trained parameter.
    pub fn names(&self) -> Vec<String> {
        match self {
            TrainedTensors::Full(map) => map.keys().cloned().collect(),
            TrainedTensors::Sharded(state) => state.names().map(String::from).collect(),
        }
    }

    /// One trained parameter, whole (f32), or `None` when it did not train.
    pub fn get(&self, name: &str) -> Result<Option<Tensor>, CheckpointError> {
        self.get_as(name, Kind::Float)
    }

    /// [`Self::get`] in `kind` (format 4 converts while reading, so no f32 copy is made).
    pub fn get_as(&self, name: &str, kind: Kind) -> Result<Option<Tensor>, CheckpointError> {
        match self {
            TrainedTensors::Full(map) => Ok(map.get(name).map(|t| t.to_kind(kind))),
            TrainedTensors::Sharded(state) => state.get_as(name, kind),
        }
    }

    /// The trained parameters whose names pass `keep`, in one map (small parts: the
    /// projector, LoRA adapters).
    pub fn collect(&self, keep: impl Fn(&str) -> bool) -> Result<ParamMap, CheckpointError> {
        let mut out = ParamMap::new();
        for name in self.names().into_iter().filter(|n| keep(n)) {
            if let Some(t) = self.get(&name)? {
                out.insert(name, t);
            }
        }
        Ok(out)
    }
}
