//! The training configuration: a TOML file (`--config FILE`) overlaid by command-line flags,
//! then resolved against the stage defaults of LLaVA-1.5 and validated before any work starts.
//!
//! The knobs are listed once, in the `knobs!` call below (see `config/knobs.rs`): each is a
//! TOML key, a `--flag` whose help is its doc comment, an `Option` field of [`ConfigLayer`] and
//! a field of [`TrainConfig`]. The file is one layer, the flags another;
//! [`ConfigLayer::overlay`] puts the flags on top and [`ConfigLayer::resolve`] fills the
//! defaults (stage 1: lr 1e-3, weight decay 0, warmup 3 %, cosine; stage 2: LoRA r 128,
//! alpha 256, lr 2e-4, projector lr 2e-5) and validates, returning a [`TrainConfig`] or a
//! [`ConfigError`] naming the field and the reason.
//!
//! Adding a knob: one entry in `knobs!` (`/// help` + `name: Type = default(value)`), plus a
//! check in [`TrainConfig::validate`] if some values are invalid, and `#[resume]` if it changes
//! the math (a resumed run must then have the checkpoint's value: see
//! [`TrainConfig::resume_record`]). Enum values parse through `clap::ValueEnum` (derive it next
//! to serde's, both `snake_case`) or `FromStr`.
#[macro_use]
mod knobs;
use knobs::record_value;

mod recompute_setting;
mod train_parts;
pub(crate) use recompute_setting::RecomputeSetting;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::str::FromStr;
pub use tessera_fsdp::{Recompute, Strategy};
pub use tessera_model::Dtype;
use tessera_model::FeatureLayers;
pub use tessera_pipeline::loader::{BadImagePolicy, ResizePolicy};
use tessera_pipeline::plan::OverLong;
use tessera_shards::image_layout::ImageLayout;
pub use train_parts::TrainParts;

/// Why a configuration was refused; every message names the field (or the file) and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, an unknown key or a bad value: toml's error (line, column, an excerpt of
    /// the file and the reason) is the source.
    #[error("config file {path}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("config field `{field}` is required ({hint})")]
    Missing {
        field: &'static str,
        hint: &'static str,
    },
    #[error("config field `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// A size (`cache_limit`) that does not parse; the parser's error is the source.
    #[error("config field `{field}`")]
    BadSize {
        field: &'static str,
        source: tessera_remote::RemoteError,
    },
    /// The run folder (`--out`) or an entry of it cannot be listed or cleared.
    #[error("--out {path}")]
    OutFolder {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A config stored in a checkpoint that this build cannot read.
    #[error("stored config")]
    Stored(#[source] serde_json::Error),
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
    /// Instruction tuning: by default projector + LoRA adapters on the LM's linear layers;
    /// `--train` picks the LM (and the tower) in full instead.
    Finetune = 2,
}

/// How checkpoints reach disk (`--checkpoint-write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum CheckpointWrite {
    /// Training stops at the checkpoint until every rank's files are written and committed.
    Sync,
    /// Training goes on while a thread per rank writes a copy of the rank's state (as torch
    /// DCP's async save does); the commit waits for all of them. One write is in flight at a
    /// time: a checkpoint that comes due while the last one is still being written waits.
    Async,
}

const STAGES: &str = "1: projector, 2: projector + LoRA, or what --train names";

impl TryFrom<u8> for Stage {
    type Error = String;
    fn try_from(v: u8) -> Result<Self, String> {
        match v {
            1 => Ok(Stage::Align),
            2 => Ok(Stage::Finetune),
            other => Err(format!("stage {other} does not exist ({STAGES})")),
        }
    }
}

/// `--stage 1` or `--stage 2`.
impl FromStr for Stage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse::<u8>()
            .ok()
            .and_then(|n| Stage::try_from(n).ok())
            .ok_or_else(|| format!("stage {s} does not exist ({STAGES})"))
    }
}

impl From<Stage> for u8 {
    fn from(s: Stage) -> u8 {
        s as u8
    }
}

