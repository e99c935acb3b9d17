//! Planner (token budget, packing, type-aligned rank distribution) and loader (decode, resize).
//! `batch` is the contract: the planner emits `MicroBatchPlan`s, the loader turns each into a
//! `MicroBatch` for the trainer.
mod batch;
pub mod loader;
pub mod plan;

pub use batch::{MicroBatch, MicroBatchPlan, IGNORE_INDEX};
