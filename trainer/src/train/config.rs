//! The training configuration: a TOML file (`--config FILE`) overlaid by command-line flags,
//! then resolved against the stage defaults of LLaVA-1.5 and validated before any work starts.
//!
//! Every field of the file is optional ([`ConfigLayer`]); the CLI builds a second layer from
//! its flags and [`ConfigLayer::overlay`] puts it on top. [`ConfigLayer::resolve`] fills the
//! stage defaults (stage 1: lr 1e-3, weight decay 0, warmup 3 %, cosine; stage 2: LoRA r 128,
//! alpha 256, lr 2e-4, projector lr 2e-5) and returns a [`TrainConfig`] or a
//! [`ConfigError`] naming the field and the reason.
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why a configuration was refused; every message names the field (or the file) and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config field `{field}` is required ({hint})")]
    Missing {
        field: &'static str,
        hint: &'static str,
    },
    #[error("config field `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Training stage, as LLaVA-1.5 names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub enum Stage {
    /// Feature alignment: only the projector trains.
    Align = 1,
    /// Instruction tuning: projector + LoRA adapters on the LM's linear layers.
    Finetune = 2,
}

impl TryFrom<u8> for Stage {
    type Error = String;
    fn try_from(v: u8) -> Result<Self, String> {
        match v {
            1 => Ok(Stage::Align),
            2 => Ok(Stage::Finetune),
            other => Err(format!(
                "stage {other} does not exist (1: projector, 2: projector + LoRA)"
            )),
        }
    }
}

impl From<Stage> for u8 {
    fn from(s: Stage) -> u8 {
        s as u8
    }
}

/// FSDP sharding strategy (PyTorch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    FullShard,
    ShardGradOp,
    NoShard,
}

/// Whether backward recomputes each trained unit's forward (activation checkpointing, least
/// memory) or keeps the forward's activations (`none`: no second forward, most memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    All,
    None,
}

/// Where tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    Cpu,
    Cuda,
}

/// How images reach the vision tower's square input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resize {
    /// SigLIP processor: resize straight to size x size.
    Squash,
    /// LLaVA's expand2square, then resize.
    Pad,
}

/// One layer of settings: a TOML file or the command line. `None` = not set here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigLayer {
    pub shards: Option<PathBuf>,
    pub vision: Option<PathBuf>,
    pub lm: Option<PathBuf>,
    pub stage: Option<Stage>,
    pub out: Option<PathBuf>,
    pub nproc: Option<usize>,
    pub strategy: Option<Strategy>,
    pub token_budget: Option<usize>,
    pub micro_steps: Option<usize>,
    pub steps: Option<u64>,
    pub epochs: Option<u32>,
    pub lr: Option<f64>,
    pub projector_lr: Option<f64>,
    pub warmup_ratio: Option<f64>,
    pub weight_decay: Option<f64>,
    pub grad_clip: Option<f64>,
    pub lora_r: Option<usize>,
    pub lora_alpha: Option<f64>,
    pub seed: Option<u64>,
    pub checkpoint_every: Option<u64>,
    pub device: Option<Device>,
    pub image_size: Option<usize>,
    pub resize: Option<Resize>,
    pub seq_len: Option<usize>,
    pub loader_threads: Option<usize>,
    pub collective_timeout_s: Option<u64>,
    pub init_projector: Option<PathBuf>,
    pub recompute: Option<Recompute>,
}

/// A resolved, validated configuration: every knob has its value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub shards: PathBuf,
    pub vision: PathBuf,
    pub lm: PathBuf,
    pub stage: Stage,
    pub out: PathBuf,
    pub nproc: usize,
    pub strategy: Strategy,
    /// Most tokens (padding included) in one rank's micro-batch.
    pub token_budget: usize,
    /// Micro-steps (gradient accumulation) per optimizer step.
    pub micro_steps: usize,
    /// Optimizer steps; `None` = run `epochs` full passes.
    pub steps: Option<u64>,
    pub epochs: u32,
    /// Learning rate of the trained part (stage 1: projector; stage 2: LoRA).
    pub lr: f64,
    /// Stage 2: learning rate of the projector (LLaVA-1.5's mm_projector_lr).
    pub projector_lr: f64,
    pub warmup_ratio: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm to this; 0 = no clipping.
    pub grad_clip: f64,
    pub lora_r: usize,
    pub lora_alpha: f64,
    pub seed: u64,
    /// Write a checkpoint every N steps (and always at the end); 0 = only at the end.
    pub checkpoint_every: u64,
    pub device: Device,
    /// Vision input size; `None` = the vision config's `image_size`.
    pub image_size: Option<usize>,
    pub resize: Resize,
    /// Longest packed row, in tokens.
    pub seq_len: usize,
    pub loader_threads: usize,
    pub collective_timeout_s: u64,
    /// Projector to start from (stage 2 after stage 1): an exported `mm_projector.safetensors`
    /// or a stage-1 run directory (its latest checkpoint); `None` = fresh init.
    pub init_projector: Option<PathBuf>,
    /// Activation checkpointing of the trained units: `all` (default) or `none`.
    pub recompute: Recompute,
}

