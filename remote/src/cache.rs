//! The local shard cache: fetched byte ranges of remote shards (aligned 128 KiB blocks, see
//! `files::CACHE_BLOCK`), one file per range, kept under
//! `DIR/ranges/<shard sha256>/<start>-<end>`. Content-addressed by the shard's sha256
//! from index.json, so a re-ingested dataset never reads stale bytes, and the same shard under
//! two URLs shares its entries.
//!
//! - Least recently used first out: a hit sets the file's mtime; when the bytes this process
//!   believes are cached pass the limit, the directory is scanned and the oldest entries are
//!   removed down to 90% of it. Each process rescans after writing 1/16 of the limit, so
//!   ranks sharing a cache overshoot by at most that much each between scans.
//! - Several processes share it safely: an entry appears by an atomic rename of a temporary
//!   file; whoever takes an entry's lock file (`flock`, released by the kernel if the holder
//!   dies) downloads it, the others wait on that lock and then read the entry.
use crate::RemoteError;
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::SystemTime;

pub struct RangeCache {
    root: PathBuf,
    limit: u64,
    /// Bytes cached, as of the last scan plus this process's writes since.
    used: AtomicU64,
    written_since_scan: AtomicU64,
    scanning: Mutex<()>,
}

/// An entry's lock, held while its range downloads. Dropping it removes the lock file (so the
/// directory does not fill with them) and then releases the lock.
pub struct EntryLock {
    path: PathBuf,
    _file: File,
}

impl Drop for EntryLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl RangeCache {
    /// Opens (creating) the cache under `dir`, at most `limit` bytes.
    pub fn open(dir: &Path, limit: u64) -> Result<RangeCache, RemoteError> {
        let root = dir.join("ranges");
        std::fs::create_dir_all(&root).map_err(|e| RemoteError::cache(&root, e))?;
        let cache = RangeCache {
            root,
            limit,
            used: AtomicU64::new(0),
            written_since_scan: AtomicU64::new(0),
            scanning: Mutex::new(()),
        };
        cache.evict()?;
        Ok(cache)
    }

    /// Bytes the cache keeps at most.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn dir(&self) -> &Path {
        self.root.parent().unwrap_or(&self.root)
    }

    fn entry(&self, shard_sha: &str, range: &Range<u64>) -> PathBuf {
        self.root
            .join(shard_sha)
            .join(format!("{}-{}", range.start, range.end))
    }

    /// The cached bytes of `range`, if present and whole; marks them recently used.
    pub fn get(&self, shard_sha: &str, range: &Range<u64>) -> Option<Bytes> {
        let path = self.entry(shard_sha, range);
        let mut file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
        let mut bytes = Vec::with_capacity((range.end - range.start) as usize);
        file.read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 != range.end - range.start {
            tracing::warn!(entry = %path.display(), "cache entry has the wrong length; refetching");
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let _ = file.set_modified(SystemTime::now());
        Some(bytes.into())
    }

    /// Takes `range`'s lock if nobody holds it (`None`: another thread or process does).
    pub fn try_lock(
        &self,
        shard_sha: &str,
        range: &Range<u64>,
    ) -> Result<Option<EntryLock>, RemoteError> {
        self.lock(shard_sha, range, libc::LOCK_EX | libc::LOCK_NB)
    }

    /// Waits for `range`'s lock (its holder is downloading it).
    pub fn wait_lock(&self, shard_sha: &str, range: &Range<u64>) -> Result<EntryLock, RemoteError> {
        loop {
            if let Some(lock) = self.lock(shard_sha, range, libc::LOCK_EX)? {
                return Ok(lock);
            }
        }
    }

    fn lock(
        &self,
        shard_sha: &str,
        range: &Range<u64>,
        how: libc::c_int,
    ) -> Result<Option<EntryLock>, RemoteError> {
        let entry = self.entry(shard_sha, range);
        let path = entry.with_extension("lock");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| RemoteError::cache(dir, e))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| RemoteError::cache(&path, e))?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), how) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return match err.kind() {
                ErrorKind::WouldBlock => Ok(None),
                ErrorKind::Interrupted => Ok(None),
                _ => Err(RemoteError::cache(&path, err)),
            };
        }
        Ok(Some(EntryLock { path, _file: file }))
    }

    /// Stores `bytes` as `range`'s entry (atomically), then evicts if over the limit.
    pub fn put(
        &self,
        shard_sha: &str,
        range: &Range<u64>,
        bytes: &[u8],
    ) -> Result<(), RemoteError> {
        let path = self.entry(shard_sha, range);
        let n = TEMP_COUNTER.fetch_add(1, Relaxed);
        let temp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
        let written = File::create(&temp).and_then(|mut f| f.write_all(bytes));
        if let Err(e) = written.and_then(|()| std::fs::rename(&temp, &path)) {
            let _ = std::fs::remove_file(&temp);
            return Err(RemoteError::cache(&path, e));
        }
        let len = bytes.len() as u64;
        let used = self.used.fetch_add(len, Relaxed) + len;
        let since = self.written_since_scan.fetch_add(len, Relaxed) + len;
        if used > self.limit || since > self.limit / 16 {
            self.evict()?;
        }
        Ok(())
    }

    /// Scans the cache; removes least recently used entries down to 90% of the limit when
    /// over it, and temporary files left by a killed process (older than an hour).
    pub fn evict(&self) -> Result<(), RemoteError> {
        let Ok(_scan) = self.scanning.lock() else {
            return Ok(());
        };
        let mut entries = self.scan()?;
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total > self.limit {
            entries.sort_by_key(|e| e.0);
            let target = self.limit / 10 * 9;
            for (_, len, path) in &entries {
                if total <= target {
                    break;
                }
                match std::fs::remove_file(path) {
                    Ok(()) => total -= len,
                    Err(e) if e.kind() == ErrorKind::NotFound => total -= len,
                    Err(e) => return Err(RemoteError::cache(path, e)),
                }
            }
            tracing::debug!(cache = %self.root.display(), total, "evicted to the cache limit");
        }
        self.used.store(total, Relaxed);
        self.written_since_scan.store(0, Relaxed);
        Ok(())
    }

    /// (last use, bytes, path) of every entry.
    fn scan(&self) -> Result<Vec<(SystemTime, u64, PathBuf)>, RemoteError> {
        let mut entries = Vec::new();
        let read = |dir: &Path| std::fs::read_dir(dir).map_err(|e| RemoteError::cache(dir, e));
        for shard in read(&self.root)? {
            let Ok(shard) = shard else { continue };
            let Ok(files) = read(&shard.path()) else {
                continue;
            };
            for file in files.flatten() {
                let path = file.path();
                let Ok(meta) = file.metadata() else { continue };
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                let name = file.file_name();
                let name = name.to_string_lossy();
                if name.contains(".tmp.") {
                    let age = modified.elapsed().unwrap_or_default();
                    if age.as_secs() > 3600 {
                        let _ = std::fs::remove_file(&path);
                    }
                } else if !name.ends_with(".lock") {
                    entries.push((modified, meta.len(), path));
                }
            }
        }
        Ok(entries)
    }

    /// Bytes of the entries now in the cache (a fresh scan).
    pub fn size_on_disk(&self) -> Result<u64, RemoteError> {
        Ok(self.scan()?.iter().map(|e| e.1).sum())
    }
}
