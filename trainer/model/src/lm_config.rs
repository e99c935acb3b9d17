//! The language model's `config.json`, for every family tessera trains. The four decoders
//! (transformers' `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`,
//! `LlamaForCausalLM`) differ only in a few switches, which this file reads from the config and
//! `decoder.rs` obeys:
//!
//! | `model_type` | q/k/v bias              | o_proj bias      | MLP bias   | q/k norm | `head_dim` default | MLP            |
//! |--------------|-------------------------|------------------|------------|----------|--------------------|----------------|
//! | `qwen2`      | always                  | never            | never      | no       | hidden / heads     | dense          |
//! | `qwen3`      | `attention_bias` (false)| `attention_bias` | never      | yes      | 128                | dense          |
//! | `qwen3_moe`  | `attention_bias` (false)| `attention_bias` | never      | yes      | hidden / heads     | sparse or dense|
//! | `llama`      | `attention_bias` (false)| `attention_bias` | `mlp_bias` | no       | hidden / heads     | dense          |
//!
//! A `qwen3_moe` layer's MLP is the sparse block (see `moe.rs`) unless `mlp_only_layers` lists
//! it or `decoder_sparse_step` skips it ([`MoeConfig`]). MoE variants tessera does not
//! implement (a shared expert as in `qwen2_moe`, sigmoid or group-limited routers, an expert
//! bias) are refused by the key that asks for them.
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
#[serde(rename_all = "snake_case")]
pub enum LmFamily {
    /// Qwen2, Qwen2.5.
    Qwen2,
    /// Qwen3 (dense).
    Qwen3,
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B; Qwen3-VL-MoE's text model).
    Qwen3Moe,
    /// Llama and Llama-architecture checkpoints (SmolLM2, TinyLlama, ...).
    Llama,
}

/// What the refusal messages list as supported.
pub(crate) const SUPPORTED_LMS: &str =
    "qwen2 (Qwen2, Qwen2.5), qwen3 (Qwen3), qwen3_moe (Qwen3-MoE) and llama (Llama, SmolLM2) \
     language models with the default RoPE";

impl LmFamily {
    pub const ALL: [LmFamily; 4] = [
        LmFamily::Qwen2,
        LmFamily::Qwen3,
        LmFamily::Qwen3Moe,
        LmFamily::Llama,
    ];

    /// The family of a config.json `model_type`, if tessera trains it.
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.model_type() == model_type)
    }

    pub fn model_type(self) -> &'static str {
        match self {
            LmFamily::Qwen2 => "qwen2",
            LmFamily::Qwen3 => "qwen3",
            LmFamily::Qwen3Moe => "qwen3_moe",
            LmFamily::Llama => "llama",
        }
    }

    /// transformers' class for the family (`architectures` of a config it writes).
    pub fn architecture(self) -> &'static str {
        match self {
            LmFamily::Qwen2 => "Qwen2ForCausalLM",
            LmFamily::Qwen3 => "Qwen3ForCausalLM",
            LmFamily::Qwen3Moe => "Qwen3MoeForCausalLM",
            LmFamily::Llama => "LlamaForCausalLM",
        }
    }

    fn default_vocab_size(self) -> i64 {
        match self {
            LmFamily::Qwen2 | LmFamily::Qwen3 | LmFamily::Qwen3Moe => 151_936,
            LmFamily::Llama => 32_000,
        }
    }
}

impl std::str::FromStr for LmFamily {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::from_model_type(s)
            .ok_or_else(|| format!("unknown family {s:?} (qwen2, qwen3, qwen3_moe, llama)"))
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
    /// Defaults to `hidden_size / num_attention_heads` (Qwen2, Qwen3-MoE, Llama) or 128 (Qwen3).
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
    /// `qwen3_moe`'s sparse-MLP keys (all absent in a dense config).
    #[serde(flatten)]
    pub moe: MoeConfig,
}

