//! The vision tower as the VLM runs it, whichever architecture its config names
//! ([`VisionArch`]): the embeddings unit and the encoder layers up to the feature layer (by
//! default the one before the last, LLaVA's `vision_feature_layer` -2), whose output (without
//! the CLS token a DINOv2 tower carries) is the image features; with several feature layers,
//! their outputs concatenated ([`FeatureCarry`]). What the architectures share lives here: the parameter-spec
//! and LayerNorm helpers, the dispatch, the whole tower for generation, and the pixel
//! normalisation each architecture's image processor applies.
use super::attention::attend;
use super::config::{VisionArch, VisionConfig};
use super::gemm::{self, CpuBf16Gemm};
use super::keys::{KeyPath, LinearKeys};
use super::{dinov2, param, siglip};
use tch::Tensor;
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

/// Root of every tower parameter's tessera key (`vision_model.embeddings...`). A checkpoint
/// may store the keys without it (`SiglipVisionModel` in transformers 5, `Dinov2Model`).
pub(super) const PREFIX: &str = "vision_model";

/// A frozen parameter's spec.
pub(super) fn spec(name: &str, shape: Vec<i64>) -> ParamSpec {
    ParamSpec {
        name: name.to_string(),
        shape,
        trainable: false,
        expert: None,
    }
}

/// A LayerNorm's keys: `{path}.weight` and `{path}.bias`, both `[hidden]`.
pub(super) struct NormKeys {
    weight: String,
    bias: String,
}

impl NormKeys {
    pub(super) fn new(path: KeyPath) -> Self {
        NormKeys {
            weight: path.key("weight"),
            bias: path.key("bias"),
        }
    }

    pub(super) fn specs(&self, hidden: i64) -> [ParamSpec; 2] {
        [
            spec(&self.weight, vec![hidden]),
            spec(&self.bias, vec![hidden]),
        ]
    }

    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        x: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        Ok(x.layer_norm(
            [cfg.hidden_size],
            Some(param(params, &self.weight)?),
            Some(param(params, &self.bias)?),
            cfg.layer_norm_eps,
            false,
        ))
    }
}

pub(super) fn linear(
    params: &ParamMap,
    x: &Tensor,
    keys: &LinearKeys,
) -> Result<Tensor, ComputeError> {
    Ok(gemm::linear(
        x,
        param(params, &keys.weight)?,
        keys.bias.as_deref().map(|b| param(params, b)).transpose()?,
    )?)
}

/// Conv2d patch embedding (stride = patch) of normalised pixels `[n, 3, s, s]`, computed in the
/// weights' dtype as transformers does (bf16 compute): `[n, (s/p)², D]`.
pub(super) fn patch_embeddings(
    cfg: &VisionConfig,
    params: &ParamMap,
    (weight, bias): (&str, &str),
    pixels: &Tensor,
) -> Result<Tensor, ComputeError> {
    let w = param(params, weight)?;
    let pixels = pixels.to_kind(w.kind());
    // [n, D, g, g] -> [n, g*g, D]
    Ok(CpuBf16Gemm::current()
        .patch_conv(&pixels, w, param(params, bias)?, cfg.patch_size)
        .flatten(2, -1)
        .transpose(1, 2))
}

/// A tower layer's bidirectional multi-head self-attention (scale hd^-0.5): its four
/// projections' keys, as each architecture names them.
pub(super) struct AttentionKeys {
    pub(super) q: LinearKeys,
    pub(super) k: LinearKeys,
    pub(super) v: LinearKeys,
    pub(super) out: LinearKeys,
}

impl AttentionKeys {
    /// The four projections' specs, q, k, v, out (frozen).
    pub(super) fn specs(&self) -> Vec<ParamSpec> {
        [&self.q, &self.k, &self.v, &self.out]
            .into_iter()
            .flat_map(|linear| linear.specs(false))
            .collect()
    }

    /// Normalised hidden states `[n, len, D]` -> the attention block's output (before any
    /// residual add).
    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        h: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        let (n, len, d) = h.size3()?;
        let (heads, hd) = (cfg.num_attention_heads, cfg.head_dim());
        let split = |t: Tensor| t.view([n, len, heads, hd]).transpose(1, 2);
        let q = split(linear(params, h, &self.q)?);
        let k = split(linear(params, h, &self.k)?);
        let v = split(linear(params, h, &self.v)?);
        let attn = attend(&q, &k, &v, None)
            .transpose(1, 2)
            .reshape([n, len, d]);
        linear(params, &attn, &self.out)
    }
}