impl ConfigLayer {
    /// Reads a TOML file; unknown keys are errors (a typo must not silently use a default).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().to_string() + &describe_span(&text, e.span()),
        })
    }

    /// `self` with every field that `top` sets replaced by `top`'s value.
    pub fn overlay(self, top: ConfigLayer) -> ConfigLayer {
        macro_rules! pick {
            ($($f:ident),*) => { ConfigLayer { $($f: top.$f.or(self.$f)),* } };
        }
        pick!(
            shards,
            vision,
            lm,
            stage,
            out,
            nproc,
            strategy,
            token_budget,
            micro_steps,
            steps,
            epochs,
            lr,
            projector_lr,
            warmup_ratio,
            weight_decay,
            grad_clip,
            lora_r,
            lora_alpha,
            seed,
            checkpoint_every,
            device,
            image_size,
            resize,
            seq_len,
            loader_threads,
            collective_timeout_s,
            init_projector,
            recompute
        )
    }

    /// Fills stage defaults and validates every field.
    pub fn resolve(self) -> Result<TrainConfig, ConfigError> {
        let stage = self.stage.ok_or(ConfigError::Missing {
            field: "stage",
            hint: "1: projector only, 2: projector + LoRA",
        })?;
        let required =
            |v: Option<PathBuf>, field, hint| v.ok_or(ConfigError::Missing { field, hint });
        let (default_lr, default_projector_lr) = match stage {
            Stage::Align => (1e-3, 1e-3),
            Stage::Finetune => (2e-4, 2e-5),
        };
        if self.steps.is_some() && self.epochs.is_some() {
            return Err(invalid("steps", "set either `steps` or `epochs`, not both"));
        }
        let cfg = TrainConfig {
            shards: required(
                self.shards,
                "shards",
                "a directory written by `tessera ingest`",
            )?,
            vision: required(self.vision, "vision", "a SigLIP Hugging Face directory")?,
            lm: required(self.lm, "lm", "a Qwen2 Hugging Face directory")?,
            out: required(self.out, "out", "the run directory to write")?,
            stage,
            nproc: self.nproc.unwrap_or(1),
            strategy: self.strategy.unwrap_or(Strategy::FullShard),
            token_budget: self.token_budget.unwrap_or(4096),
            micro_steps: self.micro_steps.unwrap_or(1),
            steps: self.steps,
            epochs: self.epochs.unwrap_or(1),
            lr: self.lr.unwrap_or(default_lr),
            projector_lr: self.projector_lr.unwrap_or(default_projector_lr),
            warmup_ratio: self.warmup_ratio.unwrap_or(0.03),
            weight_decay: self.weight_decay.unwrap_or(0.0),
            grad_clip: self.grad_clip.unwrap_or(1.0),
            lora_r: self.lora_r.unwrap_or(128),
            lora_alpha: self.lora_alpha.unwrap_or(256.0),
            seed: self.seed.unwrap_or(42),
            checkpoint_every: self.checkpoint_every.unwrap_or(0),
            device: self.device.unwrap_or(Device::Cpu),
            image_size: self.image_size,
            resize: self.resize.unwrap_or(Resize::Squash),
            seq_len: self.seq_len.unwrap_or(2048),
            loader_threads: self.loader_threads.unwrap_or_else(default_loader_threads),
            collective_timeout_s: self.collective_timeout_s.unwrap_or(300),
            init_projector: self.init_projector,
            recompute: self.recompute.unwrap_or(Recompute::All),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

fn default_loader_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(8))
}

