//! The training loop. Per rank: join the job, load the model, pick up the latest checkpoint
//! (`--resume`), then for every optimizer step run its G micro-batches (each rank its own, all
//! ranks the same kind), scale each micro-batch's summed token loss by 1 / (supervised tokens
//! of the whole step across ranks), all-reduce, clip, AdamW, log, checkpoint.
use super::checkpoint::{
    self, Checkpoint, CheckpointMeta, CheckpointWriter, Expected, RankState, FORMAT_VERSION,
};
use super::config::{Dtype, Stage, TrainConfig};
use super::error::{io, TrainError};
use super::export::{VlmDescription, TRAINABLE_FILE, VLM_FILE};
use super::metrics::{self, MetricsWriter, Progress, StepMetrics, Summary};
use super::plot::plot_loss;
use super::run_dir::{self, RunStart};
use super::schedule::CosineSchedule;
use super::setup::{self, Setup};
use super::step::{ShardedVlm, StepTotals, UnitTimes};
use crate::dist::RankEnv;
use crate::model::save_safetensors;
use pipeline::loader::{Loader, LoaderConfig, SampleSource};
use pipeline::plan::{Plan, Planner, Position, Step};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use tch::Tensor;

/// Trains one rank. Rank 0 returns the run's summary; other ranks return `None`.
pub fn train(
    cfg: &TrainConfig,
    env: Option<RankEnv>,
    start: &RunStart,
) -> Result<Option<Summary>, TrainError> {
    let mut cfg = cfg.clone();
    if let Some(env) = &env {
        cfg.nproc = env.world_size;
    }
    // Rank 0 alone, before joining the job: no other rank writes into --out until then.
    if env.as_ref().is_none_or(|e| e.rank == 0) {
        run_dir::prepare(&cfg.out, start)?;
    }
    std::fs::create_dir_all(&cfg.out).map_err(io(&cfg.out))?;
    let pg = setup::process_group(&cfg, env.as_ref())?;
    let mut s = setup::build(&cfg, pg)?;
    // The sharded model copies what it keeps (its shards); the full tensors go as soon as it
    // exists.
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
    let mut model = ShardedVlm::new(&cfg, &s.vlm, &s.pg, &params, s.device)?;
    drop(params);
    let mut train_loop = TrainLoop::new(&cfg, &s)?;
    let first = train_loop.restore(start, &mut model)?;
    train_loop.run(&mut model, first)?;
    drop(model);
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

/// The loop over optimizer steps: plans each epoch, feeds each step's micro-batches to the
/// model, logs and checkpoints.
struct TrainLoop<'a> {
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

impl<'a> TrainLoop<'a> {
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
            .resize(cfg.resize)
            .threads(cfg.loader_threads)
            .on_bad_image(cfg.on_bad_image)
            .build()?;
        let mut train_loop = TrainLoop {
            cfg,
            s,
            loader_cfg,
            total_steps: 0,
            schedule: CosineSchedule::new(cfg.lr, cfg.warmup_ratio, 1),
        };
        train_loop.total_steps = match cfg.steps {
            Some(n) => n,
            None => {
                let mut n = 0;
                for epoch in 0..u64::from(cfg.epochs) {
                    n += train_loop.planner(epoch)?.plan().steps.len() as u64;
                }
                n
            }
        };
        train_loop.schedule = CosineSchedule::new(cfg.lr, cfg.warmup_ratio, train_loop.total_steps);
        Ok(train_loop)
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

    /// What a resume must match: everything that changes the math. The frozen weights are
    /// named by the model directories' fingerprints (a checkpoint does not store them).
    fn run_record(&self) -> BTreeMap<String, String> {
        let (cfg, s) = (self.cfg, self.s);
        let m = &s.model_fingerprint;
        let mut r = BTreeMap::new();
        let mut put = |key: &str, value: String| r.insert(key.to_string(), value);
        put("vision_config", m.vision_config.clone());
        put("vision_weights", m.vision_weights.clone());
        put("lm_config", m.lm_config.clone());
        put("lm_weights", m.lm_weights.clone());
        put("shards", s.dataset.fingerprint().to_string());
        put("stage", (cfg.stage as u8).to_string());
        put("lr", cfg.lr.to_string());
        put("projector_lr", cfg.projector_lr.to_string());
        put("warmup_ratio", cfg.warmup_ratio.to_string());
        put("weight_decay", cfg.weight_decay.to_string());
        put("grad_clip", cfg.grad_clip.to_string());
        put("total_steps", self.total_steps.to_string());
        put("token_budget", cfg.token_budget.to_string());
        put("seq_len", cfg.seq_len.to_string());
        put("micro_steps", cfg.micro_steps.to_string());
        put("seed", cfg.seed.to_string());
        put("image_size", s.vlm.vision.image_size.to_string());
        put("resize", format!("{:?}", cfg.resize).to_lowercase());
        // Recorded only when not f32, so runs from before the knob existed still resume.
        if cfg.precision != Dtype::F32 {
            put("precision", cfg.precision.name().into());
            put("reduce_dtype", cfg.reduce_dtype.name().into());
        }
        if cfg.stage == Stage::Finetune {
            put("lora_r", cfg.lora_r.to_string());
            put("lora_alpha", cfg.lora_alpha.to_string());
        }
        r
    }

    /// With `--resume`: loads the latest complete checkpoint after checking it belongs to this
    /// run (format, world size, parameter set, run record).
    fn restore(&mut self, start: &RunStart, model: &mut ShardedVlm) -> Result<Start, TrainError> {
        let fresh = Start {
            step: 0,
            position: None,
        };
        if !start.resume {
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
            model: &self.s.model_fingerprint,
            run: &self.run_record(),
            allow_changing: &start.resume_changing,
        })?;
        let state = ckpt.rank_state(self.s.rank)?;
        let position: Position = serde_json::from_value(state.planner.clone()).map_err(|e| {
            TrainError::Invalid(format!(
                "checkpoint {} rank {}: planner position is unreadable: {e}",
                ckpt.dir.display(),
                self.s.rank
            ))
        })?;
        model.load(&ckpt.rank_dir(self.s.rank)?)?;
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

    fn run(&mut self, model: &mut ShardedVlm, start: Start) -> Result<(), TrainError> {
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
                let m = self.one_step(model, &mut loader, plan_step, step)?;
                if let Some(w) = writer.as_mut() {
                    w.append(&m)?;
                    progress.show(&m);
                }
                step += 1;
                let due = cfg.checkpoint_every > 0 && step.is_multiple_of(cfg.checkpoint_every);
                if due || step == self.total_steps {
                    self.checkpoint(model, step, &plan.resume_position(i + 1)?)?;
                }
            }
            epoch += 1;
        }
        Ok(())
    }

    fn one_step(
        &self,
        model: &mut ShardedVlm,
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
        let mut local = StepTotals::default();
        for _ in 0..plan_step.micro_steps.len() {
            let t = Instant::now();
            let mb = loader.next().ok_or_else(|| {
                TrainError::Invalid(format!("step {step}: the loader ended before the plan did"))
            })??;
            wait += t.elapsed().as_secs_f64();
            local.loss_sum += model.forward_backward(&mb, 1.0 / divisor, &mut times)?;
            local.add_batch(&mb);
        }
        let compute = started.elapsed().as_secs_f64() - wait;
        let lr_factor = self.schedule.factor(step);
        let t = Instant::now();
        let grad_norm = model.optimizer_step(lr_factor)?;
        times.insert("optimizer".into(), t.elapsed().as_secs_f64());
        let mut totals = Tensor::from_slice(&local.to_array());
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
        let totals: Vec<f64> = Vec::try_from(&totals)?;
        let totals = StepTotals::from_slice(&totals);
        let computes: Vec<f64> = Vec::try_from(&computes)?;
        let mean_compute = computes.iter().sum::<f64>() / computes.len() as f64;
        let max_compute = computes.iter().copied().fold(0.0, f64::max);
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        Ok(StepMetrics {
            step,
            loss: totals.loss_sum / divisor,
            lr: self.schedule.lr(step),
            grad_norm,
            tokens_per_s: totals.tokens / secs,
            real_tokens_per_s: totals.real_tokens / secs,
            images_per_s: totals.images / secs,
            loader_wait_frac: wait / secs,
            imbalance: if mean_compute > 0.0 {
                max_compute / mean_compute
            } else {
                1.0
            },
            step_time_s: secs,
            tokens: totals.tokens as u64,
            real_tokens: totals.real_tokens as u64,
            supervised_tokens: totals.supervised_tokens as u64,
            images: totals.images as u64,
            unit_time_s: times,
            rss_mib: metrics::rss_mib(),
        })
    }

    /// Every rank writes its folder; after a barrier rank 0 commits; a second barrier keeps
    /// ranks from racing ahead of the commit.
    fn checkpoint(
        &self,
        model: &mut ShardedVlm,
        step: u64,
        next: &Position,
    ) -> Result<(), TrainError> {
        let (cfg, s) = (self.cfg, self.s);
        let writer = CheckpointWriter::begin(&cfg.out, step, s.rank)?;
        model.save(writer.dir())?;
        let trainable = model.trainable()?;
        if s.rank == 0 && !writer.dir().join(TRAINABLE_FILE).is_file() {
            save_safetensors(&writer.dir().join(TRAINABLE_FILE), &trainable)?;
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
                run: self.run_record(),
            })?;
            tracing::info!("checkpoint {}", dir.display());
            let removed = checkpoint::prune(&cfg.out, cfg.keep_checkpoints, cfg.keep_every)?;
            if !removed.is_empty() {
                tracing::debug!("removed the checkpoints of steps {removed:?}");
            }
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
