//! [`VlmDescription`]: the VLM a run trains, written once as the run's `vlm.json` and, with what
//! export wrote, as an export's `config.json`.
use crate::config::{ResizePolicy, TrainConfig};
use crate::export::error::ExportError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tessera_model::{FeatureLayers, FeatureStats, LoraConfig, Vlm, VlmOptions};
use tessera_shards::image_layout::ImageLayout;

/// The VLM a run trains, as exported in `config.json` (LLaVA's key names where it has them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct VlmDescription {
    pub model_type: String,
    /// Vision tower source directory (absolute).
    pub mm_vision_tower: PathBuf,
    /// Language model source directory (absolute).
    pub language_model: PathBuf,
    pub mm_projector_type: String,
    /// The hidden state the features are (-2: the layer before the last), or a list of them
    /// concatenated in order (tessera's extension of LLaVA's integer; transformers' list).
    pub mm_vision_select_layer: FeatureLayers,
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
    /// The special tokens the shards were tokenized with.
    pub special_tokens: tessera_text::SpecialTokens,
    /// Rows the LM appended for tokens ingest added (`<image>`), trained with the projector.
    #[serde(default)]
    pub added_tokens: i64,
    /// `--image-layout`: `single` (one tile per image) or `anyres_max_N` (LLaVA-OneVision's
    /// tiles with `image_newline`).
    #[serde(default)]
    pub image_layout: ImageLayout,
    /// `--standardize-features`: the per-channel statistics the projector standardises the
    /// tower's features with (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_stats: Option<FeatureStats>,
}

impl VlmDescription {
    /// The run of `cfg` training `vlm` on the shards of `manifest`.
    pub(crate) fn new(cfg: &TrainConfig, vlm: &Vlm, manifest: &tessera_shards::Manifest) -> Self {
        let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let (vision, lm) = (&vlm.vision, &vlm.lm);
        let tokens = manifest.special_tokens();
        VlmDescription {
            model_type: format!("llava_{}", lm.family().model_type()),
            mm_vision_tower: abs(&cfg.vision),
            language_model: abs(&cfg.lm),
            mm_projector_type: "mlp2x_gelu".into(),
            mm_vision_select_layer: vision.feature_layers.clone(),
            mm_vision_select_feature: "patch".into(),
            mm_hidden_size: vision.feature_size(),
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
            special_tokens: tokens,
            added_tokens: vlm.options.added_tokens,
            image_layout: vlm.options.image_layout.clone(),
            feature_stats: vlm.options.feature_stats.clone(),
        }
    }

    /// The model options the run's tower was built with (its image side and feature layer),
    /// everything else at its default: what rebuilding the run's `Vlm` from its folders needs.
    pub(crate) fn tower_options(&self) -> VlmOptions {
        VlmOptions {
            image_size: Some(self.image_size),
            vision_feature_layer: Some(self.mm_vision_select_layer.clone()),
            image_layout: self.image_layout.clone(),
            feature_stats: self.feature_stats.clone(),
            ..Default::default()
        }
    }

    /// The special tokens the run's shards were tokenized with.
    pub(crate) fn special_tokens(&self) -> tessera_text::SpecialTokens {
        self.special_tokens.clone()
    }

    pub(crate) fn save(&self, path: &Path) -> Result<(), ExportError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| ExportError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        // Atomically: on a resume, the other ranks read it (the recorded feature statistics)
        // while rank 0 writes it again.
        tessera_shards::write_atomically(path, text.as_bytes()).map_err(|e| ExportError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
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
