//! The error type of a failed ingest run. Bad *records* are not errors: they are rejected with
//! a [`crate::Reason`] and the run goes on; these are the failures that stop a run.
use std::path::PathBuf;

/// A wrapped library error is the `source()`, never part of the message: the message names the
/// file or record, the source says why, and the CLI's chain printer shows each once.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The json is not an array of objects (found while splitting it into records).
    #[error("{path}: malformed JSON at byte {offset}: {detail}")]
    Json {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
    /// One record does not parse as a LLaVA record.
    #[error("{path}: malformed JSON at byte {offset}: record {record}")]
    Record {
        path: PathBuf,
        offset: u64,
        record: usize,
        source: serde_json::Error,
    },
    /// The input cannot be read as the layout it was given or detected as.
    #[error("{input}: {detail}")]
    Input { input: String, detail: String },
    /// A parquet input file is not readable parquet.
    #[error("{file}: parquet")]
    Parquet {
        file: String,
        source: parquet::errors::ParquetError,
    },
    /// A parquet input file's columns could not be decoded.
    #[error("{file}: arrow")]
    Arrow {
        file: String,
        source: arrow_schema::ArrowError,
    },
    #[error("{path}: not a readable zip archive")]
    Zip {
        path: PathBuf,
        source: zip::result::ZipError,
    },
    /// The tokenizer changed on disk during the ingest.
    #[error("{path}: cannot load tokenizer: {detail}")]
    Tokenizer { path: PathBuf, detail: String },
    /// The tokenizer, its special tokens or the template's markers (`tessera-text`'s errors).
    #[error(transparent)]
    Text(#[from] tessera_text::TextError),
    #[error(transparent)]
    Shards(#[from] tessera_shards::ShardError),
    #[error("{dir}: {detail}")]
    OutDir { dir: PathBuf, detail: String },
    #[error("cannot resume in {dir}: {detail}")]
    Resume { dir: PathBuf, detail: String },
    /// The resume journal could not be written or read back.
    #[error("cannot resume in {dir}: {file}")]
    Journal {
        dir: PathBuf,
        file: &'static str,
        source: serde_json::Error,
    },
    /// The ingest report could not be serialised.
    #[error("{path}")]
    Report {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("a worker thread panicked: {0}")]
    WorkerPanic(String),
}

impl IngestError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IngestError::Io {
            path: path.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_testing::assert_cause_printed_once;

    #[test]
    fn every_wrapped_error_prints_once() {
        let io = std::io::Error::other("disk on fire");
        assert_cause_printed_once(IngestError::io("llava.json", io), "disk on fire");
        let zip = IngestError::Zip {
            path: "images.zip".into(),
            source: zip::result::ZipError::InvalidArchive("no central directory".into()),
        };
        assert_cause_printed_once(zip, "no central directory");
        let shard = tessera_shards::ShardError::OutOfRange { index: 9, len: 3 };
        let cause = shard.to_string();
        assert_cause_printed_once(IngestError::Shards(shard), &cause);
        let io = std::io::Error::other("read-only file system");
        let nested = tessera_shards::ShardError::Io {
            path: "out/index.json".into(),
            source: io,
        };
        assert_cause_printed_once(IngestError::from(nested), "read-only file system");
    }
}
