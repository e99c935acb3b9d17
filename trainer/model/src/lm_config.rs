//! The language model's `config.json`, for every family tessera trains. The three decoders
//! (transformers' `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `LlamaForCausalLM`) differ only in
//! a few switches, which this file reads from the config and `decoder.rs` obeys:
//!
//! | `model_type` | q/k/v bias              | o_proj bias      | MLP bias   | q/k norm | `head_dim` default |
//! |--------------|-------------------------|------------------|------------|----------|--------------------|
//! | `qwen2`      | always                  | never            | never      | no       | hidden / heads     |
//! | `qwen3`      | `attention_bias` (false)| `attention_bias` | never      | yes      | 128                |
//! | `llama`      | `attention_bias` (false)| `attention_bias` | `mlp_bias` | no       | hidden / heads     |
//!
//! RoPE is the default kind for all three, its base `rope_theta` (top level in released
//! configs, inside `rope_parameters` as transformers 5 writes them, 10,000 when absent). A
//! `rope_scaling` or `rope_type` other than the default, a sliding window, an activation other
//! than SiLU, or any other `model_type` is refused when the folder is read, naming it.
use super::config::{parse, read_json};
use super::error::{ModelError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The language model families (config.json's `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LmFamily {
    /// Qwen2, Qwen2.5.
    Qwen2,
    /// Qwen3 (dense).
    Qwen3,
    /// Llama and Llama-architecture checkpoints (SmolLM2, TinyLlama, ...).
    Llama,
}

/// What the refusal messages list as supported.
pub(crate) const SUPPORTED_LMS: &str =
    "qwen2 (Qwen2, Qwen2.5), qwen3 (Qwen3) and llama (Llama, SmolLM2) \
                                 language models with the default RoPE";

impl LmFamily {
    pub const ALL: [LmFamily; 3] = [LmFamily::Qwen2, LmFamily::Qwen3, LmFamily::Llama];

    /// The family of a config.json `model_type`, if tessera trains it.
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.model_type() == model_type)
    }

    pub fn model_type(self) -> &'static str {
        match self {
            LmFamily::Qwen2 => "qwen2",
            LmFamily::Qwen3 => "qwen3",
            LmFamily::Llama => "llama",
        }
    }

    /// transformers' class for the family (`architectures` of a config it writes).
    pub fn architecture(self) -> &'static str {
        match self {
            LmFamily::Qwen2 => "Qwen2ForCausalLM",
            LmFamily::Qwen3 => "Qwen3ForCausalLM",
            LmFamily::Llama => "LlamaForCausalLM",
        }
    }

    fn default_vocab_size(self) -> i64 {
        match self {
            LmFamily::Qwen2 | LmFamily::Qwen3 => 151_936,
            LmFamily::Llama => 32_000,
        }
    }
}

impl std::str::FromStr for LmFamily {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::from_model_type(s)
            .ok_or_else(|| format!("unknown family {s:?} (qwen2, qwen3, llama)"))
    }
}

fn max_position_embeddings() -> i64 {
    32_768
}
fn hidden_act() -> String {
    "silu".into()
}
fn rms_norm_eps() -> f64 {
    1e-6
}
fn rope_theta() -> f64 {
    10_000.0
}

/// A causal LM's config (transformers' `LmConfig`, `Qwen3Config`, `LlamaConfig`: the keys
/// they share plus each one's switches). Build it with [`LmConfig::from_dir`] or
/// [`LmConfig::from_json`], which check `model_type` and fill the family's defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LmConfig {
    pub model_type: LmFamily,
    /// The embedding's rows (the family's default when absent: 151,936 for Qwen, 32,000 for
    /// Llama).
    #[serde(default)]
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    /// Defaults to `num_attention_heads` (no GQA) when absent.
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    /// Defaults to `hidden_size / num_attention_heads` (Qwen2, Llama) or 128 (Qwen3).
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default = "hidden_act")]
    pub hidden_act: String,
    #[serde(default = "max_position_embeddings")]
    pub max_position_embeddings: i64,
    #[serde(default = "rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Top level in released configs; transformers 5 writes `rope_parameters`.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Only `null` (or a default-type object) is implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    /// Qwen3 and Llama: bias on q/k/v/o_proj (Qwen2 has q/k/v bias whatever this says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Llama: bias on gate/up/down_proj.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    /// Qwen2/Qwen3: sliding-window attention is not implemented (refused when true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

/// `rope_parameters` as transformers 5 writes it (only the default rope type is supported).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeParameters {
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_type: Option<String>,
}

