//! `MicroBatchPlan`: the planner's decision for one rank at one micro-step, which the loader
//! turns into a [`tessera_batch::MicroBatch`].
use tessera_shards::Kind;

/// The planner's decision for one rank at one micro-step: which samples, packed into which
/// rows. The loader turns it into a `MicroBatch`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MicroBatchPlan {
    pub kind: Kind,
    /// Global sample indices (as `shards` numbers them: shard order, then row order), one
    /// inner list per packed row, in packing order.
    pub rows: Vec<Vec<u64>>,
    /// Filler at an epoch's end: real samples (images included) whose labels are all ignored.
    pub zero_loss: bool,
}
