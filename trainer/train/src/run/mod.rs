//! The training loop. Per rank: join the job, load the model, pick up where the run stopped
//! (`--resume`: the newest complete checkpoint, at any world size), then for every optimizer
//! step run its G micro-batches (each rank its own, all ranks the same kind; `rank_plan.rs` maps
//! the plan's ranks onto this run's), scale each micro-batch's summed token loss by
//! 1 / (supervised tokens of the whole step across ranks), all-reduce, clip, AdamW, log the
//! step (`metrics.jsonl`) and its samples (`plan.jsonl`), validate (`validate.rs`), checkpoint.
pub(crate) mod cpu_gemm;
mod feature_stats;
mod memory_estimate;
pub(crate) mod rank_plan;
mod recompute_choice;
pub(crate) mod restore;
pub(crate) mod schedule;
pub(crate) mod setup;
pub(crate) mod sharded_vlm;
pub(crate) mod start;
pub(crate) mod validate;

use crate::checkpoint::format::{CheckpointMeta, RankState, FORMAT_VERSION};
use crate::checkpoint::room;
use crate::checkpoint::save::CheckpointSaver;
use crate::config::{Stage, TrainConfig};
use crate::error::{io, TrainError};
use crate::report::event_file::EventFile;
use crate::report::metrics::{self, MoeMetrics, PerRank, Progress, StepLog, StepMetrics, Summary};
use crate::report::plot::{plot_loss, Losses};
use crate::report::profile::Profiler;
use crate::report::tensorboard;
use crate::run::rank_plan::{step_samples, RankLayout};
use crate::run::schedule::CosineSchedule;
use crate::run::sharded_vlm::{Groups, ShardedVlm, StepTotals, UnitTimes};
use crate::run::validate::Validation;
use crate::run_dir::RunDir;
use crate::vlm_description::VlmDescription;
use restore::Start;
use setup::Setup;
use start::RunStart;
use std::sync::Arc;
use std::time::Instant;
use tch::Tensor;
use tessera_fsdp::dist::{Liveness, RankEnv};
use tessera_model::CpuBf16Gemm;
use tessera_pipeline::loader::{Loader, LoaderConfig, SampleSource};
use tessera_pipeline::plan::{Plan, Planner, Position, Step};

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
        start::prepare(&cfg.out, start)?;
    }
    std::fs::create_dir_all(&cfg.out).map_err(io(&cfg.out))?;
    let pg = setup::process_group(&cfg, env.as_ref())?;
    let liveness = match env.as_ref().filter(|e| e.world_size > 1) {
        Some(env) => {
            let timeout = std::time::Duration::from_secs(cfg.heartbeat_timeout_s);
            Some(Liveness::start(env, timeout)?)
        }
        None => None,
    };
    let mesh = match env.as_ref().filter(|_| cfg.strategy.is_hybrid()) {
        Some(env) => Some(setup::hybrid_mesh(&cfg, env, &pg)?),
        None => None,
    };
    let experts = setup::expert_mesh(&cfg, env.as_ref(), &pg)?;
    match train_rank(&cfg, pg, mesh, experts, start) {
        Ok(summary) => {
            // Trained to the end: the other ranks stop watching this one's heartbeat.
            if let Some(liveness) = liveness {
                liveness.finish();
            }
            Ok(summary)
        }
        Err(e) => Err(name_lost_ranks(e, liveness.as_ref())),
    }
}

/// A collective that failed because peers died (gloo: "Connection closed by peer") says which
/// ranks are gone: the ranks whose heartbeat stopped.
fn name_lost_ranks(e: TrainError, liveness: Option<&Liveness>) -> TrainError {
    let collective = is_collective_failure(&e);
    match liveness.filter(|_| collective) {
        Some(liveness) => match liveness.silent_ranks() {
            ranks if ranks.is_empty() => e,
            ranks => TrainError::RanksLost {
                ranks,
                source: Box::new(e),
            },
        },
        None => e,
    }
}

