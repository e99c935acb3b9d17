//! Planner (token budget, packing, type-aligned rank distribution), loader (decode, resize) and
//! weighted mixtures of shard sets (`mix`).
//! `batch` is the contract: the planner emits `MicroBatchPlan`s, the loader turns each into a
//! `MicroBatch` for the trainer.
mod batch;
pub mod loader;
pub mod mix;
pub mod plan;

pub use batch::{MicroBatch, MicroBatchPlan, IGNORE_INDEX};
