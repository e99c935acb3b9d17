//! `index.json`: the manifest of a shard directory. Written last (atomically and durably,
//! `crate::atomic`), so its presence means every shard it lists is complete.
use crate::atomic::write_atomically;
use crate::error::ShardError;
use crate::location::DatasetLocation;
use crate::schema::FORMAT_VERSION;
use crate::shard_info::ShardInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera_text::SpecialTokens;

/// File name of the manifest inside a shard directory.
pub const INDEX_FILE: &str = "index.json";

/// The tokenizer.json the ids were made with, kept by ingest beside index.json (written before
/// it): its sha256 is the manifest's `tokenizer_fingerprint`. `train` copies it into the run
/// folder, so export and generate find the run's tokenizer wherever they run.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Name of shard `n`: `shard-00000.parquet`, ...
pub fn shard_file_name(n: usize) -> String {
    format!("shard-{n:05}.parquet")
}

/// What ingest did: records read, samples written, rejections and notes by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestReport {
    pub records_read: u64,
    pub samples_written: u64,
    pub rejected: BTreeMap<String, u64>,
    /// Kept-but-notable inputs (e.g. `tiny_image`, `extreme_aspect`, `png_named_jpg`).
    pub notes: BTreeMap<String, u64>,
    /// Images by detected format (a sample of several images counts each).
    pub image_formats: BTreeMap<String, u64>,
    /// Whether every image was fully decoded (false with `--no-verify`).
    pub images_verified: bool,
}

impl IngestReport {
    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().sum()
    }
}

/// What an ingest's output bytes depend on: its inputs' fingerprints and the settings that
/// change the shards. Ingest records it in its resume journal while it runs and in index.json
/// when it finishes; `ingest --resume` refuses to go on (or to call a finished directory
/// complete) when the inputs or settings it is given now differ. The `json_*` fields describe
/// whatever `--input` is (their names predate parquet inputs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestSettings {
    /// The input layout (`llava`, `onevision`, `cauldron`, `messages`; `llava` in journals
    /// and index.json written before layouts existed).
    #[serde(default = "llava_format")]
    pub format: String,
    /// Bytes of the input (the json, or all parquet files).
    pub json_bytes: u64,
    /// Records (json elements, parquet rows) of the input.
    pub json_records: u64,
    /// Hex sha256 of the json, or of the parquet files' names, sizes, modification times and
    /// footers (empty in journals written before it was recorded).
    #[serde(default)]
    pub json_sha256: String,
    /// Hex sha256 of the images' zip central directory, or of the folder's names, sizes and
    /// modification times (empty in journals written before it was recorded).
    #[serde(default)]
    pub images_fingerprint: String,
    pub tokenizer_fingerprint: String,
    pub template: String,
    pub shard_size: u64,
    pub verify: bool,
    pub max_pixels: u64,
    /// `--max-tokens`: records longer than this were rejected (`too_long`), each image counted
    /// as `max_tokens_image_tokens` tokens; absent when no limit was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_image_tokens: Option<u64>,
}

fn llava_format() -> String {
    "llava".into()
}

/// The parsed `index.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// Hex sha256 of the tokenizer.json the ids were made with.
    pub tokenizer_fingerprint: String,
    /// Chat template name (`plain` or `chatml`).
    pub template: String,
    /// The image token's id standing for one image in `input_ids` (`special_tokens.image`).
    pub image_placeholder_id: u32,
    /// The special tokens the ids were made with.
    pub special_tokens: SpecialTokens,
    /// sha256 of the tokenizer.json ingest was given, when ingest added tokens to it (then the
    /// copy beside index.json, whose sha256 is `tokenizer_fingerprint`, is that tokenizer
    /// with the tokens added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_tokenizer_fingerprint: Option<String>,
    pub num_samples: u64,
    pub shards: Vec<ShardInfo>,
    pub ingest: IngestReport,
    /// The inputs and settings of the ingest that wrote this directory; `None` in index.json
    /// written before they were recorded, or by anything but ingest (then it is left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingest_settings: Option<IngestSettings>,
}

impl Manifest {
    /// Reads and checks `DIR/index.json`.
    pub fn load(dir: &Path) -> Result<Manifest, ShardError> {
        let path = dir.join(INDEX_FILE);
        let text = std::fs::read(&path).map_err(|e| ShardError::io(&path, e))?;
        Manifest::parse(&text, path)
    }

