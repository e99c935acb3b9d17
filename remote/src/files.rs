//! [`ObjectFiles`]: one remote shard directory as `tessera_shards::RemoteFiles`. Synchronous calls
//! (the loader's worker threads) run their requests on a small tokio runtime of their own;
//! the ranges of one call are fetched concurrently, adjacent ones merged into one request.
use crate::cache::RangeCache;
use crate::request_counts::{Counters, RequestCounts};
use crate::RemoteError;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tessera_shards::{RemoteFiles, ShardError, ShardInfo};

/// Bytes per cache entry (aligned blocks of a shard).
pub const CACHE_BLOCK: u64 = 128 * 1024;

/// Requests in flight at once per call.
const CONCURRENT_REQUESTS: usize = 16;

/// Requests and bytes fetched from the store (cache hits not counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchCounts {
    pub requests: u64,
    pub bytes: u64,
}

pub struct ObjectFiles {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// `https://` stores cannot list (plain HTTP has no listing).
    can_list: bool,
    runtime: Option<tokio::runtime::Runtime>,
    cache: Option<RangeCache>,
    /// Slept before each request ([`Self::latency`]).
    latency: Duration,
    requests: AtomicU64,
    bytes: AtomicU64,
    /// Every HTTP attempt of the store, retries included (`request_counts.rs`).
    attempts: Arc<Counters>,
}

#[cfg(feature = "test-hooks")]
fn injected_latency() -> Duration {
    tessera_switches::Switches::get().remote_latency
}

#[cfg(not(feature = "test-hooks"))]
fn injected_latency() -> Duration {
    Duration::ZERO
}

