//! Checkpoints: a directory per step under `RUN/checkpoints/`, written by every rank and made
//! visible atomically.
//!
//! ```text
//! checkpoints/step-00000100/          complete (renamed from step-00000100.tmp by rank 0)
//!   meta.json                         rank 0, written last: W, strategy, fingerprints, config,
//!                                     the run record
//!   rank-0000R/manifest.json          sha256 of every file rank R wrote
//!   rank-0000R/state.json             next step, planner position, RNG seed
//!   rank-0000R/shards.safetensors     rank R's flat shards of the trained buffers and their
//!                                     AdamW moments (rank 0 alone under NO_SHARD)
//!   rank-00000/layout.json            parameter -> slice of a flat buffer, shard size
//! ```
//! The format (4, the only one this tessera reads) stores the trained state as FSDP holds it:
//! each rank writes its own 1/W in parallel, nothing is gathered, so a full fine-tune of any
//! size checkpoints in the memory it trains in (`sharded_state.rs`). `layout.json` lets a run at
//! any W' re-slice it: each rank reads only the byte ranges of the writers' files that fall in
//! its own shards, and export reads one parameter at a time. A checkpoint of another format
//! (1-3, written before 1.0) is refused naming its format ([`CheckpointError::Format`]).
//! The data plan keeps the world size it was laid out for (`plan_world_size`): a resumed run
//! executes that plan's per-rank micro-batches on its own ranks, so every step trains on the
//! same samples as the uninterrupted run (see `layout::RankLayout`).
//! Frozen parameters are not stored: the model directories hold them, and `meta.json` names
//! those directories by fingerprint (configs and weight files), checked on resume with the
//! rest of the run record (everything that changes the math: the knobs marked `#[resume]` in
//! `config.rs`, by serde's names and spellings). After each commit [`prune`]
//! keeps the last `--keep-checkpoints` and every `--keep-every`-th.
//! Protocol: every rank calls [`CheckpointWriter::begin`], writes its files, calls
//! [`CheckpointWriter::finish_rank`]; after a barrier rank 0 calls [`CheckpointWriter::commit`],
//! which checks all W manifests, writes `meta.json` and renames the folder. A `.tmp` folder is
//! never read; a complete one whose files do not hash as their manifest says is refused.
use crate::run_dir::RunDir;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera_fsdp::Strategy;

/// Per-rank flat shards plus a layout (any world size resumes it, nothing gathered): the one
/// format this tessera writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 4;
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
    /// safetensors refused the tensors themselves (not an I/O error).
    #[error("checkpoint {path}: writing the tensors")]
    Tensors {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },
    #[error("checkpoint {dir} is corrupt: {reason}")]
    Corrupt { dir: PathBuf, reason: String },
    /// One of its files cannot be read or parsed; the cause is the source.
    #[error("checkpoint {dir} is corrupt: cannot read {file}")]
    Unreadable {
        dir: PathBuf,
        file: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("checkpoint {dir} belongs to another model: {what} differs from this run's")]
    Model { dir: PathBuf, what: &'static str },
    #[error(
        "checkpoint {dir} was written by a run with other settings: {changes}; resume with the \
         same settings, or pass --resume-changing {keys} to accept the change"
    )]
    RunChanged {
        dir: PathBuf,
        /// `key: old -> new`, joined.
        changes: String,
        /// The changed keys, comma-separated (what `--resume-changing` would need).
        keys: String,
    },
    #[error("--resume-changing {key}: no such run-record key (keys: {known})")]
    UnknownKey { key: String, known: String },
    /// A checkpoint of another format than [`FORMAT_VERSION`] (an older tessera's).
    #[error(
        "checkpoint {dir} has checkpoint format {found}; this tessera reads format \
         {FORMAT_VERSION} only: train the run again with this version (or resume and export it \
         with the tessera that wrote it)"
    )]
    Format { dir: PathBuf, found: u32 },
    /// Hashing or atomically writing one of its files failed (the message names the file).
    #[error(transparent)]
    File(#[from] tessera_shards::ShardError),
    /// The disk is full: the file, the bytes it needed, the bytes free.
    #[error(transparent)]
    NoSpace(#[from] tessera_shards::NoSpace),
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
    /// Fingerprint of the vision directory's weight files (names, sizes, crc32c of the bytes):
    /// the frozen tower a checkpoint leaves out.
    pub vision_weights: String,
    /// The same for the LM directory.
    pub lm_weights: String,
}

/// Rank 0's description of a checkpoint (`meta.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub format_version: u32,
    /// Optimizer steps completed: a resumed run starts at this step.
    pub step: u64,
    pub world_size: usize,
    /// By its serde name (`full_shard`), as the config spells it.
    pub strategy: Strategy,
    pub stage: u8,
    pub model: ModelFingerprint,
    pub data_fingerprint: String,
    /// The resolved training config (as JSON) of the run that wrote it.
    pub config: serde_json::Value,
    /// What a resume must match, by key (`lr`, `seed`, `lm_weights`, ...): the knobs marked
    /// `#[resume]` in `config.rs` and the fingerprints `TrainLoop::run_record` (`run.rs`) adds.
    pub run: BTreeMap<String, String>,
    /// The world size the data plan is laid out for (the first run's).
    pub plan_world_size: usize,
}

