//! Liveness of the job's ranks, the trainer's own (as PyTorch's NCCL heartbeat monitor is
//! NCCL's): every rank beats a counter under `hb/{rank}` in the job's TCPStore once a second
//! from a thread of its own, and watches every other rank's counter. A rank whose counter has
//! not moved for the timeout is lost, and so is rank 0 when the store it hosts stops
//! answering: the watcher prints which ranks were lost and ends this process (exit code 1) at
//! once, instead of letting it sit in a collective until the collective timeout (300 s by
//! default). Within a machine `--nproc`'s launcher and torchrun already stop every rank when
//! one fails; this is what stops the ranks of the other machines when a whole node dies.
//!
//! A rank that finishes cleanly sets `done/{rank}` before it stops beating, so ranks still
//! writing the run's last files do not take it for lost.
use super::store::{RankEnv, Store};
use super::DistError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The heartbeat thread of this rank; [`Liveness::finish`] (or drop) stops it.
pub struct Liveness {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    store: Arc<Store>,
    rank: usize,
    watch: Arc<Mutex<Watch>>,
    interval: Duration,
}

/// What the watcher concluded this round.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Alive,
    /// These ranks sent no heartbeat for the timeout.
    Lost(Vec<usize>),
    /// The store (hosted by rank 0) stopped answering for the timeout.
    StoreGone(String),
}

/// Heartbeat counters seen so far, by rank, and when each last moved.
struct Watch {
    seen: Vec<(Option<Vec<u8>>, Instant)>,
    done: Vec<bool>,
    store_failing_since: Option<Instant>,
}

impl Watch {
    fn new(world_size: usize, now: Instant) -> Self {
        Watch {
            seen: vec![(None, now); world_size],
            done: vec![false; world_size],
            store_failing_since: None,
        }
    }

    /// Records rank `r`'s counter read at `now`.
    fn observe(&mut self, r: usize, value: Option<Vec<u8>>, now: Instant) {
        if value.is_some() && value != self.seen[r].0 {
            self.seen[r] = (value, now);
        }
    }

    /// The ranks (not `me`, not done) whose counter has not moved for `timeout` by `now`.
    fn lost(&self, me: usize, now: Instant, timeout: Duration) -> Vec<usize> {
        (0..self.seen.len())
            .filter(|&r| r != me && !self.done[r])
            .filter(|&r| now.duration_since(self.seen[r].1) > timeout)
            .collect()
    }
}

impl Liveness {
    /// Connects a store client of its own and starts beating and watching. Ranks lost for
    /// `timeout` end this process.
    pub fn start(env: &RankEnv, timeout: Duration) -> Result<Liveness, DistError> {
        let store = Arc::new(Store::connect(
            &env.master_addr,
            env.master_port,
            false,
            env.world_size,
            timeout,
            "tessera/liveness",
        )?);
        let stop = Arc::new(AtomicBool::new(false));
        let (rank, world_size) = (env.rank, env.world_size);
        let interval = (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let watch = Arc::new(Mutex::new(Watch::new(world_size, Instant::now())));
        let handle = {
            let (store, stop, watch) = (store.clone(), stop.clone(), watch.clone());
            std::thread::Builder::new()
                .name(format!("liveness-{rank}"))
                .spawn(move || beat_and_watch(&store, &stop, &watch, rank, interval, timeout))
                .map_err(|e| DistError::Store {
                    host: env.master_addr.clone(),
                    port: env.master_port,
                    message: format!("starting the liveness thread: {e}"),
                })?
        };
        Ok(Liveness {
            stop,
            handle: Some(handle),
            store,
            rank,
            watch,
            interval,
        })
    }

    /// After a collective failed: the ranks whose heartbeat has not moved for three beats
    /// (waits that long first). Dead peers close their connections, so the collective fails
    /// at once, before the timeout would name them.
    pub fn silent_ranks(&self) -> Vec<usize> {
        let quiet = self.interval * 3;
        std::thread::sleep(quiet + self.interval);
        match self.watch.lock() {
            Ok(w) => w.lost(self.rank, Instant::now(), quiet),
            Err(_) => Vec::new(),
        }
    }

    /// This rank finished cleanly: others stop watching it, and the thread stops.
    pub fn finish(mut self) {
        if let Err(e) = self.store.set(&format!("done/{}", self.rank), b"1") {
            tracing::debug!("liveness: marking rank {} done: {e}", self.rank);
        }
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.halt();
    }
}

fn beat_and_watch(
    store: &Store,
    stop: &AtomicBool,
    watch: &Mutex<Watch>,
    me: usize,
    interval: Duration,
    timeout: Duration,
) {
    let mut beat: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        beat += 1;
        let verdict = match watch.lock() {
            Ok(mut w) => round(store, &mut w, me, beat, timeout),
            Err(_) => return,
        };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match verdict {
            Verdict::Alive => {}
            Verdict::Lost(ranks) => abort(
                me,
                &format!(
                    "ranks {ranks:?} sent no heartbeat for {}s: their machine or process is gone \
                 (the job cannot go on without them; resume from the last checkpoint, on fewer \
                 nodes if need be)",
                    timeout.as_secs_f64()
                ),
            ),
            Verdict::StoreGone(message) => abort(
                me,
                &format!(
                "the job's store at rank 0 has not answered for {}s ({message}): rank 0 is gone \
                 (resume from the last checkpoint)",
                timeout.as_secs_f64()
            ),
            ),
        }
        std::thread::sleep(interval);
    }
}

