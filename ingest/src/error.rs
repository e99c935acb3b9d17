//! The error type of a failed ingest run. Bad *records* are not errors: they are rejected with
//! a [`crate::Reason`] and the run goes on; these are the failures that stop a run.
use std::path::PathBuf;

/// Wrapped library errors are part of the message and deliberately not `source()`: anyhow's
/// `{:#}` prints the whole chain, so returning them as source too printed them twice.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: malformed JSON at byte {offset}: {detail}")]
    Json {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
    #[error("{path}: not a readable zip archive: {error}")]
    Zip {
        path: PathBuf,
        error: zip::result::ZipError,
    },
    #[error("{path}: cannot load tokenizer: {detail}")]
    Tokenizer { path: PathBuf, detail: String },
    #[error("tokenizer {path} has no token {token}, which the {template} template needs")]
    MissingToken {
        path: PathBuf,
        token: String,
        template: String,
    },
    #[error("record {id}: tokenizer failed: {detail}")]
    Tokenize { id: String, detail: String },
    #[error(transparent)]
    Shards(#[from] shards::ShardError),
    #[error("{dir}: {detail}")]
    OutDir { dir: PathBuf, detail: String },
    #[error("cannot resume in {dir}: {detail}")]
    Resume { dir: PathBuf, detail: String },
    #[error("a worker thread panicked: {0}")]
    WorkerPanic(String),
}

impl IngestError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IngestError::Io {
            path: path.into(),
            error: source,
        }
    }
}
