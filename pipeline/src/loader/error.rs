//! The loader's error type: every message names the sample (or the config field) at fault.

/// What can stop the loader. A bad image under the `skip` policy is not an error: it is
/// reported with `tracing::warn!` and dropped from its micro-batch.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The sample source (shards) failed to read the given indices.
    #[error("reading samples {indices:?}: {message}")]
    Read { indices: Vec<u64>, message: String },
    /// The source answered with a different number of samples than asked for.
    #[error("reading samples {indices:?}: asked for {asked} samples, got {got}")]
    ShortRead {
        indices: Vec<u64>,
        asked: usize,
        got: usize,
    },
    /// An image could not be decoded (bad bytes, unsupported format) or resized.
    #[error("sample {sample_id}: image: {message}")]
    Image { sample_id: String, message: String },
    /// A sample's image bytes or token ids do not match the crc32c written at ingest: the
    /// shard changed on disk. Handled like an undecodable image (the bad-image policy).
    #[error(
        "{at} (sample {sample_id}): {column} fails its crc32c (stored {stored:08x}, computed \
         {computed:08x}): the shard is corrupt on disk; `tessera shards verify` checks every row"
    )]
    Checksum {
        /// Shard file and row (`shard-00003.parquet row 17`), or the global index.
        at: String,
        sample_id: String,
        column: &'static str,
        stored: u32,
        computed: u32,
    },
    /// The token ids and the image disagree (placeholder count, missing image bytes, ...).
    #[error("sample {sample_id}: {message}")]
    Sample { sample_id: String, message: String },
    /// The loader's configuration is unusable.
    #[error("loader config: {0}")]
    Config(String),
    /// A worker thread died (a bug: workers do not panic on input data).
    #[error("loader worker thread stopped unexpectedly: {0}")]
    Worker(String),
}

impl LoaderError {
    /// The sample id this error is about, when there is one.
    pub fn sample_id(&self) -> Option<&str> {
        match self {
            LoaderError::Image { sample_id, .. }
            | LoaderError::Sample { sample_id, .. }
            | LoaderError::Checksum { sample_id, .. } => Some(sample_id),
            _ => None,
        }
    }
}
