//! SigLIP vision tower (transformers `SiglipVisionTransformer`, also SigLIP-2 FixRes): Conv2d
//! patch embedding with stride = patch, learned position embedding (no CLS token), pre-LN
//! encoder layers with non-causal attention (scale hd^-0.5) and a gelu-tanh MLP.
//! LLaVA-style features are `hidden_states[-2]`: the output of the layer before the last,
//! without `post_layernorm` and without the pooling head, so neither the last layer, the
//! post-layernorm nor the head is a parameter here (checkpoints holding them load fine).
use super::attention::attend;
use super::config::SiglipVisionConfig;
use super::gemm::{self, CpuBf16Gemm};
use super::keys::{KeyPath, LinearKeys};
use super::param;
use tch::Tensor;
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};
use tessera_sys::ShimError;

const PREFIX: &str = "vision_model";

fn spec(name: &str, shape: Vec<i64>) -> ParamSpec {
    ParamSpec {
        name: name.to_string(),
        shape,
        trainable: false,
        expert: None,
    }
}

/// Number of encoder layers the features need: all but the last.
pub(super) fn feature_layers(cfg: &SiglipVisionConfig) -> i64 {
    cfg.num_hidden_layers - 1
}

/// A LayerNorm's keys: `{path}.weight` and `{path}.bias`, both `[hidden]`.
struct NormKeys {
    weight: String,
    bias: String,
}

impl NormKeys {
    fn new(path: KeyPath) -> Self {
        NormKeys {
            weight: path.key("weight"),
            bias: path.key("bias"),
        }
    }

    fn specs(&self, hidden: i64) -> [ParamSpec; 2] {
        [
            spec(&self.weight, vec![hidden]),
            spec(&self.bias, vec![hidden]),
        ]
    }

    fn forward(&self, cfg: &SiglipVisionConfig, params: &ParamMap, x: &Tensor) -> Tensor {
        x.layer_norm(
            [cfg.hidden_size],
            Some(param(params, &self.weight)),
            Some(param(params, &self.bias)),
            cfg.layer_norm_eps,
            false,
        )
    }
}

fn linear(params: &ParamMap, x: &Tensor, keys: &LinearKeys) -> Result<Tensor, ShimError> {
    gemm::linear(
        x,
        param(params, &keys.weight),
        keys.bias.as_deref().map(|b| param(params, b)),
    )
}

fn activation(cfg: &SiglipVisionConfig, x: &Tensor) -> Tensor {
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

    pub(super) fn specs(&self, cfg: &SiglipVisionConfig) -> Vec<ParamSpec> {
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
        cfg: &SiglipVisionConfig,
        params: &ParamMap,
        pixels: &Tensor,
    ) -> Tensor {
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
    pub(super) fn new(cfg: &SiglipVisionConfig, i: i64) -> Self {
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

    pub(super) fn specs(&self, cfg: &SiglipVisionConfig) -> Vec<ParamSpec> {
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
        cfg: &SiglipVisionConfig,
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

/// The tower up to the features LLaVA reads: embeddings and all encoder layers but the last.
pub(crate) struct VisionTower {
    cfg: SiglipVisionConfig,
    embeddings: Embeddings,
    layers: Vec<EncoderLayer>,
}

impl VisionTower {
    pub(crate) fn new(cfg: &SiglipVisionConfig) -> Self {
        VisionTower {
            cfg: cfg.clone(),
            embeddings: Embeddings::new(),
            layers: (0..feature_layers(cfg))
                .map(|i| EncoderLayer::new(cfg, i))
                .collect(),
        }
    }

    /// Parameters the features read, in checkpoint order, frozen.
    pub(crate) fn param_specs(&self) -> Vec<ParamSpec> {
        let mut specs = self.embeddings.specs(&self.cfg);
        for layer in &self.layers {
            specs.extend(layer.specs(&self.cfg));
        }
        specs
    }

    /// Features of the layer before the last for normalised pixels `[n, 3, s, s]`:
    /// `[n, (s/p)^2, hidden]`.
    pub(crate) fn features(
        &self,
        params: &ParamMap,
        pixel_values: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        let mut hidden = self.embeddings.forward(&self.cfg, params, pixel_values);
        for layer in &self.layers {
            hidden = layer.forward(&self.cfg, params, &hidden)?;
        }
        Ok(hidden)
    }
}

/// Parameters the vision features read, in checkpoint order, frozen.
pub(super) fn param_specs(cfg: &SiglipVisionConfig) -> Vec<ParamSpec> {
    VisionTower::new(cfg).param_specs()
}

/// Every tensor of a complete `SiglipVisionModel` checkpoint without the pooling head: the
/// feature parameters plus the last layer and `post_layernorm` (what `init-model` writes).
pub(super) fn checkpoint_specs(cfg: &SiglipVisionConfig) -> Vec<ParamSpec> {
    let mut specs = param_specs(cfg);
    specs.extend(EncoderLayer::new(cfg, cfg.num_hidden_layers - 1).specs(cfg));
    let post = NormKeys::new(KeyPath::new(PREFIX) / "post_layernorm");
    specs.extend(post.specs(cfg.hidden_size));
    specs
}

/// SigLIP's image processor normalisation (mean 0.5, std 0.5 per channel): u8 pixels
/// `[n, 3, s, s]` -> f32 `(x/255 − 0.5)/0.5`, in [-1, 1].
pub(crate) fn normalize_pixels(raw: &Tensor) -> Tensor {
    const MEAN: f64 = 0.5;
    const STD: f64 = 0.5;
    (raw.to_kind(tch::Kind::Float) / 255.0 - MEAN) / STD
}
