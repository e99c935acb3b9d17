//! The `remote` crate's error: every message names the URL (or the cache path) it is about.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// A request failed after object_store's retries (or was not retryable: a missing object).
    #[error("{url}: {error}")]
    Store {
        url: String,
        error: object_store::Error,
    },
    #[error("{url}: not a shard directory URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{url}: {detail}")]
    Invalid { url: String, detail: String },
    #[error("shard cache {path}: {error}")]
    Cache {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cache limit {text:?}: {reason}")]
    BadSize { text: String, reason: String },
    #[error("starting the object-store I/O threads: {0}")]
    Runtime(std::io::Error),
}

impl RemoteError {
    pub(crate) fn store(url: impl Into<String>, error: object_store::Error) -> Self {
        RemoteError::Store {
            url: url.into(),
            error,
        }
    }

    pub(crate) fn cache(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        RemoteError::Cache {
            path: path.into(),
            error,
        }
    }
}

impl From<RemoteError> for shards::ShardError {
    fn from(e: RemoteError) -> Self {
        shards::ShardError::Remote(Box::new(e))
    }
}