/// The one field every format's `meta.json` holds, read before the rest.
#[derive(Deserialize)]
struct FormatOnly {
    format_version: u32,
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

pub(crate) fn rank_dir_name(rank: usize) -> String {
    format!("rank-{rank:05}")
}

/// Writes `value` as JSON through [`tessera_shards::write_atomically`] (synced, then renamed).
fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), CheckpointError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| CheckpointError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    Ok(tessera_shards::write_atomically(path, &bytes)?)
}

/// Flushes `path` (a file this rank wrote, or a folder after entries were renamed into it) to
/// the disk, so a power cut cannot leave a committed checkpoint whose files are not there. A
/// filesystem that finds itself full only now (delayed allocation) says so like a write.
fn sync(path: &Path) -> Result<(), CheckpointError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| {
            let size = std::fs::metadata(path).map_or(0, |m| m.len());
            match tessera_shards::NoSpace::from_io(path, &e, size) {
                Some(full) => full.into(),
                None => io_err(path)(e),
            }
        })
}

fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, path: &Path) -> Result<T, CheckpointError> {
    let unreadable =
        |source: Box<dyn std::error::Error + Send + Sync>| CheckpointError::Unreadable {
            dir: dir.to_path_buf(),
            file: path.to_path_buf(),
            source,
        };
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.into()))?;
    serde_json::from_slice(&bytes).map_err(|e| unreadable(e.into()))
}

/// One rank's side of writing the checkpoint of `step`.
pub(crate) struct CheckpointWriter {
    tmp_root: PathBuf,
    final_root: PathBuf,
    rank_dir: PathBuf,
}

impl CheckpointWriter {
    /// Creates `checkpoints/step-N.tmp/rank-R/` (empty; a leftover from a crash is replaced).
    pub(crate) fn begin(run: &RunDir, step: u64, rank: usize) -> Result<Self, CheckpointError> {
        let tmp_root = run.unfinished_checkpoint(step);
        let rank_dir = tmp_root.join(rank_dir_name(rank));
        if rank_dir.exists() {
            std::fs::remove_dir_all(&rank_dir).map_err(io_err(&rank_dir))?;
        }
        std::fs::create_dir_all(&rank_dir).map_err(io_err(&rank_dir))?;
        Ok(CheckpointWriter {
            final_root: run.checkpoint(step),
            tmp_root,
            rank_dir,
        })
    }

    /// Where this rank writes its files.
    pub(crate) fn dir(&self) -> &Path {
        &self.rank_dir
    }

    /// After a failed write: removes what this rank wrote, and the step's folder once no rank
    /// has anything left in it, so a full disk is not left fuller. A resume never reads an
    /// uncommitted folder; this only gives the space back.
    pub(super) fn abandon(&self) {
        let _ = std::fs::remove_dir_all(&self.rank_dir);
        let _ = std::fs::remove_dir(&self.tmp_root);
    }

