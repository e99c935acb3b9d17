//! Qwen2 / Qwen2.5 causal LM (transformers `Qwen2ForCausalLM`): token embedding, decoder
//! layers h = x + attn(rms(x)), out = h + down(silu(gate(rms(h))) · up(rms(h))) with RMSNorm in
//! f32, RoPE (rotate_half), grouped-query attention, q/k/v bias and no o_proj bias; final
//! RMSNorm and `lm_head` (tied to `model.embed_tokens.weight` when the checkpoint has no
//! `lm_head.weight`). LoRA adapters (see [`super::lora`]) add to the seven linear layers.
use super::attention::{attend, attend_spans, Span};
use super::config::{LoraConfig, Qwen2Config};
use super::lora;
use super::param;
use super::rope::apply_rotary;
use crate::unit::{ParamMap, ParamSpec};
use tch::{Kind, Tensor};

pub const EMBED: &str = "model.embed_tokens.weight";
pub const NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

fn frozen(name: String, shape: Vec<i64>) -> ParamSpec {
    ParamSpec {
        name,
        shape,
        trainable: false,
    }
}

pub fn embed_specs(cfg: &Qwen2Config) -> Vec<ParamSpec> {
    vec![frozen(EMBED.into(), vec![cfg.vocab_size, cfg.hidden_size])]
}

/// Final norm + output projection; with tied embeddings the projection is `EMBED` itself.
pub fn head_specs(cfg: &Qwen2Config, tied: bool) -> Vec<ParamSpec> {
    let out = if tied { EMBED } else { LM_HEAD };
    vec![
        frozen(NORM.into(), vec![cfg.hidden_size]),
        frozen(out.into(), vec![cfg.vocab_size, cfg.hidden_size]),
    ]
}

/// Name of the output projection the head reads.
pub fn output_weight(tied: bool) -> &'static str {
    if tied {
        EMBED
    } else {
        LM_HEAD
    }
}

/// `(module path, out_features, in_features, has bias)` of layer `i`'s seven linear layers.
pub fn linear_layers(cfg: &Qwen2Config, i: i64) -> Vec<(String, i64, i64, bool)> {
    let d = cfg.hidden_size;
    let q = cfg.num_attention_heads * cfg.head_dim();
    let kv = cfg.kv_heads() * cfg.head_dim();
    let ff = cfg.intermediate_size;
    let l = format!("model.layers.{i}");
    vec![
        (format!("{l}.self_attn.q_proj"), q, d, true),
        (format!("{l}.self_attn.k_proj"), kv, d, true),
        (format!("{l}.self_attn.v_proj"), kv, d, true),
        (format!("{l}.self_attn.o_proj"), d, q, false),
        (format!("{l}.mlp.gate_proj"), ff, d, false),
        (format!("{l}.mlp.up_proj"), ff, d, false),
        (format!("{l}.mlp.down_proj"), d, ff, false),
    ]
}

/// Layer `i`'s base weights (frozen) followed by its LoRA adapters (trainable), if any.
pub fn layer_specs(cfg: &Qwen2Config, i: i64, lora: Option<&LoraConfig>) -> Vec<ParamSpec> {
    let l = format!("model.layers.{i}");
    let d = cfg.hidden_size;
    let mut specs = vec![
        frozen(format!("{l}.input_layernorm.weight"), vec![d]),
        frozen(format!("{l}.post_attention_layernorm.weight"), vec![d]),
    ];
    for (module, out, inp, bias) in linear_layers(cfg, i) {
        specs.push(frozen(format!("{module}.weight"), vec![out, inp]));
        if bias {
            specs.push(frozen(format!("{module}.bias"), vec![out]));
        }
    }
    if let Some(lora) = lora {
        specs.extend(lora::layer_specs(cfg, i, lora));
    }
    specs
}

/// RMSNorm as transformers computes it: in f32, x·rsqrt(mean(x²) + eps), cast back, · weight.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let xf = x.to_kind(Kind::Float);
    let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
    let normed = (xf * (var + eps).rsqrt()).to_kind(x.kind());
    normed * weight
}

