//! The training loop. Per rank: join the job, load the model, pick up the latest checkpoint
//! (`--resume`), then for every optimizer step run its G micro-batches (each rank its own, all
//! ranks the same kind), scale each micro-batch's summed token loss by 1 / (supervised tokens
//! of the whole step across ranks), all-reduce, clip, AdamW, log, checkpoint.
use super::checkpoint::{
    Checkpoint, CheckpointMeta, CheckpointWriter, Expected, RankState, FORMAT_VERSION,
};
use super::config::{Resize, Stage, TrainConfig};
use super::engine::{Engine, UnitTimes};
use super::error::{io, TrainError};
use super::export::{VlmDescription, TRAINABLE_FILE, VLM_FILE};
use super::fsdp_engine::FsdpEngine;
use super::metrics::{self, MetricsWriter, Progress, StepMetrics, Summary};
use super::plot::plot_loss;
use super::schedule::CosineSchedule;
use super::setup::{self, Setup};
use crate::dist::RankEnv;
use crate::model::weights;
use pipeline::loader::{Loader, LoaderConfig, ResizePolicy, SampleSource};
use pipeline::plan::{Plan, Planner, Position, Step};
use std::sync::Arc;
use std::time::Instant;
use tch::Tensor;

/// Trains one rank. Rank 0 returns the run's summary; other ranks return `None`.
pub fn train(
    cfg: &TrainConfig,
    env: Option<RankEnv>,
    resume: bool,
) -> Result<Option<Summary>, TrainError> {
    let mut cfg = cfg.clone();
    if let Some(env) = &env {
        cfg.nproc = env.world_size;
    }
    std::fs::create_dir_all(&cfg.out).map_err(io(&cfg.out))?;
    let pg = setup::process_group(&cfg, env.as_ref())?;
    let mut s = setup::build(&cfg, pg)?;
    // The engine copies what it keeps (its shards); the full tensors go as soon as it exists.
    let params = std::mem::take(&mut s.params);
    let s = s;
    if s.rank == 0 {
        let vlm_desc = VlmDescription::new(
            &cfg,
            &s.vlm.vision,
            &s.vlm.lm,
            s.dataset.manifest(),
            s.vlm.options.lora.clone(),
        );
        vlm_desc.save(&cfg.out.join(VLM_FILE))?;
    }
    // FSDP runs every strategy: NO_SHARD (DDP) is its unsharded mode.
    let mut engine: Box<dyn Engine + '_> =
        Box::new(FsdpEngine::new(&cfg, &s.vlm, &s.pg, &params, s.device)?);
    drop(params);
    let mut looper = Looper::new(&cfg, &s)?;
    let start = looper.restore(resume, engine.as_mut())?;
    looper.run(engine.as_mut(), start)?;
    drop(engine);
    if s.rank != 0 {
        return Ok(None);
    }
    let steps = metrics::read_metrics(&cfg.out.join("metrics.jsonl"))?;
    let summary = Summary::from_steps(&steps);
    if let Some(summary) = &summary {
        let path = cfg.out.join("summary.json");
        let text = serde_json::to_string_pretty(summary)
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        std::fs::write(&path, text).map_err(io(&path))?;
        let losses: Vec<(u64, f64)> = steps.iter().map(|m| (m.step, m.loss)).collect();
        plot_loss(&losses, &cfg.out.join("loss.png"))?;
    }
    Ok(summary)
}

/// Where the run starts: the global step and the planner position (None = epoch 0's start).
struct Start {
    step: u64,
    position: Option<Position>,
}

struct Looper<'a> {
    cfg: &'a TrainConfig,
    s: &'a Setup,
    loader_cfg: LoaderConfig,
    total_steps: u64,
    schedule: CosineSchedule,
}

/// Stage 1 trains only the projector, which text-only samples never reach: it plans image
/// samples alone (LLaVA's stage 1 data has no text-only samples either).
fn planned_kind(stage: Stage) -> Option<shards::Kind> {
    (stage == Stage::Align).then_some(shards::Kind::Image)
}

impl<'a> Looper<'a> {
    fn new(cfg: &'a TrainConfig, s: &'a Setup) -> Result<Self, TrainError> {
        if let Some(kind) = planned_kind(cfg.stage) {
            let left_out = s.samples.iter().filter(|m| m.kind != kind).count();
            if left_out == s.samples.len() {
                return Err(TrainError::Invalid(format!(
                    "stage {} trains on {kind:?} samples only and {} holds none",
                    cfg.stage as u8,
                    cfg.shards.display()
                )));
            }
            if left_out > 0 && s.rank == 0 {
                tracing::info!(
                    "stage {}: {left_out} samples that are not {kind:?} samples are left out \
                     (only the projector trains)",
                    cfg.stage as u8
                );
            }
        }
        let loader_cfg = LoaderConfig::builder()
            .image_size(s.vlm.vision.image_size as usize)
            .image_tokens(s.vlm.vision.num_patches() as usize)
            .placeholder_id(s.dataset.manifest().image_placeholder_id)
            .resize(match cfg.resize {
                Resize::Squash => ResizePolicy::Squash,
                Resize::Pad => ResizePolicy::Pad,
            })
            .threads(cfg.loader_threads)
            .build()?;
        let mut looper = Looper {
            cfg,
            s,
            loader_cfg,
            total_steps: 0,
            schedule: CosineSchedule::new(cfg.lr, cfg.warmup_ratio, 1),
        };
        looper.total_steps = match cfg.steps {
            Some(n) => n,
            None => {
                let mut n = 0;
                for epoch in 0..u64::from(cfg.epochs) {
                    n += looper.planner(epoch)?.plan().steps.len() as u64;
                }
                n
            }
        };
        looper.schedule = CosineSchedule::new(1.0, cfg.warmup_ratio, looper.total_steps);
        Ok(looper)
    }

