//! `--resume`: where a run continues (the newest complete checkpoint, checked against this
//! run's record and loaded at this run's world size), and `resumes.jsonl`, one line per resume
//! naming the checkpoint and the newer folders passed over.
use super::sharded_vlm::ShardedVlm;
use super::start::RunStart;
use super::TrainLoop;
use crate::checkpoint::format::{CheckpointError, Expected};
use crate::checkpoint::pick::{Pick, Skipped};
use crate::checkpoint::sharded_state::ShardedState;
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::run_dir::RunDir;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use tessera_pipeline::plan::Position;

/// Where the run starts: the global step and the planner position (None = epoch 0's start).
pub(super) struct Start {
    pub(super) step: u64,
    pub(super) position: Option<Position>,
}

/// What `resumes.jsonl` says of one resume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResumeRecord {
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

/// Appends `record` to `RUN/resumes.jsonl` (rank 0, once per resume), synced.
pub(crate) fn append_resume_record(
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

impl TrainLoop<'_> {
    /// What a resume must match: everything that changes the math. The knobs marked
    /// `#[resume]` in `config.rs`, plus what no knob holds as is: the frozen weights by the
    /// model directories' fingerprints (a checkpoint does not store them), the data by its
    /// fingerprint (`shards`, whatever path it is read from now), the run's length in steps and
    /// the image size the tower resolved.
    pub(super) fn run_record(&self) -> BTreeMap<String, String> {
        let (cfg, s) = (self.cfg, self.s);
        let m = &s.model_fingerprint;
        let mut r = cfg.resume_record();
        for (key, value) in [
            ("vision_config", m.vision_config.clone()),
            ("vision_weights", m.vision_weights.clone()),
            ("lm_config", m.lm_config.clone()),
            ("lm_weights", m.lm_weights.clone()),
            ("shards", s.data.fingerprint().to_string()),
            ("total_steps", self.total_steps.to_string()),
            ("image_size", s.vlm.vision.image_size.to_string()),
        ] {
            r.insert(key.to_string(), value);
        }
        if let Some(choice) = self.settled.cpu_gemm {
            r.insert(
                super::cpu_gemm::RECORD_KEY.to_string(),
                choice.record_name().to_string(),
            );
        }
        if let Some(policy) = self.settled.recompute {
            r.insert(
                super::recompute_choice::RECORD_KEY.to_string(),
                policy.to_string(),
            );
        }
        r
    }

    /// With `--resume`: loads the newest complete checkpoint (`pick`) after checking it
    /// belongs to this run (format, parameter set, run record), at this run's world size;
    /// says which newer folders it skipped and why (log, and `resumes.jsonl`).
    pub(super) fn restore(
        &mut self,
        pick: Option<Pick>,
        start: &RunStart,
        model: &mut ShardedVlm,
    ) -> Result<Start, TrainError> {
        let fresh = Start {
            step: 0,
            position: None,
        };
        let Some(Pick {
            checkpoint,
            skipped,
        }) = pick
        else {
            return Ok(fresh);
        };
        let (rank, out) = (self.s.rank, self.run.path());
        if rank == 0 {
            for s in &skipped {
                tracing::warn!("--resume: skipped {}: {}", s.checkpoint, s.reason);
            }
        }
        let Some(ckpt) = checkpoint else {
            let committed = skipped.iter().any(|s| !s.checkpoint.ends_with(".tmp"));
            if committed {
                let list: Vec<String> = skipped
                    .iter()
                    .map(|s| format!("{} ({})", s.checkpoint, s.reason))
                    .collect();
                return Err(TrainError::Invalid(format!(
                    "--resume: no usable checkpoint under {}/checkpoints: {}",
                    out.display(),
                    list.join("; ")
                )));
            }
            tracing::warn!(
                "--resume: no complete checkpoint under {}/checkpoints; starting at step 0",
                out.display()
            );
            return Ok(fresh);
        };
        ckpt.check_matches(&Expected {
            model: &self.s.model_fingerprint,
            run: &self.run_record(),
            allow_changing: &start.resume_changing,
            resume_knobs: &TrainConfig::resume_knobs().collect::<Vec<_>>(),
        })?;
        // Every rank's position is the same (the plan is global): read rank 0's.
        let state = ckpt.rank_state(0)?;
        let position: Position =
            serde_json::from_value(state.planner.clone()).map_err(|source| TrainError::Json {
                what: format!(
                    "checkpoint {} rank 0: planner position is unreadable",
                    ckpt.dir.display()
                ),
                source,
            })?;
        model.load_sharded(&ShardedState::open(&ckpt)?)?;
        let m = &ckpt.meta;
        if rank == 0 {
            tracing::info!(
                "resumed from {} (step {}, written by {} ranks, now {}; data plan laid out for {})",
                ckpt.dir.display(),
                m.step,
                m.world_size,
                self.s.world_size,
                m.plan_world_size
            );
            append_resume_record(
                &self.run,
                &ResumeRecord {
                    step: m.step,
                    checkpoint: self.run.shown(&ckpt.dir),
                    checkpoint_world_size: m.world_size,
                    world_size: self.s.world_size,
                    plan_world_size: m.plan_world_size,
                    skipped,
                },
            )?;
        }
        Ok(Start {
            step: m.step,
            position: Some(position),
        })
    }
}
