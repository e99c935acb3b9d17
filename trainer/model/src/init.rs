//! Random-weight Hugging Face checkpoints for tests and the demo (`tessera init-model`):
//! `vision/` (a `SiglipVisionModel` without pooling head) and `lm/` (a `Qwen2ForCausalLM`,
//! `Qwen3ForCausalLM` or `LlamaForCausalLM`),
//! each a `config.json` transformers reads plus a `model.safetensors`. Weights are seeded:
//! matrices and embeddings N(0, 0.02²) (transformers' `initializer_range`), biases
//! N(0, 0.02²), norm weights 1 + N(0, 0.02²), except the tiny preset's language model, which
//! is drawn at a trained model's scale (see [`LmInit`]).
use super::config::{VisionArch, VisionConfig};
use super::error::{ModelError, Result};
use super::lm_config::{LmConfig, LmFamily, MoeConfig};
use super::{decoder, vision, vocab, weights};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::path::Path;
use tch::Tensor;
use tessera_fsdp::{ParamMap, ParamSpec};

/// Standard deviation of every random tensor.
pub const INIT_STD: f64 = 0.02;

/// Named model sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Trains on 2 CPU cores: 64 px images (64 tokens), LM hidden 128, Qwen's vocabulary.
    Tiny,
    /// For throughput measurements: 128 px images (64 tokens), LM hidden 256, 6 layers.
    Small,
    /// Qwen2.5-0.5B's exact shape with a siglip-so400m-patch14-384 tower (about 0.9 B params).
    Qwen05bShape,
}

impl Preset {
    /// The preset's tower and LM, the LM of `family`: Qwen2 as Qwen2.5 (q/k/v bias, tied,
    /// RoPE base 1e6); Qwen3 as Qwen3 (no bias, q/k norms, an explicit `head_dim` twice
    /// hidden/heads as in Qwen3-0.6B, tied, 1e6); Llama as SmolLM2 (no bias, RoPE base 1e5,
    /// RMSNorm eps 1e-5) but untied, so the untied head of the family is exercised too;
    /// Qwen3-MoE as Qwen3 with every layer sparse (8 experts of a quarter of the dense
    /// width, top-2 renormalised, as Qwen3-30B-A3B routes) and an untied head, as
    /// Qwen3-30B-A3B has.
    pub fn configs(self, family: LmFamily) -> (VisionConfig, LmConfig) {
        let vision = |hidden, ff, layers, heads, image, patch| VisionConfig {
            hidden_size: hidden,
            intermediate_size: ff,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_channels: 3,
            image_size: image,
            patch_size: patch,
            hidden_act: "gelu_pytorch_tanh".into(),
            layer_norm_eps: 1e-6,
            arch: VisionArch::Siglip,
            feature_layers: crate::FeatureLayers::default(),
        };
        let lm = |hidden: i64, ff, layers, heads: i64, kv, max_pos| {
            let (head_dim, rope_theta, eps, tied) = match family {
                LmFamily::Qwen2 => (None, 1e6, 1e-6, true),
                LmFamily::Qwen3 => (Some(2 * hidden / heads), 1e6, 1e-6, true),
                LmFamily::Qwen3Moe => (Some(2 * hidden / heads), 1e6, 1e-6, false),
                LmFamily::Llama => (None, 1e5, 1e-5, false),
            };
            LmConfig {
                model_type: family,
                vocab_size: 151_936,
                hidden_size: hidden,
                intermediate_size: ff,
                num_hidden_layers: layers,
                num_attention_heads: heads,
                num_key_value_heads: Some(kv),
                head_dim,
                hidden_act: "silu".into(),
                max_position_embeddings: max_pos,
                rms_norm_eps: eps,
                rope_theta: Some(rope_theta),
                rope_parameters: None,
                rope_scaling: None,
                attention_bias: (family != LmFamily::Qwen2).then_some(false),
                mlp_bias: (family == LmFamily::Llama).then_some(false),
                use_sliding_window: (family != LmFamily::Llama).then_some(false),
                tie_word_embeddings: tied,
                moe: match family {
                    LmFamily::Qwen3Moe => MoeConfig {
                        num_experts: Some(8),
                        num_experts_per_tok: Some(2),
                        moe_intermediate_size: Some(ff / 4),
                        norm_topk_prob: Some(true),
                        router_aux_loss_coef: Some(0.001),
                        decoder_sparse_step: Some(1),
                        mlp_only_layers: Some(vec![]),
                        output_router_logits: Some(false),
                    },
                    _ => MoeConfig::default(),
                },
            }
        };
        match self {
            Preset::Tiny => (vision(64, 128, 3, 4, 64, 8), lm(128, 256, 2, 4, 2, 4096)),
            Preset::Small => (
                vision(192, 768, 4, 6, 128, 16),
                lm(256, 1024, 6, 8, 2, 8192),
            ),
            Preset::Qwen05bShape => (
                vision(1152, 4304, 27, 16, 384, 14),
                lm(896, 4864, 24, 14, 2, 32768),
            ),
        }
    }

