//! The one error type of the `shards` crate. Every message names the file, shard, row or sample
//! it is about, so a user can find the problem without a debugger.
use std::path::PathBuf;

/// Errors from writing, opening, reading or verifying shards.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{shard}: parquet: {source}")]
    Parquet {
        shard: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{shard}: arrow: {source}")]
    Arrow {
        shard: String,
        #[source]
        source: arrow_schema::ArrowError,
    },
    #[error("{path}: index.json is not valid: {source}")]
    Manifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: index.json has format version {found}, this build reads version {expected}")]
    FormatVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{shard}: schema does not match tessera schema v1: {detail}")]
    Schema { shard: String, detail: String },
    #[error("{shard} row {row}: {detail}")]
    BadRow {
        shard: String,
        row: u64,
        detail: String,
    },
    #[error("sample index {index} is out of range: the dataset holds {len} samples")]
    OutOfRange { index: u64, len: usize },
    #[error("{shard}: {detail}")]
    Mismatch { shard: String, detail: String },
}

impl ShardError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ShardError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn parquet(shard: &str, source: parquet::errors::ParquetError) -> Self {
        ShardError::Parquet {
            shard: shard.to_string(),
            source,
        }
    }

    pub(crate) fn arrow(shard: &str, source: arrow_schema::ArrowError) -> Self {
        ShardError::Arrow {
            shard: shard.to_string(),
            source,
        }
    }
}