fn describe_span(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(s) => {
            let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

impl TrainConfig {
    /// Checks values only (no file system access): ranges, and relations between fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive_rate = |field, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(invalid(
                    field,
                    format!("{v} is not a learning rate (must be > 0)"),
                ))
            }
        };
        positive_rate("lr", self.lr)?;
        positive_rate("projector_lr", self.projector_lr)?;
        if self.nproc == 0 {
            return Err(invalid("nproc", "0 ranks cannot train (at least 1)"));
        }
        if self.token_budget == 0 {
            return Err(invalid(
                "token_budget",
                "0 is not a budget (tokens per micro-batch, > 0)",
            ));
        }
        if self.seq_len == 0 {
            return Err(invalid("seq_len", "0 tokens cannot hold a sample"));
        }
        if self.token_budget < self.seq_len {
            return Err(invalid(
                "token_budget",
                format!(
                    "{} is below seq_len {}: a micro-batch must hold at least one full row",
                    self.token_budget, self.seq_len
                ),
            ));
        }
        if self.micro_steps == 0 {
            return Err(invalid(
                "micro_steps",
                "0 micro-steps per step run nothing (at least 1)",
            ));
        }
        if self.steps == Some(0) {
            return Err(invalid("steps", "0 steps train nothing"));
        }
        if self.epochs == 0 {
            return Err(invalid("epochs", "0 epochs train nothing"));
        }
        if !(0.0..1.0).contains(&self.warmup_ratio) {
            return Err(invalid(
                "warmup_ratio",
                format!(
                    "{} is not a fraction of the run in [0, 1)",
                    self.warmup_ratio
                ),
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(invalid(
                "weight_decay",
                format!("{} must be >= 0", self.weight_decay),
            ));
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            return Err(invalid(
                "grad_clip",
                format!("{} must be >= 0 (0 = off)", self.grad_clip),
            ));
        }
        if self.stage == Stage::Finetune && self.lora_r == 0 {
            return Err(invalid(
                "lora_r",
                "rank 0 adds no adapter (stage 2 needs r >= 1)",
            ));
        }
        if !(self.lora_alpha.is_finite() && self.lora_alpha > 0.0) {
            return Err(invalid(
                "lora_alpha",
                format!("{} must be > 0", self.lora_alpha),
            ));
        }
        if self.image_size == Some(0) {
            return Err(invalid("image_size", "0 pixels is not an image size"));
        }
        if self.loader_threads == 0 {
            return Err(invalid(
                "loader_threads",
                "the loader needs at least 1 thread",
            ));
        }
        if self.collective_timeout_s == 0 {
            return Err(invalid(
                "collective_timeout_s",
                "a 0 s timeout fails every collective",
            ));
        }
        if self.device == Device::Cuda && !cfg!(feature = "cuda") {
            return Err(invalid(
                "device",
                "cuda needs a tessera built with `--features cuda`; this build is CPU only",
            ));
        }
        Ok(())
    }

    /// Checks the inputs exist and look like what they claim to be, before any work starts.
    pub fn check_paths(&self) -> Result<(), ConfigError> {
        if !self.shards.join("index.json").is_file() {
            return Err(invalid(
                "shards",
                format!(
                    "{} holds no index.json (not a complete shard directory; run `tessera ingest`)",
                    self.shards.display()
                ),
            ));
        }
        for (field, dir) in [("vision", &self.vision), ("lm", &self.lm)] {
            if !dir.join("config.json").is_file() {
                return Err(invalid(
                    field,
                    format!(
                        "{} holds no config.json (not a Hugging Face model directory)",
                        dir.display()
                    ),
                ));
            }
        }
        if let Some(p) = &self.init_projector {
            if !p.is_file() && !p.join("checkpoints").is_dir() {
                return Err(invalid(
                    "init_projector",
                    format!(
                        "{} is neither a safetensors file nor a run directory with checkpoints/",
                        p.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Optimizer steps of the whole run, given the planner's steps per epoch.
    pub fn total_steps(&self, steps_per_epoch: u64) -> u64 {
        self.steps
            .unwrap_or(steps_per_epoch.saturating_mul(u64::from(self.epochs)))
    }
}