impl LmConfig {
    /// Reads and checks `dir/config.json`; an unsupported `model_type` or setting is refused
    /// naming the folder, the `model_type` and what tessera supports.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        Self::from_json(read_json(&path)?, dir)
    }

    /// A config from its JSON (a config.json, or a LLaVA config's `text_config`); `origin`
    /// names where it came from in errors.
    pub fn from_json(value: serde_json::Value, origin: &Path) -> Result<Self> {
        let model_type = value
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let unsupported = |reason: String| ModelError::Unsupported {
            dir: origin.to_path_buf(),
            model_type: model_type.clone(),
            reason,
            supported: SUPPORTED_LMS,
        };
        let Some(family) = LmFamily::from_model_type(&model_type) else {
            let reason = if model_type.is_empty() {
                "config.json has no model_type".to_string()
            } else {
                "this language model type is not supported".to_string()
            };
            return Err(unsupported(reason));
        };
        let mut cfg: Self = parse(&origin.join("config.json"), value)?;
        if cfg.vocab_size == 0 {
            cfg.vocab_size = family.default_vocab_size();
        }
        if cfg.head_dim.is_none() && family == LmFamily::Qwen3 {
            cfg.head_dim = Some(128);
        }
        if let Some(reason) = cfg.unsupported_setting() {
            return Err(unsupported(reason));
        }
        cfg.validate().map_err(|e| e.in_dir(origin))?;
        Ok(cfg)
    }

    /// A setting tessera does not implement, said as the refusal says it.
    fn unsupported_setting(&self) -> Option<String> {
        let scaling = self.rope_scaling.as_ref().filter(|v| !v.is_null());
        if let Some(scaling) = scaling {
            let kind = ["rope_type", "type"]
                .iter()
                .find_map(|k| scaling.get(k).and_then(|v| v.as_str()));
            if kind != Some("default") {
                return Some(format!(
                    "rope_scaling {scaling} is not implemented (only the default RoPE, \
                     rope_theta alone, is)"
                ));
            }
        }
        let rope_type = self
            .rope_parameters
            .as_ref()
            .and_then(|r| r.rope_type.as_deref());
        if let Some(kind) = rope_type.filter(|k| *k != "default") {
            return Some(format!(
                "rope_parameters.rope_type {kind:?} is not implemented (only \"default\" is)"
            ));
        }
        if self.use_sliding_window == Some(true) {
            return Some("use_sliding_window: true is not implemented".into());
        }
        if self.hidden_act != "silu" {
            return Some(format!(
                "hidden_act {:?} is not implemented (silu is)",
                self.hidden_act
            ));
        }
        None
    }

    /// The shape checks (heads, GQA groups, rotary pairs).
    pub fn validate(&self) -> Result<()> {
        let kv = self.kv_heads();
        if kv <= 0 || self.num_attention_heads % kv != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {kv}",
                self.num_attention_heads
            )));
        }
        if self.head_dim() <= 0 || self.head_dim() % 2 != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "head_dim {} is not a positive even number; rotary embeddings need one",
                self.head_dim()
            )));
        }
        if let Some(reason) = self.unsupported_setting() {
            return Err(ModelError::InvalidConfig(reason));
        }
        Ok(())
    }

    pub fn family(&self) -> LmFamily {
        self.model_type
    }

    pub fn kv_heads(&self) -> i64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> i64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// `rope_parameters.rope_theta`, else top-level `rope_theta`, else 10,000.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|r| r.rope_theta)
            .or(self.rope_theta)
            .unwrap_or_else(rope_theta)
    }

    /// Whether q_proj, k_proj and v_proj have a bias.
    pub fn qkv_bias(&self) -> bool {
        match self.model_type {
            LmFamily::Qwen2 => true,
            LmFamily::Qwen3 | LmFamily::Llama => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether o_proj has a bias.
    pub fn o_bias(&self) -> bool {
        match self.model_type {
            LmFamily::Qwen2 => false,
            LmFamily::Qwen3 | LmFamily::Llama => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether gate_proj, up_proj and down_proj have a bias.
    pub fn mlp_bias(&self) -> bool {
        self.model_type == LmFamily::Llama && self.mlp_bias.unwrap_or(false)
    }

    /// Whether queries and keys go through a per-head RMSNorm (`q_norm`, `k_norm`) before RoPE.
    pub fn qk_norm(&self) -> bool {
        self.model_type == LmFamily::Qwen3
    }
}

impl LmConfig {
    /// The config.json transformers writes for this model (`architectures`, `model_type`, every
    /// key tessera reads, with `rope_theta` at the top level as released configs have it).
    pub fn hf_json(&self) -> serde_json::Value {
        let family = self.family();
        let mut json = serde_json::json!({
            "architectures": [family.architecture()],
            "model_type": family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.kv_heads(),
            "head_dim": self.head_dim(),
            "hidden_act": self.hidden_act,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta(),
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "torch_dtype": "float32",
        });
        match family {
            LmFamily::Qwen2 => json["use_sliding_window"] = false.into(),
            LmFamily::Qwen3 => {
                json["use_sliding_window"] = false.into();
                json["attention_bias"] = self.o_bias().into();
            }
            LmFamily::Llama => {
                json["attention_bias"] = self.o_bias().into();
                json["mlp_bias"] = self.mlp_bias().into();
            }
        }
        json
    }
}
