//! The six kinds of FSDP unit (see [`tessera_fsdp::Unit`]): `vision.embeddings`,
//! `vision.layers.{i}`, `projector`, `embed`, `layers.{i}` and `head`. Each lists the
//! parameters it reads and computes from them alone. Both towers are wrapped layer by layer
//! (as torchtitan and FSDP's transformer wrap policy do), so a rank gathers one layer at a
//! time, never a whole tower. What the kinds share (name, component, parameters, whether a
//! text-only micro-batch skips them) is [`ChainUnit`]; each kind adds only its computation.
use super::anyres::pack_image_features;
use super::config::{LoraConfig, VisionConfig};
use super::ctx::VlmCtx;
use super::decoder::{DecoderLayer, LayerInputs};
use super::lm_config::LmConfig;
use super::moe::ExpertGroup;
use super::selective::CheapOps;
use super::vision::{patch_tokens, FeatureCarry, TowerEmbeddings, TowerLayer};
use super::vocab;
use super::{loss, param, projector};
use tch::{Kind, Tensor};
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec, Unit};

/// The computation of one kind of unit.
pub(super) trait UnitKind: Send + Sync {
    fn compute(
        &self,
        params: &ParamMap,
        input: &Tensor,
        ctx: &VlmCtx,
    ) -> Result<Tensor, ComputeError>;

    /// See [`Unit::side_loss`].
    fn side_loss(&self, _ctx: &VlmCtx) -> Option<Tensor> {
        None
    }
}

/// One unit of the chain: a kind's computation `K` with the unit's name, the component its
/// time is booked under, its parameters, and whether it runs only on micro-batches with images.
pub(super) struct ChainUnit<K> {
    name: String,
    component: &'static str,
    images_only: bool,
    specs: Vec<ParamSpec>,
    kind: K,
}

impl<K: UnitKind> Unit<VlmCtx> for ChainUnit<K> {
    fn name(&self) -> &str {
        &self.name
    }
    fn component(&self) -> &str {
        self.component
    }
    fn params(&self) -> &[ParamSpec] {
        &self.specs
    }
    fn runs_on(&self, ctx: &VlmCtx) -> bool {
        !self.images_only || ctx.has_images()
    }
    fn forward(
        &self,
        params: &ParamMap,
        input: &Tensor,
        ctx: &VlmCtx,
    ) -> Result<Tensor, ComputeError> {
        self.kind.compute(params, input, ctx)
    }
    fn side_loss(&self, ctx: &VlmCtx) -> Option<Tensor> {
        self.kind.side_loss(ctx)
    }
}

/// `specs` with their base weights (created frozen) trained when `train` (a unit's base weights
/// train or not as one); what always trains (the added tokens' rows) stays trainable.
fn trained(mut specs: Vec<ParamSpec>, train: bool) -> Vec<ParamSpec> {
    for s in &mut specs {
        s.trainable |= train;
    }
    specs
}

/// Normalised pixels `[n, 3, s, s]` -> patch + position embeddings `[n, tokens, Dv]`.
pub(super) struct VisionEmbedUnit {
    cfg: VisionConfig,
    embeddings: TowerEmbeddings,
}

impl VisionEmbedUnit {
    pub(super) fn new(cfg: &VisionConfig, train: bool) -> ChainUnit<Self> {
        let embeddings = TowerEmbeddings::new(cfg);
        ChainUnit {
            name: "vision.embeddings".into(),
            component: "vision",
            images_only: true,
            specs: trained(embeddings.specs(cfg), train),
            kind: Self {
                cfg: cfg.clone(),
                embeddings,
            },
        }
    }
}

impl UnitKind for VisionEmbedUnit {
    fn compute(
        &self,
        params: &ParamMap,
        input: &Tensor,
        _: &VlmCtx,
    ) -> Result<Tensor, ComputeError> {
        self.embeddings.forward(&self.cfg, params, input)
    }
}

/// Vision encoder layer `i` `[n, tokens, Dv]` -> `[n, tokens, Dv]`. The chain holds the layers
/// up to the deepest feature layer (by default the one before the last), whose output is the
/// image features. With several feature layers the shallower ones ride along in extra
/// channels ([`FeatureCarry`]): `[n, tokens, Dv · (1 + stashed so far)]`.
pub(super) struct VisionLayerUnit {
    cfg: VisionConfig,
    index: i64,
    layer: TowerLayer,
    carry: FeatureCarry,
}

