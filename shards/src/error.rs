//! The one error type of the `shards` crate. Every message names the file, shard, row or sample
//! it is about, so a user can find the problem without a debugger.
use std::path::PathBuf;

/// Errors from writing, opening, reading or verifying shards.
///
/// Wrapped library errors are part of the message and deliberately not `source()`: anyhow's
/// `{:#}` prints the whole chain, so returning them as source too printed them twice.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{shard}: parquet: {error}")]
    Parquet {
        shard: String,
        error: parquet::errors::ParquetError,
    },
    #[error("{shard}: arrow: {error}")]
    Arrow {
        shard: String,
        error: arrow_schema::ArrowError,
    },
    #[error("{path}: index.json is not valid: {error}")]
    Manifest {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error(
        "{path}: index.json has format version {found}, this build reads versions 1 to \
         {expected}; read it with the tessera that wrote it, or re-ingest the source json"
    )]
    FormatVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{shard}: schema does not match tessera's shard schema: {detail}")]
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
    /// An object-store failure (the `remote` crate's error, which names the URL).
    #[error(transparent)]
    Remote(Box<dyn std::error::Error + Send + Sync>),
}

impl ShardError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ShardError::Io {
            path: path.into(),
            error: source,
        }
    }

    pub(crate) fn parquet(shard: &str, source: parquet::errors::ParquetError) -> Self {
        ShardError::Parquet {
            shard: shard.to_string(),
            error: source,
        }
    }

    pub(crate) fn arrow(shard: &str, source: arrow_schema::ArrowError) -> Self {
        ShardError::Arrow {
            shard: shard.to_string(),
            error: source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `error` under anyhow's `{:#}` (the CLI's format) holds `cause`'s text exactly once.
    fn assert_cause_printed_once(error: ShardError, cause: &str) {
        let text = format!("{:#}", anyhow::Error::new(error));
        assert_eq!(text.matches(cause).count(), 1, "{text}");
    }

    #[test]
    fn every_wrapped_error_prints_once() {
        let io = std::io::Error::other("disk on fire");
        assert_cause_printed_once(ShardError::io("shard-00000.parquet", io), "disk on fire");
        let parquet = parquet::errors::ParquetError::General("bad footer".into());
        assert_cause_printed_once(
            ShardError::parquet("shard-00001.parquet", parquet),
            "bad footer",
        );
        let arrow = arrow_schema::ArrowError::SchemaError("no column".into());
        assert_cause_printed_once(ShardError::arrow("shard-00002.parquet", arrow), "no column");
        let json = serde_json::from_str::<u32>("{").expect_err("not json");
        let cause = json.to_string();
        let manifest = ShardError::Manifest {
            path: "data/index.json".into(),
            error: json,
        };
        assert_cause_printed_once(manifest, &cause);
    }
}
