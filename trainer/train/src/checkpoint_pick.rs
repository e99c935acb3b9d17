//! Which checkpoint a resume continues from (and export, generation and `--init-projector`
//! read): the newest COMPLETE one. A folder still named `step-N.tmp` is a write that never
//! committed (the run stopped inside it); a committed one whose `meta.json` is unreadable, or
//! whose files do not hash as their rank's manifest says, is damaged. Both are passed over,
//! newest first, and each one skipped is reported (the log, and for a resume `resumes.jsonl`
//! in the run folder: one line per resume).
use super::checkpoint::{rank_dir_name, Checkpoint, CheckpointError};
use super::run_dir::RunDir;
use serde::{Deserialize, Serialize};
use std::io::Write;

/// A checkpoint folder a resume passed over, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The folder, e.g. `checkpoints/step-00000010.tmp`.
    pub checkpoint: String,
    pub reason: String,
}

/// What `resumes.jsonl` says of one resume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeRecord {
    /// The step the run continued at.
    pub step: u64,
    /// The folder it continued from.
    pub checkpoint: String,
    /// Ranks of the run that wrote it, and of this run.
    pub checkpoint_world_size: usize,
    pub world_size: usize,
    /// The world size the data plan is laid out for (constant over a run's resumes).
    pub plan_world_size: usize,
    /// Newer folders passed over, newest first.
    pub skipped: Vec<Skipped>,
}

/// The newest complete checkpoint under `RUN/checkpoints` and the newer folders skipped.
pub struct Pick {
    pub checkpoint: Option<Checkpoint>,
    pub skipped: Vec<Skipped>,
}

impl Pick {
    /// The skipped folders with their reasons, `; `-joined, for messages.
    pub fn skipped_list(&self) -> String {
        let list: Vec<String> = self
            .skipped
            .iter()
            .map(|s| format!("{} ({})", s.checkpoint, s.reason))
            .collect();
        list.join("; ")
    }
}

impl RunDir {
    /// The committed checkpoint with the highest step whose files all verify, passing over
    /// (and listing) newer uncommitted or damaged folders. Resume, export, generation and
    /// `--init-projector` all take this one. Every rank may call it: it only reads, and all
    /// reach the same answer.
    pub fn newest_complete_checkpoint(&self) -> Result<Pick, CheckpointError> {
        let mut skipped = Vec::new();
        for folder in self.checkpoint_folders()? {
            let checkpoint = self.shown(&folder.path);
            if !folder.committed {
                let ranks = (0..)
                    .map(|r| folder.path.join(rank_dir_name(r)))
                    .take_while(|d| d.is_dir())
                    .count();
                skipped.push(Skipped {
                    checkpoint,
                    reason: format!(
                        "never committed: the run stopped while writing it ({ranks} of its rank \
                         folders begun; not renamed from .tmp)"
                    ),
                });
                continue;
            }
            let opened = Checkpoint::open(&folder.path).and_then(|mut c| c.verify().map(|()| c));
            match opened {
                Ok(c) => {
                    return Ok(Pick {
                        checkpoint: Some(c),
                        skipped,
                    })
                }
                Err(e) => skipped.push(Skipped {
                    checkpoint,
                    reason: shards::with_causes(&e),
                }),
            }
        }
        Ok(Pick {
            checkpoint: None,
            skipped,
        })
    }
}

/// Appends `record` to `RUN/resumes.jsonl` (rank 0, once per resume), synced.
pub(super) fn append_resume_record(
    run: &RunDir,
    record: &ResumeRecord,
) -> Result<(), CheckpointError> {
    let path = run.resumes();
    let io = |source| CheckpointError::Io {
        path: path.clone(),
        source,
    };
    let line = serde_json::to_string(record).map_err(|e| io(std::io::Error::other(e)))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io)?;
    writeln!(file, "{line}").map_err(io)?;
    file.sync_all().map_err(io)
}

/// Test hook in the real write path, in builds with the `test-hooks` feature: with
/// `TESSERA_CHECKPOINT_PAUSE_AT=N`, the write of the checkpoint of step N stops after this
/// rank's tensor files and before its manifest and the commit, and waits there until the
/// process is killed (the crash-safety tests kill it with SIGKILL). Unset (always, outside
/// those tests) it does nothing.
#[cfg(feature = "test-hooks")]
pub(super) fn pause_mid_write_if_asked(step: u64) {
    if tessera_switches::Switches::get().checkpoint_pause_at == Some(step) {
        tracing::warn!("TESSERA_CHECKPOINT_PAUSE_AT={step}: pausing inside the checkpoint write");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Without the `test-hooks` feature (a release build) there is nothing to pause for.
#[cfg(not(feature = "test-hooks"))]
pub(super) fn pause_mid_write_if_asked(_step: u64) {}