impl VisionLayerUnit {
    pub(super) fn new(cfg: &VisionConfig, index: i64, train: bool) -> ChainUnit<Self> {
        let layer = TowerLayer::new(cfg, index);
        ChainUnit {
            name: format!("vision.layers.{index}"),
            component: "vision",
            images_only: true,
            specs: trained(layer.specs(cfg), train),
            kind: Self {
                cfg: cfg.clone(),
                index,
                layer,
                carry: FeatureCarry::new(cfg),
            },
        }
    }
}

impl UnitKind for VisionLayerUnit {
    fn compute(
        &self,
        params: &ParamMap,
        input: &Tensor,
        _: &VlmCtx,
    ) -> Result<Tensor, ComputeError> {
        self.carry.through_layer(self.index, input, |x| {
            self.layer.forward(&self.cfg, params, x)
        })
    }
}

/// Features `[n, prefix + tokens, Dv]` -> image tokens `[n * tokens, D]` (in placeholder
/// order): the patch tokens of the feature layer (a CLS token dropped), projected; with several
/// feature layers, their patch tokens concatenated in list order (`Dv · layers` channels).
pub(super) struct ProjectorUnit {
    carry: FeatureCarry,
    /// Tokens ahead of the patches (DINOv2's CLS), dropped.
    prefix: i64,
    lm_hidden: i64,
    /// Features per side of one view (the tower's image size over its patch).
    side: i64,
}

impl ProjectorUnit {
    /// `newline`: the images are `anyres_max_N` grids, packed with a learned `image_newline`.
    /// `standardized`: the features are standardised by frozen statistics first
    /// (`--standardize-features`).
    pub(super) fn new(
        vision: &VisionConfig,
        lm_hidden: i64,
        trainable: bool,
        (newline, standardized): (bool, bool),
    ) -> ChainUnit<Self> {
        let mut specs = projector::param_specs(vision.feature_size(), lm_hidden, trainable);
        if newline {
            specs.push(projector::newline_spec(lm_hidden, trainable));
        }
        if standardized {
            specs.extend(crate::feature_stats::specs(vision.feature_size()));
        }
        ChainUnit {
            name: "projector".into(),
            component: "projector",
            images_only: true,
            specs,
            kind: Self {
                carry: FeatureCarry::new(vision),
                prefix: vision.prefix_tokens(),
                lm_hidden,
                side: vision.image_size / vision.patch_size,
            },
        }
    }
}

impl UnitKind for ProjectorUnit {
    fn compute(
        &self,
        params: &ParamMap,
        input: &Tensor,
        ctx: &VlmCtx,
    ) -> Result<Tensor, ComputeError> {
        let features = patch_tokens(&self.carry.features(input), self.prefix);
        let projected = projector::forward(params, &features)?;
        if ctx.image_geometry.is_empty() {
            return Ok(projected.reshape([-1, self.lm_hidden]));
        }
        // anyres_max_N: each image's views (base first, then its tiles) packed into its tokens.
        let newline = param(params, projector::IMAGE_NEWLINE)?;
        let mut packed = Vec::with_capacity(ctx.image_geometry.len());
        let mut view = 0;
        for geometry in &ctx.image_geometry {
            let tiles = i64::from(geometry.tiles);
            let views = projected.narrow(0, view, tiles);
            view += tiles;
            let image = pack_image_features(&views, geometry, self.side, Some(newline))
                .map_err(|e| tch::TchError::Shape(e.to_string()))?;
            packed.push(image);
        }
        Ok(Tensor::cat(&packed, 0))
    }
}

/// Image tokens `[n * tokens, D]` (or an empty tensor) -> input embeddings `[rows, len, D]`
/// with the image tokens written at the placeholder positions, in order.
pub(super) struct EmbedUnit;

impl EmbedUnit {
    pub(super) fn new(cfg: &LmConfig, train: bool, added: i64) -> ChainUnit<Self> {
        ChainUnit {
            name: "embed".into(),
            component: "embed",
            images_only: false,
            specs: trained(vocab::embed_specs(cfg, added), train),
            kind: Self,
        }
    }
}

impl UnitKind for EmbedUnit {
    fn compute(
        &self,
        params: &ParamMap,
        input: &Tensor,
        ctx: &VlmCtx,
    ) -> Result<Tensor, ComputeError> {
        let embeds = vocab::embed(params, &ctx.input_ids)?;
        if input.numel() == 0 {
            return Ok(embeds);
        }
        let d = embeds.size()[2];
        Ok(embeds
            .reshape([-1, d])
            .index_copy(0, &ctx.placeholder_index, &input.to_kind(embeds.kind()))
            .view([ctx.rows, ctx.row_len, d]))
    }
}