    /// How the language model's weights are drawn.
    pub fn lm_init(self) -> LmInit {
        match self {
            Preset::Tiny => LmInit::TrainedScale {
                embed_std: 2.0 / 128f64.sqrt(),
            },
            Preset::Small | Preset::Qwen05bShape => LmInit::Uniform(INIT_STD),
        }
    }
}

/// How a random language model is drawn.
///
/// A frozen LM drawn at N(0, 0.02²) cannot say anything with confidence: its final hidden
/// state has norm √hidden after the RMSNorm and each tied embedding row about 0.02·√hidden,
/// so no logit exceeds 0.02·hidden (1.3 at hidden 64), and its layers barely pass on what
/// the image tokens hold (each matrix shrinks a vector about 0.02·√fan_in times). Stage 1,
/// which trains only the projector, then cannot lower the loss. `TrainedScale` keeps a trained
/// model's proportions instead: matrices at N(0, 1/fan_in) (gain 1) and embeddings at
/// `embed_std`, so a hidden state aligned with one row gives that token a logit of
/// `embed_std`·hidden while a random one spreads logits with std `embed_std`·√hidden.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LmInit {
    /// Every tensor as [`random_params`] draws it with this std.
    Uniform(f64),
    /// Matrices N(0, 1/fan_in), embeddings N(0, embed_std²), biases and norms as `Uniform(0.02)`.
    TrainedScale { embed_std: f64 },
}

/// One tensor's distribution: `offset + N(0, std²)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub offset: f64,
    pub std: f64,
}

fn is_norm_weight(spec: &ParamSpec) -> bool {
    spec.name.contains("norm") && spec.name.ends_with(".weight")
}

/// Norm weights 1 + N(0, std²), everything else N(0, std²).
pub(super) fn uniform_draw(spec: &ParamSpec, std: f64) -> Draw {
    let offset = if is_norm_weight(spec) { 1.0 } else { 0.0 };
    Draw { offset, std }
}

impl LmInit {
    pub fn draw(self, spec: &ParamSpec) -> Draw {
        let embed_std = match self {
            LmInit::Uniform(std) => return uniform_draw(spec, std),
            LmInit::TrainedScale { embed_std } => embed_std,
        };
        let is_matrix = spec.shape.len() == 2;
        if spec.name == vocab::EMBED || spec.name == vocab::LM_HEAD {
            Draw {
                offset: 0.0,
                std: embed_std,
            }
        } else if is_matrix {
            let fan_in = spec.shape[1] as f64;
            Draw {
                offset: 0.0,
                std: 1.0 / fan_in.sqrt(),
            }
        } else {
            uniform_draw(spec, INIT_STD)
        }
    }
}

/// Seeded tensors for `specs`: norm weights 1 + N(0, std²), everything else N(0, std²).
pub fn random_params(specs: &[ParamSpec], seed: u64, std: f64) -> ParamMap {
    random_params_by(specs, seed, |spec| uniform_draw(spec, std))
}

/// Seeded tensors for `specs`, each drawn as `draw` says.
pub(super) fn random_params_by(
    specs: &[ParamSpec],
    seed: u64,
    draw: impl Fn(&ParamSpec) -> Draw,
) -> ParamMap {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = BTreeMap::new();
    for spec in specs {
        let n: i64 = spec.shape.iter().product();
        let Draw { offset, std } = draw(spec);
        let mut values = Vec::with_capacity(n as usize);
        while values.len() < n as usize {
            // Box–Muller: two uniforms -> two independent standard normals.
            let u1: f64 = 1.0 - rng.gen::<f64>();
            let u2: f64 = rng.gen::<f64>();
            let r = (-2.0 * u1.ln()).sqrt();
            let theta = std::f64::consts::TAU * u2;
            values.push((offset + std * r * theta.cos()) as f32);
            values.push((offset + std * r * theta.sin()) as f32);
        }
        values.truncate(n as usize);
        out.insert(
            spec.name.clone(),
            Tensor::from_slice(&values).view(spec.shape.as_slice()),
        );
    }
    out
}