impl Stage {
    /// What trains unless `--train` says otherwise.
    pub fn default_parts(self) -> TrainParts {
        match self {
            Stage::Align => TrainParts::PROJECTOR,
            Stage::Finetune => TrainParts::PROJECTOR_LORA,
        }
    }
}

/// Where tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Device {
    /// CPU tensors, gloo collectives.
    Cpu,
    /// One GPU per rank, NCCL collectives (a build with `--features cuda`).
    Cuda,
}

// The training knobs, once: each is a TOML key, a `--flag` (help = its doc comment), a field of
// `ConfigLayer` (`Option<T>`) and of `TrainConfig`; `#[resume]` puts it in the run record a
// resume must match. See `knobs.rs` for the forms of the default and of `#[resume]`.
//
// Not `#[resume]`: what the record holds in another form (`shards` by the data's fingerprint,
// `vision`/`lm` by their files' fingerprints, `steps`/`epochs` as `total_steps`, `image_size`
// as the size the tower resolved: see `run.rs`), and what leaves the math alone (the world size,
// the strategy, recomputation, the device, checkpointing, validation, the loader, the cache).
knobs! {
    /// Shard directory written by `tessera ingest`: a path, or a URL (s3://bucket/prefix,
    /// gs://, az://, https://) read in byte ranges through a local cache; or a mixture file
    /// (`mix.toml`: shard sets with a `weight` or a `repeat` each, see the README).
    shards: PathBuf = required("a directory written by `tessera ingest`, or a mixture file"),
    /// Vision tower: a Hugging Face directory (config.json + safetensors) of model_type siglip,
    /// siglip_vision_model or dinov2.
    vision: PathBuf = required("a SigLIP or DINOv2 Hugging Face directory"),
    /// Language model: a Hugging Face directory (config.json + safetensors + tokenizer.json)
    /// of model_type qwen2, qwen3 or llama.
    lm: PathBuf = required("a Qwen2, Qwen3 or Llama Hugging Face directory"),
    /// 1: alignment (trains the projector); 2: instruction tuning (projector + LoRA unless
    /// --train says otherwise). The preset of --train and the learning rates.
    #[resume]
    stage: Stage = required("1: projector only, 2: projector + LoRA, or what --train names"),
    /// The parts that learn, comma-separated: projector, lora, lm (the whole LM), vision (the
    /// whole tower) or vision:K (its last K layers). Default: stage 1 `projector`, stage 2
    /// `projector,lora`; LLaVA-1.5's full stage 2 is `projector,lm`.
    #[resume]
    train: TrainParts = default(stage.default_parts()),
    /// Run directory: metrics.jsonl, checkpoints/, loss.png, summary.json.
    out: PathBuf = required("the run directory to write"),
    /// Local ranks to launch (ignored when RANK is set, e.g. under torchrun).
    nproc: usize = default(1),
    /// FSDP sharding strategy.
    strategy: Strategy = default(Strategy::FullShard),
    /// Expert parallelism for an MoE LM: each sparse layer's experts split over N consecutive
    /// ranks, tokens exchanged by all-to-all; N divides the world size and the experts.
    /// 1 (default): every rank holds every expert (FSDP-sharded).
    expert_parallel: usize = default(1),
    /// Backward recomputes each trained unit's forward (`all`: least memory), keeps the
    /// forward's activations (`none`: fastest, most memory), keeps them but the norms' and
    /// activations' (`selective`), or recomputes every K-th unit and keeps the others'
    /// (`every:K`); `auto` (default) takes the fastest whose estimated peak fits the memory at
    /// hand, and a resume keeps the choice.
    recompute: RecomputeSetting = default(RecomputeSetting::Auto),
    /// Optimizer steps (default: one epoch).
    steps: u64 = optional,
    /// Full passes over the data (instead of --steps).
    epochs: u32 = default(1),
    /// Tokens per rank per micro-batch, padding included (default 4096).
    #[resume]
    token_budget: usize = default(4096),
    /// Micro-steps (gradient accumulation) per optimizer step (default 1).
    #[resume]
    micro_steps: usize = default(1),
    /// Peak learning rate (stage 1 default 1e-3; stage 2 default 2e-4 for LoRA).
    #[resume]
    lr: f64 = default(match stage {
        Stage::Align => 1e-3,
        Stage::Finetune => 2e-4,
    }),
    /// Stage 2: projector learning rate (default 2e-5).
    #[resume]
    projector_lr: f64 = default(match stage {
        Stage::Align => 1e-3,
        Stage::Finetune => 2e-5,
    }),
    /// Learning rate of the LM's own weights when --train has `lm` (default 2e-5, LLaVA-1.5's
    /// full fine-tune).
    #[resume(when = |c| c.train.lm)]
    lm_lr: f64 = default(2e-5),
    /// Learning rate of the vision tower when --train has `vision` (default 2e-6,
    /// LLaVA-OneVision's).
    #[resume(when = |c| c.train.vision != tessera_model::VisionTraining::Frozen)]
    vision_lr: f64 = default(2e-6),
    /// Warmup as a fraction of all steps (default 0.03), then cosine decay to 0.
    #[resume]
    warmup_ratio: f64 = default(0.03),
    /// AdamW weight decay (default 0).
    #[resume]
    weight_decay: f64 = default(0.0),
    /// Clip the global gradient norm to this (default 1.0; 0 = off).
    #[resume]
    grad_clip: f64 = default(1.0),
    /// Stage 2: LoRA rank (default 128).
    #[resume(when = |c| c.train.lora)]
    lora_r: usize = default(128),
    /// Stage 2: LoRA alpha (default 256).
    #[resume(when = |c| c.train.lora)]
    lora_alpha: f64 = default(256.0),
    /// Seed of the data order and fresh initialisations (default 42).
    #[resume]
    seed: u64 = default(42),
    /// Checkpoint every N steps (and always at the end; default 0 = only at the end).
    checkpoint_every: u64 = default(0),
    /// Keep the last N checkpoints (default 3; older ones are deleted after each checkpoint).
    keep_checkpoints: usize = default(3),
    /// Also keep every checkpoint whose step is a multiple of M (default 0 = none).
    keep_every: u64 = default(0),
    /// How checkpoints reach disk: sync (default: training waits until they are committed) or
    /// async (each rank copies its trained state in host memory and writes it on a thread
    /// while training goes on; committed at the first step boundary after every rank is done).
    checkpoint_write: CheckpointWrite = default(CheckpointWrite::Sync),
    /// A sample whose image does not decode or fails its stored crc32c (shard corrupt on
    /// disk): fail (default; names shard, row and sample) or skip (warn and drop it).
    on_bad_image: BadImagePolicy = default(BadImagePolicy::Fail),
    /// A sample longer than a row (--seq-len, or --token-budget if smaller; never truncated):
    /// skip (default: the plan leaves it out on every rank and epoch, and OUT/skipped.jsonl
    /// names it with its shard and length) or fail (stop before the first step, naming it).
    over_long: OverLong = default(OverLong::Skip),
    /// Where to train.
    device: Device = default(Device::Cpu),
    /// Vision input size in pixels (default: the vision config's image_size). A SigLIP tower
    /// takes its own size only; DINOv2 interpolates its position grid to any size.
    image_size: usize = optional,
    /// The tower's hidden state the image features are (LLaVA's mm_vision_select_layer,
    /// transformers' vision_feature_layer): k the output of layer k, negative from the end;
    /// -2 (default): the layer before the last. A list (1,6; in TOML [1, 6]) concatenates
    /// those layers' features along the channels in that order, as transformers' list does.
    /// The tower runs only the layers up to the deepest.
    #[resume]
    #[arg(allow_hyphen_values = true)]
    vision_feature_layer: FeatureLayers = default(FeatureLayers::default()),
    /// How images become square: squash (SigLIP) or pad (LLaVA expand2square).
    #[resume]
    resize: ResizePolicy = default(ResizePolicy::Squash),
    /// How images become tower tiles: single (default: one tile each, LLaVA-1.5) or
    /// anyres_max_N (LLaVA-OneVision: a base view plus the best pinpoint's grid of tiles of
    /// the tower's size, 1..6 tiles a side, pooled to about N tiles' worth, with a learned
    /// image_newline that stage 1 trains beside the projector; anyres_max_9 is OneVision's).
    #[resume]
    image_layout: ImageLayout = default(ImageLayout::Single),
    /// Standardise the tower's features per channel before the projector, with their mean and
    /// standard deviation over the first N image samples of --shards (0, the default: off, as
    /// LLaVA). Measured once on the frozen tower before the first step and recorded in the
    /// run's vlm.json; a run started from a stage-1 run's projector (--init-projector RUN)
    /// takes that run's statistics instead. Exports fold them into the projector's first layer.
    #[resume(when = |c| c.standardize_features != 0)]
    standardize_features: usize = default(0),
    /// Longest packed row in tokens (default 2048).
    #[resume]
    seq_len: usize = default(2048),
    /// Loader worker threads per rank (default: $TESSERA_LOADER_THREADS, else the cores, at
    /// most 8).
    loader_threads: usize = default(default_loader_threads()),
    /// Seconds without a heartbeat after which a rank counts as lost (its node died) and every
    /// other rank stops, naming it (default 30; multi-rank runs only).
    #[arg(long = "heartbeat-timeout", value_name = "HEARTBEAT_TIMEOUT")]
    heartbeat_timeout_s: u64 = default(30),
    /// Seconds before a collective that a peer never joins fails (default 300).
    #[arg(long = "collective-timeout", value_name = "COLLECTIVE_TIMEOUT")]
    collective_timeout_s: u64 = default(300),
    /// Projector to start from: an exported mm_projector.safetensors or a stage-1 run directory.
    init_projector: PathBuf = optional,
    /// Held-out shard directory (`tessera ingest`) for the validation loss.
    val_shards: PathBuf = optional,
    /// Validation loss every N steps (and always at the end; default 0 = only at the end).
    val_every: u64 = default(0),
    /// Samples in the fixed validation set, spread evenly over --val-shards (default 256).
    val_samples: usize = default(256),
    /// Record the run's first N optimizer steps with libtorch's profiler into
    /// profile_rank{r}.json in the run directory (Chrome trace; 0: off).
    profile: u64 = default(0),
    /// Cache of a URL --shards (default $TESSERA_CACHE, else OUT/shard-cache); shared safely
    /// by the ranks of a machine and reused across runs.
    cache_dir: PathBuf = optional,
    /// Most bytes the shard cache keeps (default 50GB; e.g. 500MB, 2GiB); least recently
    /// used byte ranges go first.
    cache_limit: String = default("50GB".to_string()),
    /// Compute dtype: bf16 (mixed precision: f32 master weights, gradients and AdamW moments;
    /// bf16 gathered weights and compute) or f32 (default: bf16 on cuda, f32 on cpu).
    #[resume]
    precision: Dtype = default(match device {
        Device::Cuda => Dtype::Bf16,
        Device::Cpu => Dtype::F32,
    }),
    /// Dtype gradients are reduce-scattered in under bf16 precision (default f32; bf16 halves
    /// the bytes sent).
    #[resume(when = |c| c.precision != Dtype::F32)]
    reduce_dtype: Dtype = default(Dtype::F32),
}