/// Decoder layer `i`: its base weights (trained in a full fine-tune) and its LoRA adapters
/// (always trained when present).
pub(super) struct LayerUnit {
    cfg: LmConfig,
    lora: Option<LoraConfig>,
    layer: DecoderLayer,
}

impl LayerUnit {
    pub(super) fn new(
        cfg: &LmConfig,
        index: i64,
        lora: Option<&LoraConfig>,
        train: bool,
        experts: Option<&ExpertGroup>,
    ) -> ChainUnit<Self> {
        let layer = DecoderLayer::with_experts(cfg, index, experts);
        let mut specs = trained(layer.specs(None), train);
        if let Some(lora) = lora {
            specs.extend(layer.adapter_specs(lora));
        }
        ChainUnit {
            name: format!("layers.{index}"),
            component: "lm_layers",
            images_only: false,
            specs,
            kind: Self {
                cfg: cfg.clone(),
                lora: lora.cloned(),
                layer,
            },
        }
    }
}

impl UnitKind for LayerUnit {
    fn compute(
        &self,
        params: &ParamMap,
        input: &Tensor,
        ctx: &VlmCtx,
    ) -> Result<Tensor, ComputeError> {
        let (cos, sin) = ctx.rotary_as(input.kind());
        let inputs = LayerInputs {
            mask: ctx.mask.as_ref(),
            spans: &ctx.spans,
            varlen: ctx.varlen.as_ref(),
            cos: &cos,
            sin: &sin,
            dropout_seed: ctx.dropout_seed,
            real_index: ctx.real_index.as_ref(),
            router_log: Some(&ctx.router_log),
            cheap: CheapOps {
                recomputed: ctx.recompute_cheap_ops,
            },
        };
        self.layer
            .forward(&self.cfg, self.lora.as_ref(), params, input, &inputs)
    }

    fn side_loss(&self, ctx: &VlmCtx) -> Option<Tensor> {
        if !self.layer.is_sparse() {
            return None;
        }
        ctx.router_log
            .side_loss(self.layer.index(), ctx.balance_weight)
    }
}

/// Final norm + output projection -> sum of token cross-entropy over supervised labels,
/// chunked (see [`loss`]): a scalar, or under a mixture `[1 + sources]` f32 with that sum first
/// and then each source's part of it (detached: reported, not back-propagated; see
/// [`Unit::forward`]). With tied embeddings it reads `model.embed_tokens.weight`, which the
/// `embed` unit also reads (see `Vlm::shared_params`).
pub(super) struct HeadUnit {
    cfg: LmConfig,
    tied: bool,
    chunk: i64,
}

impl HeadUnit {
    pub(super) fn new(
        cfg: &LmConfig,
        tied: bool,
        added: i64,
        chunk: i64,
        train: bool,
    ) -> ChainUnit<Self> {
        ChainUnit {
            name: "head".into(),
            component: "head",
            images_only: false,
            specs: trained(vocab::head_specs(cfg, tied, added), train),
            kind: Self {
                cfg: cfg.clone(),
                tied,
                chunk,
            },
        }
    }
}

impl UnitKind for HeadUnit {
    fn compute(
        &self,
        params: &ParamMap,
        input: &Tensor,
        ctx: &VlmCtx,
    ) -> Result<Tensor, ComputeError> {
        if ctx.supervised == 0 {
            // Zero-loss micro-batch: a zero that still reaches every input, so backward runs.
            return Ok(input.sum(Kind::Float) * 0.0);
        }
        let d = input.size()[2];
        let h = input
            .reshape([-1, d])
            .index_select(0, &ctx.supervised_index);
        let cheap = CheapOps {
            recomputed: ctx.recompute_cheap_ops,
        };
        let h = cheap.rms_norm(&h, param(params, vocab::NORM)?, self.cfg.rms_norm_eps)?;
        let w = vocab::output_matrix(params, self.tied)?;
        let sources = ctx.supervised_sources.as_ref();
        let (sum, tokens) =
            loss::chunked_cross_entropy(&h, &w, &ctx.targets, self.chunk, sources.is_some());
        match (sources, tokens) {
            (Some((source, count)), Some(tokens)) => {
                let zeros = Tensor::zeros([*count], (Kind::Float, tokens.device()));
                let by_source = zeros.index_add(0, source, &tokens.to_kind(Kind::Float));
                Ok(Tensor::cat(&[sum.reshape([1]), by_source.detach()], 0))
            }
            _ => Ok(sum),
        }
    }
}