/// Pixels to tokens: `[n, 3, s, s]` normalised pixels -> `[n, prefix + (s/p)², D]`.
pub(super) enum TowerEmbeddings {
    Siglip(siglip::Embeddings),
    Dinov2(dinov2::Embeddings),
}

impl TowerEmbeddings {
    pub(super) fn new(cfg: &VisionConfig) -> Self {
        match cfg.arch {
            VisionArch::Siglip => Self::Siglip(siglip::Embeddings::new()),
            VisionArch::Dinov2 { .. } => Self::Dinov2(dinov2::Embeddings::new()),
        }
    }

    pub(super) fn specs(&self, cfg: &VisionConfig) -> Vec<ParamSpec> {
        match self {
            Self::Siglip(e) => e.specs(cfg),
            Self::Dinov2(e) => e.specs(cfg),
        }
    }

    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        pixels: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        match self {
            Self::Siglip(e) => e.forward(cfg, params, pixels),
            Self::Dinov2(e) => e.forward(cfg, params, pixels),
        }
    }
}

/// Encoder layer `i`: `[n, tokens, D]` -> `[n, tokens, D]`.
pub(super) enum TowerLayer {
    Siglip(siglip::EncoderLayer),
    Dinov2(dinov2::Layer),
}

impl TowerLayer {
    pub(super) fn new(cfg: &VisionConfig, i: i64) -> Self {
        match cfg.arch {
            VisionArch::Siglip => Self::Siglip(siglip::EncoderLayer::new(cfg, i)),
            VisionArch::Dinov2 { .. } => Self::Dinov2(dinov2::Layer::new(cfg, i)),
        }
    }

    pub(super) fn specs(&self, cfg: &VisionConfig) -> Vec<ParamSpec> {
        match self {
            Self::Siglip(l) => l.specs(cfg),
            Self::Dinov2(l) => l.specs(cfg),
        }
    }

    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        x: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        match self {
            Self::Siglip(l) => l.forward(cfg, params, x),
            Self::Dinov2(l) => l.forward(cfg, params, x),
        }
    }
}

/// The patch tokens of the features `[n, prefix + T, C]`: `[n, T, C]`.
pub(super) fn patch_tokens(hidden: &Tensor, prefix: i64) -> Tensor {
    match prefix {
        0 => hidden.shallow_clone(),
        k => hidden.narrow(1, k, hidden.size()[1] - k),
    }
}

/// How the unit chain carries several feature layers (see [`VisionConfig::feature_layers`])
/// to the projector in its one tensor: channels `[current | stash]`, where the stash holds the
/// feature layers shallower than the deepest, each `hidden` wide, in ascending order, appended
/// as the chain passes them. With one feature layer there is never a stash.
pub(super) struct FeatureCarry {
    hidden: i64,
    /// The feature layers as `hidden_states` indices, in list order.
    states: Vec<i64>,
    /// The feature layers shallower than the deepest, ascending: the stash's slots.
    stashed: Vec<i64>,
}

impl FeatureCarry {
    pub(super) fn new(cfg: &VisionConfig) -> Self {
        let states = cfg.feature_states();
        let deepest = cfg.layers_run();
        let mut stashed: Vec<i64> = states.iter().copied().filter(|&s| s < deepest).collect();
        stashed.sort_unstable();
        FeatureCarry {
            hidden: cfg.hidden_size,
            states,
            stashed,
        }
    }

    /// Encoder layer `index` (its output is `hidden_states[index + 1]`) applied to the carried
    /// `[.., current | stash]`: the layer reads `current`; its output becomes the new
    /// `current`, and joins the stash too when it is a feature layer shallower than the deepest.
    pub(super) fn through_layer(
        &self,
        index: i64,
        carried: &Tensor,
        layer: impl FnOnce(&Tensor) -> Result<Tensor, ComputeError>,
    ) -> Result<Tensor, ComputeError> {
        let width = *carried.size().last().unwrap_or(&0);
        let stash_here = self.stashed.contains(&(index + 1));
        if width == self.hidden && !stash_here {
            return layer(carried);
        }
        let current = carried.narrow(-1, 0, self.hidden);
        let out = layer(&current)?;
        let mut parts = vec![out.shallow_clone()];
        if width > self.hidden {
            parts.push(carried.narrow(-1, self.hidden, width - self.hidden));
        }
        if stash_here {
            parts.push(out);
        }
        Ok(Tensor::cat(&parts, -1))
    }

