//! Where a dataset lives: a local directory (shards memory-mapped: the fast path) or an object
//! store behind [`RemoteFiles`] (`tessera-remote`: `s3://`, `gs://`, `az://`, `https://`).
//!
//! A remote shard is read in byte ranges: its footer once, then for each read only the pages
//! the row selection touches (parquet's offset index says where they are), fetched in one
//! batch and handed to parquet's ordinary reader through [`FetchedRanges`].
use crate::error::ShardError;
use crate::shard_info::ShardInfo;
use bytes::Bytes;
use parquet::file::reader::{ChunkReader, Length};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// The files of one remote shard directory. Implementations name the URL in their errors.
pub trait RemoteFiles: Send + Sync {
    /// The directory's URL, for messages.
    fn url(&self) -> String;
    /// A whole small file of the directory (index.json), never cached.
    fn read_file(&self, name: &str) -> Result<Bytes, ShardError>;
    /// Byte ranges of a shard, in the asked order; fetched concurrently (or from a cache).
    fn read_ranges(
        &self,
        shard: &ShardInfo,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, ShardError>;
    /// Names of the files directly in the directory (verify's unlisted-shard check).
    fn list(&self) -> Result<Vec<String>, ShardError>;
    /// The size in bytes of the file `name` of the directory (ingest's parquet inputs).
    fn size(&self, name: &str) -> Result<u64, ShardError>;
    /// Whether fetched ranges are kept (a local cache), so that fetching ahead pays off.
    fn keeps_ranges(&self) -> bool {
        false
    }
}

/// A shard directory: local or remote.
#[derive(Clone)]
pub enum DatasetLocation {
    Dir(PathBuf),
    Remote(Arc<dyn RemoteFiles>),
}

impl DatasetLocation {
    /// The directory or URL, for messages.
    pub fn describe(&self) -> String {
        match self {
            DatasetLocation::Dir(dir) => dir.display().to_string(),
            DatasetLocation::Remote(files) => files.url(),
        }
    }
}

impl std::fmt::Debug for DatasetLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Bytes fetched of the tail of a remote shard for its footer and page index: one request
/// serves both for shards written by tessera (their page index sits right before the footer).
pub(crate) const FOOTER_PREFETCH: u64 = 256 * 1024;

/// A remote file's fetched byte ranges, as parquet's [`ChunkReader`]: a shard's pages for one
/// read, or a row group of an ingest input. A read outside them (a page the offset index did
/// not announce, a footer longer than the prefetched tail) fetches that range on its own.
/// `shard` names the file and its length (`file`, `bytes`; its `sha256` keys the range cache).
#[derive(Clone)]
pub struct FetchedRanges {
    files: Arc<dyn RemoteFiles>,
    shard: Arc<ShardInfo>,
    /// Start offset -> bytes from there.
    pieces: Arc<BTreeMap<u64, Bytes>>,
}

impl FetchedRanges {
    /// Fetches `ranges` of `shard` (in one batch of concurrent requests).
    pub fn fetch(
        files: Arc<dyn RemoteFiles>,
        shard: Arc<ShardInfo>,
        mut ranges: Vec<Range<u64>>,
    ) -> Result<Self, ShardError> {
        ranges.sort_by_key(|r| (r.start, r.end));
        ranges.dedup();
        let bytes = files.read_ranges(&shard, &ranges)?;
        let pieces = Arc::new(ranges.iter().map(|r| r.start).zip(bytes).collect());
        Ok(FetchedRanges {
            files,
            shard,
            pieces,
        })
    }

    /// `len` bytes from `start`, from a fetched piece when one holds them.
    fn slice(&self, start: u64, len: usize) -> parquet::errors::Result<Bytes> {
        let end = start + len as u64;
        if let Some((&at, piece)) = self.pieces.range(..=start).next_back() {
            if at + piece.len() as u64 >= end {
                let from = (start - at) as usize;
                return Ok(piece.slice(from..from + len));
            }
        }
        tracing::debug!(shard = %self.shard.file, start, len, "range not prefetched");
        let fetched = self
            .files
            .read_ranges(&self.shard, std::slice::from_ref(&(start..end)))
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
        fetched.into_iter().next().ok_or_else(|| {
            parquet::errors::ParquetError::General(format!(
                "{}: no bytes for range {start}..{end}",
                self.shard.file
            ))
        })
    }
}

impl Length for FetchedRanges {
    fn len(&self) -> u64 {
        self.shard.bytes
    }
}

impl ChunkReader for FetchedRanges {
    type T = bytes::buf::Reader<Bytes>;

    /// A reader from `start` to the end of the piece holding it (parquet reads page headers
    /// this way only for files without an offset index); else to at most 1 MiB further.
    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use bytes::Buf;
        let within = self
            .pieces
            .range(..=start)
            .next_back()
            .filter(|(&at, piece)| at + piece.len() as u64 > start);
        let bytes = match within {
            Some((&at, piece)) => piece.slice((start - at) as usize..),
            None => {
                let len = (self.shard.bytes.saturating_sub(start)).min(1 << 20);
                self.slice(start, len as usize)?
            }
        };
        Ok(bytes.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, length)
    }
}