/// Whether `e` is a failed collective: FSDP's own, or one inside a unit's forward or backward
/// (expert parallelism's all-to-all, whose backward failure comes back through libtorch's
/// backward as its message).
fn is_collective_failure(e: &TrainError) -> bool {
    use tessera_fsdp::{ComputeError, FsdpError};
    match e {
        TrainError::Dist(_) | TrainError::Fsdp(FsdpError::Dist(_)) => true,
        TrainError::Fsdp(FsdpError::Compute { source, .. }) => match source {
            ComputeError::Collective(_) => true,
            ComputeError::Torch(t) => t.to_string().contains("all-to-all"),
            ComputeError::Shim(_) | ComputeError::MissingParam { .. } => false,
        },
        _ => false,
    }
}

/// Everything a rank does once it has joined the job.
fn train_rank(
    cfg: &TrainConfig,
    pg: tessera_fsdp::dist::ProcessGroup,
    mesh: Option<tessera_fsdp::dist::Mesh>,
    experts: Option<tessera_fsdp::dist::ExpertMesh>,
    start: &RunStart,
) -> Result<Option<Summary>, TrainError> {
    let cfg = cfg.clone();
    setup::check_shared_run_dir(&cfg.out, &pg)?;
    // The sharded model reads from the checkpoints only the slices its shards keep.
    let (s, init) = setup::build(&cfg, start.resume, pg, mesh, experts)?;
    let run = RunDir::new(&cfg.out);
    if s.rank == 0 {
        let vlm_desc = VlmDescription::new(&cfg, &s.vlm, s.data.manifest());
        vlm_desc.save(&run.vlm())?;
        run.keep_tokenizer(s.data.first())?;
        s.data.log_mixture();
    }
    let groups = Groups {
        pg: &s.pg,
        mesh: s.mesh.as_ref(),
        expert_replicas: s.expert_replicas.as_ref(),
    };
    let mut model = ShardedVlm::new(&cfg, &s.vlm, groups, &init, s.device)?;
    tracing::info!(
        "rank {}: shards built from {} MiB of checkpoint reads; peak RSS so far {:.0} MiB",
        s.rank,
        init.bytes_read() >> 20,
        metrics::peak_rss_mib()
    );
    drop(init);
    let held = model.training_state_bytes();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    tracing::info!(
        "rank {}: training state {:.1} MiB (trained {}: masters {:.1}, gradients {:.1}, AdamW \
         moments {:.1}; {:?} over {} ranks); frozen and trained parameters at rest {:.1} MiB",
        s.rank,
        mib(held.trainable_param_bytes + held.grad_bytes + held.optimizer_bytes),
        cfg.train,
        mib(held.trainable_param_bytes),
        mib(held.grad_bytes),
        mib(held.optimizer_bytes),
        cfg.strategy,
        s.world_size,
        mib(held.param_bytes),
    );
    let pick = if start.resume {
        Some(run.newest_complete_checkpoint()?)
    } else {
        None
    };
    let resumed = pick.as_ref().and_then(|p| p.checkpoint.as_ref());
    let plan_world_size = resumed.map_or(s.world_size, |c| c.meta.plan_world_size);
    let settled = Settled {
        cpu_gemm: cpu_gemm::settle(&cfg, &s, resumed)?,
        recompute: recompute_choice::settle(&cfg, &s, &mut model, resumed)?,
    };
    let mut train_loop = TrainLoop::new(&cfg, &s, plan_world_size, settled)?;
    let first = train_loop.restore(pick, start, &mut model)?;
    train_loop.run(&mut model, first, start.progress)?;
    drop(model);
    if s.rank != 0 {
        return Ok(None);
    }
    let steps = metrics::read_metrics(&run.metrics())?;
    let mut summary = Summary::from_steps(&steps);
    if let Some(summary) = summary.as_mut() {
        summary.skipped_over_long = std::fs::read_to_string(run.skipped()).map_or(0, |t| {
            t.lines().filter(|l| !l.trim().is_empty()).count() as u64
        });
    }
    if let Some(summary) = &summary {
        let path = run.summary();
        let text = serde_json::to_string_pretty(summary).map_err(|source| TrainError::Json {
            what: path.display().to_string(),
            source,
        })?;
        tessera_shards::write_atomically(&path, text.as_bytes())?;
        plot_loss(&Losses::from_steps(&steps), &run.loss_plot())?;
    }
    Ok(summary)
}

