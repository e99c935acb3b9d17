//! The vision tower's and LoRA's configs parsed from Hugging Face `config.json` files (the
//! language model's is `lm_config.rs`). Field names are exactly HF's;
//! what sparse Hub configs leave out gets HF's default from a small named function, so a
//! config written by `save_pretrained` and a hand-trimmed one parse to the same values.
use super::error::{ModelError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

fn siglip_hidden_size() -> i64 {
    768
}
fn siglip_intermediate_size() -> i64 {
    3072
}
fn siglip_num_hidden_layers() -> i64 {
    12
}
fn siglip_num_attention_heads() -> i64 {
    12
}
fn siglip_num_channels() -> i64 {
    3
}
fn siglip_image_size() -> i64 {
    224
}
fn siglip_patch_size() -> i64 {
    16
}
fn siglip_hidden_act() -> String {
    "gelu_pytorch_tanh".into()
}
fn layer_norm_eps() -> f64 {
    1e-6
}

/// SigLIP (and SigLIP-2 FixRes) vision tower: `SiglipVisionConfig`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiglipVisionConfig {
    #[serde(default = "siglip_hidden_size")]
    pub hidden_size: i64,
    #[serde(default = "siglip_intermediate_size")]
    pub intermediate_size: i64,
    #[serde(default = "siglip_num_hidden_layers")]
    pub num_hidden_layers: i64,
    #[serde(default = "siglip_num_attention_heads")]
    pub num_attention_heads: i64,
    #[serde(default = "siglip_num_channels")]
    pub num_channels: i64,
    #[serde(default = "siglip_image_size")]
    pub image_size: i64,
    #[serde(default = "siglip_patch_size")]
    pub patch_size: i64,
    #[serde(default = "siglip_hidden_act")]
    pub hidden_act: String,
    #[serde(default = "layer_norm_eps")]
    pub layer_norm_eps: f64,
}

impl SiglipVisionConfig {
    /// Reads `dir/config.json`, either a `SiglipVisionConfig` (flat, `model_type`
    /// `siglip_vision_model`) or a `SiglipConfig` (`siglip`) whose `vision_config` sub-object
    /// describes the tower. SigLIP-2's fixed-resolution checkpoints are the latter; any other
    /// `model_type` (SigLIP-2 NaFlex's `siglip2` included) is refused, naming the folder.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let value = read_json(&dir.join("config.json"))?;
        check_vision_model_type(dir, &value)?;
        let vision = value.get("vision_config").cloned().unwrap_or(value);
        let cfg: Self = parse(&dir.join("config.json"), vision)?;
        cfg.validate().map_err(|e| e.in_dir(dir))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        if self.hidden_size % self.num_attention_heads != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "vision hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            )));
        }
        // image_size need not be a multiple of patch_size (so400m: 384 / 14): the stride-p
        // convolution drops the remainder, as in transformers.
        if self.patch_size <= 0 || self.image_size < self.patch_size {
            return Err(ModelError::InvalidConfig(format!(
                "vision image_size {} is smaller than patch_size {}",
                self.image_size, self.patch_size
            )));
        }
        if self.num_hidden_layers < 2 {
            return Err(ModelError::InvalidConfig(
                "the vision tower needs at least 2 layers (features come from the layer before the last)".into(),
            ));
        }
        if !matches!(self.hidden_act.as_str(), "gelu_pytorch_tanh" | "gelu") {
            return Err(ModelError::InvalidConfig(format!(
                "vision hidden_act `{}` is not supported (gelu_pytorch_tanh, gelu)",
                self.hidden_act
            )));
        }
        Ok(())
    }

    pub fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_attention_heads
    }

    /// Vision tokens per image: floor(image_size / patch_size)^2.
    pub fn num_patches(&self) -> i64 {
        let side = self.image_size / self.patch_size;
        side * side
    }
}

/// What the vision tower accepts, for the refusal messages.
const SUPPORTED_VISION: &str = "siglip and siglip_vision_model towers (SigLIP, and SigLIP-2's \
                                fixed-resolution checkpoints, which share its architecture)";

/// Accepts `siglip` and `siglip_vision_model`; refuses anything else with the folder, the
/// `model_type` and what is supported.
fn check_vision_model_type(dir: &Path, value: &serde_json::Value) -> Result<()> {
    let model_type = value.get("model_type").and_then(|v| v.as_str());
    let reason = match model_type {
        Some("siglip" | "siglip_vision_model") => return Ok(()),
        Some("siglip2" | "siglip2_vision_model") => {
            "SigLIP-2 NaFlex (native aspect ratio: a linear patch embedding over pre-patchified \
             pixels and a resized position grid) is not supported"
        }
        Some(_) => "this vision tower type is not supported",
        None => "config.json has no model_type",
    };
    Err(ModelError::Unsupported {
        dir: dir.to_path_buf(),
        model_type: model_type.unwrap_or("").to_string(),
        reason: reason.to_string(),
        supported: SUPPORTED_VISION,
    })
}

fn lora_r() -> i64 {
    8
}
fn lora_alpha() -> f64 {
    16.0
}
fn lora_targets() -> Vec<String> {
    [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    .map(String::from)
    .to_vec()
}

/// LoRA on the LM's linear layers (PEFT's `LoraConfig` fields).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    #[serde(default = "lora_r")]
    pub r: i64,
    #[serde(default = "lora_alpha")]
    pub lora_alpha: f64,
    #[serde(default = "lora_targets")]
    pub target_modules: Vec<String>,
    #[serde(default)]
    pub lora_dropout: f64,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            r: lora_r(),
            lora_alpha: lora_alpha(),
            target_modules: lora_targets(),
            lora_dropout: 0.0,
        }
    }
}

impl LoraConfig {
    /// PEFT's scaling: alpha / r.
    pub fn scaling(&self) -> f64 {
        self.lora_alpha / self.r as f64
    }

    /// Accepts PEFT module names (`q_proj`) and short forms (`q`, `gate`).
    pub fn with_targets(mut self, names: &[&str]) -> Result<Self> {
        let mut out = Vec::new();
        for name in names {
            let full = if name.ends_with("_proj") {
                name.to_string()
            } else {
                format!("{name}_proj")
            };
            if !lora_targets().contains(&full) {
                return Err(ModelError::InvalidConfig(format!(
                    "LoRA target `{name}` is not one of q, k, v, o, gate, up, down"
                )));
            }
            out.push(full);
        }
        self.target_modules = out;
        Ok(self)
    }

    pub fn validate(&self) -> Result<()> {
        if self.r <= 0 {
            return Err(ModelError::InvalidConfig(format!(
                "LoRA r {} is not a rank",
                self.r
            )));
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(ModelError::InvalidConfig(format!(
                "LoRA dropout {} is outside [0, 1)",
                self.lora_dropout
            )));
        }
        for t in &self.target_modules {
            if !lora_targets().contains(t) {
                return Err(ModelError::InvalidConfig(format!(
                    "LoRA target `{t}` is not a linear layer of the language model"
                )));
            }
        }
        Ok(())
    }
}

pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.into(),
        source,
    })
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    path: &Path,
    value: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(value).map_err(|source| ModelError::Json {
        path: path.into(),
        source,
    })
}