/// The mixture-of-experts keys of transformers' `Qwen3MoeConfig`, as config.json spells them;
/// absent ones take transformers' defaults through the accessors of [`LmConfig`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// Experts per sparse layer (128). transformers 5 writes it as `num_local_experts`.
    #[serde(
        default,
        alias = "num_local_experts",
        skip_serializing_if = "Option::is_none"
    )]
    pub num_experts: Option<i64>,
    /// Experts each token is routed to, `k` of top-k (8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts_per_tok: Option<i64>,
    /// Each expert's SwiGLU width (768).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<i64>,
    /// Renormalise the top-k probabilities to sum to 1 (false; Qwen3-30B-A3B: true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_topk_prob: Option<bool>,
    /// Weight of the load-balancing loss in the training loss (0.001).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_aux_loss_coef: Option<f64>,
    /// Every this-many-th layer is sparse (1: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_sparse_step: Option<i64>,
    /// Layers whose MLP stays dense whatever `decoder_sparse_step` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_only_layers: Option<Vec<i64>>,
    /// transformers adds the balance loss only when this is on; tessera's trainer always adds
    /// it (the value is kept so an export writes what was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_router_logits: Option<bool>,
}

/// Keys of MoE variants tessera does not implement, with what they ask for.
const UNIMPLEMENTED_MOE_KEYS: [(&str, &str); 7] = [
    ("shared_expert_intermediate_size", "a shared expert"),
    ("n_shared_experts", "shared experts"),
    (
        "scoring_func",
        "a router scoring function other than softmax",
    ),
    ("topk_method", "a top-k method other than plain top-k"),
    ("n_group", "group-limited routing"),
    ("routed_scaling_factor", "a scaled routed output"),
    ("moe_router_bias", "an expert bias in the router"),
];

