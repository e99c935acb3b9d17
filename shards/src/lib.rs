//! tessera's shard format (schema v1): parquet files `shard-00000.parquet`, ... one row per
//! sample, plus `index.json` written last (its presence means every listed shard is complete).
//!
//! 1. [`ShardWriter`] writes one shard: row groups bounded by rows and bytes, a temporary name,
//!    sha256 computed while writing (on a sink thread), then a rename. It returns the [`ShardInfo`] for the index.
//! 2. [`Manifest`] is `index.json`: format version, tokenizer fingerprint, template, shards,
//!    and the ingest report.
//! 3. [`Dataset`] opens a directory (memory-mapped shards) and reads samples by global index
//!    (shards in order, rows in order), decoding only the row groups needed; its
//!    [`Dataset::metadata`] scan reads only kind and token counts (the planner's input).
//! 4. [`verify()`] and [`stats()`] back `tessera shards verify|stats`.
mod error;
mod manifest;
mod reader;
mod sample;
mod schema;
mod sink;
mod stats;
mod verify;
mod writer;

pub use error::ShardError;
pub use manifest::{
    shard_file_name, write_atomically, IngestReport, Manifest, RowGroupInfo, ShardInfo, INDEX_FILE,
};
pub use reader::{fingerprint_of, Dataset};
pub use sample::{Kind, Sample, SampleMeta, Turn};
pub use schema::{col, samples_to_batch, schema_v1, FORMAT_VERSION};
pub use stats::{stats, DatasetStats, Percentiles, EXTREME_ASPECT, TINY_SIDE};
pub use verify::{sha256_file, verify, VerifyReport};
pub use writer::{estimated_sample_bytes, RowGroupLimits, ShardWriter};

/// `<|image_pad|>` in the Qwen2 tokenizer: the placeholder id each image's tokens replace
/// (ingest writes it once per image; the loader expands it; the model finds images by it).
pub const IMAGE_PAD_ID: u32 = 151_655;

/// Sanity check that a dataset is usable from many threads (the loader relies on it).
#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Dataset>();
}
