//! The loader's error type: every message names the sample (or the config field) at fault.
//!
//! Errors of other tessera crates (`shards`) and of the loader's own stages (`decode`, `resize`)
//! are kept as `source()` and left out of the message, so the CLI's chain printer prints each
//! cause once; [`tessera_errors::with_causes`] gives the same text for a log line.
use super::decode::DecodeError;
use super::resize::ResizeError;

/// What can stop the loader. A bad image under the `skip` policy is not an error: it is
/// reported with `tracing::warn!` and dropped from its micro-batch.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The sample source (shards) failed to read the given indices.
    #[error("reading samples {indices:?}")]
    Read {
        indices: Vec<u64>,
        #[source]
        source: tessera_shards::ShardError,
    },
    /// The source answered with a different number of samples than asked for.
    #[error("reading samples {indices:?}: asked for {asked} samples, got {got}")]
    ShortRead {
        indices: Vec<u64>,
        asked: usize,
        got: usize,
    },
    /// An image could not be decoded (bad bytes, unsupported format). `image` is its index
    /// among the sample's `images`.
    #[error("sample {sample_id}: decoding {}", which_image(*image, *images))]
    Decode {
        sample_id: String,
        image: u32,
        images: u32,
        #[source]
        source: DecodeError,
    },
    /// A decoded image could not be resized into its output.
    #[error("sample {sample_id}: resizing {}", which_image(*image, *images))]
    Resize {
        sample_id: String,
        image: u32,
        images: u32,
        #[source]
        source: ResizeError,
    },
    /// A sample's image bytes or token ids do not match the crc32c written at ingest: the
    /// shard changed on disk. Handled like an undecodable image (the bad-image policy).
    #[error(
        "{at} (sample {sample_id}): {} fails its crc32c (stored {stored:08x}, computed \
         {computed:08x}): the shard is corrupt on disk; `tessera shards verify` checks every row",
        checked(column, *image)
    )]
    Checksum {
        /// Shard file and row (`shard-00003.parquet row 17`), or the global index.
        at: String,
        sample_id: String,
        column: &'static str,
        /// For an image: which (from 0) of how many.
        image: Option<(u32, u32)>,
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

/// What a checksum covers: `input_ids`, `image` (a sample of one), `image 2 of 3`.
fn checked(column: &'static str, image: Option<(u32, u32)>) -> String {
    let mismatch = tessera_shards::ChecksumMismatch {
        column,
        image,
        stored: 0,
        computed: 0,
    };
    mismatch.what()
}

/// "its image" for a sample of one image, else "image 2 of 3" (counted from 1).
fn which_image(image: u32, images: u32) -> String {
    if images <= 1 {
        "its image".into()
    } else {
        format!("image {} of {images}", image + 1)
    }
}

impl LoaderError {
    /// The sample id this error is about, when there is one.
    pub fn sample_id(&self) -> Option<&str> {
        match self {
            LoaderError::Decode { sample_id, .. }
            | LoaderError::Resize { sample_id, .. }
            | LoaderError::Sample { sample_id, .. }
            | LoaderError::Checksum { sample_id, .. } => Some(sample_id),
            _ => None,
        }
    }

    /// Whether the sample's image is at fault and its tokens are sound (an image that fails to
    /// decode or resize, or image bytes that fail their checksum).
    pub fn is_bad_image(&self) -> bool {
        matches!(
            self,
            LoaderError::Decode { .. }
                | LoaderError::Resize { .. }
                | LoaderError::Checksum {
                    column: tessera_shards::col::IMAGES,
                    ..
                }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_testing::assert_cause_printed_once;

    #[test]
    fn every_wrapped_error_prints_once() {
        let shard = tessera_shards::ShardError::Io {
            path: "shard-00003.parquet".into(),
            source: std::io::Error::other("disk on fire"),
        };
        let read = LoaderError::Read {
            indices: vec![4, 5],
            source: shard,
        };
        assert_cause_printed_once(read, "disk on fire");
        let decode = LoaderError::Decode {
            sample_id: "s-1".into(),
            image: 0,
            images: 1,
            source: DecodeError::TooManyPixels {
                width: 20_000,
                height: 20_000,
            },
        };
        assert_cause_printed_once(decode, "decompression bomb guard");
        let resize = LoaderError::Resize {
            sample_id: "s-2".into(),
            image: 1,
            images: 2,
            source: ResizeError::OutputLength { len: 7, size: 4 },
        };
        assert_cause_printed_once(resize, "output holds 7 bytes");
    }

    #[test]
    fn with_causes_names_the_sample_and_the_cause() {
        let error = LoaderError::Decode {
            sample_id: "s-3".into(),
            image: 0,
            images: 1,
            source: DecodeError::UnknownFormat,
        };
        assert_eq!(
            tessera_errors::with_causes(&error),
            "sample s-3: decoding its image: not a JPEG, PNG or WebP (unknown magic bytes)"
        );
        let second = LoaderError::Decode {
            sample_id: "s-4".into(),
            image: 1,
            images: 3,
            source: DecodeError::UnknownFormat,
        };
        assert!(
            second
                .to_string()
                .starts_with("sample s-4: decoding image 2 of 3"),
            "{second}"
        );
        assert!(error.is_bad_image());
        assert_eq!(error.sample_id(), Some("s-3"));
    }
}