impl ObjectFiles {
    pub(crate) fn new(
        url: String,
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        can_list: bool,
        cache: Option<RangeCache>,
        attempts: Arc<Counters>,
    ) -> Result<ObjectFiles, RemoteError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tessera-io")
            .enable_all()
            .build()
            .map_err(RemoteError::Runtime)?;
        Ok(ObjectFiles {
            url: url.trim_end_matches('/').to_string(),
            store,
            prefix,
            can_list,
            runtime: Some(runtime),
            cache,
            latency: injected_latency(),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            attempts,
        })
    }

    /// Every HTTP attempt so far, retries included, and the failed ones by cause: a run that
    /// finished retried each failed one.
    pub fn attempts(&self) -> RequestCounts {
        self.attempts.snapshot()
    }

    /// The delay slept before each request: `TESSERA_REMOTE_LATENCY_MS` in builds with the
    /// `test-hooks` feature (benchmarks: a far store on a near one), else none.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// What this process fetched from the store so far.
    pub fn fetched(&self) -> FetchCounts {
        FetchCounts {
            requests: self.requests.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
        }
    }

    pub fn cache(&self) -> Option<&RangeCache> {
        self.cache.as_ref()
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub(crate) fn object(&self, name: &str) -> ObjectPath {
        self.prefix.child(name)
    }

    pub(crate) fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }

    /// Runs `fut` on the I/O runtime and waits for it; from inside another runtime (a caller's
    /// async context) it waits on a scoped thread instead of panicking.
    pub(crate) fn block_on<F>(&self, fut: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        let Some(runtime) = &self.runtime else {
            unreachable!("the runtime lives until drop")
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| runtime.block_on(fut))
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
        } else {
            runtime.block_on(fut)
        }
    }

    /// Fetches `ranges` of `name` from the store (no cache): sorted, adjacent ones merged,
    /// up to [`CONCURRENT_REQUESTS`] requests at once.
    fn fetch(&self, name: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, RemoteError> {
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
        let mut runs: Vec<Range<u64>> = Vec::new();
        for &i in &order {
            let r = &ranges[i];
            match runs.last_mut() {
                Some(run) if r.start <= run.end => run.end = run.end.max(r.end),
                _ => runs.push(r.clone()),
            }
        }
        let path = self.object(name);
        let (store, latency) = (&self.store, self.latency);
        let fetched: Vec<Bytes> = self
            .block_on(
                futures::stream::iter(runs.clone())
                    .map(|run| {
                        let path = path.clone();
                        async move {
                            tokio::time::sleep(latency).await;
                            store.get_range(&path, run).await
                        }
                    })
                    .buffered(CONCURRENT_REQUESTS)
                    .try_collect(),
            )
            .map_err(|e| RemoteError::store(self.url_of(name), e))?;
        self.requests.fetch_add(runs.len() as u64, Relaxed);
        let total: usize = fetched.iter().map(Bytes::len).sum();
        self.bytes.fetch_add(total as u64, Relaxed);
        ranges
            .iter()
            .map(|r| {
                let k = runs.partition_point(|run| run.end < r.end);
                let (run, bytes) = (runs.get(k), fetched.get(k));
                match (run, bytes) {
                    (Some(run), Some(bytes))
                        if run.start <= r.start && (r.end - run.start) as usize <= bytes.len() =>
                    {
                        Ok(bytes
                            .slice((r.start - run.start) as usize..(r.end - run.start) as usize))
                    }
                    _ => Err(RemoteError::Invalid {
                        url: self.url_of(name),
                        detail: format!("bytes {}..{} not returned by the store", r.start, r.end),
                    }),
                }
            })
            .collect()
    }

    /// `ranges` through the cache, which holds aligned blocks of [`CACHE_BLOCK`] bytes: a
    /// few files per read rather than one per parquet page (pages of small columns are tens
    /// of bytes; a dataset has millions).
    fn read_cached(
        &self,
        cache: &RangeCache,
        shard: &ShardInfo,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, RemoteError> {
        let len = shard.bytes;
        let mut wanted = std::collections::BTreeSet::new();
        for r in ranges.iter().filter(|r| r.end > r.start) {
            wanted.extend(r.start / CACHE_BLOCK..=(r.end - 1) / CACHE_BLOCK);
        }
        let blocks: Vec<Range<u64>> = wanted
            .iter()
            .map(|&k| k * CACHE_BLOCK..((k + 1) * CACHE_BLOCK).min(len))
            .collect();
        let got = self.read_blocks(cache, shard, &blocks)?;
        let by_start: std::collections::BTreeMap<u64, Bytes> =
            blocks.iter().map(|b| b.start).zip(got).collect();
        ranges
            .iter()
            .map(|r| {
                let mut out = bytes::BytesMut::with_capacity((r.end - r.start) as usize);
                for (&start, block) in by_start.range(r.start - r.start % CACHE_BLOCK..r.end) {
                    let from = r.start.max(start) - start;
                    let to = r.end.min(start + block.len() as u64) - start;
                    if from >= to {
                        continue;
                    }
                    if out.is_empty() && to - from == r.end - r.start {
                        return Ok(block.slice(from as usize..to as usize));
                    }
                    out.extend_from_slice(&block[from as usize..to as usize]);
                }
                if out.len() as u64 != r.end - r.start {
                    return Err(RemoteError::Invalid {
                        url: self.url_of(&shard.file),
                        detail: format!(
                            "bytes {}..{} are past the end of the shard",
                            r.start, r.end
                        ),
                    });
                }
                Ok(out.freeze())
            })
            .collect()
    }

    /// Blocks through the cache: hits read from disk, misses whose lock this thread takes
    /// fetched together, then misses another thread or process is fetching waited for.
    fn read_blocks(
        &self,
        cache: &RangeCache,
        shard: &ShardInfo,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, RemoteError> {
        let sha = &shard.sha256;
        let mut out: Vec<Option<Bytes>> = ranges.iter().map(|r| cache.get(sha, r)).collect();
        let (mut mine, mut locks, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
        for (i, r) in ranges.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            match cache.try_lock(sha, r)? {
                // Re-checked under the lock: the holder before us may have just stored it.
                Some(lock) => match cache.get(sha, r) {
                    Some(bytes) => out[i] = Some(bytes),
                    None => {
                        mine.push(i);
                        locks.push(lock);
                    }
                },
                None => theirs.push(i),
            }
        }
        if !mine.is_empty() {
            let wanted: Vec<Range<u64>> = mine.iter().map(|&i| ranges[i].clone()).collect();
            let fetched = self.fetch(&shard.file, &wanted)?;
            for (&i, bytes) in mine.iter().zip(fetched) {
                cache.put(sha, &ranges[i], &bytes)?;
                out[i] = Some(bytes);
            }
        }
        drop(locks);
        for i in theirs {
            let r = &ranges[i];
            let _lock = cache.wait_lock(sha, r)?;
            let bytes = match cache.get(sha, r) {
                Some(bytes) => bytes,
                None => {
                    let fetched = self.fetch(&shard.file, std::slice::from_ref(r))?;
                    let bytes = fetched.into_iter().next().unwrap_or_default();
                    cache.put(sha, r, &bytes)?;
                    bytes
                }
            };
            out[i] = Some(bytes);
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }
}

impl Drop for ObjectFiles {
    fn drop(&mut self) {
        // Safe to drop from inside another runtime too (a plain drop would panic there).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl RemoteFiles for ObjectFiles {
    fn url(&self) -> String {
        self.url.clone()
    }

    fn keeps_ranges(&self) -> bool {
        self.cache.as_ref().is_some_and(|c| c.limit() > 0)
    }

    fn read_file(&self, name: &str) -> Result<Bytes, ShardError> {
        let path = self.object(name);
        let got = self.block_on(async {
            tokio::time::sleep(self.latency).await;
            let result = self.store.get(&path).await?;
            result.bytes().await
        });
        let bytes = got.map_err(|e| RemoteError::store(self.url_of(name), e))?;
        self.requests.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes.len() as u64, Relaxed);
        Ok(bytes)
    }

    fn read_ranges(
        &self,
        shard: &ShardInfo,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, ShardError> {
        let read = match &self.cache {
            Some(cache) => self.read_cached(cache, shard, ranges),
            None => self.fetch(&shard.file, ranges),
        };
        Ok(read.map_err(|e| e.of_shard(shard))?)
    }

    fn size(&self, name: &str) -> Result<u64, ShardError> {
        match self.stored_size(name)? {
            Some(size) => Ok(size),
            None => Err(RemoteError::Invalid {
                url: self.url_of(name),
                detail: "no such object".into(),
            }
            .into()),
        }
    }

    fn list(&self) -> Result<Vec<String>, ShardError> {
        if !self.can_list {
            tracing::warn!(url = %self.url, "plain HTTP cannot list a directory; not checked for unlisted shards");
            return Ok(Vec::new());
        }
        let prefix = self.prefix.clone();
        let policy = crate::RetryPolicy::from_switches();
        let mut wait = policy.first_backoff;
        let mut tries = 0;
        let listed = loop {
            let listed = self.block_on(async {
                let listing = self.store.list_with_delimiter(Some(&prefix)).await?;
                Ok::<_, object_store::Error>(listing.objects)
            });
            // object_store retries a listing's request but not the reading of its answer: an
            // answer cut mid-body ("list response body") is retried here, as reads are.
            match listed {
                Err(e)
                    if tries < policy.retries && e.to_string().contains("list response body") =>
                {
                    tries += 1;
                    tracing::debug!("{}: listing cut short, retry {tries}: {e}", self.url);
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(std::time::Duration::from_secs(10));
                }
                other => break other,
            }
        };
        let objects = listed.map_err(|e| RemoteError::store(self.url.clone(), e))?;
        Ok(objects
            .into_iter()
            .filter_map(|o| o.location.filename().map(str::to_string))
            .collect())
    }
}
