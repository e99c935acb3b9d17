//! tch model (SigLIP, projector, Qwen2, LoRA), c10d collectives, FSDP and the train loop.
//!
//! 1. [`model`]: the VLM as a chain of units over Hugging Face checkpoints.
//! 2. [`dist`]: c10d process groups (gloo, NCCL) and the `--nproc` launcher.
//! 3. [`fsdp`]: a unit chain sharded over a process group, with its optimizer.
//! 4. [`train`]: config, the loop, checkpoints, metrics and export (`tessera train|export`).
//!
//! [`Unit`], [`ParamSpec`] and [`ParamMap`] are the contract between the model and FSDP.
pub mod dist;
mod dtype;
pub mod fsdp;
pub mod model;
mod shim;
pub mod train;
mod unit;

pub use dtype::Dtype;
pub use unit::{ParamMap, ParamSource, ParamSpec, SourceError, Unit};

#[cfg(test)]
mod error_chain_tests;
