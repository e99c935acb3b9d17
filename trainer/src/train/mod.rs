//! Training: config (TOML + flags, LLaVA-1.5 stage defaults), schedule (warmup + cosine),
//! metrics (`metrics.jsonl`, progress, summary), plot (`loss.png`), checkpoints (per-rank
//! shards + metadata, atomic, verified on resume), export (projector + PEFT adapter + VLM
//! config) and the loop itself.
pub mod checkpoint;
pub mod config;
pub mod engine;
pub mod error;
pub mod export;
pub mod fsdp_engine;
pub mod metrics;
pub mod plot;
pub mod run;
pub mod run_dir;
pub mod schedule;
pub mod setup;

pub use config::{ConfigError, ConfigLayer, Stage, Strategy, TrainConfig};
pub use error::TrainError;
pub use run::train;

#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod config_tests;
