//! Planner (token budget, packing, type-aligned rank distribution) and loader (decode, resize).
//! Filled in by the pipeline issue; `batch` is the contract with the trainer.
mod batch;

pub use batch::{MicroBatch, IGNORE_INDEX};
