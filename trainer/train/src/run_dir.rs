//! The run folder (`tessera train --out R`): [`RunDir`] names what a run keeps there and scans
//! its checkpoints (the one scan resume, export, generation, `--init-projector` and pruning
//! use). A run folder belongs to one run. Without `--resume`, `tessera train --out R` refuses a
//! non-empty R (as ingest does) unless `--overwrite`, which clears it first; with `--resume`
//! the checkpoint's run record must match this run's (see `checkpoint/format.rs`).
//!
//! ```text
//! R/vlm.json            what the model is (rank 0, at the start): export and generate read it
//! R/tokenizer.json      the tokenizer the shards were made with (copied from beside their
//!                       index.json), so export and generate need no --tokenizer
//! R/metrics.jsonl       one line per step;   R/plan.jsonl: each step's samples
//! R/events.out.tfevents.*  the same scalars for TensorBoard, one file per (re)start
//! R/resumes.jsonl       one line per resume; R/summary.json, R/loss.png: at the end
//! R/checkpoints/step-N  a committed checkpoint; step-N.tmp: a write not (yet) committed
//! ```
use std::path::{Path, PathBuf};

/// Written at the start of a run: what the model is, for `export` and `generate`.
pub(crate) const VLM_FILE: &str = "vlm.json";
/// The run's copy of the tokenizer its shards were made with.
pub(crate) const TOKENIZER_FILE: &str = tessera_shards::TOKENIZER_FILE;
pub(crate) const METRICS_FILE: &str = "metrics.jsonl";
const PLAN_FILE: &str = "plan.jsonl";
const RESUMES_FILE: &str = "resumes.jsonl";
const SKIPPED_FILE: &str = "skipped.jsonl";
pub(crate) const SUMMARY_FILE: &str = "summary.json";
pub(crate) const RECOMPUTE_FILE: &str = "recompute.json";
pub(crate) const LOSS_PLOT_FILE: &str = "loss.png";
pub(crate) const CHECKPOINTS_DIR: &str = "checkpoints";
const SAMPLES_FILE: &str = "samples.jsonl";
const RANK0_TOKEN_FILE: &str = ".rank0-token";
const SHARD_CACHE_DIR: &str = "shard-cache";

/// A run folder: where each thing a run writes lives, and its checkpoint folders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDir {
    root: PathBuf,
}

/// One folder under `checkpoints/`, as the scan found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointFolder {
    pub step: u64,
    /// `step-N` (renamed by the commit) rather than `step-N.tmp` (a write under way or killed).
    pub committed: bool,
    pub path: PathBuf,
}

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RunDir { root: root.into() }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `vlm.json`: what the model is (`VlmDescription`).
    pub fn vlm(&self) -> PathBuf {
        self.root.join(VLM_FILE)
    }

    /// `tokenizer.json`: the run's copy of its shards' tokenizer.
    pub fn tokenizer(&self) -> PathBuf {
        self.root.join(TOKENIZER_FILE)
    }

    /// `metrics.jsonl`: one line per optimizer step.
    pub fn metrics(&self) -> PathBuf {
        self.root.join(METRICS_FILE)
    }

    /// `plan.jsonl`: the samples each step trained on.
    pub fn plan(&self) -> PathBuf {
        self.root.join(PLAN_FILE)
    }

    /// `skipped.jsonl`: the samples the plan leaves out for their length (`--over-long skip`).
    pub fn skipped(&self) -> PathBuf {
        self.root.join(SKIPPED_FILE)
    }

    /// `resumes.jsonl`: one line per resume.
    pub fn resumes(&self) -> PathBuf {
        self.root.join(RESUMES_FILE)
    }

    /// `recompute.json`: the recompute policy, why, and the peak estimated for each one.
    pub fn recompute_report(&self) -> PathBuf {
        self.root.join(RECOMPUTE_FILE)
    }

    /// `summary.json`, written at the end of the run.
    pub fn summary(&self) -> PathBuf {
        self.root.join(SUMMARY_FILE)
    }

    /// `loss.png`, drawn at the end of the run.
    pub fn loss_plot(&self) -> PathBuf {
        self.root.join(LOSS_PLOT_FILE)
    }

    /// `samples.jsonl`: where `generate --run R --shards` writes by default.
    pub fn samples(&self) -> PathBuf {
        self.root.join(SAMPLES_FILE)
    }

    /// `profile_rank{rank}.json` (`--profile`).
    pub fn profile(&self, rank: usize) -> PathBuf {
        self.root.join(format!("profile_rank{rank}.json"))
    }

    /// `.rank0-token`: rank 0's proof that a rank sees its run folder (multi-node runs).
    pub fn rank0_token(&self) -> PathBuf {
        self.root.join(RANK0_TOKEN_FILE)
    }

    /// `shard-cache/`: the local cache of remote shards when no cache folder is given.
    pub fn shard_cache(&self) -> PathBuf {
        self.root.join(SHARD_CACHE_DIR)
    }

    /// `checkpoints/`.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join(CHECKPOINTS_DIR)
    }

    /// `checkpoints/step-N`: the committed checkpoint of `step`.
    pub fn checkpoint(&self, step: u64) -> PathBuf {
        self.checkpoints().join(format!("step-{step:08}"))
    }

    /// `checkpoints/step-N.tmp`: where the checkpoint of `step` is written before its commit.
    pub fn unfinished_checkpoint(&self, step: u64) -> PathBuf {
        self.checkpoints().join(format!("step-{step:08}.tmp"))
    }

    /// Every `step-N` and `step-N.tmp` folder under `checkpoints/` (none when it does not
    /// exist), newest first; at one step the committed folder before a leftover `.tmp`.
    /// Nothing is opened: [`RunDir::newest_complete_checkpoint`] says which one is usable.
    pub fn checkpoint_folders(&self) -> std::io::Result<Vec<CheckpointFolder>> {
        let root = self.checkpoints();
        if !root.is_dir() {
            return Ok(Vec::new());
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&root)? {
            let path = entry?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let Some(rest) = name.as_deref().and_then(|n| n.strip_prefix("step-")) else {
                continue;
            };
            let (digits, committed) = match rest.strip_suffix(".tmp") {
                Some(digits) => (digits, false),
                None => (rest, true),
            };
            if let (Ok(step), true) = (digits.parse::<u64>(), path.is_dir()) {
                found.push(CheckpointFolder {
                    step,
                    committed,
                    path,
                });
            }
        }
        found.sort_by(|a, b| b.step.cmp(&a.step).then(b.committed.cmp(&a.committed)));
        Ok(found)
    }

    /// `path` relative to the run folder (`checkpoints/step-00000010`), for messages and
    /// records.
    pub fn shown(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}
