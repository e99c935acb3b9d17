//! `tessera train`: a TOML config (`--config FILE`) overlaid by these flags, validated before any
//! work. With `--nproc N` (N > 1) and no RANK in the environment it launches N local ranks of
//! itself; with RANK set (torchrun or the launcher) it runs one rank.
use anyhow::Context;
use std::path::PathBuf;
use trainer::train::config::{ConfigLayer, Device, Recompute, Resize, Stage, Strategy};

/// Arguments of `tessera train` (each flag overrides the same key of `--config`).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML file with any of the keys below (snake_case, e.g. `token_budget = 8192`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Shard directory written by `tessera ingest`.
    #[arg(long)]
    pub shards: Option<PathBuf>,
    /// SigLIP vision tower: a Hugging Face directory (config.json + safetensors).
    #[arg(long)]
    pub vision: Option<PathBuf>,
    /// Qwen2 language model: a Hugging Face directory (config.json + safetensors).
    #[arg(long)]
    pub lm: Option<PathBuf>,
    /// 1: train the projector (alignment); 2: projector + LoRA on the LM (LLaVA-1.5 stages).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub stage: Option<u8>,
    /// Run directory: metrics.jsonl, checkpoints/, loss.png, summary.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Local ranks to launch (ignored when RANK is set, e.g. under torchrun).
    #[arg(long)]
    pub nproc: Option<usize>,
    /// FSDP sharding strategy.
    #[arg(long, value_parser = ["full_shard", "shard_grad_op", "no_shard"])]
    pub strategy: Option<String>,
    /// Optimizer steps (default: one epoch).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Full passes over the data (instead of --steps).
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Tokens per rank per micro-batch, padding included (default 4096).
    #[arg(long)]
    pub token_budget: Option<usize>,
    /// Micro-steps (gradient accumulation) per optimizer step (default 1).
    #[arg(long)]
    pub micro_steps: Option<usize>,
    /// Peak learning rate (stage 1 default 1e-3; stage 2 default 2e-4 for LoRA).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Stage 2: projector learning rate (default 2e-5).
    #[arg(long)]
    pub projector_lr: Option<f64>,
    /// Warmup as a fraction of all steps (default 0.03), then cosine decay to 0.
    #[arg(long)]
    pub warmup_ratio: Option<f64>,
    /// AdamW weight decay (default 0).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Clip the global gradient norm to this (default 1.0; 0 = off).
    #[arg(long)]
    pub grad_clip: Option<f64>,
    /// Stage 2: LoRA rank (default 128).
    #[arg(long)]
    pub lora_r: Option<usize>,
    /// Stage 2: LoRA alpha (default 256).
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    /// Seed of the data order and fresh initialisations (default 42).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Checkpoint every N steps (and always at the end; default 0 = only at the end).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Continue from the latest complete checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Where to train.
    #[arg(long, value_parser = ["cpu", "cuda"])]
    pub device: Option<String>,
    /// Vision input size in pixels (default: the vision config's image_size).
    #[arg(long)]
    pub image_size: Option<usize>,
    /// How images become square: squash (SigLIP) or pad (LLaVA expand2square).
    #[arg(long, value_parser = ["squash", "pad"])]
    pub resize: Option<String>,
    /// Longest packed row in tokens (default 2048).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Loader worker threads per rank (default: cores, at most 8).
    #[arg(long)]
    pub loader_threads: Option<usize>,
    /// Seconds before a collective that a peer never joins fails (default 300).
    #[arg(long)]
    pub collective_timeout: Option<u64>,
    /// Projector to start from: an exported mm_projector.safetensors or a stage-1 run directory.
    #[arg(long)]
    pub init_projector: Option<PathBuf>,
    /// Backward recomputes each trained unit's forward (`all`, default: least memory) or keeps
    /// the forward's activations (`none`: faster, more memory).
    #[arg(long, value_parser = ["all", "none"])]
    pub recompute: Option<String>,
}

impl Args {
    /// The flags as a config layer (only what was given).
    fn layer(&self) -> anyhow::Result<ConfigLayer> {
        let stage = match self.stage {
            Some(1) => Some(Stage::Align),
            Some(2) => Some(Stage::Finetune),
            Some(other) => anyhow::bail!("--stage {other} does not exist"),
            None => None,
        };
        let strategy = self.strategy.as_deref().map(|s| match s {
            "shard_grad_op" => Strategy::ShardGradOp,
            "no_shard" => Strategy::NoShard,
            _ => Strategy::FullShard,
        });
        Ok(ConfigLayer {
            shards: self.shards.clone(),
            vision: self.vision.clone(),
            lm: self.lm.clone(),
            stage,
            out: self.out.clone(),
            nproc: self.nproc,
            strategy,
            token_budget: self.token_budget,
            micro_steps: self.micro_steps,
            steps: self.steps,
            epochs: self.epochs,
            lr: self.lr,
            projector_lr: self.projector_lr,
            warmup_ratio: self.warmup_ratio,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            lora_r: self.lora_r,
            lora_alpha: self.lora_alpha,
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            device: self.device.as_deref().map(|d| {
                if d == "cuda" {
                    Device::Cuda
                } else {
                    Device::Cpu
                }
            }),
            image_size: self.image_size,
            resize: self.resize.as_deref().map(|r| {
                if r == "pad" {
                    Resize::Pad
                } else {
                    Resize::Squash
                }
            }),
            seq_len: self.seq_len,
            loader_threads: self.loader_threads,
            collective_timeout_s: self.collective_timeout,
            init_projector: self.init_projector.clone(),
            recompute: self.recompute.as_deref().map(|r| {
                if r == "none" {
                    Recompute::None
                } else {
                    Recompute::All
                }
            }),
        })
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => ConfigLayer::from_file(path)?,
        None => ConfigLayer::default(),
    };
    let cfg = file.overlay(args.layer()?).resolve()?;
    cfg.check_paths()?;
    let rank_env =
        trainer::dist::RankEnv::from_env().context("reading the torchrun environment")?;
    if rank_env.is_none() && cfg.nproc > 1 {
        return launch_ranks(cfg.nproc);
    }
    let summary = trainer::train::run::train(&cfg, rank_env, args.resume)?;
    if let Some(s) = summary {
        println!(
            "trained {} steps: loss {:.4} -> {:.4} (mean of the last 10%: {:.4}); run in {}",
            s.steps,
            s.first_loss,
            s.last_loss,
            s.final_loss_mean,
            cfg.out.display()
        );
    }
    Ok(())
}

/// Re-runs this very command line once per rank through the dist launcher (the ranks see RANK
/// in their environment, so they train instead of launching again).
fn launch_ranks(nproc: usize) -> anyhow::Result<()> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let spec = trainer::dist::launcher::LaunchSpec::current_exe(nproc, args)
        .context("locating the tessera binary")?;
    trainer::dist::launcher::run(spec).context("training on local ranks")?;
    Ok(())
}
