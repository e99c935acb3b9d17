//! Training, one folder per concern, `run_dir.rs` (what a run keeps where, its checkpoint
//! folder scan) at the bottom importing nothing above it:
//! - `config.rs` (+ `config/`): TOML + flags, LLaVA-1.5's stage defaults, `--train`'s parts;
//! - `run/`: the loop (`mod.rs`) over `sharded_vlm.rs` (the model sharded by FSDP), with
//!   `setup.rs` (process group, model, data), `start.rs` (what `--out` may hold),
//!   `restore.rs` (`--resume` and `resumes.jsonl`), `rank_plan.rs` (the plan's ranks onto
//!   this run's), `schedule.rs` (warmup + cosine) and `validate.rs`;
//! - `checkpoint/`: the format and its commit protocol, format 4's sharded state, the pick of
//!   the newest complete checkpoint, the loop's saver (sync or async);
//! - `export/`: projector + PEFT adapter + VLM config, `llava_hf.rs` (one transformers
//!   directory, streamed tensor by tensor from `run_weights.rs`) and `for_generation.rs` (a run
//!   or an export loaded for `tessera generate`);
//! - `report/`: `metrics.jsonl`, progress and summary, `loss.png`, profiler traces;
//! - `run_tokenizer.rs`: the run's copy of its shards' tokenizer.
//!
//! The top of the trainer's crates: `tessera-sys` (the C++ shims) <- `tessera-model` and
//! `tessera-fsdp` <- `tessera-train` <- the `tessera` CLI.
mod checkpoint;
mod config;
mod data;
mod error;
mod export;
mod report;
mod run;
mod run_dir;
mod run_tokenizer;
mod shard_tokenizer;
mod vlm_description;

// The CLI's and the tests' entry points, and the types their signatures name.
pub use checkpoint::format::{Checkpoint, CheckpointError};
pub use checkpoint::sharded_state::ShardedState;
pub use checkpoint::trained::TrainedTensors;
pub use config::{
    BadImagePolicy, CheckpointWrite, ConfigError, ConfigLayer, Device, Dtype, Recompute,
    ResizePolicy, Stage, Strategy, TrainConfig, TrainParts,
};
pub use error::TrainError;
pub use export::caption::{
    held_out_prompt, image_sample, CaptionError, Captioner, DEFAULT_INSTRUCTION,
};
pub use export::error::ExportError;
pub use export::for_generation::{load_export_model, load_run_model, GenerationModel};
pub use export::llava_hf::{
    export_llava_hf, weight_kind, write_llava_hf, LlavaHfOptions, LlavaHfReport, LlavaSources,
};
pub use export::run_checkpoint::newest_complete_trained;
pub use export::run_weights::unmap_freed_tensors;
pub use export::{export_as, ExportReport};
pub use report::metrics::{MetricsError, Summary};
pub use report::plot::PlotError;
pub use run::setup::check_model_dirs;
pub use run::start::{prepare as prepare_run_dir, RunStart};
pub use run::train;
pub use run_dir::RunDir;

#[cfg(test)]
mod error_chain_tests;
