//! SigLIP vision tower (transformers `SiglipVisionTransformer`, also SigLIP-2 FixRes): Conv2d
//! patch embedding with stride = patch, learned position embedding (no CLS token), pre-LN
//! encoder layers with non-causal attention (scale hd^-0.5) and a gelu-tanh MLP.
//! LLaVA-style features are `hidden_states[-2]`: the output of the layer before the last,
//! without `post_layernorm` and without the pooling head, so neither the last layer, the
//! post-layernorm nor the head is a parameter here (checkpoints holding them load fine).
use super::config::VisionConfig;
use super::keys::{KeyPath, LinearKeys};
use super::param;
use super::vision::{linear, patch_embeddings, spec, AttentionKeys, NormKeys, PREFIX};
use tch::Tensor;
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

fn activation(cfg: &VisionConfig, x: &Tensor) -> Tensor {
    match cfg.hidden_act.as_str() {
        "gelu" => x.gelu("none"),
        _ => x.gelu("tanh"),
    }
}

/// Patch and position embeddings' keys.
pub(super) struct Embeddings {
    patch_weight: String,
    patch_bias: String,
    position: String,
}

impl Embeddings {
    pub(super) fn new() -> Self {
        let p = KeyPath::new(PREFIX) / "embeddings";
        Embeddings {
            patch_weight: (&p / "patch_embedding").key("weight"),
            patch_bias: (&p / "patch_embedding").key("bias"),
            position: (&p / "position_embedding").key("weight"),
        }
    }

    pub(super) fn specs(&self, cfg: &VisionConfig) -> Vec<ParamSpec> {
        let (d, p) = (cfg.hidden_size, cfg.patch_size);
        vec![
            spec(&self.patch_weight, vec![d, cfg.num_channels, p, p]),
            spec(&self.patch_bias, vec![d]),
            spec(&self.position, vec![cfg.num_patches(), d]),
        ]
    }

    /// Normalised pixels `[n, 3, s, s]` -> `[n, (s/p)^2, D]`.
    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        pixels: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        let keys = (self.patch_weight.as_str(), self.patch_bias.as_str());
        let patches = patch_embeddings(cfg, params, keys, pixels)?;
        Ok(patches + param(params, &self.position)?.unsqueeze(0))
    }
}

/// Encoder layer `i`'s keys and shapes, built once: its specs and forward both read them.
pub(super) struct EncoderLayer {
    layer_norm1: NormKeys,
    layer_norm2: NormKeys,
    attention: AttentionKeys,
    fc1: LinearKeys,
    fc2: LinearKeys,
}

impl EncoderLayer {
    pub(super) fn new(cfg: &VisionConfig, i: i64) -> Self {
        let (d, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let p = KeyPath::new(PREFIX) / "encoder" / "layers" / i;
        let attn = &p / "self_attn";
        let mlp = &p / "mlp";
        EncoderLayer {
            layer_norm1: NormKeys::new(&p / "layer_norm1"),
            layer_norm2: NormKeys::new(&p / "layer_norm2"),
            attention: AttentionKeys {
                q: LinearKeys::new(&attn / "q_proj", d, d, true),
                k: LinearKeys::new(&attn / "k_proj", d, d, true),
                v: LinearKeys::new(&attn / "v_proj", d, d, true),
                out: LinearKeys::new(&attn / "out_proj", d, d, true),
            },
            fc1: LinearKeys::new(&mlp / "fc1", ff, d, true),
            fc2: LinearKeys::new(&mlp / "fc2", d, ff, true),
        }
    }

    pub(super) fn specs(&self, cfg: &VisionConfig) -> Vec<ParamSpec> {
        let d = cfg.hidden_size;
        let mut specs = Vec::new();
        specs.extend(self.layer_norm1.specs(d));
        specs.extend(self.layer_norm2.specs(d));
        specs.extend(self.attention.specs());
        specs.extend(self.fc1.specs(false));
        specs.extend(self.fc2.specs(false));
        specs
    }

    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        x: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        let h = self.layer_norm1.forward(cfg, params, x)?;
        let h = x + self.attention.forward(cfg, params, &h)?;

        let residual = &h;
        let m = self.layer_norm2.forward(cfg, params, &h)?;
        let m = activation(cfg, &linear(params, &m, &self.fc1)?);
        Ok(residual + linear(params, &m, &self.fc2)?)
    }
}

/// What a complete `SiglipVisionModel` checkpoint (without the pooling head) holds besides the
/// embeddings and layers: `post_layernorm`.
pub(super) fn unread_specs(cfg: &VisionConfig) -> Vec<ParamSpec> {
    let post = NormKeys::new(KeyPath::new(PREFIX) / "post_layernorm");
    post.specs(cfg.hidden_size).to_vec()
}
