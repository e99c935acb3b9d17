//! Checkpoints: a directory per step under `RUN/checkpoints/`, written by every rank and made
//! visible atomically.
//!
//! ```text
//! checkpoints/step-00000100/          complete (renamed from step-00000100.tmp by rank 0)
//!   meta.json                         rank 0, written last: W, strategy, fingerprints, config
//!   rank-00000/manifest.json          sha256 of every file this rank wrote
//!   rank-00000/state.json             next step, planner position, RNG seed
//!   rank-00000/...                    this rank's parameter and optimizer shards (FSDP)
//! ```
//! Protocol: every rank calls [`CheckpointWriter::begin`], writes its files, calls
//! [`CheckpointWriter::finish_rank`]; after a barrier rank 0 calls [`CheckpointWriter::commit`],
//! which checks all W manifests, writes `meta.json` and renames the folder. A `.tmp` folder is
//! never read; a complete one whose files do not hash as their manifest says is refused.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(super) const FORMAT_VERSION: u32 = 1;
const META: &str = "meta.json";
const MANIFEST: &str = "manifest.json";
const STATE: &str = "state.json";

/// Why a checkpoint could not be written or used. Each message names the checkpoint folder.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint {dir} is corrupt: {reason}")]
    Corrupt { dir: PathBuf, reason: String },
    #[error(
        "checkpoint {dir} was written by {found} ranks but this run has {expected}; \
         resume with --nproc {found}"
    )]
    WorldSize {
        dir: PathBuf,
        found: usize,
        expected: usize,
    },
    #[error("checkpoint {dir} belongs to another model: {what} differs from this run's")]
    Model { dir: PathBuf, what: &'static str },
    #[error(
        "checkpoint {dir} was trained on other data: dataset fingerprint {found} but --shards \
         has {expected}"
    )]
    Data {
        dir: PathBuf,
        found: String,
        expected: String,
    },
    #[error("checkpoint {dir} is a stage {found} run; this run is stage {expected}")]
    Stage {
        dir: PathBuf,
        found: u8,
        expected: u8,
    },
    /// Hashing or atomically writing one of its files failed (the message names the file).
    #[error(transparent)]
    File(#[from] shards::ShardError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What identifies a model, hashed part by part so a mismatch can say which part differs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFingerprint {
    /// sha256 of the vision config.json bytes.
    pub vision_config: String,
    /// sha256 of the LM config.json bytes.
    pub lm_config: String,
    /// sha256 of every unit's parameter names, shapes and trainable flags (LoRA included).
    pub params: String,
}

/// Rank 0's description of a checkpoint (`meta.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub format_version: u32,
    /// Optimizer steps completed: a resumed run starts at this step.
    pub step: u64,
    pub world_size: usize,
    pub strategy: String,
    pub stage: u8,
    pub model: ModelFingerprint,
    pub data_fingerprint: String,
    /// The resolved training config (as JSON) of the run that wrote it.
    pub config: serde_json::Value,
}

/// One rank's position (`state.json`): enough to continue exactly where it stopped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankState {
    pub rank: usize,
    pub next_step: u64,
    /// The planner's resume position (opaque to the checkpoint).
    pub planner: serde_json::Value,
    /// Seed of torch's generator; every step reseeds from (seed, step, rank).
    pub seed: u64,
}

pub(super) fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

pub(super) fn rank_dir_name(rank: usize) -> String {
    format!("rank-{rank:05}")
}

/// Writes `value` as JSON through [`shards::write_atomically`] (synced, then renamed).
fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), CheckpointError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| CheckpointError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    Ok(shards::write_atomically(path, &bytes)?)
}

/// Flushes `path` (a file this rank wrote, or a folder after entries were renamed into it) to
/// the disk, so a power cut cannot leave a committed checkpoint whose files are not there.
fn sync(path: &Path) -> Result<(), CheckpointError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path))
}

fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, path: &Path) -> Result<T, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|e| CheckpointError::Corrupt {
        dir: dir.to_path_buf(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Corrupt {
        dir: dir.to_path_buf(),
        reason: format!("{} is not valid: {e}", path.display()),
    })
}

/// One rank's side of writing the checkpoint of `step`.
pub(super) struct CheckpointWriter {
    tmp_root: PathBuf,
    final_root: PathBuf,
    rank_dir: PathBuf,
}

impl CheckpointWriter {
    /// Creates `checkpoints/step-N.tmp/rank-R/` (empty; a leftover from a crash is replaced).
    pub(super) fn begin(run_dir: &Path, step: u64, rank: usize) -> Result<Self, CheckpointError> {
        let root = run_dir.join("checkpoints");
        let tmp_root = root.join(format!("{}.tmp", step_dir_name(step)));
        let rank_dir = tmp_root.join(rank_dir_name(rank));
        if rank_dir.exists() {
            std::fs::remove_dir_all(&rank_dir).map_err(io_err(&rank_dir))?;
        }
        std::fs::create_dir_all(&rank_dir).map_err(io_err(&rank_dir))?;
        Ok(CheckpointWriter {
            final_root: root.join(step_dir_name(step)),
            tmp_root,
            rank_dir,
        })
    }

    /// Where this rank writes its files.
    pub(super) fn dir(&self) -> &Path {
        &self.rank_dir
    }

