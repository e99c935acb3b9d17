//! Loader counters: time per stage (summed over worker threads), items, and how long the
//! consumer waited (the trainer logs `loader_wait_frac` = wait / step time).
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A snapshot of the loader's counters since it started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoaderStats {
    /// Micro-batches handed to the consumer.
    pub batches: u64,
    /// Samples packed (after dropping bad ones).
    pub samples: u64,
    /// Images decoded and resized.
    pub images: u64,
    /// Tower views cut from them: one per image under `single`, the base view and tiles of
    /// each under `anyres_max_N`.
    pub views: u64,
    /// Samples dropped under the `skip` policy.
    pub skipped: u64,
    /// Worker time reading samples from the source (the checksum check included).
    pub read: Duration,
    /// Of `read`: worker time checking the samples' stored crc32c.
    pub checksum: Duration,
    /// Worker time decoding images.
    pub decode: Duration,
    /// Worker time resizing (and laying out CHW).
    pub resize: Duration,
    /// Worker time building token tensors.
    pub assemble: Duration,
    /// Time the consumer spent blocked in `next()` waiting for a micro-batch.
    pub wait: Duration,
}

impl LoaderStats {
    /// Adds `other`'s counts and times to these (totals over several runs).
    pub fn add(&mut self, other: &LoaderStats) {
        self.batches += other.batches;
        self.samples += other.samples;
        self.images += other.images;
        self.views += other.views;
        self.skipped += other.skipped;
        self.read += other.read;
        self.checksum += other.checksum;
        self.decode += other.decode;
        self.resize += other.resize;
        self.assemble += other.assemble;
        self.wait += other.wait;
    }
}

/// Shared, lock-free accumulators behind `LoaderStats`.
#[derive(Default)]
pub(crate) struct StatCells {
    pub samples: AtomicU64,
    pub images: AtomicU64,
    pub views: AtomicU64,
    pub skipped: AtomicU64,
    pub read_ns: AtomicU64,
    pub checksum_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub resize_ns: AtomicU64,
    pub assemble_ns: AtomicU64,
}

impl StatCells {
    pub(super) fn add_time(cell: &AtomicU64, d: Duration) {
        cell.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    pub(super) fn snapshot(&self, batches: u64, wait: Duration) -> LoaderStats {
        LoaderStats {
            batches,
            samples: self.samples.load(Relaxed),
            images: self.images.load(Relaxed),
            views: self.views.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            read: Duration::from_nanos(self.read_ns.load(Relaxed)),
            checksum: Duration::from_nanos(self.checksum_ns.load(Relaxed)),
            decode: Duration::from_nanos(self.decode_ns.load(Relaxed)),
            resize: Duration::from_nanos(self.resize_ns.load(Relaxed)),
            assemble: Duration::from_nanos(self.assemble_ns.load(Relaxed)),
            wait,
        }
    }
}
