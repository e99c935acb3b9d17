//! Planner (token budget, packing, type-aligned rank distribution), loader (decode, resize) and
//! weighted mixtures of shard sets (`mix`).
//! The planner emits `MicroBatchPlan`s, the loader turns each into a `MicroBatch` (the `batch`
//! crate's, the contract with the trainer and the model).
pub mod loader;
mod micro_batch_plan;
pub mod mix;
pub mod plan;

pub use micro_batch_plan::MicroBatchPlan;
pub use tessera_batch::{MicroBatch, IGNORE_INDEX};
