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
            LoaderError::Image { sample_id, .. } | LoaderError::Sample { sample_id, .. } => {
                Some(sample_id)
            }
            _ => None,
        }
    }
}
