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
pub(crate) mod error;
pub(crate) mod for_generation;
pub(crate) mod llava_hf;
pub(crate) mod run_checkpoint;
pub(crate) mod run_weights;

use crate::checkpoint::trained::TrainedTensors;
use crate::config::{Dtype, Stage};
use crate::run_dir::RunDir;
use crate::vlm_description::VlmDescription;
use error::ExportError;
use run_checkpoint::{newest_complete_trained, stored_config};
use run_weights::initial_projector;
use std::path::{Path, PathBuf};
use tessera_model::{
    save_adapter_as, save_safetensors_as, write_hub_files, Vlm, ADAPTER_CONFIG, HUB_SHARD_BYTES,
    IMAGE_NEWLINE,
};

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
        vlm.tower_options(),
    )?;
    let (projector, projector_from) = match initial_projector(run, &cfg, &model)? {
        Some((projector, from)) => (projector, Some(from)),
        None => (
            params.collect(|k| k.starts_with("mm_projector.") || k == IMAGE_NEWLINE)?,
            None,
        ),
    };
    // A --standardize-features run's statistics go into the first layer: the file is LLaVA's
    // plain mlp2x_gelu projector.
    let mut projector = projector;
    if let Some(stats) = &vlm.feature_stats {
        tessera_model::fold_into_projector(&mut projector, stats)?;
    }
    // An anyres_max_N run's image_newline trains beside the projector and ships with it.
    let expected = if model.has_image_newline() { 5 } else { 4 };
    if projector.len() != expected {
        return Err(ExportError::BadRun {
            run: run.to_path_buf(),
            what: format!(
                "checkpoint {} holds {} projector tensors, expected {expected} (mm_projector.0/2 \
                 weight+bias{})",
                ckpt.dir.display(),
                projector.len(),
                if expected == 5 { ", image_newline" } else { "" }
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
