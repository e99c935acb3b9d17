//! DINOv2 vision tower (transformers `Dinov2Model`, the Hub's facebook/dinov2-* checkpoints):
//! Conv2d patch embedding, a learned CLS token ahead of the patches, position embeddings
//! learned on a fixed grid and interpolated bicubically to the image's grid, pre-LN encoder
//! layers whose attention and MLP outputs are scaled per channel (layer scale) before their
//! residual add, and an exact-GELU MLP. Keys as the Hub stores them (`embeddings.cls_token`,
//! `encoder.layer.N.attention.attention.query`, `...layer_scale1.lambda1`), under tessera's
//! `vision_model.` root.
use super::config::{VisionArch, VisionConfig};
use super::keys::{KeyPath, LinearKeys};
use super::param;
use super::vision::{linear, patch_embeddings, spec, AttentionKeys, NormKeys, PREFIX};
use tch::{Kind, Tensor};
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

fn position_grid(cfg: &VisionConfig) -> i64 {
    match cfg.arch {
        VisionArch::Dinov2 { position_grid } => position_grid,
        VisionArch::Siglip => unreachable!("a DINOv2 unit built for a SigLIP config"),
    }
}

/// Patch, CLS and position embeddings' keys.
pub(super) struct Embeddings {
    patch_weight: String,
    patch_bias: String,
    cls: String,
    position: String,
}

impl Embeddings {
    pub(super) fn new() -> Self {
        let p = KeyPath::new(PREFIX) / "embeddings";
        Embeddings {
            patch_weight: (&p / "patch_embeddings" / "projection").key("weight"),
            patch_bias: (&p / "patch_embeddings" / "projection").key("bias"),
            cls: p.key("cls_token"),
            position: p.key("position_embeddings"),
        }
    }

    pub(super) fn specs(&self, cfg: &VisionConfig) -> Vec<ParamSpec> {
        let (d, p, g) = (cfg.hidden_size, cfg.patch_size, position_grid(cfg));
        vec![
            spec(&self.cls, vec![1, 1, d]),
            spec(&self.position, vec![1, g * g + 1, d]),
            spec(&self.patch_weight, vec![d, cfg.num_channels, p, p]),
            spec(&self.patch_bias, vec![d]),
        ]
    }

    /// The position embeddings for a `side`² patch grid, `[1, 1 + side², D]`: the stored ones
    /// when the grid matches, else the CLS position plus the grid resampled bicubically (in f32,
    /// corners not aligned), exactly as transformers' `interpolate_pos_encoding`.
    fn positions(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        side: i64,
    ) -> Result<Tensor, ComputeError> {
        let pos = param(params, &self.position)?;
        let (g, d) = (position_grid(cfg), cfg.hidden_size);
        if side == g {
            return Ok(pos.shallow_clone());
        }
        let cls = pos.narrow(1, 0, 1);
        let grid = pos
            .narrow(1, 1, g * g)
            .reshape([1, g, g, d])
            .permute([0, 3, 1, 2])
            .to_kind(Kind::Float)
            .upsample_bicubic2d([side, side], false, None, None)
            .to_kind(pos.kind())
            .permute([0, 2, 3, 1])
            .reshape([1, side * side, d]);
        Ok(Tensor::cat(&[cls, grid], 1))
    }

    /// Normalised pixels `[n, 3, s, s]` -> `[n, 1 + (s/p)², D]` (CLS first).
    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        pixels: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        // Square images (the loader's): one side gives the patch grid.
        let (n, _, side, _) = pixels.size4()?;
        let keys = (self.patch_weight.as_str(), self.patch_bias.as_str());
        let patches = patch_embeddings(cfg, params, keys, pixels)?;
        let cls = param(params, &self.cls)?.expand([n, 1, cfg.hidden_size], false);
        let tokens = Tensor::cat(&[cls, patches], 1);
        Ok(tokens + self.positions(cfg, params, side / cfg.patch_size)?)
    }
}

/// Encoder layer `i`'s keys, built once: its specs and forward both read them.
pub(super) struct Layer {
    norm1: NormKeys,
    norm2: NormKeys,
    attention: AttentionKeys,
    scale1: String,
    fc1: LinearKeys,
    fc2: LinearKeys,
    scale2: String,
}

impl Layer {
    pub(super) fn new(cfg: &VisionConfig, i: i64) -> Self {
        let (d, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let p = KeyPath::new(PREFIX) / "encoder" / "layer" / i;
        let attn = &p / "attention";
        let mlp = &p / "mlp";
        Layer {
            norm1: NormKeys::new(&p / "norm1"),
            norm2: NormKeys::new(&p / "norm2"),
            attention: AttentionKeys {
                q: LinearKeys::new(&attn / "attention" / "query", d, d, true),
                k: LinearKeys::new(&attn / "attention" / "key", d, d, true),
                v: LinearKeys::new(&attn / "attention" / "value", d, d, true),
                out: LinearKeys::new(&attn / "output" / "dense", d, d, true),
            },
            scale1: (&p / "layer_scale1").key("lambda1"),
            fc1: LinearKeys::new(&mlp / "fc1", ff, d, true),
            fc2: LinearKeys::new(&mlp / "fc2", d, ff, true),
            scale2: (&p / "layer_scale2").key("lambda1"),
        }
    }

    pub(super) fn specs(&self, cfg: &VisionConfig) -> Vec<ParamSpec> {
        let d = cfg.hidden_size;
        let mut specs = Vec::new();
        specs.extend(self.norm1.specs(d));
        specs.extend(self.attention.specs());
        specs.push(spec(&self.scale1, vec![d]));
        specs.extend(self.norm2.specs(d));
        specs.extend(self.fc1.specs(false));
        specs.extend(self.fc2.specs(false));
        specs.push(spec(&self.scale2, vec![d]));
        specs
    }

    pub(super) fn forward(
        &self,
        cfg: &VisionConfig,
        params: &ParamMap,
        x: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        let h = self.norm1.forward(cfg, params, x)?;
        let h = x + self.attention.forward(cfg, params, &h)? * param(params, &self.scale1)?;

        let m = self.norm2.forward(cfg, params, &h)?;
        let m = linear(params, &m, &self.fc1)?.gelu("none");
        let m = linear(params, &m, &self.fc2)? * param(params, &self.scale2)?;
        Ok(h + m)
    }
}

/// What a `Dinov2Model` checkpoint holds besides the embeddings and layers: the mask token
/// (pretraining's masked patches) and the final `layernorm`.
pub(super) fn unread_specs(cfg: &VisionConfig) -> Vec<ParamSpec> {
    let d = cfg.hidden_size;
    let mut specs = vec![spec(
        &(KeyPath::new(PREFIX) / "embeddings").key("mask_token"),
        vec![1, d],
    )];
    specs.extend(NormKeys::new(KeyPath::new(PREFIX) / "layernorm").specs(d));
    specs
}
