//! The vision tower's and LoRA's configs parsed from Hugging Face `config.json` files (the
//! language model's is `lm_config.rs`). Field names are exactly HF's;
//! what sparse Hub configs leave out gets HF's default from a small named function, so a
//! config written by `save_pretrained` and a hand-trimmed one parse to the same values.
use super::error::{ModelError, Result};
use super::feature_layers::FeatureLayers;
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

/// The tower architectures tessera implements, with what only one of them has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VisionArch {
    /// SigLIP (and SigLIP-2 FixRes): no CLS token, position embeddings for exactly the
    /// config's `image_size`, gelu-tanh (or exact gelu), keys under `vision_model.`.
    #[default]
    Siglip,
    /// DINOv2 (`Dinov2Model`): a CLS token (dropped from the features, as LLaVA's
    /// `vision_feature_select_strategy` "default" does), layer scale, exact GELU, and position
    /// embeddings learned on a `position_grid`² grid (plus the CLS position), interpolated
    /// bicubically to the run's image size as transformers does.
    Dinov2 { position_grid: i64 },
}

/// A vision tower's config: `SiglipVisionConfig` fields, which DINOv2's config maps onto
/// (`intermediate_size` = `hidden_size · mlp_ratio`). `image_size` is the side images are fed
/// at: the config's own, or a run's `--image-size` for a tower that interpolates its position
/// embeddings ([`VisionConfig::at_image_size`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
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
    #[serde(skip)]
    pub arch: VisionArch,
    /// Which hidden states the image features are (LLaVA's `mm_vision_select_layer`,
    /// transformers' `vision_feature_layer`): by default -2, the layer before the last; several
    /// are concatenated along the channels in the order listed. The tower runs only the layers
    /// up to the deepest of them.
    #[serde(skip)]
    pub feature_layers: FeatureLayers,
}

/// transformers' `Dinov2Config` fields tessera reads, with its defaults.
#[derive(Deserialize)]
struct Dinov2Json {
    #[serde(default = "siglip_hidden_size")]
    hidden_size: i64,
    #[serde(default = "siglip_num_hidden_layers")]
    num_hidden_layers: i64,
    #[serde(default = "siglip_num_attention_heads")]
    num_attention_heads: i64,
    #[serde(default = "dinov2_mlp_ratio")]
    mlp_ratio: f64,
    #[serde(default = "siglip_num_channels")]
    num_channels: i64,
    #[serde(default = "siglip_image_size")]
    image_size: i64,
    #[serde(default = "dinov2_patch_size")]
    patch_size: i64,
    #[serde(default = "dinov2_hidden_act")]
    hidden_act: String,
    #[serde(default = "layer_norm_eps")]
    layer_norm_eps: f64,
    #[serde(default = "yes")]
    qkv_bias: bool,
    #[serde(default)]
    use_swiglu_ffn: bool,
}

fn dinov2_mlp_ratio() -> f64 {
    4.0
}
fn dinov2_patch_size() -> i64 {
    14
}
fn dinov2_hidden_act() -> String {
    "gelu".into()
}
fn yes() -> bool {
    true
}

