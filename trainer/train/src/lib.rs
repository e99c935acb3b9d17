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
mod config;
mod error;
mod export;
mod report;
mod run;
mod run_dir;
mod run_tokenizer;

pub use checkpoint::format::{
    Checkpoint, CheckpointError, CheckpointMeta, ModelFingerprint, RankState,
};
pub use checkpoint::pick::{Pick, Skipped};
pub use checkpoint::sharded_state::ShardedState;
pub use config::{
    BadImagePolicy, CheckpointWrite, ConfigError, ConfigLayer, Device, Dtype, Recompute,
    ResizePolicy, Stage, Strategy, TrainConfig, TrainParts,
};
pub use error::TrainError;
pub use export::for_generation::{load_export_model, load_run_model, GenerationModel};
pub use export::llava_hf::{
    export_llava_hf, lm_target_regex, weight_kind, write_llava_hf, LlavaHfOptions, LlavaHfReport,
    LlavaSources,
};
pub use export::run_weights::{initial_projector, unmap_freed_tensors, RunWeights};
pub use export::{
    export, export_as, newest_complete, newest_complete_trained, ExportError, ExportReport,
    TrainedTensors, VlmDescription, ADAPTER_DIR, LM_DIR, PROJECTOR_FILE, TRAINABLE_FILE,
    VISION_DIR,
};
pub use report::metrics::{read_metrics, MetricsError, StepMetrics, Summary};
pub use report::plot::PlotError;
pub use run::restore::ResumeRecord;
pub use run::setup::check_model_dirs;
pub use run::start::{prepare as prepare_run_dir, RunStart};
pub use run::train;
pub use run_dir::{CheckpointFolder, RunDir, TOKENIZER_FILE, VLM_FILE};

#[cfg(test)]
mod error_chain_tests;
