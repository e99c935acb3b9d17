//! The training loop's checkpoints, written the way `--checkpoint-write` says, always by
//! `checkpoint.rs`'s protocol: every rank writes its own folder under `step-N.tmp`, and after
//! a barrier rank 0 commits (checks every manifest, writes `meta.json`, renames, prunes).
//!
//! - `sync`: both happen at the step boundary; training waits for the disk.
//! - `async`: at the step boundary each rank copies its trained state into host memory (its
//!   1/W, once more) and a thread writes it while the next steps train. At each later
//!   boundary one all-reduce asks whether every rank's thread is done; the commit happens at
//!   the first boundary where all are, and at the end of the run in any case. A checkpoint
//!   that comes due while the previous one is still being written first waits for it: one
//!   write is in flight at a time, so at most one extra copy of the state is held.
//!
//! Crash safety is the same either way: until the commit only the `.tmp` folder exists, which
//! a resume skips ("never committed"), so a crash mid-write resumes from the last committed
//! checkpoint.
use crate::checkpoint::format::{
    prune, CheckpointError, CheckpointMeta, CheckpointWriter, RankState,
};
use crate::checkpoint::sharded_state::StateSnapshot;
use crate::config::{CheckpointWrite, TrainConfig};
use crate::error::TrainError;
use crate::run_dir::RunDir;
use std::thread::JoinHandle;
use tch::Tensor;
use tessera_fsdp::dist::ProcessGroup;

/// The ranks that write a checkpoint together: this one, how many, and their group (for the
/// barriers around the commit and the all-reduce that asks whether every write is done).
pub(crate) struct WriterRanks<'a> {
    pub(crate) pg: &'a ProcessGroup,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
}

/// A checkpoint whose files this rank's thread is still writing.
struct Pending {
    step: u64,
    /// Rank 0's `meta.json` (other ranks: `None`).
    meta: Option<CheckpointMeta>,
    thread: JoinHandle<Result<CheckpointWriter, CheckpointError>>,
}

/// Saves the loop's checkpoints; holds the one asynchronous write in flight, if any.
pub(crate) struct CheckpointSaver {
    mode: CheckpointWrite,
    keep_checkpoints: usize,
    keep_every: u64,
    pending: Option<Pending>,
}

impl CheckpointSaver {
    pub(crate) fn new(cfg: &TrainConfig) -> Self {
        CheckpointSaver {
            mode: cfg.checkpoint_write,
            keep_checkpoints: cfg.keep_checkpoints,
            keep_every: cfg.keep_every,
            pending: None,
        }
    }

    /// The checkpoint of `step` (the state after `step` optimizer steps): written and
    /// committed now (`sync`), or handed to a thread (`async`). `snapshot(copy)` takes this
    /// rank's trained state (`copy`: into host memory, for a write in the background).
    /// `meta`: rank 0's `meta.json`.
    pub(crate) fn save(
        &mut self,
        run: &RunDir,
        s: &WriterRanks<'_>,
        snapshot: impl FnOnce(bool) -> StateSnapshot,
        state: RankState,
        meta: Option<CheckpointMeta>,
    ) -> Result<(), TrainError> {
        self.finish(run, s)?;
        let step = state.next_step;
        let writer = CheckpointWriter::begin(run, step, s.rank)?;
        let in_background = self.mode == CheckpointWrite::Async;
        let snapshot = snapshot(in_background);
        let write = move || {
            let written = snapshot.write(writer.dir()).and_then(|()| {
                pause_mid_write_if_asked(step);
                writer.finish_rank(&state)
            });
            match written {
                Ok(()) => Ok(writer),
                Err(e) => {
                    // A full disk is not left fuller; the last committed checkpoint is intact.
                    writer.abandon();
                    Err(e)
                }
            }
        };
        if !in_background {
            let writer = write()?;
            return self.commit(run, s, writer, step, meta);
        }
        let thread = std::thread::Builder::new()
            .name(format!("checkpoint-{step}"))
            .spawn(write)
            .map_err(|e| {
                TrainError::Invalid(format!(
                    "checkpoint of step {step}: cannot start its writer thread: {e}"
                ))
            })?;
        tracing::debug!(
            "rank {}: checkpoint of step {step} is being written",
            s.rank
        );
        self.pending = Some(Pending { step, meta, thread });
        Ok(())
    }

    /// At a step boundary: commits the checkpoint in flight once every rank has written its
    /// files (one all-reduce over the ranks while one is in flight; nothing otherwise).
    pub(crate) fn poll(&mut self, run: &RunDir, s: &WriterRanks<'_>) -> Result<(), TrainError> {
        let Some(pending) = &self.pending else {
            return Ok(());
        };
        let mut busy = Tensor::from_slice(&[i64::from(!pending.thread.is_finished())]);
        if s.world_size > 1 {
            s.pg.all_reduce_sum(&mut busy, "checkpoint write")?.wait()?;
        }
        if busy.int64_value(&[0]) > 0 {
            return Ok(());
        }
        self.finish(run, s)
    }

    /// Waits for the checkpoint in flight, if any, and commits it (before the next one, and
    /// at the end of the run).
    pub(crate) fn finish(&mut self, run: &RunDir, s: &WriterRanks<'_>) -> Result<(), TrainError> {
        let Some(Pending { step, meta, thread }) = self.pending.take() else {
            return Ok(());
        };
        let writer = thread.join().map_err(|_| {
            TrainError::Invalid(format!(
                "checkpoint of step {step}: rank {}'s writer thread panicked",
                s.rank
            ))
        })??;
        self.commit(run, s, writer, step, meta)
    }

    /// Every rank has written its folder: after a barrier rank 0 commits; a second barrier
    /// keeps ranks from racing ahead of the commit.
    fn commit(
        &self,
        run: &RunDir,
        s: &WriterRanks<'_>,
        writer: CheckpointWriter,
        step: u64,
        meta: Option<CheckpointMeta>,
    ) -> Result<(), TrainError> {
        s.pg.barrier("checkpoint write")?;
        if let Some(meta) = meta {
            let dir = writer.commit(&meta)?;
            tracing::info!("checkpoint {}", dir.display());
            let removed = prune(run, self.keep_checkpoints, self.keep_every)?;
            if !removed.is_empty() {
                tracing::debug!("removed the checkpoints of steps {removed:?}");
            }
        }
        s.pg.barrier("checkpoint commit")?;
        tracing::debug!("rank {}: checkpoint of step {step} committed", s.rank);
        Ok(())
    }
}

/// Test hook in the real write path, in builds with the `test-hooks` feature: with
/// `TESSERA_CHECKPOINT_PAUSE_AT=N`, the write of the checkpoint of step N stops after this
/// rank's tensor files and before its manifest and the commit, and waits there until the
/// process is killed (the crash-safety tests kill it with SIGKILL). Unset (always, outside
/// those tests) it does nothing.
#[cfg(feature = "test-hooks")]
pub(crate) fn pause_mid_write_if_asked(step: u64) {
    if tessera_switches::Switches::get().checkpoint_pause_at == Some(step) {
        tracing::warn!("TESSERA_CHECKPOINT_PAUSE_AT={step}: pausing inside the checkpoint write");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Without the `test-hooks` feature (a release build) there is nothing to pause for.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn pause_mid_write_if_asked(_step: u64) {}