impl VisionConfig {
    /// Reads `dir/config.json`: a `SiglipVisionConfig` (flat, `model_type`
    /// `siglip_vision_model`), a `SiglipConfig` (`siglip`) whose `vision_config` sub-object
    /// describes the tower (SigLIP-2's fixed-resolution checkpoints), or a `Dinov2Config`
    /// (`dinov2`). Any other `model_type` (SigLIP-2 NaFlex's `siglip2`, DINOv2 with registers)
    /// is refused, naming the folder.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        Self::from_json(&path, read_json(&path)?).map_err(|e| e.in_dir(dir))
    }

    /// A tower's config from its JSON (`path` names it in errors): `siglip_vision_model`,
    /// `siglip` (whose `vision_config` holds the tower's fields) or `dinov2`.
    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<Self> {
        let dir = path.parent().unwrap_or(path);
        let arch = check_vision_model_type(dir, &value)?;
        let value = value.get("vision_config").cloned().unwrap_or(value);
        let cfg = match arch {
            VisionArch::Siglip => parse(path, value)?,
            VisionArch::Dinov2 { .. } => Self::from_dinov2(parse(path, value)?)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn from_dinov2(d: Dinov2Json) -> Result<Self> {
        let refuse = |what: &str| {
            Err(ModelError::InvalidConfig(format!(
                "DINOv2 with {what} is not supported (tessera implements the released \
                 DINOv2 ViT-S/B/L: an MLP with exact GELU and q/k/v biases)"
            )))
        };
        if d.use_swiglu_ffn {
            return refuse("a SwiGLU feed-forward (use_swiglu_ffn, as in ViT-g)");
        }
        if !d.qkv_bias {
            return refuse("no q/k/v biases (qkv_bias false)");
        }
        if d.patch_size <= 0 || d.image_size < d.patch_size {
            return Err(ModelError::InvalidConfig(format!(
                "DINOv2 image_size {} is smaller than patch_size {}",
                d.image_size, d.patch_size
            )));
        }
        Ok(VisionConfig {
            hidden_size: d.hidden_size,
            intermediate_size: (d.hidden_size as f64 * d.mlp_ratio) as i64,
            num_hidden_layers: d.num_hidden_layers,
            num_attention_heads: d.num_attention_heads,
            num_channels: d.num_channels,
            image_size: d.image_size,
            patch_size: d.patch_size,
            hidden_act: d.hidden_act,
            layer_norm_eps: d.layer_norm_eps,
            arch: VisionArch::Dinov2 {
                position_grid: d.image_size / d.patch_size,
            },
            feature_layers: FeatureLayers::default(),
        })
    }

    /// This tower fed `size`-pixel images. SigLIP's position embeddings fix its input size,
    /// so any other size is refused; DINOv2 interpolates them to any size of at least a patch.
    pub fn at_image_size(&self, size: i64) -> Result<Self> {
        match self.arch {
            VisionArch::Siglip if size != self.image_size => {
                Err(ModelError::InvalidConfig(format!(
                    "image size {size} differs from the vision config's image_size {} (a \
                     FixRes tower's position embeddings fix its input size)",
                    self.image_size
                )))
            }
            VisionArch::Dinov2 { .. } if size < self.patch_size => {
                Err(ModelError::InvalidConfig(format!(
                    "image size {size} is smaller than the tower's patch ({}px)",
                    self.patch_size
                )))
            }
            _ => Ok(VisionConfig {
                image_size: size,
                ..self.clone()
            }),
        }
    }

    /// This tower with its features taken from `layers` (see
    /// [`VisionConfig::feature_layers`]).
    pub fn at_feature_layers(&self, layers: &FeatureLayers) -> Result<Self> {
        let cfg = VisionConfig {
            feature_layers: layers.clone(),
            ..self.clone()
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The feature layers as indices into `hidden_states` (1..=num_hidden_layers once
    /// validated), in list order.
    pub fn feature_states(&self) -> Vec<i64> {
        self.feature_layers.resolve(self.num_hidden_layers)
    }

    /// Encoder layers the features need: those up to the deepest feature layer.
    pub fn layers_run(&self) -> i64 {
        self.feature_states().into_iter().max().unwrap_or(0)
    }

    /// Channels of one feature token: the tower's width times the number of feature layers
    /// (what the projector's first linear layer reads).
    pub fn feature_size(&self) -> i64 {
        self.hidden_size * self.feature_layers.len() as i64
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
        self.feature_layers
            .check(self.num_hidden_layers)
            .map_err(ModelError::InvalidConfig)?;
        let acts: &[&str] = match self.arch {
            VisionArch::Siglip => &["gelu_pytorch_tanh", "gelu"],
            VisionArch::Dinov2 { .. } => &["gelu"],
        };
        if !acts.contains(&self.hidden_act.as_str()) {
            return Err(ModelError::InvalidConfig(format!(
                "vision hidden_act `{}` is not supported ({})",
                self.hidden_act,
                acts.join(", ")
            )));
        }
        Ok(())
    }

    pub fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_attention_heads
    }

    /// Vision tokens per image: floor(image_size / patch_size)^2 (a CLS token is not one).
    pub fn num_patches(&self) -> i64 {
        let side = self.image_size / self.patch_size;
        side * side
    }

    /// Tokens the tower carries ahead of the patches (DINOv2's CLS), dropped from the features.
    pub fn prefix_tokens(&self) -> i64 {
        match self.arch {
            VisionArch::Siglip => 0,
            VisionArch::Dinov2 { .. } => 1,
        }
    }

    /// The image processor's per-channel mean and std (SigLIP 0.5/0.5, DINOv2 ImageNet's).
    pub fn pixel_mean_std(&self) -> ([f64; 3], [f64; 3]) {
        match self.arch {
            VisionArch::Siglip => ([0.5; 3], [0.5; 3]),
            VisionArch::Dinov2 { .. } => ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        }
    }
}

/// What the vision tower accepts, for the refusal messages.
const SUPPORTED_VISION: &str = "siglip and siglip_vision_model towers (SigLIP, and SigLIP-2's \
                                fixed-resolution checkpoints, which share its architecture), \
                                and dinov2 (DINOv2 without registers)";

/// The architecture of `siglip`, `siglip_vision_model` and `dinov2`; refuses anything else
/// with the folder, the `model_type` and what is supported.
fn check_vision_model_type(dir: &Path, value: &serde_json::Value) -> Result<VisionArch> {
    let model_type = value.get("model_type").and_then(|v| v.as_str());
    let reason = match model_type {
        Some("siglip" | "siglip_vision_model") => return Ok(VisionArch::Siglip),
        Some("dinov2") => return Ok(VisionArch::Dinov2 { position_grid: 0 }),
        Some("siglip2" | "siglip2_vision_model") => {
            "SigLIP-2 NaFlex (native aspect ratio: a linear patch embedding over pre-patchified \
             pixels and a resized position grid) is not supported"
        }
        Some("dinov2_with_registers") => {
            "DINOv2 with registers (extra register tokens after the CLS token) is not supported"
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
