//! Which checkpoint a resume continues from: the newest COMPLETE one. A folder still named
//! `step-N.tmp` is a write that never committed (the run stopped inside it); a committed one
//! whose `meta.json` is unreadable, or whose files do not hash as their rank's manifest says,
//! is damaged. Both are passed over, newest first, and each one skipped is reported (the log,
//! and `resumes.jsonl` in the run folder: one line per resume).
use super::checkpoint::{rank_dir_name, Checkpoint, CheckpointError};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The run folder's record of its resumes: one JSON line per resume.
pub(super) const RESUMES_FILE: &str = "resumes.jsonl";

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

/// The newest complete checkpoint under `run_dir/checkpoints` and the newer folders skipped.
pub struct Pick {
    pub checkpoint: Option<Checkpoint>,
    pub skipped: Vec<Skipped>,
}

fn shown(run_dir: &Path, path: &Path) -> String {
    path.strip_prefix(run_dir)
        .unwrap_or(path)
        .display()
        .to_string()
}

impl Checkpoint {
    /// Checks every rank's files against its manifest (all `world_size` ranks wrote one).
    pub fn verify(&self) -> Result<(), CheckpointError> {
        for rank in 0..self.meta.world_size {
            self.rank_dir(rank)?;
        }
        Ok(())
    }

    /// The complete checkpoint with the highest step whose files all verify, passing over
    /// (and listing) newer uncommitted or damaged folders. Every rank may call it: it only
    /// reads, and all reach the same answer.
    pub fn newest_complete(run_dir: &Path) -> Result<Pick, CheckpointError> {
        let root = run_dir.join("checkpoints");
        let mut candidates: Vec<(u64, bool, PathBuf)> = Vec::new();
        if root.is_dir() {
            for entry in std::fs::read_dir(&root).map_err(|source| CheckpointError::Io {
                path: root.clone(),
                source,
            })? {
                let path = entry
                    .map_err(|source| CheckpointError::Io {
                        path: root.clone(),
                        source,
                    })?
                    .path();
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                let Some(rest) = name.as_deref().and_then(|n| n.strip_prefix("step-")) else {
                    continue;
                };
                if !path.is_dir() {
                    continue;
                }
                if let Ok(step) = rest.parse::<u64>() {
                    candidates.push((step, true, path));
                } else if let Some(step) = rest.strip_suffix(".tmp").and_then(|n| n.parse().ok()) {
                    candidates.push((step, false, path));
                }
            }
        }
        // Newest first; at one step the committed folder before a leftover `.tmp`.
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        let mut skipped = Vec::new();
        for (_, committed, path) in candidates {
            let checkpoint = shown(run_dir, &path);
            if !committed {
                let ranks = (0..)
                    .map(|r| path.join(rank_dir_name(r)))
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
            match Checkpoint::open(&path).and_then(|c| c.verify().map(|()| c)) {
                Ok(c) => {
                    return Ok(Pick {
                        checkpoint: Some(c),
                        skipped,
                    })
                }
                Err(e) => skipped.push(Skipped {
                    checkpoint,
                    reason: e.to_string(),
                }),
            }
        }
        Ok(Pick {
            checkpoint: None,
            skipped,
        })
    }
}

/// Appends `record` to `run_dir/resumes.jsonl` (rank 0, once per resume), synced.
pub(super) fn append_resume_record(
    run_dir: &Path,
    record: &ResumeRecord,
) -> Result<(), CheckpointError> {
    let path = run_dir.join(RESUMES_FILE);
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

/// Test hook in the real write path: with `TESSERA_CHECKPOINT_PAUSE_AT=N`, the write of the
/// checkpoint of step N stops after this rank's tensor files and before its manifest and the
/// commit, and waits there until the process is killed (the crash-safety test kills it with
/// SIGKILL). Unset (always, outside that test) it does nothing.
pub(super) fn pause_mid_write_if_asked(step: u64) {
    let asked = std::env::var("TESSERA_CHECKPOINT_PAUSE_AT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if asked == Some(step) {
        tracing::warn!("TESSERA_CHECKPOINT_PAUSE_AT={step}: pausing inside the checkpoint write");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}
