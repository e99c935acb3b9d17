//! The contract between the model (`model/`) and FSDP (`fsdp/`): the VLM is a chain of units
//! (vision tower, projector, embeddings, each decoder layer, final norm + head). A unit owns no
//! storage: FSDP keeps each unit's parameters in flat sharded buffers, gathers them, and calls
//! `forward` with full tensors keyed by their Hugging Face names. The same `forward` serves
//! FSDP's recompute in backward (activation checkpointing), so it must be a pure function of
//! its parameters, its input and the micro-batch context.
use std::collections::BTreeMap;
use tch::Tensor;

/// One parameter of a unit: its full Hugging Face key, shape, and whether it trains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<i64>,
    pub trainable: bool,
    /// `Some(e)`: the parameter belongs to expert `e` of an expert-parallel layer. FSDP keeps
    /// each expert's parameters in buffers of their own (`"{unit}.expert.{e}.trainable"`),
    /// sharded over the expert-replica group (the ranks that hold the same experts) instead
    /// of the whole group; only the ranks holding expert `e` list it.
    pub expert: Option<usize>,
}

/// Full (gathered) parameter tensors of one unit, by Hugging Face key.
pub type ParamMap = BTreeMap<String, Tensor>;

/// One FSDP unit. `C` is the per-micro-batch context the model builds once (attention mask,
/// positions, rotary tables, labels, placeholder positions).
pub trait Unit<C>: Send + Sync {
    /// Stable name used in logs, errors and checkpoints: "vision.embeddings",
    /// "vision.layers.{i}", "projector", "embed", "layers.{i}", "head".
    fn name(&self) -> &str;
    /// The component its time is booked under in `Fsdp::take_times` (units of one kind summed:
    /// every decoder layer as "lm_layers"); by default its own name.
    fn component(&self) -> &str {
        self.name()
    }
    /// Every parameter the unit reads, in a fixed order (the flat buffer's layout).
    fn params(&self) -> &[ParamSpec];
    /// Whether the unit runs for this micro-batch (vision and projector skip text-only ones).
    fn runs_on(&self, ctx: &C) -> bool;
    /// Output of the unit. For "embed" the input is the projected image tokens (or an empty
    /// tensor); for "head" (the chain's last unit) the output is the sum of token losses over
    /// supervised labels: a scalar, or a 1-D tensor whose first element is that sum and whose
    /// others are parts of it the model reports apart (the loss by source of a mixture),
    /// detached: FSDP back-propagates from the first element only and hands the parts back in
    /// [`ChainLoss`].
    /// A failing shim (a C++ kernel tessera binds itself) is an error, which FSDP reports with
    /// the unit's name and the rank.
    fn forward(&self, params: &ParamMap, input: &Tensor, ctx: &C) -> Result<Tensor, ComputeError>;
    /// A loss term of the unit's own, read right after the forward with autograd that
    /// backward runs through: a scalar carrying that forward's graph, already weighted, which
    /// backward adds to what it propagates (an MoE layer's share of the router balance loss).
    /// Its value is not part of the chain's loss (the model reports it apart).
    fn side_loss(&self, _ctx: &C) -> Option<Tensor> {
        None
    }
}

/// What the chain's last unit gave for one micro-batch (see [`Unit::forward`]): the summed
/// loss, and the parts the model reports apart (empty when its output is a scalar).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChainLoss {
    pub sum: f64,
    pub parts: Vec<f64>,
}

/// What a unit's forward or the optimizer's update fails with: a libtorch op that reported
/// its error, or one of the shims of `tessera-sys` (which names its operation).
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Shim(#[from] tessera_sys::ShimError),
    /// A collective inside the forward (expert parallelism's all-to-all).
    #[error(transparent)]
    Collective(#[from] crate::dist::DistError),
    /// A unit read a parameter it was not given (it names a key its unit does not hold).
    #[error("parameter `{key}` was not passed to the unit that reads it")]
    MissingParam { key: String },
}

/// Where FSDP reads each rank's initial shards from, one slice of one parameter at a time, so
/// a rank copies only what its shards keep and never needs the full model in memory: a
/// [`ParamMap`] (tests, small models) or the checkpoints themselves
/// (`tessera_model::VlmInit`, positioned reads from the safetensors files).
pub trait ParamSource {
    /// Copies elements `[start, start + dst.numel())` of parameter `name` (flattened row-major;
    /// its shape must be `shape`) into `dst`, a 1-D tensor of any float dtype on any device.
    fn read_into(
        &self,
        name: &str,
        shape: &[i64],
        start: i64,
        dst: &Tensor,
    ) -> Result<(), SourceError>;
}

/// Why a [`ParamSource`] could not provide a slice (the caller names the parameter and unit).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("the initial parameters lack it")]
    Missing,
    #[error("initial tensor has shape {found:?}, expected {expected:?}")]
    Shape { expected: Vec<i64>, found: Vec<i64> },
    /// The source's own failure (a checkpoint file that cannot be read), with its cause chain.
    #[error("reading the initial parameters")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("torch")]
    Torch(#[from] tch::TchError),
}

impl ParamSource for ParamMap {
    fn read_into(
        &self,
        name: &str,
        shape: &[i64],
        start: i64,
        dst: &Tensor,
    ) -> Result<(), SourceError> {
        let full = self.get(name).ok_or(SourceError::Missing)?;
        if full.size() != shape {
            return Err(SourceError::Shape {
                expected: shape.to_vec(),
                found: full.size(),
            });
        }
        let src = full
            .detach()
            .reshape([-1])
            .narrow(0, start, dst.numel() as i64);
        tch::no_grad(|| dst.shallow_clone().f_copy_(&src))?;
        Ok(())
    }
}
