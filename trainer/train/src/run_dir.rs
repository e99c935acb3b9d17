//! The run folder (`tessera train --out R`): [`RunDir`] names what a run keeps there and scans
//! its checkpoints (the one scan resume, export, generation, `--init-projector` and pruning
//! use). A run folder belongs to one run. Without `--resume`, `tessera train --out R` refuses a
//! non-empty R (as ingest does) unless `--overwrite`, which clears it first; with `--resume`
//! the checkpoint's run record must match this run's (see [`super::checkpoint`]).
//!
//! ```text
//! R/vlm.json            what the model is (rank 0, at the start): export and generate read it
//! R/tokenizer.json      the tokenizer the shards were made with (copied from beside their
//!                       index.json), so export and generate need no --tokenizer
//! R/metrics.jsonl       one line per step;   R/plan.jsonl: each step's samples
//! R/resumes.jsonl       one line per resume; R/summary.json, R/loss.png: at the end
//! R/checkpoints/step-N  a committed checkpoint; step-N.tmp: a write not (yet) committed
//! ```
use super::checkpoint::CheckpointError;
use super::config::ConfigError;
use super::error::TrainError;
use super::export::ExportError;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Written at the start of a run: what the model is, for `export` and `generate`.
pub const VLM_FILE: &str = "vlm.json";
/// The run's copy of the tokenizer its shards were made with.
pub const TOKENIZER_FILE: &str = shards::TOKENIZER_FILE;
const METRICS_FILE: &str = "metrics.jsonl";
const PLAN_FILE: &str = "plan.jsonl";
const RESUMES_FILE: &str = "resumes.jsonl";
const SUMMARY_FILE: &str = "summary.json";
const LOSS_PLOT_FILE: &str = "loss.png";
const CHECKPOINTS_DIR: &str = "checkpoints";
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

    /// `vlm.json`: what the model is ([`super::export::VlmDescription`]).
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

    /// `resumes.jsonl`: one line per resume.
    pub fn resumes(&self) -> PathBuf {
        self.root.join(RESUMES_FILE)
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
    pub fn checkpoint_folders(&self) -> Result<Vec<CheckpointFolder>, CheckpointError> {
        let root = self.checkpoints();
        if !root.is_dir() {
            return Ok(Vec::new());
        }
        let io = |source| CheckpointError::Io {
            path: root.clone(),
            source,
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&root).map_err(io)? {
            let path = entry.map_err(io)?.path();
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

    /// The tokenizer.json to use with this run: `explicit` (`--tokenizer`) when given, else the
    /// run's own copy; refused unless its sha256 is the fingerprint the run's shards recorded
    /// (`vlm.json`), naming the file and both fingerprints.
    pub fn tokenizer_for(&self, explicit: Option<&Path>) -> Result<PathBuf, ExportError> {
        let expected = super::export::VlmDescription::load(&self.vlm())?.tokenizer_fingerprint;
        let path = match explicit {
            Some(path) => path.to_path_buf(),
            None if self.tokenizer().is_file() => self.tokenizer(),
            None => {
                return Err(ExportError::NoTokenizer {
                    run: self.root.clone(),
                    expected,
                })
            }
        };
        let (found, _) = shards::sha256_file(&path).map_err(|e| ExportError::Unreadable {
            run: self.root.clone(),
            what: "cannot read its tokenizer".into(),
            source: e.into(),
        })?;
        if found != expected {
            return Err(ExportError::TokenizerMismatch {
                run: self.root.clone(),
                file: path,
                found,
                expected,
            });
        }
        Ok(path)
    }

    /// Rank 0, at the start of a run: copies the `tokenizer.json` that ingest keeps beside the
    /// shards' index.json into the run folder, after checking it is the tokenizer the index
    /// names. Shards without one (ingested before ingest kept it) leave the run without a
    /// tokenizer: export and generate then need `--tokenizer`, and the log says so.
    pub(super) fn keep_tokenizer(&self, dataset: &shards::Dataset) -> Result<(), TrainError> {
        let name = shards::TOKENIZER_FILE;
        let bytes = match dataset.source() {
            shards::DatasetLocation::Dir(dir) => {
                let path = dir.join(name);
                if path.is_file() {
                    Some(std::fs::read(&path).map_err(super::error::io(&path))?)
                } else {
                    None
                }
            }
            shards::DatasetLocation::Remote(files) => {
                if files.list()?.iter().any(|n| n == name) {
                    Some(files.read_file(name)?.to_vec())
                } else {
                    None
                }
            }
        };
        let shards_at = dataset.source().describe();
        let Some(bytes) = bytes else {
            tracing::warn!(
                "{shards_at} holds no {name} beside its index.json (ingested before ingest kept \
                 one): `export --format llava-hf` and `generate` of this run will need --tokenizer"
            );
            return Ok(());
        };
        let found = hex::encode(Sha256::digest(&bytes));
        let expected = &dataset.manifest().tokenizer_fingerprint;
        if &found != expected {
            return Err(ConfigError::Invalid {
                field: "shards",
                reason: format!(
                    "{shards_at}/{name} has sha256 {found}, but index.json says the shards were \
                     tokenized with {expected}: put the right tokenizer.json there, or remove it \
                     (export and generate will then need --tokenizer)"
                ),
            }
            .into());
        }
        let path = self.tokenizer();
        shards::write_atomically(&path, &bytes)?;
        Ok(())
    }
}

/// How a run treats what its `--out` folder already holds, and how it reports progress
/// (command-line only, like `--resume`: none of it is part of the run's settings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStart {
    /// Continue from the newest complete checkpoint in the folder.
    pub resume: bool,
    /// Clear a non-empty folder and start afresh.
    pub overwrite: bool,
    /// Run-record keys allowed to differ from the checkpoint's on `--resume`.
    pub resume_changing: Vec<String>,
    /// Show every step on one overwritten stderr line (the CLI: on a terminal, without
    /// `--quiet` or NO_PROGRESS); otherwise about 50 log lines a run.
    pub progress: bool,
}

/// What only a tessera run folder holds; `--overwrite` clears a folder holding one of these,
/// and refuses any other (a mistyped `--out $HOME` must not be emptied).
const RUN_MARKERS: [&str; 5] = [
    CHECKPOINTS_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    LOSS_PLOT_FILE,
    VLM_FILE,
];

fn invalid(reason: String) -> ConfigError {
    ConfigError::Invalid {
        field: "out",
        reason,
    }
}

/// Checks (and with `--overwrite` clears) `out` before a run starts. Call it once, before any
/// rank writes: the CLI before launching ranks, and rank 0 before joining the job.
pub fn prepare(out: &Path, start: &RunStart) -> Result<(), ConfigError> {
    if start.resume && start.overwrite {
        return Err(invalid(
            "--resume continues the run in the folder and --overwrite clears it: pass one".into(),
        ));
    }
    if !start.resume && !start.resume_changing.is_empty() {
        return Err(invalid(
            "--resume-changing applies only with --resume".into(),
        ));
    }
    if start.resume || !out.exists() {
        return Ok(());
    }
    let io = |source| ConfigError::OutFolder {
        path: out.to_path_buf(),
        source,
    };
    let mut names: Vec<String> = std::fs::read_dir(out)
        .and_then(|entries| {
            entries
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_, _>>()
        })
        .map_err(io)?;
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    if !start.overwrite {
        let shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
        return Err(invalid(format!(
            "{} is not empty (it holds {}{}): pass --resume to continue the run in it, \
             --overwrite to clear it, or choose another --out",
            out.display(),
            shown.join(", "),
            if names.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        )));
    }
    if !names.iter().any(|n| RUN_MARKERS.contains(&n.as_str())) {
        return Err(invalid(format!(
            "--overwrite: {} does not look like a tessera run folder (no {}); clear it by hand \
             or choose another --out",
            out.display(),
            RUN_MARKERS.join(", ")
        )));
    }
    tracing::info!("--overwrite: clearing {}", out.display());
    for name in names {
        let path = out.join(&name);
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|source| ConfigError::OutFolder { path, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_used_folder_is_refused_unless_resumed_or_overwritten() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let out = tmp.path().join("run");
        let fresh = RunStart::default();
        prepare(&out, &fresh)?;
        std::fs::create_dir_all(out.join("checkpoints/step-00000040"))?;
        std::fs::write(out.join("metrics.jsonl"), b"{}\n")?;
        let msg = prepare(&out, &fresh).expect_err("used folder").to_string();
        assert!(
            msg.contains("not empty") && msg.contains("checkpoints") && msg.contains("--overwrite"),
            "{msg}"
        );
        let resume = RunStart {
            resume: true,
            ..RunStart::default()
        };
        prepare(&out, &resume)?;
        let overwrite = RunStart {
            overwrite: true,
            ..RunStart::default()
        };
        prepare(&out, &overwrite)?;
        assert_eq!(std::fs::read_dir(&out)?.count(), 0, "--overwrite clears it");
        Ok(())
    }

    #[test]
    fn overwrite_refuses_a_folder_that_is_not_a_run() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        std::fs::write(tmp.path().join("thesis.tex"), b"...")?;
        let overwrite = RunStart {
            overwrite: true,
            ..RunStart::default()
        };
        let msg = prepare(tmp.path(), &overwrite)
            .expect_err("not a run")
            .to_string();
        assert!(msg.contains("does not look like a tessera run"), "{msg}");
        assert!(tmp.path().join("thesis.tex").is_file());
        Ok(())
    }
}