/// Every tensor of a complete causal LM checkpoint of `cfg`'s family (no `lm_head.weight` when tied).
pub fn lm_checkpoint_specs(cfg: &LmConfig) -> Vec<ParamSpec> {
    let mut specs = vocab::embed_specs(cfg, 0);
    for i in 0..cfg.num_hidden_layers {
        specs.extend(decoder::DecoderLayer::new(cfg, i).specs(None));
    }
    specs.extend(
        vocab::head_specs(cfg, cfg.tie_word_embeddings, 0)
            .into_iter()
            .filter(|s| s.name != vocab::EMBED),
    );
    specs
}

/// `config.json` of the tower: a `SiglipVisionModel` without pooling head, or a
/// `Dinov2Model` (whose `image_size` is its position grid's, whatever size a run feeds).
pub(super) fn vision_config_json(cfg: &VisionConfig) -> serde_json::Value {
    if let VisionArch::Dinov2 { position_grid } = cfg.arch {
        return serde_json::json!({
            "architectures": ["Dinov2Model"],
            "model_type": "dinov2",
            "hidden_size": cfg.hidden_size,
            "mlp_ratio": cfg.intermediate_size as f64 / cfg.hidden_size as f64,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_channels": cfg.num_channels,
            "image_size": position_grid * cfg.patch_size,
            "patch_size": cfg.patch_size,
            "hidden_act": cfg.hidden_act,
            "layer_norm_eps": cfg.layer_norm_eps,
            "qkv_bias": true,
            "use_swiglu_ffn": false,
            "torch_dtype": "float32",
        });
    }
    serde_json::json!({
        "architectures": ["SiglipVisionModel"],
        "model_type": "siglip_vision_model",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_channels": cfg.num_channels,
        "image_size": cfg.image_size,
        "patch_size": cfg.patch_size,
        "hidden_act": cfg.hidden_act,
        "layer_norm_eps": cfg.layer_norm_eps,
        "attention_dropout": 0.0,
        "vision_use_head": false,
        "torch_dtype": "float32",
    })
}

fn write_dir(dir: &Path, config: &serde_json::Value, params: &ParamMap) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.into(),
        source,
    })?;
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config).map_err(|source| ModelError::Json {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, text + "\n").map_err(|source| ModelError::Io { path, source })?;
    weights::save_safetensors(&dir.join(weights::SINGLE_FILE), params)
}

/// Writes `out/vision` and `out/lm` for `preset`; returns the number of parameters written.
pub fn write_preset(out: &Path, preset: Preset, family: LmFamily, seed: u64) -> Result<i64> {
    let (vision, lm) = preset.configs(family);
    write_checkpoints_with(out, &vision, &lm, preset.lm_init(), seed)
}

/// Writes `out/vision` and `out/lm` for any pair of configs, every tensor at N(0, 0.02²).
#[cfg(feature = "testing")]
pub fn write_checkpoints(
    out: &Path,
    vision: &VisionConfig,
    lm: &LmConfig,
    seed: u64,
) -> Result<i64> {
    write_checkpoints_with(out, vision, lm, LmInit::Uniform(INIT_STD), seed)
}

/// Writes `out/vision` (N(0, 0.02²)) and `out/lm` (drawn as `lm_init` says).
pub(super) fn write_checkpoints_with(
    out: &Path,
    vision: &VisionConfig,
    lm: &LmConfig,
    lm_init: LmInit,
    seed: u64,
) -> Result<i64> {
    vision.validate()?;
    lm.validate()?;
    let count = |p: &ParamMap| p.values().map(|t| t.numel() as i64).sum::<i64>();
    // One tower at a time, so the larger presets hold one model in memory.
    let params = random_params(&vision::checkpoint_specs(vision), seed, INIT_STD);
    write_dir(&out.join("vision"), &vision_config_json(vision), &params)?;
    let mut total = count(&params);
    drop(params);
    let params = random_params_by(&lm_checkpoint_specs(lm), seed.wrapping_add(1), |spec| {
        lm_init.draw(spec)
    });
    write_dir(&out.join("lm"), &lm.hf_json(), &params)?;
    total += count(&params);
    Ok(total)
}