    /// Reads and checks the index.json of a local or remote shard directory.
    pub fn load_from(location: &DatasetLocation) -> Result<Manifest, ShardError> {
        match location {
            DatasetLocation::Dir(dir) => Manifest::load(dir),
            DatasetLocation::Remote(files) => {
                let text = files.read_file(INDEX_FILE)?;
                Manifest::parse(&text, format!("{}/{INDEX_FILE}", files.url()).into())
            }
        }
    }

    /// Parses and checks index.json's text; `path` (a file or URL) names it in errors. The
    /// format version is read first: an index.json of another format is refused by its number,
    /// whatever else it holds.
    pub fn parse(text: &[u8], path: PathBuf) -> Result<Manifest, ShardError> {
        #[derive(Deserialize)]
        struct FormatOnly {
            format_version: u32,
        }
        let invalid = |source| ShardError::Manifest {
            path: path.clone(),
            source,
        };
        let FormatOnly { format_version } = serde_json::from_slice(text).map_err(invalid)?;
        if format_version != FORMAT_VERSION {
            return Err(ShardError::FormatVersion {
                path,
                found: format_version,
                expected: FORMAT_VERSION,
            });
        }
        serde_json::from_slice(text).map_err(invalid)
    }

    /// The special tokens the ids were made with.
    pub fn special_tokens(&self) -> SpecialTokens {
        self.special_tokens.clone()
    }

    /// sha256 of the tokenizer.json ingest was given (the language model's own, for a check
    /// that shards and model share a vocabulary).
    pub fn source_tokenizer_fingerprint(&self) -> &str {
        self.source_tokenizer_fingerprint
            .as_deref()
            .unwrap_or(&self.tokenizer_fingerprint)
    }

    /// Writes `DIR/index.json` atomically.
    pub fn save(&self, dir: &Path) -> Result<(), ShardError> {
        let text = serde_json::to_vec_pretty(self).map_err(|source| ShardError::Manifest {
            path: dir.join(INDEX_FILE),
            source,
        })?;
        write_atomically(&dir.join(INDEX_FILE), &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(ingest_settings: Option<IngestSettings>) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            tokenizer_fingerprint: "t".into(),
            template: "plain".into(),
            image_placeholder_id: 7,
            special_tokens: SpecialTokens::qwen(),
            source_tokenizer_fingerprint: None,
            num_samples: 0,
            shards: Vec::new(),
            ingest: IngestReport::default(),
            ingest_settings,
        }
    }

    #[test]
    fn index_json_without_special_tokens_is_refused_naming_them() {
        // An index.json as written before the special tokens were recorded (format 3 then).
        let old = br#"{"format_version": 3, "tokenizer_fingerprint": "t", "template": "plain",
            "image_placeholder_id": 7, "num_samples": 0, "shards": [],
            "ingest": {"records_read": 0, "samples_written": 0, "rejected": {}, "notes": {},
                       "image_formats": {}, "images_verified": true}}"#;
        let err = Manifest::parse(old, "index.json".into()).err();
        let cause = err
            .as_ref()
            .and_then(std::error::Error::source)
            .map(ToString::to_string);
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("index.json: index.json is not valid")
        );
        assert!(
            cause
                .as_deref()
                .is_some_and(|c| c.contains("missing field `special_tokens`")),
            "{cause:?}"
        );
    }

    #[test]
    fn ingest_settings_round_trip_and_are_left_out_when_absent() -> anyhow::Result<()> {
        let settings = IngestSettings {
            format: "cauldron".into(),
            json_bytes: 10,
            json_records: 2,
            json_sha256: "j".into(),
            images_fingerprint: "i".into(),
            tokenizer_fingerprint: "t".into(),
            template: "plain".into(),
            shard_size: 1 << 20,
            verify: true,
            max_pixels: 40,
            max_tokens: None,
            max_tokens_image_tokens: None,
        };
        let with = manifest(Some(settings));
        let text = serde_json::to_vec(&with)?;
        assert_eq!(Manifest::parse(&text, "index.json".into())?, with);
        let without = serde_json::to_string(&manifest(None))?;
        assert!(!without.contains("ingest_settings"), "{without}");
        Ok(())
    }
}