    fn planner(&self, epoch: u64) -> Result<Planner, TrainError> {
        Ok(Planner::builder()
            .samples(&self.s.samples)
            .image_tokens(self.s.vlm.vision.num_patches() as u32)
            .world_size(self.s.world_size)
            .token_budget(self.cfg.token_budget as u64)
            .seq_len(self.cfg.seq_len as u64)
            .micro_steps(self.cfg.micro_steps)
            .seed(self.cfg.seed)
            .epoch(epoch)
            .fingerprint(self.s.dataset.fingerprint())
            .only(planned_kind(self.cfg.stage))
            .build()?)
    }

    /// With `resume`: loads the latest complete checkpoint after checking it belongs to this run.
    fn restore(&mut self, resume: bool, engine: &mut dyn Engine) -> Result<Start, TrainError> {
        let fresh = Start {
            step: 0,
            position: None,
        };
        if !resume {
            return Ok(fresh);
        }
        let Some(ckpt) = Checkpoint::latest(&self.cfg.out)? else {
            tracing::warn!(
                "--resume: no complete checkpoint under {}/checkpoints; starting at step 0",
                self.cfg.out.display()
            );
            return Ok(fresh);
        };
        ckpt.check_matches(&Expected {
            world_size: self.s.world_size,
            stage: self.cfg.stage.into(),
            model: &self.s.model_fingerprint,
            data_fingerprint: self.s.dataset.fingerprint(),
        })?;
        let state = ckpt.rank_state(self.s.rank)?;
        let position: Position = serde_json::from_value(state.planner.clone()).map_err(|e| {
            TrainError::Invalid(format!(
                "checkpoint {} rank {}: planner position is unreadable: {e}",
                ckpt.dir.display(),
                self.s.rank
            ))
        })?;
        engine.load(&ckpt.rank_dir(self.s.rank)?, ckpt.meta.step)?;
        tracing::info!(
            "resumed from {} (step {})",
            ckpt.dir.display(),
            ckpt.meta.step
        );
        Ok(Start {
            step: ckpt.meta.step,
            position: Some(position),
        })
    }

    fn run(&mut self, engine: &mut dyn Engine, start: Start) -> Result<(), TrainError> {
        let (cfg, s) = (self.cfg, self.s);
        let resume_step = (start.step > 0).then_some(start.step);
        let mut writer = if s.rank == 0 {
            Some(MetricsWriter::open(
                &cfg.out.join("metrics.jsonl"),
                resume_step.or(Some(0)),
            )?)
        } else {
            None
        };
        let progress = Progress::new(self.total_steps);
        let mut step = start.step;
        let mut position = start.position;
        let mut epoch = position.as_ref().map_or(0, |p| p.epoch);
        while step < self.total_steps {
            let planner = self.planner(epoch)?;
            let plan: Plan = match position.take() {
                Some(p) if p.epoch == epoch => planner.plan_from(&p)?,
                _ => planner.plan(),
            };
            if plan.steps.is_empty() {
                if plan.stats.samples == 0 && plan.end.step == 0 {
                    return Err(TrainError::Invalid(format!("epoch {epoch} plans no steps")));
                }
                epoch += 1;
                continue;
            }
            let todo = ((self.total_steps - step) as usize).min(plan.steps.len());
            let mine: Vec<_> = plan.steps[..todo]
                .iter()
                .flat_map(|st| st.for_rank(s.rank).cloned())
                .collect();
            let source: Arc<dyn SampleSource> = s.dataset.clone();
            let mut loader = Loader::new(source, mine, self.loader_cfg.clone());
            for (i, plan_step) in plan.steps[..todo].iter().enumerate() {
                let m = self.one_step(engine, &mut loader, plan_step, step)?;
                if let Some(w) = writer.as_mut() {
                    w.append(&m)?;
                    progress.show(&m);
                }
                step += 1;
                let due = cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0;
                if due || step == self.total_steps {
                    self.checkpoint(engine, step, &plan.resume_position(i + 1)?)?;
                }
            }
            epoch += 1;
        }
        Ok(())
    }

