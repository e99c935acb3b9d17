//! SigLIP vision tower (transformers `SiglipVisionTransformer`, also SigLIP-2 FixRes): Conv2d
//! patch embedding with stride = patch, learned position embedding (no CLS token), pre-LN
//! encoder layers with non-causal attention (scale hd^-0.5) and a gelu-tanh MLP.
//! LLaVA-style features are `hidden_states[-2]`: the output of the layer before the last,
//! without `post_layernorm` and without the pooling head, so neither the last layer, the
//! post-layernorm nor the head is a parameter here (checkpoints holding them load fine).
use super::attention::attend;
use super::config::SiglipVisionConfig;
use super::param;
use crate::unit::{ParamMap, ParamSpec};
use tch::Tensor;

const PREFIX: &str = "vision_model";

fn spec(name: String, shape: Vec<i64>) -> ParamSpec {
    ParamSpec {
        name,
        shape,
        trainable: false,
    }
}

/// Number of encoder layers the features need: all but the last.
pub fn feature_layers(cfg: &SiglipVisionConfig) -> i64 {
    cfg.num_hidden_layers - 1
}

/// Parameters the vision features read, in checkpoint order, frozen.
pub fn param_specs(cfg: &SiglipVisionConfig) -> Vec<ParamSpec> {
    let d = cfg.hidden_size;
    let p = cfg.patch_size;
    let mut specs = vec![
        spec(
            format!("{PREFIX}.embeddings.patch_embedding.weight"),
            vec![d, cfg.num_channels, p, p],
        ),
        spec(format!("{PREFIX}.embeddings.patch_embedding.bias"), vec![d]),
        spec(
            format!("{PREFIX}.embeddings.position_embedding.weight"),
            vec![cfg.num_patches(), d],
        ),
    ];
    for i in 0..feature_layers(cfg) {
        specs.extend(layer_specs(cfg, i));
    }
    specs
}

fn layer_specs(cfg: &SiglipVisionConfig, i: i64) -> Vec<ParamSpec> {
    let d = cfg.hidden_size;
    let ff = cfg.intermediate_size;
    let l = format!("{PREFIX}.encoder.layers.{i}");
    let mut specs = Vec::new();
    for norm in ["layer_norm1", "layer_norm2"] {
        specs.push(spec(format!("{l}.{norm}.weight"), vec![d]));
        specs.push(spec(format!("{l}.{norm}.bias"), vec![d]));
    }
    for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
        specs.push(spec(format!("{l}.self_attn.{proj}.weight"), vec![d, d]));
        specs.push(spec(format!("{l}.self_attn.{proj}.bias"), vec![d]));
    }
    specs.push(spec(format!("{l}.mlp.fc1.weight"), vec![ff, d]));
    specs.push(spec(format!("{l}.mlp.fc1.bias"), vec![ff]));
    specs.push(spec(format!("{l}.mlp.fc2.weight"), vec![d, ff]));
    specs.push(spec(format!("{l}.mlp.fc2.bias"), vec![d]));
    specs
}

/// Every tensor of a complete `SiglipVisionModel` checkpoint without the pooling head: the
/// feature parameters plus the last layer and `post_layernorm` (what `init-model` writes).
pub fn checkpoint_specs(cfg: &SiglipVisionConfig) -> Vec<ParamSpec> {
    let mut specs = param_specs(cfg);
    specs.extend(layer_specs(cfg, cfg.num_hidden_layers - 1));
    specs.push(spec(
        format!("{PREFIX}.post_layernorm.weight"),
        vec![cfg.hidden_size],
    ));
    specs.push(spec(
        format!("{PREFIX}.post_layernorm.bias"),
        vec![cfg.hidden_size],
    ));
    specs
}

fn linear(params: &ParamMap, x: &Tensor, key: &str) -> Tensor {
    x.linear(
        param(params, &format!("{key}.weight")),
        Some(param(params, &format!("{key}.bias"))),
    )
}

fn layer_norm(cfg: &SiglipVisionConfig, params: &ParamMap, x: &Tensor, key: &str) -> Tensor {
    let w = param(params, &format!("{key}.weight"));
    let b = param(params, &format!("{key}.bias"));
    x.layer_norm(
        [cfg.hidden_size],
        Some(w),
        Some(b),
        cfg.layer_norm_eps,
        false,
    )
}

fn activation(cfg: &SiglipVisionConfig, x: &Tensor) -> Tensor {
    match cfg.hidden_act.as_str() {
        "gelu" => x.gelu("none"),
        _ => x.gelu("tanh"),
    }
}

fn encoder_layer(cfg: &SiglipVisionConfig, params: &ParamMap, x: &Tensor, i: i64) -> Tensor {
    let l = format!("{PREFIX}.encoder.layers.{i}");
    let (n, len, d) = x.size3().expect("vision hidden is [n, tokens, D]");
    let heads = cfg.num_attention_heads;
    let hd = cfg.head_dim();

    let residual = x;
    let h = layer_norm(cfg, params, x, &format!("{l}.layer_norm1"));
    let split = |t: Tensor| t.view([n, len, heads, hd]).transpose(1, 2);
    let q = split(linear(params, &h, &format!("{l}.self_attn.q_proj")));
    let k = split(linear(params, &h, &format!("{l}.self_attn.k_proj")));
    let v = split(linear(params, &h, &format!("{l}.self_attn.v_proj")));
    let attn = attend(&q, &k, &v, None)
        .transpose(1, 2)
        .reshape([n, len, d]);
    let h = residual + linear(params, &attn, &format!("{l}.self_attn.out_proj"));

    let residual = &h;
    let m = layer_norm(cfg, params, &h, &format!("{l}.layer_norm2"));
    let m = activation(cfg, &linear(params, &m, &format!("{l}.mlp.fc1")));
    residual + linear(params, &m, &format!("{l}.mlp.fc2"))
}

/// Features of the layer before the last for normalised pixels `[n, 3, s, s]`:
/// `[n, (s/p)^2, hidden]`.
pub fn features(cfg: &SiglipVisionConfig, params: &ParamMap, pixel_values: &Tensor) -> Tensor {
    let w = param(
        params,
        &format!("{PREFIX}.embeddings.patch_embedding.weight"),
    );
    let b = param(params, &format!("{PREFIX}.embeddings.patch_embedding.bias"));
    let pos = param(
        params,
        &format!("{PREFIX}.embeddings.position_embedding.weight"),
    );
    let p = cfg.patch_size;
    // [n, D, g, g] -> [n, g*g, D]
    let patches = pixel_values
        .conv2d(w, Some(b), [p, p], [0, 0], [1, 1], 1)
        .flatten(2, -1)
        .transpose(1, 2);
    let mut hidden = patches + pos.unsqueeze(0);
    for i in 0..feature_layers(cfg) {
        hidden = encoder_layer(cfg, params, &hidden, i);
    }
    hidden
}
