//! Shard directories in object storage: `tessera train --shards s3://bucket/prefix` (and
//! `gs://`, `az://`, `https://`, `file://`).
//!
//! 1. [`open_location`] turns a `--shards` argument into a `tessera_shards::DatasetLocation`: a local
//!    directory (memory-mapped, as before) or an [`ObjectFiles`] over an `object_store` store
//!    built from the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`, as object_store's `from_env`
//!    builders read them), timed out and retried as [`RetryPolicy`] says, every request
//!    counted ([`RequestCounts`]: attempts, and failed attempts by cause).
//! 2. `tessera_shards::Dataset` reads a remote shard in byte ranges: the footer once, then only the
//!    pages each read selects (parquet's offset index), concurrently.
//! 3. `ObjectFiles::upload_dataset` sends a finished local shard directory (`ingest --out
//!    s3://...` ingests into a local staging folder first): shards multipart, index.json last.
//! 4. [`RangeCache`] keeps fetched ranges on local disk under a size limit, shared safely by
//!    the ranks of one machine and reused across runs.
mod cache;
mod error;
mod files;
mod request_counts;
mod retry;
mod size;
mod upload;
mod url_store;

pub use cache::RangeCache;
pub use error::RemoteError;
pub use files::{FetchCounts, ObjectFiles, CACHE_BLOCK};
pub use request_counts::RequestCounts;
pub use retry::RetryPolicy;
pub use size::parse_size;
pub use upload::UploadSummary;
pub use url_store::{is_remote, open_location, open_remote, CacheConfig, StoreSettings};
