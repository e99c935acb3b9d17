//! FSDP over c10d: flat sharded unit buffers, gather / free, recompute, reduce-scatter.
//!
//! The crate never sees a model, only a chain of [`Unit`]s (`unit.rs`, the contract a model
//! implements: parameters by name and a pure `forward`) and a [`dist::ProcessGroup`] (`dist/`:
//! c10d through `tessera-sys`, rendezvous from torchrun's variables, the `--nproc` launcher).
//!
//! 1. `flat_param.rs`: each unit's parameters flatten into a frozen and a trainable buffer padded
//!    to a multiple of W; rank r keeps shard r (a tied parameter lives once, in its first unit).
//! 2. [`Fsdp::forward_backward`]: forward runs every unit that `runs_on` the micro-batch
//!    under no_grad, gathering the next unit's buffers while the current one computes; backward
//!    re-gathers (FULL_SHARD), recomputes each unit from its saved input, back-propagates the
//!    upstream gradient and reduce-scatters parameter gradients into the shards. The frozen
//!    prefix (units before the first trainable one) runs no backward at all. With
//!    [`Recompute::None`] the forward keeps each trained unit's autograd graph instead, and
//!    backward runs through it without gathering or recomputing. At W=1 nothing is gathered:
//!    units read the shards (the whole buffers) in place.
//! 3. [`Fsdp::step`]: one all-reduce of (squared grad norm, loss), clipping, and
//!    `ShardedAdamW` (`optim.rs`) on the shards (ATen's fused kernel, `fused_adamw.rs`).
//! 4. Mixed precision ([`FsdpConfig::compute_kind`] bf16): trainable shards stay f32 masters
//!    with f32 gradients and moments; they are cast to bf16 before the all-gather, so units
//!    compute in bf16; their gradients are cast to [`FsdpConfig::reduce_kind`] (f32 by default)
//!    before the reduce-scatter. Frozen shards have no master and are stored in bf16.
pub mod dist;
mod engine;
mod flat_param;
mod forward_only;
mod fused_adamw;
mod gather;
mod optim;
#[cfg(test)]
mod optim_tests;
mod state;
mod unit;

pub use engine::{Fsdp, FsdpConfig, MemoryReport, StepStats};
pub use optim::{AdamWConfig, ParamGroup};
pub use state::{BufferLayout, ParamSlice, ShardView};
pub use unit::{ChainLoss, ComputeError, ParamMap, ParamSource, ParamSpec, SourceError, Unit};

use crate::dist::DistError;

/// How parameters, gradients and optimizer state are split over ranks; PyTorch's names
/// (`full_shard`, `shard_grad_op`, `no_shard`) in TOML, JSON and on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Shards everywhere; gather before each unit's forward and again in its backward.
    FullShard,
    /// Shards at rest; gathered parameters stay from a unit's forward to its backward.
    ShardGradOp,
    /// DDP: full parameters and optimizer state on every rank, gradients all-reduced.
    NoShard,
    /// FULL_SHARD inside each machine, replicated across machines: all-gathers and
    /// reduce-scatters stay inside a node; shard gradients are then all-reduced between the
    /// nodes' matching local ranks ([`Fsdp::new_hybrid`]).
    HybridShard,
    /// The same with SHARD_GRAD_OP inside each machine (ZeRO-2 within the node).
    HybridShardZero2,
}

impl Strategy {
    /// Whether parameters are sharded over the node only and replicated across nodes.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Strategy::HybridShard | Strategy::HybridShardZero2)
    }

    /// Whether gathered parameters are freed after each use (FULL_SHARD-style) rather than
    /// kept from a unit's forward to its backward.
    pub fn frees_after_use(self) -> bool {
        matches!(self, Strategy::FullShard | Strategy::HybridShard)
    }
}

/// What backward does for units that train (or pass gradients to one that does). Spelled
/// `all`, `none`, `selective` or `every:K` on the command line and in TOML.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Recompute {
    /// Activation checkpointing: forward runs without autograd; backward gathers the unit
    /// again and recomputes it from its saved input. Least memory.
    All,
    /// Forward builds the autograd graph and keeps it (with the parameters it read) until
    /// backward: no second forward, no second gather. Most memory.
    None,
    /// Every K-th of the units backward runs through (counting from the first, in chain
    /// order) recomputed as `All` does, the others keeping their graphs as `None` does
    /// (torchtitan's "every N-th layer" checkpointing): memory and time between the two.
    Every(usize),
    /// Every unit keeps its graph as with `None`, but the model runs its cheap element-wise
    /// pieces (norms, activations) so that they keep only their inputs and run again in
    /// backward (the model reads [`Recompute::recomputes_cheap_ops`]; tessera-model's
    /// `selective.rs` lists what is kept). Between `none` and `all` in memory, near `none`
    /// in time.
    Selective,
}

impl Recompute {
    /// Whether the `i`-th unit backward runs through (0 = the first) is recomputed.
    pub fn recomputes(self, i: usize) -> bool {
        match self {
            Recompute::All => true,
            Recompute::None | Recompute::Selective => false,
            Recompute::Every(k) => i.is_multiple_of(k.max(1)),
        }
    }

    /// Whether the model recomputes its cheap pieces inside units that keep their graphs.
    pub fn recomputes_cheap_ops(self) -> bool {
        self == Recompute::Selective
    }
}

impl std::str::FromStr for Recompute {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Recompute::All),
            "none" => Ok(Recompute::None),
            "selective" => Ok(Recompute::Selective),
            _ => match s.strip_prefix("every:").map(str::parse::<usize>) {
                Some(Ok(k)) if k >= 1 => Ok(Recompute::Every(k)),
                _ => Err(format!(
                    "`{s}` is not a recompute choice: all, none, selective (norms and \
                     activations recomputed, matmul and attention outputs kept) or every:K \
                     (K >= 1: every K-th unit recomputed, the others keeping their activations)"
                )),
            },
        }
    }
}

impl std::fmt::Display for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Recompute::All => f.write_str("all"),
            Recompute::None => f.write_str("none"),
            Recompute::Selective => f.write_str("selective"),
            Recompute::Every(k) => write!(f, "every:{k}"),
        }
    }
}

impl TryFrom<String> for Recompute {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Recompute> for String {
    fn from(r: Recompute) -> String {
        r.to_string()
    }
}

/// FSDP errors; each names the unit, parameter or checkpoint key involved.
#[derive(Debug, thiserror::Error)]
pub enum FsdpError {
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error("parameter `{name}`: {message}")]
    Layout { name: String, message: String },
    #[error("parameter `{name}` of unit '{unit}'")]
    Init {
        name: String,
        unit: String,
        source: Box<crate::unit::SourceError>,
    },
    /// A libtorch op or a shim failed in a unit's forward or backward, or in the optimizer.
    #[error("rank {rank}: unit '{unit}'")]
    Compute {
        rank: usize,
        unit: String,
        source: ComputeError,
    },
    #[error("rank {rank}: unit '{unit}' ends the chain but its output has shape {shape:?}, not a loss (a scalar, or a vector of the loss and its parts)")]
    NotScalarLoss {
        rank: usize,
        unit: String,
        shape: Vec<i64>,
    },
    #[error(
        "rank {rank}: all-gather of unit '{unit}' would never complete: ranks {running:?} run the unit \
         on this micro-step and ranks {skipping:?} skip it (micro-batch kinds differ across ranks)"
    )]
    Misaligned {
        rank: usize,
        unit: String,
        running: Vec<usize>,
        skipping: Vec<usize>,
    },
}
