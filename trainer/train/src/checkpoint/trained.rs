//! What a checkpoint trained, as tensors: its shards, read one parameter at a time, or (for a
//! caller that holds them already, e.g. a model gathered in memory) a map of full tensors.
use super::format::{Checkpoint, CheckpointError};
use super::sharded_state::ShardedState;
use tch::{Kind, Tensor};
use tessera_fsdp::ParamMap;

/// The trained tensors to export or take parts from: a checkpoint's shards, read one parameter
/// at a time (a full fine-tune is never whole in memory here), or full tensors in memory.
pub enum TrainedTensors {
    Full(ParamMap),
    Sharded(ShardedState),
}

impl TrainedTensors {
    /// Opens what `ckpt` trained (verified against its manifests).
    pub fn open(ckpt: &Checkpoint) -> Result<Self, CheckpointError> {
        Ok(TrainedTensors::Sharded(ShardedState::open(ckpt)?))
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

    /// [`Self::get`] in `kind` (shards convert while reading, so no f32 copy is made).
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