/// The loop over optimizer steps: plans each epoch, feeds each step's micro-batches to the
/// model, logs and checkpoints.
struct TrainLoop<'a> {
    cfg: &'a TrainConfig,
    s: &'a Setup,
    run: RunDir,
    loader_cfg: LoaderConfig,
    total_steps: u64,
    schedule: CosineSchedule,
    layout: RankLayout,
    validation: Option<Validation>,
    saver: CheckpointSaver,
    /// What the run chose before its first step and keeps in its run record.
    settled: Settled,
}

/// Choices a run makes before its first step and a resume keeps (both `None` for a resume
/// of a run from before it recorded them).
struct Settled {
    /// A bf16 CPU run's matrix-product kernels (`cpu_gemm.rs`).
    cpu_gemm: Option<CpuBf16Gemm>,
    /// The recompute policy (`recompute_choice.rs`).
    recompute: Option<tessera_fsdp::Recompute>,
}

/// Stage 1 trains only the projector, which text-only samples never reach: it plans image
/// samples alone (LLaVA's stage 1 data has no text-only samples either).
fn planned_kind(stage: Stage) -> Option<tessera_shards::Kind> {
    (stage == Stage::Align).then_some(tessera_shards::Kind::Image)
}

/// What one rank's micro-batches of a step summed, before the ranks reduce it.
struct LocalStep {
    totals: StepTotals,
    /// A mixture's loss by source: each source's summed token loss, then its token count.
    by_source: Vec<f64>,
    /// An MoE LM's balance loss (each micro-batch's weighs coef / all micro-batches of the
    /// step) and its sparse layers' expert loads ([`moe_len`]).
    moe: Vec<f64>,
    times: UnitTimes,
    /// Seconds spent waiting for the loader.
    wait: f64,
}

impl LocalStep {
    fn add_router(&mut self, router: &tessera_model::RouterStats) {
        add_router(&mut self.moe, router);
        // Inside lm_layers' time: what the sparse blocks took of it (CPU).
        *self.times.entry("moe_router_dispatch".into()).or_default() += router.router_s;
        *self.times.entry("moe_experts".into()).or_default() += router.experts_s;
        if router.exchange_s > 0.0 {
            *self.times.entry("moe_all_to_all".into()).or_default() += router.exchange_s;
        }
    }
}

/// A step's totals over every rank, and each rank's compute, loader wait and peak RSS.
struct Reduced {
    totals: StepTotals,
    loss_by_source: std::collections::BTreeMap<String, f64>,
    moe: Option<MoeMetrics>,
    computes: Vec<f64>,
    waits: Vec<f64>,
    peak_rss_mib: Vec<f64>,
}

/// What [`TrainLoop::run`] carries from step to step.
struct RunState {
    logs: RunLogs,
    progress: Progress,
    /// The step this (re)start began at.
    first_step: u64,
    /// The next step to train.
    step: u64,
    /// Failed object-store requests already counted in a step's metrics.
    retried: u64,
    /// Running from the first step through `--profile` steps.
    profiler: Option<Profiler>,
}

/// Rank 0's per-step logs; other ranks keep none. Each drops any line of a step this run
/// (re)does.
struct RunLogs {
    metrics: Option<StepLog<StepMetrics>>,
    /// The same scalars for TensorBoard: a new event file per (re)start, which tells readers
    /// to drop an earlier file's steps from its first step on.
    events: Option<EventFile>,
    /// The samples each step trains on, for audits (same truncation on resume).
    plan: Option<StepLog<PlannedStep>>,
}

impl RunLogs {
    fn open(rank: usize, run: &RunDir, start_step: u64) -> Result<RunLogs, TrainError> {
        if rank != 0 {
            return Ok(RunLogs {
                metrics: None,
                events: None,
                plan: None,
            });
        }
        let resume_step = Some(start_step);
        let metrics = StepLog::open(&run.metrics(), resume_step)?;
        let events = EventFile::create(run.path(), start_step)?;
        tracing::debug!("TensorBoard events: {}", events.path().display());
        Ok(RunLogs {
            metrics: Some(metrics),
            events: Some(events),
            plan: Some(StepLog::open(&run.plan(), resume_step)?),
        })
    }

