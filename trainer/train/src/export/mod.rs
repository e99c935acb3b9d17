//! `tessera export --run DIR --out DIR`: what a run leaves for transformers and PEFT.
//!
//! From the run's newest complete checkpoint (committed, every file as its manifest says; newer
//! damaged or unfinished ones are passed over and named, as a resume does) it writes
//! - `mm_projector.safetensors`: the projector with LLaVA's keys (`mm_projector.0.weight`, ...):
//!   the trained one, or for a run that did not train it (`--train lm`) the one it started from
//!   (see [`initial_projector`]), which the report names; with it the rows the LM appended for
//!   tokens ingest added (`added_tokens.*`), as LLaVA keeps new embeddings in mm_projector.bin;
//! - `adapter/` (stage 2): `adapter_model.safetensors` + `adapter_config.json` in PEFT's format;
//!   both in bf16 (as the Hub ships weights) unless `--dtype f32` asks for the masters as they are;
//! - `lm/`, `vision/` (a full fine-tune): the source Hugging Face directory with every trained
//!   tensor replaced, written one tensor at a time (`tessera_model::write_hub_files`): the source
//!   tensor or the trained one is read, written and dropped before the next, so the export
//!   never holds a tower in memory;
//! - `config.json`: the VLM (vision and LM source directories, projector type, image token
//!   count and id, template, resize policy), using LLaVA's config key names where LLaVA has one.
pub(crate) mod caption;
pub(crate) mod for_generation;
pub(crate) mod llava_hf;
pub(crate) mod run_weights;

use crate::checkpoint::format::{Checkpoint, CheckpointError};
use crate::checkpoint::sharded_state::ShardedState;
use crate::config::{Dtype, ResizePolicy, Stage, TrainConfig};
use crate::export::run_weights::initial_projector;
use crate::run_dir::RunDir;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};
use tessera_fsdp::ParamMap;
use tessera_model::{
    load_safetensors, save_adapter_as, save_safetensors_as, write_hub_files, LoraConfig,
    ModelError, Vlm, VlmOptions, ADAPTER_CONFIG, HUB_SHARD_BYTES,
};

/// File (in rank 0's checkpoint folder) holding the full trainable tensors, by HF key.
pub(crate) const TRAINABLE_FILE: &str = "trainable.safetensors";
pub(crate) const PROJECTOR_FILE: &str = "mm_projector.safetensors";
pub(crate) const ADAPTER_DIR: &str = "adapter";
/// A full fine-tune's LM, as a Hugging Face directory (config.json + model.safetensors).
pub(crate) const LM_DIR: &str = "lm";
/// The vision tower when it trained, likewise.
pub(crate) const VISION_DIR: &str = "vision";