    fn one_step(
        &self,
        engine: &mut dyn Engine,
        loader: &mut Loader,
        plan_step: &Step,
        step: u64,
    ) -> Result<StepMetrics, TrainError> {
        let s = self.s;
        tch::manual_seed(step_seed(self.cfg.seed, step, s.rank));
        let started = Instant::now();
        let divisor = plan_step.supervised_tokens.max(1) as f64;
        let mut times = UnitTimes::new();
        let mut wait = 0.0;
        let mut local = [0.0f64; 5]; // loss sum, tokens, real tokens, images, supervised
        for _ in 0..plan_step.micro_steps.len() {
            let t = Instant::now();
            let mb = loader.next().ok_or_else(|| {
                TrainError::Invalid(format!("step {step}: the loader ended before the plan did"))
            })??;
            wait += t.elapsed().as_secs_f64();
            local[0] += engine.forward_backward(&mb, 1.0 / divisor, &mut times)?;
            local[1] += (mb.rows * mb.row_len) as f64;
            local[2] += mb.real_tokens as f64;
            local[3] += mb.num_images as f64;
            local[4] += mb.supervised_tokens as f64;
        }
        let compute = started.elapsed().as_secs_f64() - wait;
        let lr_factor = self.schedule.factor(step);
        let t = Instant::now();
        let grad_norm = engine.optimizer_step(lr_factor, self.cfg.grad_clip)?;
        times.insert("optimizer".into(), t.elapsed().as_secs_f64());
        let mut totals = Tensor::from_slice(&local);
        let mut computes =
            Tensor::zeros([s.world_size as i64], (tch::Kind::Double, tch::Device::Cpu));
        if s.world_size > 1 {
            s.pg.all_reduce_sum(&mut totals, "step metrics")?.wait()?;
            s.pg.all_gather_into(
                &mut computes,
                &Tensor::from_slice(&[compute]),
                "step metrics",
            )?
            .wait()?;
        } else {
            computes = Tensor::from_slice(&[compute]);
        }
        let totals: Vec<f64> = Vec::try_from(&totals).map_err(TrainError::Torch)?;
        let computes: Vec<f64> = Vec::try_from(&computes).map_err(TrainError::Torch)?;
        let mean_compute = computes.iter().sum::<f64>() / computes.len() as f64;
        let max_compute = computes.iter().copied().fold(0.0, f64::max);
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        Ok(StepMetrics {
            step,
            loss: totals[0] / divisor,
            lr: self.cfg.lr * lr_factor,
            grad_norm,
            tokens_per_s: totals[1] / secs,
            real_tokens_per_s: totals[2] / secs,
            images_per_s: totals[3] / secs,
            loader_wait_frac: wait / secs,
            imbalance: if mean_compute > 0.0 {
                max_compute / mean_compute
            } else {
                1.0
            },
            step_time_s: secs,
            tokens: totals[1] as u64,
            real_tokens: totals[2] as u64,
            supervised_tokens: totals[4] as u64,
            images: totals[3] as u64,
            unit_time_s: times,
            rss_mib: metrics::rss_mib(),
        })
    }

    /// Every rank writes its folder; after a barrier rank 0 commits; a second barrier keeps
    /// ranks from racing ahead of the commit.
    fn checkpoint(
        &self,
        engine: &mut dyn Engine,
        step: u64,
        next: &Position,
    ) -> Result<(), TrainError> {
        let (cfg, s) = (self.cfg, self.s);
        let writer = CheckpointWriter::begin(&cfg.out, step, s.rank)?;
        engine.save(writer.dir())?;
        let trainable = engine.trainable()?;
        if s.rank == 0 && !writer.dir().join(TRAINABLE_FILE).is_file() {
            weights::save(&writer.dir().join(TRAINABLE_FILE), &trainable)?;
        }
        let planner = serde_json::to_value(next).map_err(|e| TrainError::Invalid(e.to_string()))?;
        writer.finish_rank(&RankState {
            rank: s.rank,
            next_step: step,
            planner,
            seed: cfg.seed,
        })?;
        s.pg.barrier("checkpoint write")?;
        if s.rank == 0 {
            let config =
                serde_json::to_value(cfg).map_err(|e| TrainError::Invalid(e.to_string()))?;
            let dir = writer.commit(&CheckpointMeta {
                format_version: FORMAT_VERSION,
                step,
                world_size: s.world_size,
                strategy: format!("{:?}", cfg.strategy),
                stage: cfg.stage.into(),
                model: s.model_fingerprint.clone(),
                data_fingerprint: s.dataset.fingerprint().to_string(),
                config,
            })?;
            tracing::info!("checkpoint {}", dir.display());
        }
        s.pg.barrier("checkpoint commit")?;
        Ok(())
    }
}

/// Torch's generator seed for a rank's step: a pure function, so a resumed step draws exactly
/// what the uninterrupted run drew.
fn step_seed(seed: u64, step: u64, rank: usize) -> i64 {
    let mut x = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    (x & 0x7FFF_FFFF_FFFF_FFFF) as i64
}
