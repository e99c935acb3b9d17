//! SigLIP vision tower (transformers `SiglipVisionTransformer`, also SigLIP-2 FixRes): Conv2d
//! patch embedding with stride = patch, learned position embedding (no CLS token), pre-LN
//! encoder layers with non-causal attention (scale hd^-0.5) and a gelu-tanh MLP.
//! LLaVA-style features are `hidden_states[-2]`: the output of the layer before the last,
//! without `post_layernorm` and without the pooling head, so neither the last layer, the
//! post-layernorm nor the head is a parameter here (checkpoints holding them load fine).
use super::attention::attend;
use super::config::VisionConfig;
use super::gemm::CpuBf16Gemm;
use super::keys::{KeyPath, LinearKeys};
use super::param;
use super::vision::{linear, spec, NormKeys, PREFIX};
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
    pub(super) fn forward(&self, cfg: &VisionConfig, params: &ParamMap, pixels: &Tensor) -> Tensor {
        let w = param(params, &self.patch_weight);
        let b = param(params, &self.patch_bias);
        let pos = param(params, &self.position);
        let p = cfg.patch_size;
        // The f32 pixels in the weights' dtype (bf16 compute), as transformers' embeddings do.
        let pixels = pixels.to_kind(w.kind());
        // [n, D, g, g] -> [n, g*g, D]
        let patches = CpuBf16Gemm::current()
            .patch_conv(&pixels, w, b, p)
            .flatten(2, -1)
            .transpose(1, 2);
        patches + pos.unsqueeze(0)
    }
}

/// Encoder layer `i`'s keys and shapes, built once: its specs and forward both read them.
pub(super) struct EncoderLayer {
    layer_norm1: NormKeys,
    layer_norm2: NormKeys,
    q_proj: LinearKeys,
    k_proj: LinearKeys,
    v_proj: LinearKeys,
    out_proj: LinearKeys,
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
            q_proj: LinearKeys::new(&attn / "q_proj", d, d, true),
            k_proj: LinearKeys::new(&attn / "k_proj", d, d, true),
            v_proj: LinearKeys::new(&attn / "v_proj", d, d, true),
            out_proj: LinearKeys::new(&attn / "out_proj", d, d, true),
            fc1: LinearKeys::new(&mlp / "fc1", ff, d, true),
            fc2: LinearKeys::new(&mlp / "fc2", d, ff, true),
        }
    }

    pub(super) fn specs(&self, cfg: &VisionConfig) -> Vec<ParamSpec> {
        let d = cfg.hidden_size;
        let mut specs = Vec::new();
        specs.extend(self.layer_norm1.specs(d));
        specs.extend(self.layer_norm2.specs(d));
        for linear in [&self.q_proj, &self.k_proj, &self.v_proj, &self.out_proj] {
            specs.extend(linear.specs(false));
        }
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
        let (n, len, d) = x.size3()?;
        let heads = cfg.num_attention_heads;
        let hd = cfg.head_dim();

        let residual = x;
        let h = self.layer_norm1.forward(cfg, params, x);
        let split = |t: Tensor| t.view([n, len, heads, hd]).transpose(1, 2);
        let q = split(linear(params, &h, &self.q_proj)?);
        let k = split(linear(params, &h, &self.k_proj)?);
        let v = split(linear(params, &h, &self.v_proj)?);
        let attn = attend(&q, &k, &v, None)
            .transpose(1, 2)
            .reshape([n, len, d]);
        let h = residual + linear(params, &attn, &self.out_proj)?;

        let residual = &h;
        let m = self.layer_norm2.forward(cfg, params, &h);
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
