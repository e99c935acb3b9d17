//! tessera's shard format (schema v3, any number of images per sample; v1 and v2 still read): parquet files `shard-00000.parquet`, ... one row per
//! sample, plus `index.json` written last (its presence means every listed shard is complete).
//!
//! 1. [`ShardWriter`] writes one shard: row groups bounded by rows and bytes, a temporary name,
//!    sha256 computed while writing (on a sink thread), then a rename. It returns the
//!    [`ShardInfo`] for the index.
//! 2. [`Manifest`] is `index.json`: format version, tokenizer fingerprint, template, shards,
//!    and the ingest report; ingest keeps the tokenizer itself beside it ([`TOKENIZER_FILE`]).
//! 3. [`Dataset`] opens a directory (memory-mapped shards) and reads samples by global index
//!    (shards in order, rows in order), decoding only the row groups needed; its
//!    [`Dataset::metadata`] scan reads only kind and token counts (the planner's input).
//! 4. [`verify()`] and [`stats()`] back `tessera shards verify|stats`.
//!
//! index.json records the special tokens the ids were made with (`tessera_text::SpecialTokens`, as the
//! dataset's tokenizer spells and numbers them); the chat templates are `tessera_text::chat`'s.
//!
//! Every file tessera writes whole (index.json, the ingest journal, synth's json and zip) goes
//! through [`write_atomically`]: a temporary sibling, fsync, rename, fsync of the folder.
mod atomic;
mod disk_space;
mod error;
pub mod image_layout;
mod location;
mod manifest;
mod reader;
mod remote_read;
mod sample;
mod schema;
mod shard_info;
mod sink;
mod stats;
mod verify;
mod writer;

pub use atomic::{temp_path, write_atomically, write_atomically_with};
pub use disk_space::{free_bytes, shown_bytes, NoSpace};
pub use error::ShardError;
pub use location::{DatasetLocation, FetchedRanges, RemoteFiles};
pub use manifest::{
    shard_file_name, IngestReport, IngestSettings, Manifest, INDEX_FILE, TOKENIZER_FILE,
};
pub use reader::Dataset;
pub use sample::{ChecksumMismatch, Image, Kind, Sample, SampleMeta, Turn};
pub use schema::{col, input_ids_crc32c, FORMAT_VERSION};
pub use shard_info::{RowGroupInfo, ShardInfo};
pub use stats::{
    sample_images, stats, stats_under, DatasetStats, LayoutStats, Percentiles, SampleImages,
    EXTREME_ASPECT, TINY_SIDE,
};
pub use verify::{sha256_file, verify, verify_at, VerifyReport};
pub use writer::{RowGroupLimits, ShardWriter};

/// Sanity check that a dataset is usable from many threads (the loader relies on it).
#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Dataset>();
}
