//! The error type of `tessera synth`.
use std::path::{Path, PathBuf};

/// Errors of `tessera synth`; each names the file, folder or sample it concerns. A wrapped
/// library error is the `source()`, never part of the message (as in `shards` and `ingest`):
/// the CLI's chain printer shows each once.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("invalid synth settings: {0}")]
    Config(String),
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sample {id}: encoding JPEG for {path}")]
    Encode {
        id: String,
        path: PathBuf,
        source: image::ImageError,
    },
    #[error("no readable photographs (.jpg, .jpeg, .png, .webp) under {0}")]
    NoPhotos(PathBuf),
    #[error("{path}: adding zip entry {entry}")]
    Zip {
        path: PathBuf,
        entry: String,
        source: zip::result::ZipError,
    },
    #[error("{path}: writing json")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// Creating, syncing or renaming an output file (`tessera_shards::write_atomically_with`).
    #[error(transparent)]
    Output(#[from] tessera_shards::ShardError),
}

impl SynthError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        SynthError::Io {
            path: path.to_path_buf(),
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
        assert_cause_printed_once(SynthError::io(Path::new("out/images"), io), "disk on fire");
        let zip = SynthError::Zip {
            path: "out/.images.zip.tmp".into(),
            entry: "00000/000000001.jpg".into(),
            source: zip::result::ZipError::FileNotFound,
        };
        assert_cause_printed_once(zip, &zip::result::ZipError::FileNotFound.to_string());
        let json = serde_json::from_str::<u32>("{").expect_err("not json");
        let cause = json.to_string();
        let json = SynthError::Json {
            path: "out/blip_laion_cc_sbu_558k.json".into(),
            source: json,
        };
        assert_cause_printed_once(json, &cause);
        let output = tessera_shards::ShardError::Io {
            path: "out/.blip_laion_cc_sbu_558k.json.tmp".into(),
            source: std::io::Error::other("read-only file system"),
        };
        assert_cause_printed_once(SynthError::from(output), "read-only file system");
        let encode = image::ImageError::Limits(image::error::LimitError::from_kind(
            image::error::LimitErrorKind::DimensionError,
        ));
        let cause = encode.to_string();
        let encode = SynthError::Encode {
            id: "000000001".into(),
            path: "out/images/00000/000000001.jpg".into(),
            source: encode,
        };
        assert_cause_printed_once(encode, &cause);
    }
}