    /// The carried `[.., current | stash]` after the deepest feature layer -> the features
    /// `[.., hidden · layers]`, the layers in list order (as transformers concatenates them).
    pub(super) fn features(&self, carried: &Tensor) -> Tensor {
        if self.states.len() == 1 {
            return carried.shallow_clone();
        }
        let slot = |state: i64| match self.stashed.iter().position(|&s| s == state) {
            Some(i) => i as i64 + 1,
            None => 0,
        };
        let parts: Vec<Tensor> = self
            .states
            .iter()
            .map(|&state| carried.narrow(-1, slot(state) * self.hidden, self.hidden))
            .collect();
        Tensor::cat(&parts, -1)
    }
}

/// The tower up to the features LLaVA reads: embeddings and the encoder layers up to the
/// config's deepest feature layer (by default all but the last).
pub(crate) struct VisionTower {
    cfg: VisionConfig,
    embeddings: TowerEmbeddings,
    layers: Vec<TowerLayer>,
    carry: FeatureCarry,
}

impl VisionTower {
    pub(crate) fn new(cfg: &VisionConfig) -> Self {
        Self::with_layers(cfg, cfg.layers_run())
    }

    /// The embeddings and the first `layers` encoder layers.
    fn with_layers(cfg: &VisionConfig, layers: i64) -> Self {
        VisionTower {
            cfg: cfg.clone(),
            embeddings: TowerEmbeddings::new(cfg),
            layers: (0..layers).map(|i| TowerLayer::new(cfg, i)).collect(),
            carry: FeatureCarry::new(cfg),
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

    /// The image features for normalised pixels `[n, 3, s, s]`: `[n, (s/p)^2, hidden · layers]`
    /// (the patch tokens of the feature layers, concatenated in list order; a CLS token is
    /// dropped). The same computation as the unit chain's, carry included.
    pub(crate) fn features(
        &self,
        params: &ParamMap,
        pixel_values: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        let mut hidden = self.embeddings.forward(&self.cfg, params, pixel_values)?;
        for (i, layer) in self.layers.iter().enumerate() {
            hidden = self
                .carry
                .through_layer(i as i64, &hidden, |x| layer.forward(&self.cfg, params, x))?;
        }
        Ok(patch_tokens(
            &self.carry.features(&hidden),
            self.cfg.prefix_tokens(),
        ))
    }
}

/// Parameters the vision features read, in checkpoint order, frozen.
pub(super) fn param_specs(cfg: &VisionConfig) -> Vec<ParamSpec> {
    VisionTower::new(cfg).param_specs()
}

/// Every tensor of a complete tower checkpoint (what an export writes and `init-model` draws):
/// every layer (those past the feature layer included, which training never reads), the final
/// norm and DINOv2's mask token.
pub(super) fn checkpoint_specs(cfg: &VisionConfig) -> Vec<ParamSpec> {
    let mut specs = VisionTower::with_layers(cfg, cfg.num_hidden_layers).param_specs();
    specs.extend(match cfg.arch {
        VisionArch::Siglip => siglip::unread_specs(cfg),
        VisionArch::Dinov2 { .. } => dinov2::unread_specs(cfg),
    });
    specs
}

/// The image processor's normalisation: u8 pixels `[n, 3, s, s]` -> f32 `(x/255 − mean)/std`
/// per channel (SigLIP: 0.5/0.5, so [-1, 1]; DINOv2: ImageNet's mean and std).
pub(crate) fn normalize_pixels(cfg: &VisionConfig, raw: &Tensor) -> Tensor {
    let (mean, std) = cfg.pixel_mean_std();
    let x = raw.to_kind(tch::Kind::Float) / 255.0;
    if mean == [0.5; 3] && std == [0.5; 3] {
        return (x - 0.5) / 0.5;
    }
    let per_channel = |v: [f64; 3]| {
        Tensor::from_slice(&v.map(|c| c as f32))
            .view([1, 3, 1, 1])
            .to_device(raw.device())
    };
    (x - per_channel(mean)) / per_channel(std)
}
