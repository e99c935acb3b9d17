//! The one error type of `tessera-shards`. Every message names the file, shard, row or sample
//! it is about, so a user can find the problem without a debugger.
use std::path::PathBuf;

/// Errors from writing, opening, reading or verifying shards.
///
/// A wrapped library error is the `source()`, never part of the message: the message says what
/// failed (the file, the shard), the source why, and a chain printer (anyhow's `{:#}`, or
/// `tessera_errors::with_causes` for a log line or a report) prints each once.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{shard}: parquet")]
    Parquet {
        shard: String,
        source: parquet::errors::ParquetError,
    },
    #[error("{shard}: arrow")]
    Arrow {
        shard: String,
        source: arrow_schema::ArrowError,
    },
    #[error("{path}: index.json is not valid")]
    Manifest {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{path}: shard format {found}, but this tessera reads shard format {expected} only: \
         re-ingest the source with this version"
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
    /// A write that found the disk full: the file, the bytes needed, the bytes free.
    #[error(transparent)]
    NoSpace(#[from] crate::disk_space::NoSpace),
    /// An object-store failure (the `tessera-remote` crate's error, which names the URL).
    #[error(transparent)]
    Remote(Box<dyn std::error::Error + Send + Sync>),
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

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_errors::with_causes;
    use tessera_testing::assert_cause_printed_once;

    #[test]
    fn a_library_error_that_prints_its_own_source_prints_it_once() {
        let io = std::io::Error::other("connection reset");
        let parquet = parquet::errors::ParquetError::External(Box::new(io));
        let error = ShardError::parquet("s3://bucket/data/shard-00004.parquet", parquet);
        assert_eq!(
            with_causes(&error),
            "s3://bucket/data/shard-00004.parquet: parquet: External: connection reset"
        );
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
            source: json,
        };
        assert_cause_printed_once(manifest, &cause);
    }
}