impl ConfigLayer {
    /// Reads a TOML file; unknown keys are errors (a typo must not silently use a default).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Fills the defaults (stage defaults included) and validates every knob.
    pub fn resolve(self) -> Result<TrainConfig, ConfigError> {
        // Checked before `fill`, which gives `epochs` its default.
        if self.steps.is_some() && self.epochs.is_some() {
            return Err(invalid("steps", "set either `steps` or `epochs`, not both"));
        }
        let cfg = self.fill()?;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `TESSERA_LOADER_THREADS` when set (a flag or config key wins over it), else the cores, at
/// most 8.
fn default_loader_threads() -> usize {
    tessera_switches::Switches::get()
        .loader_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().min(8)))
}

impl TrainConfig {
    /// A config stored by a run (checkpoint metadata), read back: a knob added after the run
    /// takes its default, so adding one does not make older runs unreadable. Not validated
    /// again (the run was).
    pub fn from_stored(value: serde_json::Value) -> Result<TrainConfig, ConfigError> {
        let layer: ConfigLayer = serde_json::from_value(value).map_err(ConfigError::Stored)?;
        layer.fill()
    }

    /// Checks values only (no file system access): ranges, and relations between fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_rates()?;
        self.validate_ranks()?;
        self.validate_batches()?;
        self.validate_optimizer()?;
        self.validate_run_settings()
    }

    /// The learning rates: finite and > 0.
    fn validate_rates(&self) -> Result<(), ConfigError> {
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
        positive_rate("lm_lr", self.lm_lr)?;
        positive_rate("vision_lr", self.vision_lr)?;
        Ok(())
    }

    /// The ranks and how the experts are split over them.
    fn validate_ranks(&self) -> Result<(), ConfigError> {
        if self.nproc == 0 {
            return Err(invalid("nproc", "0 ranks cannot train (at least 1)"));
        }
        if self.expert_parallel == 0 {
            return Err(invalid(
                "expert_parallel",
                "0 ranks cannot hold the experts (1: no expert parallelism)",
            ));
        }
        if self.expert_parallel > 1 && self.strategy.is_hybrid() {
            return Err(invalid(
                "expert_parallel",
                format!(
                    "expert parallelism runs with full_shard, shard_grad_op or no_shard; with \
                     {:?} it is not implemented",
                    self.strategy
                ),
            ));
        }
        Ok(())
    }

    /// Tokens per micro-batch and row, micro-steps per step, and the run's length.
    fn validate_batches(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// The schedule, AdamW and LoRA.
    fn validate_optimizer(&self) -> Result<(), ConfigError> {
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
        if self.train.lora && self.lora_r == 0 {
            return Err(invalid(
                "lora_r",
                "rank 0 adds no adapter (LoRA needs r >= 1)",
            ));
        }
        if !(self.lora_alpha.is_finite() && self.lora_alpha > 0.0) {
            return Err(invalid(
                "lora_alpha",
                format!("{} must be > 0", self.lora_alpha),
            ));
        }
        Ok(())
    }

    /// Checkpoints, images, the loader, the cache, timeouts, validation, dtypes and the device.
    fn validate_run_settings(&self) -> Result<(), ConfigError> {
        if self.keep_checkpoints == 0 {
            return Err(invalid(
                "keep_checkpoints",
                "0 would delete the checkpoint a resume needs (at least 1)",
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
        if let Err(source) = tessera_remote::parse_size(&self.cache_limit) {
            return Err(ConfigError::BadSize {
                field: "cache_limit",
                source,
            });
        }
        if self.heartbeat_timeout_s == 0 {
            return Err(invalid(
                "heartbeat_timeout_s",
                "0 s would count every rank lost at once",
            ));
        }
        if self.collective_timeout_s == 0 {
            return Err(invalid(
                "collective_timeout_s",
                "a 0 s timeout fails every collective",
            ));
        }
        if self.val_samples == 0 {
            return Err(invalid(
                "val_samples",
                "an empty validation set measures nothing (at least 1)",
            ));
        }
        if self.reduce_dtype == Dtype::Bf16 && self.precision == Dtype::F32 {
            return Err(invalid(
                "reduce_dtype",
                "bf16 gradients need bf16 precision (an f32 run reduces in f32)",
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
        let spec = self.shards.to_string_lossy();
        let remote_shards = tessera_remote::is_remote(&spec);
        if tessera_pipeline::mix::is_mixture(&spec) {
            // A mixture file: its sources are checked as they are opened.
            if !self.shards.is_file() {
                return Err(invalid(
                    "shards",
                    format!(
                        "{} is not a file (a mixture file, mix.toml)",
                        self.shards.display()
                    ),
                ));
            }
        } else if !remote_shards && !self.shards.join("index.json").is_file() {
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
        if let Some(dir) = &self.val_shards {
            if !dir.join("index.json").is_file() {
                return Err(invalid(
                    "val_shards",
                    format!(
                        "{} holds no index.json (not a complete shard directory; run `tessera \
                         ingest`)",
                        dir.display()
                    ),
                ));
            }
        }
        if let Some(p) = &self.init_projector {
            if !p.is_file() && !crate::run_dir::RunDir::new(p).checkpoints().is_dir() {
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

#[cfg(test)]
mod tests;
