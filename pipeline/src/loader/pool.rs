//! `Loader`: plans in, micro-batches out, in plan order, through N worker threads.
//!
//! A feeder thread numbers the plans and hands them to the workers over a bounded channel;
//! each worker builds whole micro-batches and sends `(seq, result)` back; the consumer keeps a
//! small reorder buffer and yields sequence numbers in order. The feeder takes a credit before
//! each plan and the consumer returns it when it yields that micro-batch, so at most `prefetch`
//! micro-batches exist at once (queued, in work or waiting for reordering): a slow trainer
//! stalls the loader instead of growing memory, and a slow loader shows as `wait` time.
//! With one thread nothing is spawned: micro-batches are built in `next()` (easy to debug).
//! A source that fetches remotely (`SampleSource::reads_ahead`) also gets a read-ahead thread:
//! the feeder hands it the samples of the next `prefetch` plans before the workers take them,
//! so their bytes are in the local cache by then; time still lost to the store shows up as the
//! consumer's `wait` (metrics.jsonl's `loader_wait_frac`).
use super::stats::{LoaderStats, StatCells};
use super::worker::Worker;
use super::{LoaderConfig, LoaderError, SampleSource};
use crate::{MicroBatch, MicroBatchPlan};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Plans = Box<dyn Iterator<Item = MicroBatchPlan> + Send>;
type Outcome = (u64, Result<MicroBatch, LoaderError>);

/// Iterator over one rank's micro-batches. Ends after the last plan, or after the first error
/// (which is yielded, e.g. a bad image under the `fail` policy).
pub struct Loader {
    mode: Mode,
    stats: Arc<StatCells>,
    batches: u64,
    wait: Duration,
    finished: bool,
}

enum Mode {
    Inline {
        plans: Plans,
        worker: Box<Worker>,
    },
    Threaded {
        results: Option<Receiver<Outcome>>,
        credits: Option<Sender<()>>,
        reorder: BTreeMap<u64, Result<MicroBatch, LoaderError>>,
        next_seq: u64,
        /// Plans the feeder handed to workers so far.
        dispatched: Arc<AtomicU64>,
        threads: Vec<JoinHandle<()>>,
    },
}

impl Loader {
    /// Starts loading `plans` (this rank's, in order) from `source`.
    pub fn new<I>(source: Arc<dyn SampleSource>, plans: I, config: LoaderConfig) -> Loader
    where
        I: IntoIterator<Item = MicroBatchPlan>,
        I::IntoIter: Send + 'static,
    {
        let plans: Plans = Box::new(plans.into_iter());
        let stats = Arc::new(StatCells::default());
        let config = Arc::new(config);
        let mode = if config.threads <= 1 {
            let worker = Box::new(Worker::new(source, config, stats.clone()));
            Mode::Inline { plans, worker }
        } else {
            spawn(source, plans, config, stats.clone())
        };
        Loader {
            mode,
            stats,
            batches: 0,
            wait: Duration::ZERO,
            finished: false,
        }
    }

    /// Counters so far; `wait` is the time `next()` spent blocked.
    pub fn stats(&self) -> LoaderStats {
        self.stats.snapshot(self.batches, self.wait)
    }

    fn next_threaded(&mut self) -> Option<Result<MicroBatch, LoaderError>> {
        let Mode::Threaded {
            results,
            credits,
            reorder,
            next_seq,
            dispatched,
            ..
        } = &mut self.mode
        else {
            return None;
        };
        let results = results.as_ref()?;
        let outcome = loop {
            if let Some(ready) = reorder.remove(next_seq) {
                break ready;
            }
            match results.recv() {
                Ok((seq, outcome)) => {
                    reorder.insert(seq, outcome);
                }
                // Every worker is gone: either all plans were done, or a worker died mid-plan.
                Err(_) if reorder.is_empty() && *next_seq >= dispatched.load(SeqCst) => {
                    return None
                }
                Err(_) => {
                    let msg = format!("micro-batch {next_seq} never arrived");
                    return Some(Err(LoaderError::Worker(msg)));
                }
            }
        };
        *next_seq += 1;
        if let Some(credits) = credits {
            // The feeder may already be done; a closed credit channel is fine.
            let _ = credits.send(());
        }
        Some(outcome)
    }
}