/// What tessera says of MoE model types it does not train.
fn moe_type_refusal(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "qwen2_moe" => {
            "qwen2_moe is not implemented: its shared expert (shared_expert_intermediate_size, \
             mlp.shared_expert, mlp.shared_expert_gate) is missing from tessera's sparse block, \
             which implements qwen3_moe"
        }
        "mixtral" | "deepseek_v2" | "deepseek_v3" | "olmoe" | "granitemoe" | "jamba" | "dbrx"
        | "phimoe" | "gpt_oss" | "glm4_moe" => {
            "this mixture-of-experts type is not implemented (qwen3_moe is: softmax router, \
             top-k, SwiGLU experts, no shared expert or expert bias)"
        }
        _ => return None,
    })
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
            } else if let Some(moe) = moe_type_refusal(&model_type) {
                moe.to_string()
            } else {
                "this language model type is not supported".to_string()
            };
            return Err(unsupported(reason));
        };
        if let Some(reason) = unimplemented_moe_key(&value) {
            return Err(unsupported(reason));
        }
        let mut cfg: Self = parse(&origin.join("config.json"), value)?;
        if cfg.vocab_size == 0 {
            cfg.vocab_size = family.default_vocab_size();
        }
        if cfg.head_dim.is_none() && family == LmFamily::Qwen3 {
            cfg.head_dim = Some(128);
        }
        if let Some(reason) = cfg.unsupported_setting_or_moe() {
            return Err(unsupported(reason));
        }
        cfg.validate().map_err(|e| e.in_dir(origin))?;
        Ok(cfg)
    }

    /// A setting tessera does not implement, said as the refusal says it.
    fn unsupported_setting_or_moe(&self) -> Option<String> {
        self.unsupported_setting().or_else(|| self.moe_problem())
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
        if let Some(reason) = self.unsupported_setting_or_moe() {
            return Err(ModelError::InvalidConfig(reason));
        }
        Ok(())
    }

    /// MoE keys in a dense family, or sparse settings that do not hold together.
    fn moe_problem(&self) -> Option<String> {
        if self.model_type != LmFamily::Qwen3Moe {
            let experts = self.moe.num_experts.unwrap_or(0);
            return (experts > 0).then(|| {
                format!(
                    "{} is a dense model type but config.json sets num_experts {experts}: \
                     is it qwen3_moe?",
                    self.model_type.model_type()
                )
            });
        }
        let (experts, k) = (self.num_experts(), self.experts_per_token());
        if experts <= 0 || k <= 0 || k > experts {
            return Some(format!(
                "num_experts_per_tok {k} must be in 1..=num_experts ({experts})"
            ));
        }
        if self.moe_intermediate_size() <= 0 || self.decoder_sparse_step() <= 0 {
            return Some(format!(
                "moe_intermediate_size {} and decoder_sparse_step {} must be positive",
                self.moe_intermediate_size(),
                self.decoder_sparse_step()
            ));
        }
        let layers = self.num_hidden_layers;
        if let Some(bad) = self
            .mlp_only_layers()
            .iter()
            .find(|&&l| l < 0 || l >= layers)
        {
            return Some(format!(
                "mlp_only_layers names layer {bad}, outside 0..{layers}"
            ));
        }
        None
    }

    pub fn family(&self) -> LmFamily {
        self.model_type
    }

    pub fn kv_heads(&self) -> i64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Experts per sparse layer (0 for dense families).
    pub fn num_experts(&self) -> i64 {
        match self.model_type {
            LmFamily::Qwen3Moe => self.moe.num_experts.unwrap_or(128),
            _ => 0,
        }
    }

    /// `k` of the router's top-k.
    pub fn experts_per_token(&self) -> i64 {
        self.moe.num_experts_per_tok.unwrap_or(8)
    }

    pub fn moe_intermediate_size(&self) -> i64 {
        self.moe.moe_intermediate_size.unwrap_or(768)
    }

    pub fn norm_topk_prob(&self) -> bool {
        self.moe.norm_topk_prob.unwrap_or(false)
    }

    /// The balance loss's weight in the training loss.
    pub fn router_aux_loss_coef(&self) -> f64 {
        self.moe.router_aux_loss_coef.unwrap_or(0.001)
    }

    fn decoder_sparse_step(&self) -> i64 {
        self.moe.decoder_sparse_step.unwrap_or(1)
    }

    fn mlp_only_layers(&self) -> &[i64] {
        self.moe.mlp_only_layers.as_deref().unwrap_or(&[])
    }

    /// Whether layer `i`'s MLP is the sparse block (transformers' rule: not in
    /// `mlp_only_layers`, experts configured, and `(i + 1) % decoder_sparse_step == 0`).
    pub fn is_sparse_layer(&self, i: i64) -> bool {
        self.num_experts() > 0
            && !self.mlp_only_layers().contains(&i)
            && (i + 1) % self.decoder_sparse_step() == 0
    }

    /// The sparse layers' indices, in order.
    pub fn sparse_layers(&self) -> Vec<i64> {
        (0..self.num_hidden_layers)
            .filter(|&i| self.is_sparse_layer(i))
            .collect()
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
            _ => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether o_proj has a bias.
    pub fn o_bias(&self) -> bool {
        match self.model_type {
            LmFamily::Qwen2 => false,
            _ => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether gate_proj, up_proj and down_proj have a bias.
    pub fn mlp_bias(&self) -> bool {
        self.model_type == LmFamily::Llama && self.mlp_bias.unwrap_or(false)
    }

    /// Whether queries and keys go through a per-head RMSNorm (`q_norm`, `k_norm`) before RoPE.
    pub fn qk_norm(&self) -> bool {
        matches!(self.model_type, LmFamily::Qwen3 | LmFamily::Qwen3Moe)
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
            LmFamily::Qwen3Moe => {
                json["use_sliding_window"] = false.into();
                json["attention_bias"] = self.o_bias().into();
                json["num_experts"] = self.num_experts().into();
                json["num_experts_per_tok"] = self.experts_per_token().into();
                json["moe_intermediate_size"] = self.moe_intermediate_size().into();
                json["norm_topk_prob"] = self.norm_topk_prob().into();
                json["router_aux_loss_coef"] = self.router_aux_loss_coef().into();
                json["decoder_sparse_step"] = self.decoder_sparse_step().into();
                json["mlp_only_layers"] = self.mlp_only_layers().into();
                json["output_router_logits"] =
                    self.moe.output_router_logits.unwrap_or(false).into();
            }
            LmFamily::Llama => {
                json["attention_bias"] = self.o_bias().into();
                json["mlp_bias"] = self.mlp_bias().into();
            }
        }
        json
    }
}

/// The first key of `config` that asks for an MoE variant tessera does not implement, said as
/// the refusal says it (a `scoring_func` of "softmax" and a `routed_scaling_factor` of 1 are
/// what tessera computes, so they pass).
fn unimplemented_moe_key(config: &serde_json::Value) -> Option<String> {
    UNIMPLEMENTED_MOE_KEYS.iter().find_map(|&(key, what)| {
        let v = config.get(key).filter(|v| !v.is_null())?;
        let harmless = match key {
            "scoring_func" => v.as_str() == Some("softmax"),
            "routed_scaling_factor" => v.as_f64() == Some(1.0),
            "shared_expert_intermediate_size" | "n_shared_experts" | "n_group" => {
                v.as_i64() == Some(0)
            }
            _ => false,
        };
        (!harmless).then(|| format!("{key} = {v} asks for {what}, which is not implemented"))
    })
}
