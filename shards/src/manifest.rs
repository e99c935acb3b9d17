//! `index.json`: the manifest of a shard directory. Written last (atomically and durably,
//! `crate::atomic`), so its presence means every shard it lists is complete.
use crate::atomic::write_atomically;
use crate::error::ShardError;
use crate::location::DatasetLocation;
use crate::schema::{FORMAT_VERSION, OLDEST_READABLE_VERSION};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// File name of the manifest inside a shard directory.
pub const INDEX_FILE: &str = "index.json";

/// Name of shard `n`: `shard-00000.parquet`, ...
pub fn shard_file_name(n: usize) -> String {
    format!("shard-{n:05}.parquet")
}

/// One row group of a shard, as parquet's footer records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowGroupInfo {
    /// Byte offset of the row group's first column chunk in the file.
    pub offset: u64,
    /// Compressed bytes of the row group's column chunks.
    pub bytes: u64,
    pub rows: u64,
    /// Row index (within the shard) of the group's first row.
    pub first_row: u64,
}

/// One shard file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub file: String,
    pub rows: u64,
    pub bytes: u64,
    /// Hex sha256 of the whole file.
    pub sha256: String,
    pub num_text_tokens: u64,
    pub num_supervised_tokens: u64,
    pub num_image_samples: u64,
    pub row_groups: Vec<RowGroupInfo>,
}

/// What ingest did: records read, samples written, rejections and notes by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestReport {
    pub records_read: u64,
    pub samples_written: u64,
    pub rejected: BTreeMap<String, u64>,
    /// Kept-but-notable inputs (e.g. `tiny_image`, `extreme_aspect`, `png_named_jpg`).
    pub notes: BTreeMap<String, u64>,
    /// Image samples by detected format.
    pub image_formats: BTreeMap<String, u64>,
    /// Whether every image was fully decoded (false with `--no-verify`).
    pub images_verified: bool,
}

impl IngestReport {
    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().sum()
    }
}

/// The parsed `index.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// Hex sha256 of the tokenizer.json the ids were made with.
    pub tokenizer_fingerprint: String,
    /// Chat template name (`plain` or `chatml`).
    pub template: String,
    /// The `<|image_pad|>` id standing for one image in `input_ids`.
    pub image_placeholder_id: u32,
    pub num_samples: u64,
    pub shards: Vec<ShardInfo>,
    pub ingest: IngestReport,
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

    /// Parses and checks index.json's text; `path` (a file or URL) names it in errors.
    pub fn parse(text: &[u8], path: PathBuf) -> Result<Manifest, ShardError> {
        let manifest: Manifest =
            serde_json::from_slice(text).map_err(|source| ShardError::Manifest {
                path: path.clone(),
                error: source,
            })?;
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&manifest.format_version) {
            return Err(ShardError::FormatVersion {
                path,
                found: manifest.format_version,
                expected: FORMAT_VERSION,
            });
        }
        Ok(manifest)
    }

    /// Writes `DIR/index.json` atomically.
    pub fn save(&self, dir: &Path) -> Result<(), ShardError> {
        let text = serde_json::to_vec_pretty(self).map_err(|source| ShardError::Manifest {
            path: dir.join(INDEX_FILE),
            error: source,
        })?;
        write_atomically(&dir.join(INDEX_FILE), &text)
    }
}