/// Writes `out` as a copy of the Hugging Face directory `src` (its config and other small
/// files) whose weights are `src`'s with every trained tensor replaced, in `dtype`, one tensor
/// at a time (sharded past 5 GB as `save_pretrained` shards).
fn export_tower(
    src: &Path,
    out: &Path,
    trained: &TrainedTensors,
    dtype: Dtype,
) -> Result<(), ExportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ExportError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    for entry in std::fs::read_dir(src).map_err(io(src))? {
        let path = entry.map_err(io(src))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some(name) = name else { continue };
        let weights = name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json");
        if path.is_file() && !weights {
            std::fs::copy(&path, out.join(&name)).map_err(io(&path))?;
        }
    }
    let ckpt = tessera_model::HfCheckpoint::open(src)?;
    let mut entries: Vec<(String, Vec<i64>)> = ckpt
        .names()
        .map(|name| {
            let shape = ckpt.shape(name).map(<[i64]>::to_vec).unwrap_or_default();
            (name.to_string(), shape)
        })
        .collect();
    entries.sort();
    let kind = dtype.kind();
    write_hub_files(out, &entries, kind, HUB_SHARD_BYTES, |name| {
        match trained.get_as(name, kind)? {
            Some(t) => Ok(t),
            None => {
                let shape = ckpt.shape(name).map(<[i64]>::to_vec).unwrap_or_default();
                Ok::<_, ExportError>(ckpt.tensor_as_stored(name, &shape)?)
            }
        }
    })?;
    Ok(())
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("run {run}: no complete checkpoint under {run}/checkpoints ({why})")]
    NoCheckpoint {
        run: PathBuf,
        /// The folders passed over and why, or what to do when there are none.
        why: String,
    },
    #[error(
        "run {run} keeps no tokenizer.json (its shards had none beside index.json): pass \
         --tokenizer, the tokenizer.json its shards were made with (sha256 {expected})"
    )]
    NoTokenizer { run: PathBuf, expected: String },
    #[error(
        "run {run}: tokenizer {file} has sha256 {found}, but the run's shards were tokenized \
         with {expected}"
    )]
    TokenizerMismatch {
        run: PathBuf,
        file: PathBuf,
        found: String,
        expected: String,
    },
    #[error("run {run}: {what}")]
    BadRun { run: PathBuf, what: String },
    /// A file of the run that cannot be read or parsed: `what` names it, the source says why.
    #[error("run {run}: {what}")]
    Unreadable {
        run: PathBuf,
        what: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The VLM a run trains, as exported in `config.json` (LLaVA's key names where it has them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct VlmDescription {
    pub model_type: String,
    /// Vision tower source directory (absolute).
    pub mm_vision_tower: PathBuf,
    /// Language model source directory (absolute).
    pub language_model: PathBuf,
    pub mm_projector_type: String,
    /// Features come from the layer before the last.
    pub mm_vision_select_layer: i64,
    pub mm_vision_select_feature: String,
    pub mm_hidden_size: i64,
    pub hidden_size: i64,
    pub image_size: i64,
    /// Vision tokens per image: each placeholder expands to this many.
    pub image_token_count: i64,
    pub image_token_id: u32,
    pub image_token: String,
    /// `square` (resize straight) or `pad` (expand2square), as LLaVA's `image_aspect_ratio`.
    pub image_aspect_ratio: String,
    /// Chat template the shards were tokenized with (`plain` or `chatml`).
    pub template: String,
    pub tokenizer_fingerprint: String,
    pub stage: u8,
    #[serde(default)]
    pub lora: Option<LoraConfig>,
    /// Filled by `export`: the checkpoint step exported and the files written.
    #[serde(default)]
    pub step: Option<u64>,
    #[serde(default)]
    pub projector_file: Option<String>,
    #[serde(default)]
    pub adapter_dir: Option<String>,
    /// The special tokens the shards were tokenized with (`None` in runs from before they
    /// were recorded, which used Qwen's: see [`VlmDescription::special_tokens`]).
    #[serde(default)]
    pub special_tokens: Option<shards::SpecialTokens>,
    /// Rows the LM appended for tokens ingest added (`<image>`), trained with the projector.
    #[serde(default)]
    pub added_tokens: i64,
}

impl VlmDescription {
    /// The run of `cfg` training `vlm` on the shards of `manifest`.
    pub(crate) fn new(cfg: &TrainConfig, vlm: &Vlm, manifest: &shards::Manifest) -> Self {
        let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let (vision, lm) = (&vlm.vision, &vlm.lm);
        let tokens = manifest.special_tokens();
        VlmDescription {
            model_type: format!("llava_{}", lm.family().model_type()),
            mm_vision_tower: abs(&cfg.vision),
            language_model: abs(&cfg.lm),
            mm_projector_type: "mlp2x_gelu".into(),
            mm_vision_select_layer: -2,
            mm_vision_select_feature: "patch".into(),
            mm_hidden_size: vision.hidden_size,
            hidden_size: lm.hidden_size,
            image_size: vision.image_size,
            image_token_count: vision.num_patches(),
            image_token_id: manifest.image_placeholder_id,
            image_token: tokens.image.text.clone(),
            image_aspect_ratio: match cfg.resize {
                ResizePolicy::Squash => "square".into(),
                ResizePolicy::Pad => "pad".into(),
            },
            template: manifest.template.clone(),
            tokenizer_fingerprint: manifest.tokenizer_fingerprint.clone(),
            stage: cfg.stage.into(),
            lora: vlm.options.lora.clone(),
            step: None,
            projector_file: None,
            adapter_dir: None,
            special_tokens: Some(tokens),
            added_tokens: vlm.options.added_tokens,
        }
    }

    /// The special tokens the run's shards were tokenized with.
    pub(crate) fn special_tokens(&self) -> shards::SpecialTokens {
        self.special_tokens
            .clone()
            .unwrap_or_else(shards::SpecialTokens::qwen_before_recorded)
    }

    pub(crate) fn save(&self, path: &Path) -> Result<(), ExportError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| ExportError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(path, text).map_err(|source| ExportError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    pub(crate) fn load(path: &Path) -> Result<Self, ExportError> {
        let unreadable = |what: String, source| ExportError::Unreadable {
            run: path.parent().unwrap_or(path).to_path_buf(),
            what,
            source,
        };
        let text = std::fs::read(path)
            .map_err(|e| unreadable(format!("cannot read {}", path.display()), e.into()))?;
        serde_json::from_slice(&text)
            .map_err(|e| unreadable(format!("{} is not valid", path.display()), e.into()))
    }
}

/// What `export` wrote.
#[derive(Clone, Debug)]
pub struct ExportReport {
    pub step: u64,
    pub projector: PathBuf,
    /// Where the projector came from when the run did not train it (`--train lm`): the
    /// `--init-projector` it started from, or the seed that drew it.
    pub projector_from: Option<String>,
    pub adapter: Option<PathBuf>,
    pub config: PathBuf,
}

/// The trained tensors of a checkpoint: format 3's one file of full tensors, or format 4's
/// shards, read one parameter at a time (a full fine-tune is never whole in memory here).
pub enum TrainedTensors {
    Full(ParamMap),
    Sharded(ShardedState),
}

impl TrainedTensors {
    /// Opens what `ckpt` trained (verified against its manifests).
    pub fn open(ckpt: &Checkpoint) -> Result<Self, ExportError> {
        if ckpt.meta.format_version >= 4 {
            return Ok(TrainedTensors::Sharded(ShardedState::open(ckpt)?));
        }
        let dir = ckpt.rank_dir(0)?;
        Ok(TrainedTensors::Full(load_safetensors(
            &dir.join(TRAINABLE_FILE),
        )?))
    }

    /// Names of every trained parameter.
    pub fn names(&self) -> Vec<String> {
        match self {
            TrainedTensors::Full(map) => map.keys().cloned().collect(),
            TrainedTensors::Sharded(state) => state.names().map(String::from).collect(),
        }
    }

    /// One trained parameter, whole (f32), or `None` when it did not train.
    pub fn get(&self, name: &str) -> Result<Option<Tensor>, ExportError> {
        self.get_as(name, Kind::Float)
    }

    /// [`Self::get`] in `kind` (format 4 converts while reading, so no f32 copy is made).
    pub fn get_as(&self, name: &str, kind: Kind) -> Result<Option<Tensor>, ExportError> {
        match self {
            TrainedTensors::Full(map) => Ok(map.get(name).map(|t| t.to_kind(kind))),
            TrainedTensors::Sharded(state) => Ok(state.get_as(name, kind)?),
        }
    }

    /// The trained parameters whose names pass `keep`, in one map (small parts: the
    /// projector, LoRA adapters).
    pub fn collect(&self, keep: impl Fn(&str) -> bool) -> Result<ParamMap, ExportError> {
        let mut out = ParamMap::new();
        for name in self.names().into_iter().filter(|n| keep(n)) {
            if let Some(t) = self.get(&name)? {
                out.insert(name, t);
            }
        }
        Ok(out)
    }
}

/// The run's newest complete checkpoint (see [`RunDir::newest_complete_checkpoint`]); each
/// newer folder passed over is logged with its reason, and with none usable the error names
/// them all.
pub(crate) fn newest_complete(run: &Path) -> Result<Checkpoint, ExportError> {
    let pick = RunDir::new(run).newest_complete_checkpoint()?;
    let Some(checkpoint) = pick.checkpoint else {
        let why = if pick.skipped.is_empty() {
            "train first, or wait for the first checkpoint".to_string()
        } else {
            format!("skipped {}", pick.skipped_list())
        };
        return Err(ExportError::NoCheckpoint {
            run: run.to_path_buf(),
            why,
        });
    };
    let shown = run.display();
    for s in &pick.skipped {
        tracing::warn!("run {shown}: skipped {}: {}", s.checkpoint, s.reason);
    }
    Ok(checkpoint)
}

/// The trained tensors of the run's newest complete checkpoint, and that checkpoint.
pub fn newest_complete_trained(run: &Path) -> Result<(Checkpoint, TrainedTensors), ExportError> {
    let ckpt = newest_complete(run)?;
    let trained = TrainedTensors::open(&ckpt)?;
    Ok((ckpt, trained))
}

/// The training config `ckpt` (of `run`) was written under.
pub(crate) fn stored_config(run: &Path, ckpt: &Checkpoint) -> Result<TrainConfig, ExportError> {
    TrainConfig::from_stored(ckpt.meta.config.clone()).map_err(|e| ExportError::Unreadable {
        run: run.to_path_buf(),
        what: format!(
            "checkpoint {} holds an unreadable config",
            ckpt.dir.display()
        ),
        source: e.into(),
    })
}

/// [`export`] with the projector and adapter weights written in `dtype` (the checkpoint holds
/// the f32 masters, whatever the run's precision).
pub fn export_as(run: &Path, out: &Path, dtype: Dtype) -> Result<ExportReport, ExportError> {
    let mut vlm = VlmDescription::load(&RunDir::new(run).vlm())?;
    let (ckpt, params) = newest_complete_trained(run)?;
    let cfg = stored_config(run, &ckpt)?;
    std::fs::create_dir_all(out).map_err(|source| ExportError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let model = Vlm::from_dirs(
        &vlm.mm_vision_tower,
        &vlm.language_model,
        VlmOptions::default(),
    )?;
    let (projector, projector_from) = match initial_projector(run, &cfg, &model)? {
        Some((projector, from)) => (projector, Some(from)),
        None => (params.collect(|k| k.starts_with("mm_projector."))?, None),
    };
    if projector.len() != 4 {
        return Err(ExportError::BadRun {
            run: run.to_path_buf(),
            what: format!(
                "checkpoint {} holds {} projector tensors, expected 4 (mm_projector.0/2 weight+bias)",
                ckpt.dir.display(),
                projector.len()
            ),
        });
    }
    // The added tokens' rows (`<image>` past the LM's vocabulary) trained beside the
    // projector: kept in the same file, as LLaVA keeps new embeddings in mm_projector.bin.
    let mut projector = projector;
    projector.append(&mut params.collect(|k| k.starts_with("added_tokens."))?);
    let projector_path = out.join(PROJECTOR_FILE);
    save_safetensors_as(&projector_path, &projector, dtype.kind())?;
    let adapter = match (cfg.stage, &vlm.lora) {
        (Stage::Finetune, Some(lora_cfg)) => {
            let dir = out.join(ADAPTER_DIR);
            let base = vlm.language_model.display().to_string();
            let adapters = params.collect(|k| k.contains(".lora_"))?;
            save_adapter_as(&dir, lora_cfg, &adapters, &base, dtype.kind())?;
            Some(dir)
        }
        _ => None,
    };
    // A full fine-tune's LM (and vision tower, if it trained) as Hugging Face directories the
    // exported config points to; frozen towers stay where the run read them.
    let names = params.names();
    let trained_lm = names
        .iter()
        .any(|n| (n.starts_with("model.") || n == "lm_head.weight") && !n.contains(".lora_"));
    if trained_lm {
        let dir = out.join(LM_DIR);
        export_tower(&vlm.language_model, &dir, &params, dtype)?;
        vlm.language_model = dir;
    }
    if names.iter().any(|n| n.starts_with("vision_model.")) {
        let dir = out.join(VISION_DIR);
        export_tower(&vlm.mm_vision_tower, &dir, &params, dtype)?;
        vlm.mm_vision_tower = dir;
    }
    vlm.step = Some(ckpt.meta.step);
    vlm.projector_file = Some(PROJECTOR_FILE.into());
    vlm.adapter_dir = adapter.as_ref().map(|_| ADAPTER_DIR.into());
    let config = out.join("config.json");
    vlm.save(&config)?;
    debug_assert!(adapter
        .as_ref()
        .is_none_or(|d| d.join(ADAPTER_CONFIG).is_file()));
    Ok(ExportReport {
        step: ckpt.meta.step,
        projector: projector_path,
        projector_from,
        adapter,
        config,
    })
}
