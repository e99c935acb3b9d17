//! The model `tessera generate` runs: a run's newest complete checkpoint (the frozen vision
//! tower and LM from the directories the run names, the trained projector and LoRA adapters
//! from the checkpoint), or a `tessera export --format llava-hf` directory.
use super::export::{newest_complete_trained, ExportError, VlmDescription};
use super::run_dir::RunDir;
use pipeline::loader::ResizePolicy;
use std::path::Path;
use tessera_model::{
    load_llava_dir, CaptionError, Captioner, Generator, ModelError, Vlm, VlmOptions,
};

/// A model ready to generate, with what preprocessing it needs.
pub struct GenerationModel {
    pub generator: Generator,
    /// Chat template the model was trained with: `plain` or `chatml`.
    pub template: String,
    /// `square` (resize straight) or `pad`, as LLaVA's `image_aspect_ratio`.
    pub image_aspect_ratio: String,
    /// Hex sha256 of the tokenizer.json the run's shards were tokenized with (runs only).
    pub tokenizer_fingerprint: Option<String>,
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
        Captioner::new(self.generator, template, resize, tokenizer)
    }
}

/// Loads the newest complete checkpoint of `run`.
pub fn load_run_model(run: &Path) -> Result<GenerationModel, ExportError> {
    let description = VlmDescription::load(&RunDir::new(run).vlm())?;
    let (ckpt, trainable) = newest_complete_trained(run)?;
    // Stage 2 (finetune) trains LoRA adapters; stage 1 only the projector.
    let lora = match description.stage {
        2 => description.lora.clone(),
        _ => None,
    };
    let vlm = Vlm::from_dirs(
        &description.mm_vision_tower,
        &description.language_model,
        VlmOptions {
            image_token_id: i64::from(description.image_token_id),
            lora,
            ..Default::default()
        },
    )?;
    let mut params = vlm.load_params_as_stored(
        &description.mm_vision_tower,
        &description.language_model,
        None,
        0,
    )?;
    for spec in vlm.param_specs().iter().filter(|s| s.trainable) {
        if trainable.get(&spec.name)?.is_none() {
            return Err(ExportError::BadRun {
                run: run.to_path_buf(),
                what: format!("checkpoint {} holds no `{}`", ckpt.dir.display(), spec.name),
            });
        }
    }
    // Whatever trained (projector, adapters, the LM or vision layers of a full fine-tune)
    // replaces the directories' weights.
    trainable.overlay(&mut params, &vlm.param_specs())?;
    Ok(GenerationModel {
        generator: Generator::new(&vlm, params)?,
        template: description.template.clone(),
        image_aspect_ratio: description.image_aspect_ratio.clone(),
        tokenizer_fingerprint: Some(description.tokenizer_fingerprint.clone()),
        step: Some(ckpt.meta.step),
    })
}

/// Loads a llava-hf export; its template is ChatML when its chat template speaks ChatML.
pub fn load_export_model(dir: &Path) -> Result<GenerationModel, ModelError> {
    let (vlm, params) = load_llava_dir(dir)?;
    let chat = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap_or_default();
    Ok(GenerationModel {
        generator: Generator::new(&vlm, params)?,
        template: if chat.contains(shards::chat::IM_START) {
            "chatml".into()
        } else {
            "plain".into()
        },
        image_aspect_ratio: "square".into(),
        tokenizer_fingerprint: None,
        step: None,
    })
}
