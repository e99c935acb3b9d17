//! What `tessera generate` runs, loaded for generation: a run's newest complete checkpoint (the
//! frozen vision tower and LM from the directories the run names, whatever trained from the
//! checkpoint, and for a run that did not train the projector the one it started from; see
//! `run_weights.rs`), or a `tessera export --format llava-hf` directory.
//!
//! The weights are held in one dtype: the one asked for, or else the widest the source
//! checkpoints store (bf16 for the Hub's checkpoints and for a default export, so a run and its
//! export generate alike; f32 for f32 checkpoints). Each tensor is read and converted before
//! the next is read, so the model is in memory once, in that dtype: never an f32 copy beside a
//! bf16 one, nor the source map beside the converted one.
use super::caption::{CaptionError, Captioner};
use crate::export::error::ExportError;
use crate::export::run_checkpoint::{newest_complete_trained, stored_config};
use crate::export::run_weights::{initial_projector, RunWeights};
use crate::run_dir::RunDir;
use crate::vlm_description::VlmDescription;
use std::path::Path;
use tessera_fsdp::ParamMap;
use tessera_model::llava::load_llava_dir_as;
use tessera_model::{Dtype, Generator, HfCheckpoint, ModelError, Vlm, VlmOptions};
use tessera_pipeline::loader::ResizePolicy;
use tessera_shards::image_layout::ImageLayout;

/// A model ready to generate, with what preprocessing it needs.
pub struct GenerationModel {
    pub generator: Generator,
    /// Chat template the model was trained with: `plain` or `chatml`.
    pub template: String,
    /// `square` (resize straight) or `pad`, as LLaVA's `image_aspect_ratio`.
    pub image_aspect_ratio: String,
    /// How the model sees images: `single` or `anyres_max_N` (its run's `--image-layout`).
    pub image_layout: ImageLayout,
    /// Hex sha256 of the tokenizer.json the run's shards were tokenized with (runs only).
    pub tokenizer_fingerprint: Option<String>,
    /// The special tokens the run's shards were tokenized with (runs only; an export's
    /// tokenizer folder says them itself).
    pub special_tokens: Option<tessera_text::SpecialTokens>,
    /// Checkpoint step (runs only).
    pub step: Option<u64>,
}

impl GenerationModel {
    /// The model as a [`Captioner`] with the tokenizer at `tokenizer`, prompting with its
    /// template and resizing images as it was trained.
    pub fn into_captioner(self, tokenizer: &Path) -> Result<Captioner, CaptionError> {
        let template = self.template.parse().map_err(CaptionError::Template)?;
        let resize = match self.image_aspect_ratio.as_str() {
            "pad" => ResizePolicy::Pad,
            _ => ResizePolicy::Squash,
        };
        Captioner::new(
            self.generator,
            template,
            (resize, self.image_layout),
            tokenizer,
            self.special_tokens,
        )
    }
}

/// Loads the newest complete checkpoint of `run`, its weights in `dtype` (default: the widest
/// dtype its source directories store, see the module docs).
pub fn load_run_model(run: &Path, dtype: Option<Dtype>) -> Result<GenerationModel, ExportError> {
    let description = VlmDescription::load(&RunDir::new(run).vlm())?;
    let (ckpt, trained) = newest_complete_trained(run)?;
    let cfg = stored_config(run, &ckpt)?;
    // Stage 2 (finetune) trains LoRA adapters; stage 1 only the projector.
    let lora = match description.stage {
        2 => description.lora.clone(),
        _ => None,
    };
    let vlm = Vlm::from_dirs(
        &description.mm_vision_tower,
        &description.language_model,
        VlmOptions {
            image_token_id: Some(i64::from(description.image_token_id)),
            train_projector: cfg.train.projector,
            lora,
            train_lm: cfg.train.lm,
            train_vision: cfg.train.vision,
            loss_chunk: None,
            added_tokens: description.added_tokens,
            expert_parallel: None,
            // A --standardize-features run's statistics are folded into the projector as its
            // weights are read (below): the model generating is LLaVA's plain projector.
            feature_stats: None,
            ..description.tower_options()
        },
    )?;
    let specs = vlm.param_specs();
    let names = trained.names();
    for spec in specs.iter().filter(|s| s.trainable) {
        if !names.contains(&spec.name) {
            return Err(ExportError::BadRun {
                run: run.to_path_buf(),
                what: format!("checkpoint {} holds no `{}`", ckpt.dir.display(), spec.name),
            });
        }
    }
    let known: std::collections::HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    if let Some(name) = names.iter().find(|n| !known.contains(n.as_str())) {
        return Err(ExportError::Model(ModelError::InvalidConfig(format!(
            "the checkpoint trained `{name}`, which this model does not have"
        ))));
    }
    let initial = initial_projector(run, &cfg, &vlm)?;
    if let Some((_, from)) = &initial {
        tracing::info!("the projector did not train: generating with {from}");
    }
    let weights = RunWeights::open(
        &description.mm_vision_tower,
        &description.language_model,
        &trained,
        (
            initial.as_ref().map(|(p, _)| p),
            description.feature_stats.as_ref(),
        ),
    )?;
    let kind = match dtype {
        Some(dtype) => dtype.kind(),
        None => weights.source_kind(specs.iter().map(|s| s.name.as_str()).filter(|n| {
            !n.starts_with("mm_projector.")
                && !n.starts_with("added_tokens.")
                && !n.contains(".lora_")
        })),
    };
    let mut params = ParamMap::new();
    for spec in &specs {
        let t = weights.tensor(&spec.name, &spec.shape, Some(kind))?;
        params.insert(spec.name.clone(), t);
    }
    Ok(GenerationModel {
        generator: Generator::with_kind(&vlm, params, kind)?,
        template: description.template.clone(),
        image_aspect_ratio: description.image_aspect_ratio.clone(),
        image_layout: description.image_layout.clone(),
        tokenizer_fingerprint: Some(description.tokenizer_fingerprint.clone()),
        special_tokens: Some(description.special_tokens()),
        step: Some(ckpt.meta.step),
    })
}

/// Loads a llava-hf export, its weights in `dtype` (default: the widest dtype it stores them
/// in); its template is ChatML when its chat template speaks ChatML.
pub fn load_export_model(dir: &Path, dtype: Option<Dtype>) -> Result<GenerationModel, ModelError> {
    let kind = HfCheckpoint::load_kind(dir, dtype)?;
    let (vlm, params) = load_llava_dir_as(dir, Some(kind))?;
    let chat = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap_or_default();
    Ok(GenerationModel {
        generator: Generator::with_kind(&vlm, params, kind)?,
        template: if chat.contains(tessera_text::chat::IM_START) {
            "chatml".into()
        } else {
            "plain".into()
        },
        image_aspect_ratio: "square".into(),
        image_layout: ImageLayout::Single,
        tokenizer_fingerprint: None,
        special_tokens: None,
        step: None,
    })
}