    /// Writes this rank's `state.json`, then its manifest (sha256 of every file in its folder),
    /// each file synced to disk before the manifest vouches for it.
    pub(crate) fn finish_rank(&self, state: &RankState) -> Result<(), CheckpointError> {
        write_json_atomic(&self.rank_dir.join(STATE), state)?;
        let mut manifest = BTreeMap::new();
        for entry in std::fs::read_dir(&self.rank_dir).map_err(io_err(&self.rank_dir))? {
            let path = entry.map_err(io_err(&self.rank_dir))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if let Some(name) = name.filter(|n| n != MANIFEST && path.is_file()) {
                sync(&path)?;
                manifest.insert(name, tessera_shards::sha256_file(&path)?.0);
            }
        }
        write_json_atomic(&self.rank_dir.join(MANIFEST), &manifest)?;
        sync(&self.rank_dir)
    }

    /// Rank 0, after every rank finished: checks all `world_size` manifests exist, writes
    /// `meta.json` and renames the folder to its final name (replacing an older one of the same
    /// step). Returns the final folder.
    pub(crate) fn commit(self, meta: &CheckpointMeta) -> Result<PathBuf, CheckpointError> {
        for rank in 0..meta.world_size {
            let manifest = self.tmp_root.join(rank_dir_name(rank)).join(MANIFEST);
            if !manifest.is_file() {
                return Err(CheckpointError::Corrupt {
                    dir: self.tmp_root.clone(),
                    reason: format!("rank {rank} did not finish writing (no {MANIFEST})"),
                });
            }
        }
        if let Err(e) = write_json_atomic(&self.tmp_root.join(META), meta) {
            // Every rank has finished writing into the folder: none of it can be committed.
            let _ = std::fs::remove_dir_all(&self.tmp_root);
            return Err(e);
        }
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
    pub model: &'a ModelFingerprint,
    /// This run's record (same keys as [`CheckpointMeta::run`]).
    pub run: &'a BTreeMap<String, String>,
    /// Record keys allowed to differ (`--resume-changing`).
    pub allow_changing: &'a [String],
    /// Every knob a run record can hold (`TrainConfig::resume_knobs`), whether or not this
    /// run's holds it: `--resume-changing lora_r` is how to drop LoRA from a LoRA run.
    pub resume_knobs: &'a [&'a str],
}

/// Fingerprints are long: a message shows their first 12 characters.
fn shown(value: &str) -> &str {
    let hex = value.len() >= 32 && value.bytes().all(|b| b.is_ascii_hexdigit());
    if hex {
        &value[..12]
    } else {
        value
    }
}

/// A committed checkpoint, opened for reading. Which one a run resumes, exports or generates
/// from is [`RunDir::newest_complete_checkpoint`]'s answer: committed and verified.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub meta: CheckpointMeta,
    /// Every rank's files hashed as their manifests say ([`Checkpoint::verify`]): reading a
    /// rank's folder does not hash them again.
    verified: bool,
}

