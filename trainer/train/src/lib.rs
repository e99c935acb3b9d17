//! Training: config (TOML + flags, LLaVA-1.5 stage defaults), schedule (warmup + cosine),
//! the run folder (`run_dir.rs`: what a run keeps where, its checkpoint scan),
//! metrics (`metrics.jsonl`, progress, summary), plot (`loss.png`), checkpoints (per-rank
//! shards + metadata, atomic, verified on resume), export (projector + PEFT adapter + VLM
//! config; `llava_hf.rs`: one transformers directory, streamed tensor by tensor from
//! `run_weights.rs`, a run's model one tensor at a time), `load_for_generation.rs` (a run or an
//! export loaded for `tessera generate`) and the loop itself (`run.rs`, driving `step.rs`: the
//! model sharded by FSDP).
//!
//! The top of the trainer's crates: `tessera-sys` (the C++ shims) <- `tessera-model` and
//! `tessera-fsdp` <- `tessera-train` <- the `tessera` CLI.
mod checkpoint;
mod checkpoint_pick;
mod checkpoint_save;
mod config;
mod data;
mod error;
mod export;
mod layout;
mod llava_hf;
mod load_for_generation;
mod metrics;
mod plot;
mod profile;
mod run;
mod run_dir;
mod run_weights;
mod schedule;
mod setup;
mod sharded_state;
mod step;
mod train_parts;
mod validate;

pub use checkpoint::{Checkpoint, CheckpointError, CheckpointMeta, ModelFingerprint, RankState};
pub use checkpoint_pick::{Pick, ResumeRecord, Skipped};
pub use config::{
    BadImagePolicy, CheckpointWrite, ConfigError, ConfigLayer, Device, Dtype, Recompute,
    ResizePolicy, Stage, Strategy, TrainConfig, TrainParts,
};
pub use error::TrainError;
pub use export::{
    export, export_as, newest_complete, newest_complete_trained, ExportError, ExportReport,
    TrainedTensors, VlmDescription, ADAPTER_DIR, LM_DIR, PROJECTOR_FILE, TRAINABLE_FILE,
    VISION_DIR,
};
pub use llava_hf::{
    export_llava_hf, lm_target_regex, weight_kind, write_llava_hf, LlavaHfOptions, LlavaHfReport,
    LlavaSources,
};
pub use load_for_generation::{load_export_model, load_run_model, GenerationModel};
pub use metrics::{read_metrics, MetricsError, StepMetrics, Summary};
pub use plot::PlotError;
pub use run::train;
pub use run_dir::{
    prepare as prepare_run_dir, CheckpointFolder, RunDir, RunStart, TOKENIZER_FILE, VLM_FILE,
};
pub use run_weights::{initial_projector, unmap_freed_tensors, RunWeights};
pub use setup::check_model_dirs;
pub use sharded_state::ShardedState;

#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod config_tests;
#[cfg(test)]
mod error_chain_tests;