/// Per-micro-batch inputs a decoder layer needs (built once by `VlmCtx`).
pub struct LayerInputs<'a> {
    /// Dense block-causal mask; `None` runs attention span by span over `spans`.
    pub mask: Option<&'a Tensor>,
    pub spans: &'a [Vec<Span>],
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    /// `Some(seed)` applies LoRA dropout with a mask drawn from that seed (so FSDP's recompute
    /// draws the same mask); `None` runs without dropout (evaluation).
    pub dropout_seed: Option<u64>,
}

struct Linear<'a> {
    params: &'a ParamMap,
    lora: Option<&'a LoraConfig>,
    dropout_seed: Option<u64>,
}

impl Linear<'_> {
    fn apply(&self, x: &Tensor, module: &str, bias: bool, salt: u64) -> Tensor {
        let w = param(self.params, &format!("{module}.weight"));
        let b = bias.then(|| param(self.params, &format!("{module}.bias")));
        let base = x.linear(w, b);
        match self.lora {
            Some(cfg) if lora::targets(cfg, module) => {
                base + lora::delta(
                    cfg,
                    self.params,
                    module,
                    x,
                    self.dropout_seed.map(|s| s ^ salt),
                )
            }
            _ => base,
        }
    }
}

/// One decoder layer over `x` `[rows, len, D]`.
pub fn layer_forward(
    cfg: &Qwen2Config,
    lora: Option<&LoraConfig>,
    params: &ParamMap,
    i: i64,
    x: &Tensor,
    inputs: &LayerInputs,
) -> Tensor {
    let l = format!("model.layers.{i}");
    let (rows, len, d) = x.size3().expect("decoder hidden is [rows, len, D]");
    let (heads, kv_heads, hd) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
    let salt = |k: u64| ((i as u64) << 8 | k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let lin = Linear {
        params,
        lora,
        dropout_seed: inputs.dropout_seed,
    };

    let residual = x;
    let h = rms_norm(
        x,
        param(params, &format!("{l}.input_layernorm.weight")),
        cfg.rms_norm_eps,
    );
    let q = lin
        .apply(&h, &format!("{l}.self_attn.q_proj"), true, salt(0))
        .view([rows, len, heads, hd])
        .transpose(1, 2);
    let k = lin
        .apply(&h, &format!("{l}.self_attn.k_proj"), true, salt(1))
        .view([rows, len, kv_heads, hd])
        .transpose(1, 2);
    let v = lin
        .apply(&h, &format!("{l}.self_attn.v_proj"), true, salt(2))
        .view([rows, len, kv_heads, hd])
        .transpose(1, 2);
    let q = apply_rotary(&q, inputs.cos, inputs.sin);
    let k = apply_rotary(&k, inputs.cos, inputs.sin);
    let attn = match inputs.mask {
        Some(mask) => attend(&q, &k, &v, Some(mask)),
        None => attend_spans(&q, &k, &v, inputs.spans),
    };
    let attn = attn.transpose(1, 2).reshape([rows, len, heads * hd]);
    let h = residual + lin.apply(&attn, &format!("{l}.self_attn.o_proj"), false, salt(3));

    let residual = &h;
    let m = rms_norm(
        &h,
        param(params, &format!("{l}.post_attention_layernorm.weight")),
        cfg.rms_norm_eps,
    );
    let gate = lin
        .apply(&m, &format!("{l}.mlp.gate_proj"), false, salt(4))
        .silu();
    let up = lin.apply(&m, &format!("{l}.mlp.up_proj"), false, salt(5));
    let out = residual + lin.apply(&(gate * up), &format!("{l}.mlp.down_proj"), false, salt(6));
    debug_assert_eq!(out.size(), vec![rows, len, d]);
    out
}

/// Token embeddings `[rows, len, D]` for `input_ids` `[rows, len]`.
pub fn embed(params: &ParamMap, input_ids: &Tensor) -> Tensor {
    Tensor::embedding(param(params, EMBED), input_ids, -1, false, false)
}

/// Full logits `[.., vocab]` of final hidden states (for evaluation and tests; training uses
/// the chunked loss in [`super::loss`]).
pub fn logits(cfg: &Qwen2Config, params: &ParamMap, tied: bool, hidden: &Tensor) -> Tensor {
    let h = rms_norm(hidden, param(params, NORM), cfg.rms_norm_eps);
    h.matmul(&param(params, output_weight(tied)).tr())
}