impl Checkpoint {
    /// Reads `meta.json` of a committed checkpoint folder, refusing any format but
    /// [`FORMAT_VERSION`]; its files are checked as each rank's folder is read, or all at once
    /// by [`Checkpoint::verify`].
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let path = dir.join(META);
        let FormatOnly { format_version } = read_json(dir, &path)?;
        if format_version != FORMAT_VERSION {
            return Err(CheckpointError::Format {
                dir: dir.to_path_buf(),
                found: format_version,
            });
        }
        let meta: CheckpointMeta = read_json(dir, &path)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            meta,
            verified: false,
        })
    }

    /// Checks every rank's files against its manifest (all `world_size` ranks wrote one).
    pub fn verify(&mut self) -> Result<(), CheckpointError> {
        for rank in 0..self.meta.world_size {
            self.rank_dir(rank)?;
        }
        self.verified = true;
        Ok(())
    }

    /// Refuses a checkpoint of another parameter set, or whose run record differs from this run's in a key not allowed to
    /// change; the refusal names every difference (`key: old -> new`, `(none)` for a key one
    /// record lacks). A `--resume-changing` key must be a run-record key.
    pub fn check_matches(&self, want: &Expected<'_>) -> Result<(), CheckpointError> {
        let dir = self.dir.clone();
        let m = &self.meta;
        if m.model.params != want.model.params {
            return Err(CheckpointError::Model {
                dir,
                what: "the parameter set (names, shapes, LoRA)",
            });
        }
        let mut keys: Vec<&str> = m
            .run
            .keys()
            .chain(want.run.keys())
            .map(String::as_str)
            .collect();
        keys.sort();
        keys.dedup();
        if let Some(key) = want
            .allow_changing
            .iter()
            .find(|k| !keys.contains(&k.as_str()) && !want.resume_knobs.contains(&k.as_str()))
        {
            let mut known: Vec<&str> = keys.iter().chain(want.resume_knobs).copied().collect();
            known.sort();
            known.dedup();
            return Err(CheckpointError::UnknownKey {
                key: key.clone(),
                known: known.join(", "),
            });
        }
        let missing = String::from("(none)");
        let mut changes = Vec::new();
        let mut changed_keys = Vec::new();
        for key in keys {
            let old = m.run.get(key).unwrap_or(&missing);
            let new = want.run.get(key).unwrap_or(&missing);
            if old == new {
                continue;
            }
            if want.allow_changing.iter().any(|k| k == key) {
                tracing::warn!("--resume-changing {key}: {} -> {}", shown(old), shown(new));
                continue;
            }
            changes.push(format!("{key}: {} -> {}", shown(old), shown(new)));
            changed_keys.push(key);
        }
        if !changes.is_empty() {
            return Err(CheckpointError::RunChanged {
                dir,
                changes: changes.join(", "),
                keys: changed_keys.join(","),
            });
        }
        Ok(())
    }

    /// This rank's folder, after checking every file hashes as its manifest says (once: a
    /// verified checkpoint's files are not hashed again).
    pub fn rank_dir(&self, rank: usize) -> Result<PathBuf, CheckpointError> {
        let dir = self.dir.join(rank_dir_name(rank));
        if self.verified {
            return Ok(dir);
        }
        let manifest: BTreeMap<String, String> = read_json(&self.dir, &dir.join(MANIFEST))?;
        for (name, want) in &manifest {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(CheckpointError::Corrupt {
                    dir: self.dir.clone(),
                    reason: format!("rank {rank}: {name} is missing"),
                });
            }
            if &tessera_shards::sha256_file(&path)?.0 != want {
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

/// Keeps the last `keep_last` committed checkpoints under `RUN/checkpoints` plus every one
/// whose step is a multiple of `keep_every` (0 = none), and removes the rest, along with
/// uncommitted `.tmp` folders of earlier steps (a killed write). Returns the removed steps.
/// Rank 0 calls it after a commit, when no other write is under way.
pub(crate) fn prune(
    run: &RunDir,
    keep_last: usize,
    keep_every: u64,
) -> Result<Vec<u64>, CheckpointError> {
    let (mut committed, unfinished): (Vec<_>, Vec<_>) = run
        .checkpoint_folders()
        .map_err(|source| CheckpointError::Io {
            path: run.checkpoints(),
            source,
        })?
        .into_iter()
        .partition(|f| f.committed);
    committed.reverse();
    let newest = committed.last().map_or(0, |f| f.step);
    let first_kept = committed.len().saturating_sub(keep_last.max(1));
    let mut removed = Vec::new();
    for (i, folder) in committed.iter().enumerate() {
        let every = keep_every > 0 && folder.step % keep_every == 0;
        if i < first_kept && !every {
            std::fs::remove_dir_all(&folder.path).map_err(io_err(&folder.path))?;
            removed.push(folder.step);
        }
    }
    for folder in unfinished.iter().filter(|f| f.step < newest) {
        std::fs::remove_dir_all(&folder.path).map_err(io_err(&folder.path))?;
    }
    Ok(removed)
}