    /// Writes this rank's `state.json`, then its manifest (sha256 of every file in its folder),
    /// each file synced to disk before the manifest vouches for it.
    pub(super) fn finish_rank(&self, state: &RankState) -> Result<(), CheckpointError> {
        write_json_atomic(&self.rank_dir.join(STATE), state)?;
        let mut manifest = BTreeMap::new();
        for entry in std::fs::read_dir(&self.rank_dir).map_err(io_err(&self.rank_dir))? {
            let path = entry.map_err(io_err(&self.rank_dir))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if let Some(name) = name.filter(|n| n != MANIFEST && path.is_file()) {
                sync(&path)?;
                manifest.insert(name, shards::sha256_file(&path)?.0);
            }
        }
        write_json_atomic(&self.rank_dir.join(MANIFEST), &manifest)?;
        sync(&self.rank_dir)
    }

    /// Rank 0, after every rank finished: checks all `world_size` manifests exist, writes
    /// `meta.json` and renames the folder to its final name (replacing an older one of the same
    /// step). Returns the final folder.
    pub(super) fn commit(self, meta: &CheckpointMeta) -> Result<PathBuf, CheckpointError> {
        for rank in 0..meta.world_size {
            let manifest = self.tmp_root.join(rank_dir_name(rank)).join(MANIFEST);
            if !manifest.is_file() {
                return Err(CheckpointError::Corrupt {
                    dir: self.tmp_root.clone(),
                    reason: format!("rank {rank} did not finish writing (no {MANIFEST})"),
                });
            }
        }
        write_json_atomic(&self.tmp_root.join(META), meta)?;
        if self.final_root.exists() {
            let old = self.final_root.with_extension("old");
            std::fs::rename(&self.final_root, &old).map_err(io_err(&old))?;
            std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
        }
        sync(&self.tmp_root)?;
        std::fs::rename(&self.tmp_root, &self.final_root).map_err(io_err(&self.final_root))?;
        if let Some(root) = self.final_root.parent() {
            sync(root)?;
        }
        Ok(self.final_root)
    }
}

/// What a run expects of the checkpoint it resumes from.
pub struct Expected<'a> {
    pub world_size: usize,
    pub stage: u8,
    pub model: &'a ModelFingerprint,
    pub data_fingerprint: &'a str,
}

/// A complete checkpoint, opened for reading.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub meta: CheckpointMeta,
}

impl Checkpoint {
    /// The complete checkpoint with the highest step under `run_dir/checkpoints`, if any.
    /// `.tmp` folders (a write that never committed) are ignored.
    pub fn latest(run_dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
        let root = run_dir.join("checkpoints");
        if !root.is_dir() {
            return Ok(None);
        }
        let mut best: Option<(u64, PathBuf)> = None;
        for entry in std::fs::read_dir(&root).map_err(io_err(&root))? {
            let path = entry.map_err(io_err(&root))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let step = name
                .as_deref()
                .and_then(|n| n.strip_prefix("step-"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(step) = step.filter(|_| path.is_dir()) {
                if best.as_ref().is_none_or(|(s, _)| step > *s) {
                    best = Some((step, path));
                }
            }
        }
        best.map(|(_, dir)| Checkpoint::open(&dir)).transpose()
    }

    /// Reads `meta.json` of a complete checkpoint folder.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let meta: CheckpointMeta = read_json(dir, &dir.join(META))?;
        if meta.format_version != FORMAT_VERSION {
            return Err(CheckpointError::Corrupt {
                dir: dir.to_path_buf(),
                reason: format!(
                    "format version {} (this tessera reads {FORMAT_VERSION})",
                    meta.format_version
                ),
            });
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            meta,
        })
    }

    /// Refuses a checkpoint of another world size, stage, model or dataset.
    pub fn check_matches(&self, want: &Expected<'_>) -> Result<(), CheckpointError> {
        let dir = self.dir.clone();
        let m = &self.meta;
        if m.world_size != want.world_size {
            return Err(CheckpointError::WorldSize {
                dir,
                found: m.world_size,
                expected: want.world_size,
            });
        }
        if m.stage != want.stage {
            return Err(CheckpointError::Stage {
                dir,
                found: m.stage,
                expected: want.stage,
            });
        }
        let parts = [
            (
                &m.model.vision_config,
                &want.model.vision_config,
                "the vision config (--vision)",
            ),
            (
                &m.model.lm_config,
                &want.model.lm_config,
                "the LM config (--lm)",
            ),
            (
                &m.model.params,
                &want.model.params,
                "the parameter set (names, shapes, LoRA)",
            ),
        ];
        if let Some((_, _, what)) = parts.iter().find(|(a, b, _)| a != b) {
            return Err(CheckpointError::Model { dir, what });
        }
        if m.data_fingerprint != want.data_fingerprint {
            return Err(CheckpointError::Data {
                dir,
                found: m.data_fingerprint.clone(),
                expected: want.data_fingerprint.to_string(),
            });
        }
        Ok(())
    }

    /// This rank's folder, after checking every file hashes as its manifest says.
    pub fn rank_dir(&self, rank: usize) -> Result<PathBuf, CheckpointError> {
        let dir = self.dir.join(rank_dir_name(rank));
        let manifest: BTreeMap<String, String> = read_json(&self.dir, &dir.join(MANIFEST))?;
        for (name, want) in &manifest {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(CheckpointError::Corrupt {
                    dir: self.dir.clone(),
                    reason: format!("rank {rank}: {name} is missing"),
                });
            }
            if &shards::sha256_file(&path)?.0 != want {
                return Err(CheckpointError::Corrupt {
                    dir: self.dir.clone(),
                    reason: format!("rank {rank}: {name} does not match its sha256 in {MANIFEST}"),
                });
            }
        }
        Ok(dir)
    }

    /// This rank's `state.json` (verified with the rest of its folder).
    pub fn rank_state(&self, rank: usize) -> Result<RankState, CheckpointError> {
        let dir = self.rank_dir(rank)?;
        read_json(&self.dir, &dir.join(STATE))
    }
}