/// One heartbeat and one look at every other rank's.
fn round(store: &Store, watch: &mut Watch, me: usize, beat: u64, timeout: Duration) -> Verdict {
    let now = Instant::now();
    let mut result = store.set(&format!("hb/{me}"), &beat.to_le_bytes());
    for r in (0..watch.seen.len()).filter(|&r| r != me) {
        if result.is_err() {
            break;
        }
        match store.get_if_set(&format!("done/{r}")) {
            Ok(Some(_)) => watch.done[r] = true,
            Ok(None) => {}
            Err(e) => result = Err(e),
        }
        match store.get_if_set(&format!("hb/{r}")) {
            Ok(value) => watch.observe(r, value, now),
            Err(e) => result = Err(e),
        }
    }
    match result {
        Ok(()) => {
            watch.store_failing_since = None;
            if watch.lost(me, now, timeout).is_empty() {
                Verdict::Alive
            } else {
                // A node's ranks fall silent within a beat or two of each other: name every
                // rank silent for half the timeout, not only the first past it.
                Verdict::Lost(watch.lost(me, now, timeout / 2))
            }
        }
        Err(e) => {
            let since = *watch.store_failing_since.get_or_insert(now);
            if now.duration_since(since) > timeout {
                Verdict::StoreGone(e.to_string())
            } else {
                Verdict::Alive
            }
        }
    }
}

/// Ends this process at once: its main thread may sit in a collective that would wait for the
/// lost ranks until the collective timeout, and unwinding from inside gloo is not possible.
fn abort(me: usize, why: &str) -> ! {
    eprintln!("rank {me}: {why}; stopping this rank");
    tracing::error!("rank {me}: {why}; stopping this rank");
    // SAFETY: _exit ends the process without running destructors that could wait on the
    // threads blocked in collectives; stderr is unbuffered and was written above.
    unsafe { libc::_exit(1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_whose_counter_stops_is_lost_after_the_timeout_and_a_done_one_never() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(10);
        let mut w = Watch::new(4, t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        for s in 0..5 {
            for r in 0..4 {
                w.observe(r, Some(vec![s as u8]), at(s));
            }
        }
        // Rank 2 stops at second 4, rank 3 finishes cleanly; rank 1 keeps beating.
        w.done[3] = true;
        for s in 5..20 {
            w.observe(1, Some(vec![s as u8]), at(s));
            w.observe(2, Some(vec![4]), at(s));
            let lost = w.lost(0, at(s), timeout);
            if s <= 14 {
                assert!(lost.is_empty(), "second {s}: {lost:?}");
            } else {
                assert_eq!(lost, vec![2], "second {s}");
            }
        }
        // A rank never heard from is lost once the timeout has passed since the watch began.
        let fresh = Watch::new(2, t0);
        assert_eq!(fresh.lost(0, at(11), timeout), vec![1]);
        assert!(fresh.lost(0, at(9), timeout).is_empty());
    }
}