    /// Step `m.step`'s metrics (also shown on the progress bar), scalars and samples.
    fn append(
        &mut self,
        m: &StepMetrics,
        plan_step: &Step,
        progress: &Progress,
    ) -> Result<(), TrainError> {
        if let Some(log) = self.metrics.as_mut() {
            log.append(m)?;
            progress.show(m);
        }
        if let Some(events) = self.events.as_mut() {
            events.scalars(m.step, &tensorboard::scalars(m))?;
        }
        if let Some(log) = self.plan.as_mut() {
            log.append(&PlannedStep {
                step: m.step,
                samples: step_samples(plan_step),
            })?;
        }
        Ok(())
    }
}

impl<'a> TrainLoop<'a> {
    /// `plan_world_size`: the ranks the data plan is laid out for (this run's W, or the one
    /// the resumed run started with).
    fn new(
        cfg: &'a TrainConfig,
        s: &'a Setup,
        plan_world_size: usize,
        settled: Settled,
    ) -> Result<Self, TrainError> {
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
            .image_layout(cfg.image_layout.clone(), s.vlm.vision.patch_size as u32)
            .tokens(&s.data.manifest().special_tokens())
            .resize(cfg.resize)
            .threads(cfg.loader_threads)
            .on_bad_image(cfg.on_bad_image)
            .build()?;
        let validation = Validation::new(cfg, s, &loader_cfg, planned_kind(cfg.stage))?;
        if let (Some(v), 0) = (&validation, s.rank) {
            tracing::info!(
                "validation: {} samples of {}, every {} steps and at the end",
                v.samples,
                cfg.val_shards
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display(),
                cfg.val_every
            );
        }
        let mut train_loop = TrainLoop {
            cfg,
            s,
            run: RunDir::new(&cfg.out),
            loader_cfg,
            total_steps: 0,
            schedule: CosineSchedule::new(cfg.lr, cfg.warmup_ratio, 1),
            layout: RankLayout {
                plan_world_size,
                world_size: s.world_size,
                rank: s.rank,
            },
            validation,
            saver: CheckpointSaver::new(cfg),
            settled,
        };
        train_loop.total_steps = match cfg.steps {
            // Planned once anyway: a dataset the plan refuses (an over-long sample under
            // --over-long fail) stops here, before the run's logs are opened.
            Some(n) => train_loop.planner(0).map(|_| n)?,
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
        let builder = match self.s.data.draw(self.cfg.seed, epoch) {
            Some(draw) => Planner::builder().draws(draw.items, &draw.key),
            None => Planner::builder(),
        };
        let builder = match &self.s.images {
            Some(images) => builder.sample_images(images.clone()),
            None => builder,
        };
        builder
            .samples(&self.s.samples)
            .image_tokens(self.s.vlm.vision.num_patches() as u32)
            .world_size(self.layout.plan_world_size)
            .token_budget(self.cfg.token_budget as u64)
            .seq_len(self.cfg.seq_len as u64)
            .micro_steps(self.cfg.micro_steps)
            .seed(self.cfg.seed)
            .epoch(epoch)
            .fingerprint(self.s.data.fingerprint())
            .only(planned_kind(self.cfg.stage))
            .over_long(self.cfg.over_long)
            .build()
            .map_err(|e| self.name_sample(e))
    }

    /// A planner error about one sample, said with the sample's id and where it is stored
    /// (the planner knows only its index).
    fn name_sample(&self, e: tessera_pipeline::plan::PlanError) -> TrainError {
        let tessera_pipeline::plan::PlanError::SampleTooLong {
            index,
            len,
            limit,
            limit_name,
        } = e
        else {
            return e.into();
        };
        TrainError::Invalid(format!(
            "sample {} ({}): {len} tokens exceed the {limit_name} ({limit}); over-long samples \
             are never truncated: --over-long skip (the default) leaves them out and lists them \
             in skipped.jsonl, `ingest --max-tokens` rejects them at ingest",
            self.sample_id(index),
            self.s.data.source().locate(index)
        ))
    }

    /// Sample `index`'s id, as its shard stores it (its index when it cannot be read).
    fn sample_id(&self, index: u64) -> String {
        match self.s.data.source().read(&[index]) {
            Ok(mut samples) if !samples.is_empty() => samples.swap_remove(0).id,
            _ => format!("#{index}"),
        }
    }

    /// Rank 0: `skipped.jsonl` lists the samples the plan leaves out for their length (id,
    /// where it is stored, tokens, the row limit), and the log counts them.
    fn report_skipped(&self, planner: &Planner) -> Result<usize, TrainError> {
        let skipped = planner.skipped();
        if self.s.rank != 0 || skipped.is_empty() {
            return Ok(skipped.len());
        }
        let mut text = String::new();
        for s in skipped {
            let line = serde_json::json!({
                "id": self.sample_id(s.index),
                "index": s.index,
                "location": self.s.data.source().locate(s.index),
                "tokens": s.tokens,
                "limit": s.limit,
            });
            text.push_str(&line.to_string());
            text.push('\n');
        }
        tessera_shards::write_atomically(&self.run.skipped(), text.as_bytes())?;
        tracing::warn!(
            "{} sample(s) longer than a row ({} tokens) are left out of every epoch (--over-long \
             skip): {}",
            skipped.len(),
            skipped[0].limit,
            self.run.skipped().display()
        );
        Ok(skipped.len())
    }

    /// `progress`: [`RunStart::progress`].
    fn run(
        &mut self,
        model: &mut ShardedVlm,
        start: Start,
        progress: bool,
    ) -> Result<(), TrainError> {
        let mut run = RunState {
            logs: RunLogs::open(self.s.rank, &self.run, start.step)?,
            progress: Progress::new(self.total_steps, progress),
            first_step: start.step,
            step: start.step,
            retried: 0,
            profiler: None,
        };
        if self.s.rank == 0 && start.step < self.total_steps {
            self.warn_if_no_room(model, start.step);
        }
        let mut position = start.position;
        let mut epoch = position.as_ref().map_or(0, |p| p.epoch);
        let mut reported = false;
        while run.step < self.total_steps {
            let planner = self.planner(epoch)?;
            if !reported {
                self.report_skipped(&planner)?;
                reported = true;
            }
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
            self.run_plan(model, &plan, &mut run)?;
            epoch += 1;
        }
        self.log_store_attempts();
        self.saver.finish(&self.run, &self.s.writer_ranks())
    }

    /// Said before the steps up to the first checkpoint are spent: whether `--out` has room
    /// for it.
    fn warn_if_no_room(&self, model: &ShardedVlm, start_step: u64) {
        let first = match self.cfg.checkpoint_every {
            0 => self.total_steps,
            n => ((start_step / n + 1) * n).min(self.total_steps),
        };
        room::warn_if_no_room(&self.run, first, model.checkpoint_bytes());
    }

    /// The steps of one epoch's `plan` this run still owes, each logged and checkpointed when
    /// due.
    fn run_plan(
        &mut self,
        model: &mut ShardedVlm,
        plan: &Plan,
        run: &mut RunState,
    ) -> Result<(), TrainError> {
        let (cfg, s) = (self.cfg, self.s);
        let todo = ((self.total_steps - run.step) as usize).min(plan.steps.len());
        let mine: Vec<_> = plan.steps[..todo]
            .iter()
            .flat_map(|st| self.layout.batches(st))
            .collect();
        let source: Arc<dyn SampleSource> = s.data.source();
        let mut loader = Loader::new(source, mine, self.loader_cfg.clone());
        for (i, plan_step) in plan.steps[..todo].iter().enumerate() {
            let step = run.step;
            if step == run.first_step && cfg.profile > 0 {
                run.profiler = Some(Profiler::start(s.device.is_cuda())?);
            }
            let mut m = self.one_step(model, &mut loader, plan_step, step)?;
            m.store_retries = self.store_failures() - run.retried;
            run.retried += m.store_retries;
            self.save_profile_if_done(run)?;
            let last = step + 1 == self.total_steps;
            let due = cfg.val_every > 0 && (step + 1).is_multiple_of(cfg.val_every);
            if let Some(v) = self.validation.as_ref().filter(|_| due || last) {
                let val_loss = v.loss(model, s)?;
                tracing::info!(
                    "step {step}: val_loss {val_loss:.6} ({} samples)",
                    v.samples
                );
                m.val_loss = Some(val_loss);
            }
            run.logs.append(&m, plan_step, &run.progress)?;
            run.step += 1;
            let due = cfg.checkpoint_every > 0 && run.step.is_multiple_of(cfg.checkpoint_every);
            if due || run.step == self.total_steps {
                self.checkpoint(model, run.step, &plan.resume_position(i + 1)?)?;
            } else {
                self.saver.poll(&self.run, &s.writer_ranks())?;
            }
        }
        Ok(())
    }

    /// Failed object-store requests so far, over every store this rank reads.
    fn store_failures(&self) -> u64 {
        self.s.stores.iter().map(|f| f.attempts().failed()).sum()
    }

    /// After `--profile` steps (or the run's last), the profile goes to its file.
    fn save_profile_if_done(&self, run: &mut RunState) -> Result<(), TrainError> {
        let (profile, step) = (self.cfg.profile, run.step);
        if step + 1 != run.first_step + profile && step + 1 != self.total_steps {
            return Ok(());
        }
        if let Some(p) = run.profiler.take() {
            let path = self.run.profile(self.s.rank);
            p.save(&path)?;
            tracing::info!(
                "rank {}: profile of {} steps in {}",
                self.s.rank,
                profile.min(step + 1 - run.first_step),
                path.display()
            );
        }
        Ok(())
    }

    /// Each object store's request counts, a warning when some failed.
    fn log_store_attempts(&self) {
        for store in &self.s.stores {
            let counts = store.attempts();
            let url = tessera_shards::RemoteFiles::url(store.as_ref());
            let line = format!("rank {}: {url}: {}", self.s.rank, counts.describe());
            if counts.failed() > 0 {
                tracing::warn!("{line}");
            } else {
                tracing::info!("{line}");
            }
        }
    }

    fn one_step(
        &self,
        model: &mut ShardedVlm,
        loader: &mut Loader,
        plan_step: &Step,
        step: u64,
    ) -> Result<StepMetrics, TrainError> {
        tch::manual_seed(step_seed(self.cfg.seed, step, self.s.rank));
        let started = Instant::now();
        let divisor = plan_step.supervised_tokens.max(1) as f64;
        let micro_batches = plan_step.micro_steps.len() * self.layout.per_micro_step();
        let mut local = self.micro_batches(model, loader, micro_batches, divisor, step)?;
        let compute = started.elapsed().as_secs_f64() - local.wait;
        let t = Instant::now();
        let stats = model.optimizer_step(self.schedule.factor(step))?;
        local
            .times
            .insert("optimizer".into(), t.elapsed().as_secs_f64());
        // Per rank, in rank order: compute seconds, loader wait seconds, peak RSS (MiB).
        let mine = [compute, local.wait, metrics::peak_rss_mib()];
        let reduced = self.reduce(model, &local, mine, micro_batches, step)?;
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        Ok(self.step_metrics(step, divisor, secs, local, reduced, &stats))
    }

    /// This rank's `count` micro-batches of step `step`, forward and backward, each loss
    /// divided by `divisor` (the step's supervised tokens).
    fn micro_batches(
        &self,
        model: &mut ShardedVlm,
        loader: &mut Loader,
        count: usize,
        divisor: f64,
        step: u64,
    ) -> Result<LocalStep, TrainError> {
        let sources = self.s.data.source_names().len();
        let lm = &model.vlm().lm;
        let (coef, sparse) = (lm.router_aux_loss_coef(), lm.sparse_layers());
        let mut local = LocalStep {
            totals: StepTotals::default(),
            by_source: vec![0.0f64; 2 * sources],
            moe: vec![0.0f64; moe_len(&sparse, lm.num_experts())],
            times: UnitTimes::new(),
            wait: 0.0,
        };
        let mut fetch = |model: &ShardedVlm, wait: &mut f64| -> Result<_, TrainError> {
            let t = Instant::now();
            let mb = loader.next().ok_or_else(|| {
                TrainError::Invalid(format!("step {step}: the loader ended before the plan did"))
            })??;
            *wait += t.elapsed().as_secs_f64();
            let ctx = model.prepare(&mb)?;
            Ok((mb, ctx))
        };
        let mut next = None;
        for i in 0..count {
            let (mb, mut ctx) = match next.take() {
                Some(prepared) => prepared,
                None => fetch(model, &mut local.wait)?,
            };
            // Micro-batch i+1's uploads go out before i's kernels: on CUDA they overlap.
            if i + 1 < count {
                next = Some(fetch(model, &mut local.wait)?);
            }
            // The micro-batch carries each sample's source: count its supervised tokens here,
            // the model sums their loss.
            for source in mb.supervised_sources() {
                if let Some(count) = local.by_source.get_mut(sources + source) {
                    *count += 1.0;
                }
            }
            ctx.share_balance_loss(coef, count * self.s.world_size);
            let out = model.forward_backward(ctx, 1.0 / divisor, &mut local.times)?;
            for (sum, part) in local.by_source.iter_mut().zip(out.by_source) {
                *sum += part;
            }
            if let Some(router) = out.router {
                local.add_router(&router);
            }
            local.totals.add_batch(&mb, out.loss_sum);
        }
        Ok(local)
    }

    /// Every rank's [`LocalStep`] summed, and every rank's `mine` (compute seconds, loader
    /// wait seconds, peak RSS) gathered in rank order.
    fn reduce(
        &self,
        model: &ShardedVlm,
        local: &LocalStep,
        mine: [f64; 3],
        micro_batches: usize,
        step: u64,
    ) -> Result<Reduced, TrainError> {
        let s = self.s;
        let local_totals = local.totals.to_array();
        let mut totals =
            Tensor::from_slice(&[&local_totals[..], &local.by_source, &local.moe].concat());
        let mut ranks = Tensor::zeros(
            [(mine.len() * s.world_size) as i64],
            (tch::Kind::Double, tch::Device::Cpu),
        );
        if s.world_size > 1 {
            s.pg.all_reduce_sum(&mut totals, "step metrics")?.wait()?;
            s.pg.all_gather_into(&mut ranks, &Tensor::from_slice(&mine), "step metrics")?
                .wait()?;
        } else {
            ranks = Tensor::from_slice(&mine);
        }
        let totals: Vec<f64> = Vec::try_from(&totals)?;
        let sources = s.data.source_names();
        let split = totals.get(StepTotals::LEN..).unwrap_or_default();
        let moe = split.get(2 * sources.len()..).unwrap_or_default();
        let lm = &model.vlm().lm;
        let (coef, sparse) = (lm.router_aux_loss_coef(), lm.sparse_layers());
        let all_micro_batches = micro_batches * s.world_size;
        let moe = (!moe.is_empty())
            .then(|| MoeMetrics::new(moe[0], all_micro_batches, coef, &sparse, &moe[1..]));
        if let Some(m) = moe.as_ref().filter(|_| s.rank == 0) {
            tracing::info!("step {step}: {}", m.describe());
        }
        let loss_by_source = sources
            .iter()
            .enumerate()
            .filter_map(|(k, name)| {
                let (sum, count) = (split.get(k)?, split.get(sources.len() + k)?);
                (*count > 0.0).then(|| (name.clone(), sum / count))
            })
            .collect();
        let ranks: Vec<f64> = Vec::try_from(&ranks)?;
        let column =
            |i: usize| -> Vec<f64> { ranks.iter().skip(i).step_by(mine.len()).copied().collect() };
        Ok(Reduced {
            totals: StepTotals::from_slice(&totals),
            loss_by_source,
            moe,
            computes: column(0),
            waits: column(1),
            peak_rss_mib: column(2),
        })
    }

    /// Step `step`'s metrics from what the ranks summed; `secs`: the step's wall time.
    fn step_metrics(
        &self,
        step: u64,
        divisor: f64,
        secs: f64,
        local: LocalStep,
        r: Reduced,
        stats: &tessera_fsdp::StepStats,
    ) -> StepMetrics {
        let mean_compute = r.computes.iter().sum::<f64>() / r.computes.len() as f64;
        let max_compute = r.computes.iter().copied().fold(0.0, f64::max);
        let (loss_image, loss_text) = r.totals.loss_by_kind();
        StepMetrics {
            step,
            loss: r.totals.loss_sum / divisor
                + r.moe.as_ref().map_or(0.0, |m| m.aux_weight * m.aux_loss),
            loss_image,
            loss_text,
            lr: self.schedule.lr(step),
            grad_norm: stats.grad_norm,
            tokens_per_s: r.totals.tokens / secs,
            real_tokens_per_s: r.totals.real_tokens / secs,
            images_per_s: r.totals.images / secs,
            loader_wait_frac: local.wait / secs,
            imbalance: if mean_compute > 0.0 {
                max_compute / mean_compute
            } else {
                1.0
            },
            step_time_s: secs,
            tokens: r.totals.tokens as u64,
            real_tokens: r.totals.real_tokens as u64,
            supervised_tokens: r.totals.supervised_tokens as u64,
            images: r.totals.images as u64,
            unit_time_s: local.times,
            rss_mib: metrics::rss_mib(),
            bytes_sent: stats.bytes_sent,
            bytes_sent_across_nodes: stats.bytes_sent_across,
            store_retries: 0,
            val_loss: None,
            loss_by_source: r.loss_by_source,
            per_rank: PerRank {
                loader_wait_frac: r.waits.iter().map(|w| w / secs).collect(),
                compute_s: r.computes,
                peak_rss_mib: r.peak_rss_mib,
            },
            moe: r.moe,
        }
    }

    /// The checkpoint of `step`, saved as `--checkpoint-write` says (`checkpoint/save.rs`).
    fn checkpoint(
        &mut self,
        model: &mut ShardedVlm,
        step: u64,
        next: &Position,
    ) -> Result<(), TrainError> {
        let (cfg, s) = (self.cfg, self.s);
        let json = |what: &str| {
            let what = format!("checkpoint of step {step}: {what}");
            move |source| TrainError::Json { what, source }
        };
        let planner = serde_json::to_value(next).map_err(json("planner position"))?;
        let state = RankState {
            rank: s.rank,
            next_step: step,
            planner,
            seed: cfg.seed,
        };
        let meta = if s.rank == 0 {
            Some(CheckpointMeta {
                format_version: FORMAT_VERSION,
                step,
                world_size: s.world_size,
                strategy: cfg.strategy,
                stage: cfg.stage.into(),
                model: s.model_fingerprint.clone(),
                data_fingerprint: s.data.fingerprint().to_string(),
                config: serde_json::to_value(cfg).map_err(json("config"))?,
                run: self.run_record(),
                plan_world_size: self.layout.plan_world_size,
            })
        } else {
            None
        };
        if s.rank == 0 {
            room::warn_if_no_room(&self.run, step, model.checkpoint_bytes());
        }
        let (rank, world_size) = (s.rank, s.world_size);
        self.saver.save(
            &self.run,
            &s.writer_ranks(),
            |copy| model.snapshot_sharded(rank, world_size, copy),
            state,
            meta,
        )
    }
}

/// Length of a step's MoE totals: the summed balance loss, then every sparse layer's slot
/// counts per expert (nothing for a dense LM).
fn moe_len(sparse: &[i64], experts: i64) -> usize {
    if sparse.is_empty() {
        0
    } else {
        1 + sparse.len() * experts as usize
    }
}

/// Adds one micro-batch's routing to the step's MoE totals (see [`moe_len`]).
fn add_router(totals: &mut [f64], router: &tessera_model::RouterStats) {
    let Some((aux, loads)) = totals.split_first_mut() else {
        return;
    };
    *aux += router.aux_loss;
    let counts = router.loads.iter().flat_map(|(_, load)| load.iter());
    for (total, count) in loads.iter_mut().zip(counts) {
        *total += count;
    }
}

/// One line of `plan.jsonl`.
#[derive(serde::Serialize)]
struct PlannedStep {
    step: u64,
    /// Global sample indices (shard order, then row order) of every rank's micro-batches,
    /// fillers left out, in plan order.
    samples: Vec<u64>,
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
