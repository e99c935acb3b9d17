//! [`ExportError`]: why an export, or loading a run for generation, failed.
use crate::checkpoint::format::CheckpointError;
use std::path::PathBuf;
use tessera_model::ModelError;

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("run {run}: no complete checkpoint under {run}/checkpoints ({why})")]
    NoCheckpoint {
        run: PathBuf,
        /// The folders passed over and why, or what to do when there are none.
        why: String,
    },
    #[error(
        "run {run} keeps no tokenizer.json (its shards had none beside index.json): pass \
         --tokenizer, the tokenizer.json its shards were made with (sha256 {expected})"
    )]
    NoTokenizer { run: PathBuf, expected: String },
    #[error(
        "run {run}: tokenizer {file} has sha256 {found}, but the run's shards were tokenized \
         with {expected}"
    )]
    TokenizerMismatch {
        run: PathBuf,
        file: PathBuf,
        found: String,
        expected: String,
    },
    #[error("run {run}: {what}")]
    BadRun { run: PathBuf, what: String },
    /// A file of the run that cannot be read or parsed: `what` names it, the source says why.
    #[error("run {run}: {what}")]
    Unreadable {
        run: PathBuf,
        what: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}