impl Iterator for Loader {
    type Item = Result<MicroBatch, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        let started = Instant::now();
        let item = match &mut self.mode {
            Mode::Inline { plans, worker } => plans.next().map(|plan| worker.load(&plan)),
            Mode::Threaded { .. } => self.next_threaded(),
        };
        self.wait += started.elapsed();
        match &item {
            Some(Ok(_)) => self.batches += 1,
            Some(Err(_)) | None => self.finished = true,
        }
        item
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if let Mode::Threaded {
            results,
            credits,
            threads,
            ..
        } = &mut self.mode
        {
            // Closing both ends unblocks the feeder (waiting for credit) and the workers
            // (waiting to send); then they return.
            drop(credits.take());
            drop(results.take());
            for handle in threads.drain(..) {
                let _ = handle.join();
            }
        }
    }
}

fn spawn(
    source: Arc<dyn SampleSource>,
    mut plans: Plans,
    config: Arc<LoaderConfig>,
    stats: Arc<StatCells>,
) -> Mode {
    let (job_tx, job_rx) = bounded::<(u64, MicroBatchPlan)>(config.prefetch);
    let (result_tx, result_rx) = bounded::<Outcome>(config.prefetch);
    let (credit_tx, credit_rx) = bounded::<()>(config.prefetch);
    for _ in 0..config.prefetch {
        let _ = credit_tx.send(());
    }
    let dispatched = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::with_capacity(config.threads + 2);
    // Read-ahead for remote sources: the samples of the next `prefetch` plans, fetched into the
    // source's cache by one thread while the workers decode. Lossy by design (a full queue
    // skips a plan: its worker fetches it) so it never holds the feeder up.
    let ahead = config.prefetch;
    let (ahead_tx, ahead_rx) = bounded::<Vec<u64>>(ahead);
    let ahead_tx = source.reads_ahead().then_some(ahead_tx);
    if ahead_tx.is_some() {
        let source = source.clone();
        threads.push(std::thread::spawn(move || {
            for indices in ahead_rx.iter() {
                if let Err(e) = source.read_ahead(&indices) {
                    let why = tessera_errors::with_causes(&e);
                    tracing::debug!("read-ahead failed (the worker's read will retry): {why}");
                }
            }
        }));
    }
    let sent = dispatched.clone();
    threads.push(std::thread::spawn(move || {
        let mut pending: VecDeque<MicroBatchPlan> = VecDeque::with_capacity(ahead + 1);
        let mut seq = 0u64;
        loop {
            while pending.len() <= ahead {
                let Some(plan) = plans.next() else { break };
                if let Some(tx) = &ahead_tx {
                    let _ = tx.try_send(plan.rows.iter().flatten().copied().collect());
                }
                pending.push_back(plan);
            }
            let Some(plan) = pending.pop_front() else {
                return;
            };
            if credit_rx.recv().is_err() || job_tx.send((seq, plan)).is_err() {
                return;
            }
            seq += 1;
            sent.store(seq, SeqCst);
        }
    }));
    for _ in 0..config.threads {
        let (jobs, results) = (job_rx.clone(), result_tx.clone());
        let mut worker = Worker::new(source.clone(), config.clone(), stats.clone());
        threads.push(std::thread::spawn(move || {
            for (seq, plan) in jobs.iter() {
                if results.send((seq, worker.load(&plan))).is_err() {
                    return;
                }
            }
        }));
    }
    Mode::Threaded {
        results: Some(result_rx),
        credits: Some(credit_tx),
        reorder: BTreeMap::new(),
        next_seq: 0,
        dispatched,
        threads,
    }
}
