//! Text generation with the VLM, as transformers' `LlavaForConditionalGeneration.generate`
//! runs it: the vision tower and projector once per image, the image tokens written at the
//! placeholder positions of the prompt, then the LM one token at a time with a KV cache
//! (`kv_cache: false` recomputes the whole prefix at every step instead: the benchmark's
//! baseline). Greedy by default (argmax, the first maximum on ties); with a temperature, top-p
//! (nucleus) sampling from a seeded generator. Stops after a stop id (emitted) or
//! `max_new_tokens`. LoRA adapters run unmerged when the parameters hold them.
//!
//! The weights are held in one dtype, f32 or bf16 ([`Generator::with_kind`]), converted one
//! tensor at a time as they are taken in, so the model is never in memory twice; the
//! activations run in that dtype (bf16 products as `gemm.rs` computes them), and tokens are
//! picked from f32 logits.
use super::config::{LoraConfig, VisionConfig};
use super::decoder::{DecoderLayer, LayerKv};
use super::error::{ModelError, Result};
use super::lm_config::LmConfig;
use super::rope::rotary_tables;
use super::vision::{self, VisionTower};
use super::vocab;
use super::{projector, Vlm};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};
use tessera_fsdp::ParamMap;
use tessera_shards::image_layout::ImageTokens;

/// How to pick tokens and when to stop.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// 0 picks greedily; above 0 samples from softmax(logits / temperature).
    pub temperature: f64,
    /// Nucleus: sample among the most likely tokens whose probabilities sum to `top_p`.
    pub top_p: f64,
    pub seed: u64,
    /// Generation ends after emitting one of these (the tokenizer's end of sequence, `<|im_end|>`).
    pub stop_ids: Vec<i64>,
    /// Cache keys and values (the default) or recompute the prefix at every step.
    pub kv_cache: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            stop_ids: Vec::new(),
            kv_cache: true,
        }
    }
}

/// What one call generated.
pub struct Generation {
    /// New tokens, the stop id included when one ended the generation.
    pub tokens: Vec<i64>,
    /// `[tokens, vocab]` f32: the logits each token was picked from (before temperature).
    pub step_logits: Tensor,
    /// Whether a stop id ended it (rather than `max_new_tokens`).
    pub stopped: bool,
}

/// The model and its parameters (one dtype, on their device), ready to generate.
pub struct Generator {
    /// The vision tower (`None` for a language model alone, which takes no images).
    vision: Option<(VisionConfig, VisionTower)>,
    lm: LmConfig,
    tied: bool,
    /// Ids the model scores: the checkpoint's vocabulary plus the added tokens.
    vocab: i64,
    lora: Option<LoraConfig>,
    image_token_id: i64,
    params: ParamMap,
    layers: Vec<DecoderLayer>,
}

impl Generator {
    /// `params` must hold every parameter of `vlm` (as [`Vlm::load_params`] returns them);
    /// they are converted to f32. The LoRA adapters of `vlm.options.lora` run unmerged.
    pub fn new(vlm: &Vlm, params: ParamMap) -> Result<Self> {
        Self::with_kind(vlm, params, Kind::Float)
    }

    /// [`Self::new`] holding the weights in `kind` (`Float` or `BFloat16`): each parameter is
    /// converted in place, its source dropped as its converted copy replaces it (a parameter
    /// already in `kind` is kept as is).
    pub fn with_kind(vlm: &Vlm, params: ParamMap, kind: Kind) -> Result<Self> {
        let params = converted(&vlm.param_specs(), params, kind)?;
        Ok(Self {
            vision: Some((vlm.vision.clone(), VisionTower::new(&vlm.vision))),
            layers: (0..vlm.lm.num_hidden_layers)
                .map(|i| DecoderLayer::new(&vlm.lm, i))
                .collect(),
            lm: vlm.lm.clone(),
            tied: vlm.tied,
            vocab: vlm.lm.vocab_size + vlm.options.added_tokens,
            lora: vlm.options.lora.clone(),
            // Unset: no id equals it, so a prompt's image finds no placeholder and is refused.
            image_token_id: vlm.options.image_token_id.unwrap_or(-1),
            params,
        })
    }

    /// A language model alone (text in, text out): `params` holds every tensor of its
    /// checkpoint ([`crate::lm_checkpoint_specs`]), held in `kind` (`Float` or `BFloat16`).
    pub fn language_model(lm: &LmConfig, params: ParamMap, kind: Kind) -> Result<Self> {
        let specs = crate::init::lm_checkpoint_specs(lm);
        let params = converted(&specs, params, kind)?;
        Ok(Self {
            vision: None,
            layers: (0..lm.num_hidden_layers)
                .map(|i| DecoderLayer::new(lm, i))
                .collect(),
            lm: lm.clone(),
            tied: lm.tie_word_embeddings,
            vocab: lm.vocab_size,
            lora: None,
            // No image placeholder: no id equals it.
            image_token_id: -1,
            params,
        })
    }

    /// The vision tower's config (`None` for a language model alone).
    pub fn vision(&self) -> Option<&VisionConfig> {
        self.vision.as_ref().map(|(cfg, _)| cfg)
    }

    pub fn lm(&self) -> &LmConfig {
        &self.lm
    }

    pub fn image_token_id(&self) -> i64 {
        self.image_token_id
    }

    /// The dtype the weights are held (and the activations computed) in.
    pub fn kind(&self) -> Kind {
        self.params
            .values()
            .next()
            .map_or(Kind::Float, Tensor::kind)
    }

    fn device(&self) -> Device {
        self.params
            .values()
            .next()
            .map_or(Device::Cpu, |t| t.device())
    }

    /// Projected image tokens `[tokens, D]` of u8 CHW pixels `[views, 3, s, s]`: one view of
    /// `num_patches` tokens per image, or under `anyres_max_N` each image's views packed by its
    /// `geometry` with `image_newline` (see [`crate::pack_image_features`]).
    fn image_embeds(
        &self,
        (vision, tower): &(VisionConfig, VisionTower),
        pixels: &[u8],
        views: i64,
        geometry: &[ImageTokens],
    ) -> Result<Tensor> {
        let side = vision.image_size;
        let raw = Tensor::from_slice(pixels)
            .view([views, 3, side, side])
            .to_device(self.device());
        let features = tower.features(&self.params, &vision::normalize_pixels(vision, &raw))?;
        let projected = projector::forward(&self.params, &features)?;
        if geometry.is_empty() {
            return Ok(projected.reshape([-1, self.lm.hidden_size]));
        }
        let newline = self.params.get(projector::IMAGE_NEWLINE).ok_or_else(|| {
            ModelError::InvalidConfig(
                "anyres images need image_newline, which this model does not hold".into(),
            )
        })?;
        let mut packed = Vec::with_capacity(geometry.len());
        let mut view = 0;
        for g in geometry {
            let tiles = i64::from(g.tiles);
            let features = projected.narrow(0, view, tiles);
            view += tiles;
            let side = vision.image_size / vision.patch_size;
            packed.push(crate::pack_image_features(
                &features,
                g,
                side,
                Some(newline),
            )?);
        }
        Ok(Tensor::cat(&packed, 0))
    }

    /// Input embeddings `[1, len, D]` of `ids` with the image tokens of `pixels` (one image per
    /// `num_patches` placeholders, in order; under `anyres_max_N` each image's `geometry`
    /// says its views and tokens) at the placeholder positions.
    fn prompt_embeds(
        &self,
        ids: &[i64],
        pixels: &[u8],
        geometry: &[ImageTokens],
    ) -> Result<Tensor> {
        let vocab = self.vocab;
        if let Some(id) = ids.iter().find(|&&id| id < 0 || id >= vocab) {
            return Err(ModelError::InvalidConfig(format!(
                "prompt token {id} is outside the vocabulary of {vocab}"
            )));
        }
        let placeholders: Vec<i64> = (0..ids.len() as i64)
            .filter(|&i| ids[i as usize] == self.image_token_id)
            .collect();
        let Some(vision) = &self.vision else {
            if pixels.is_empty() {
                let input = Tensor::from_slice(ids)
                    .view([1, -1])
                    .to_device(self.device());
                return Ok(vocab::embed(&self.params, &input)?);
            }
            return Err(ModelError::InvalidConfig(
                "a language model alone takes no images".into(),
            ));
        };
        let tokens = vision.0.num_patches();
        let side = vision.0.image_size;
        let per_image = (3 * side * side) as usize;
        let images = (pixels.len() / per_image) as i64;
        let (views, expected) = if geometry.is_empty() {
            (images, images * tokens)
        } else {
            let views: i64 = geometry.iter().map(|g| i64::from(g.tiles)).sum();
            (views, geometry.iter().map(|g| g.total() as i64).sum())
        };
        if pixels.len() != views as usize * per_image || placeholders.len() as i64 != expected {
            return Err(ModelError::InvalidConfig(format!(
                "prompt has {} image placeholders and {} pixel bytes; its {views} {side}px \
                 views take {} bytes and {expected} placeholders",
                placeholders.len(),
                pixels.len(),
                views as usize * per_image
            )));
        }
        let device = self.device();
        let input = Tensor::from_slice(ids).view([1, -1]).to_device(device);
        let embeds = vocab::embed(&self.params, &input)?;
        if images == 0 {
            return Ok(embeds);
        }
        let index = Tensor::from_slice(&placeholders).to_device(device);
        let d = self.lm.hidden_size;
        Ok(embeds
            .reshape([-1, d])
            .index_copy(
                0,
                &index,
                &self.image_embeds(vision, pixels, views, geometry)?,
            )
            .view([1, -1, d]))
    }

    /// The decoder over `x` `[1, len, D]` following what `kv` caches; returns the final hidden
    /// states `[1, len, D]` (before the final norm).
    fn decode(&self, x: &Tensor, kv: &mut [LayerKv]) -> Result<Tensor> {
        let past = kv.first().map_or(0, LayerKv::len);
        let len = x.size()[1];
        let positions =
            Tensor::arange_start(past, past + len, (Kind::Int64, x.device())).view([1, -1]);
        let (cos, sin) = rotary_tables(&positions, self.lm.head_dim(), self.lm.rope_theta());
        let mut h = x.shallow_clone();
        for (layer, cache) in self.layers.iter().zip(kv.iter_mut()) {
            h = layer.forward_cached(
                &self.lm,
                self.lora.as_ref(),
                &self.params,
                &h,
                (&cos, &sin),
                cache,
            )?;
        }
        Ok(h)
    }

    fn fresh_cache(&self) -> Vec<LayerKv> {
        self.layers.iter().map(|_| LayerKv::default()).collect()
    }

    /// Logits `[len, vocab]` (f32) of every prompt position (one forward, no cache kept).
    pub fn prompt_logits(&self, ids: &[i64], pixels: &[u8]) -> Result<Tensor> {
        self.prompt_logits_images(ids, pixels, &[])
    }

    /// [`Self::prompt_logits`] of `anyres_max_N` images: `pixels` holds each image's views,
    /// `geometry` what each becomes (a micro-batch's `image_geometry`).
    pub fn prompt_logits_images(
        &self,
        ids: &[i64],
        pixels: &[u8],
        geometry: &[ImageTokens],
    ) -> Result<Tensor> {
        tch::no_grad(|| {
            let x = self.prompt_embeds(ids, pixels, geometry)?;
            let h = self.decode(&x, &mut self.fresh_cache())?;
            Ok(vocab::logits(&self.lm, &self.params, self.tied, &h)?
                .squeeze_dim(0)
                .to_kind(Kind::Float))
        })
    }

    /// Generates after `ids` (placeholders expanded, one image of `pixels` per
    /// `num_patches` of them; see [`Self::generate_images`] for `anyres_max_N` images).
    pub fn generate(
        &self,
        ids: &[i64],
        pixels: &[u8],
        options: &GenerateOptions,
    ) -> Result<Generation> {
        self.generate_images(ids, pixels, &[], options)
    }

    /// [`Self::generate`] after a prompt of `anyres_max_N` images: `pixels` holds each image's
    /// views, `geometry` what each becomes (a micro-batch's `image_geometry`).
    pub fn generate_images(
        &self,
        ids: &[i64],
        pixels: &[u8],
        geometry: &[ImageTokens],
        options: &GenerateOptions,
    ) -> Result<Generation> {
        tch::no_grad(|| self.generate_inner(ids, pixels, geometry, options))
    }

    fn generate_inner(
        &self,
        ids: &[i64],
        pixels: &[u8],
        geometry: &[ImageTokens],
        options: &GenerateOptions,
    ) -> Result<Generation> {
        let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
        let mut sequence = self.prompt_embeds(ids, pixels, geometry)?;
        let mut kv = self.fresh_cache();
        let mut next_input = sequence.shallow_clone();
        let (mut tokens, mut logits) = (Vec::new(), Vec::new());
        let mut stopped = false;
        while tokens.len() < options.max_new_tokens {
            let h = if options.kv_cache {
                self.decode(&next_input, &mut kv)?
            } else {
                self.decode(&sequence, &mut self.fresh_cache())?
            };
            let last = h.narrow(1, h.size()[1] - 1, 1).squeeze_dim(0);
            let step = vocab::logits(&self.lm, &self.params, self.tied, &last)?
                .squeeze_dim(0)
                .to_kind(Kind::Float)
                .to_device(Device::Cpu);
            if step.isfinite().logical_not().any().int64_value(&[]) != 0 {
                return Err(ModelError::NonFiniteLogits { step: tokens.len() });
            }
            let token = pick(&step, options, &mut rng);
            logits.push(step);
            tokens.push(token);
            if options.stop_ids.contains(&token) {
                stopped = true;
                break;
            }
            let input = Tensor::from_slice(&[token])
                .view([1, 1])
                .to_device(self.device());
            next_input = vocab::embed(&self.params, &input)?;
            if !options.kv_cache {
                sequence = Tensor::cat(&[&sequence, &next_input], 1);
            }
        }
        let step_logits = if logits.is_empty() {
            Tensor::zeros([0, self.vocab], (Kind::Float, Device::Cpu))
        } else {
            Tensor::stack(&logits, 0)
        };
        Ok(Generation {
            tokens,
            step_logits,
            stopped,
        })
    }
}

/// `params` checked against `specs` (each present, with its shape) and converted to `kind`
/// (`Float` or `BFloat16`) in place, each source dropped as its copy replaces it.
fn converted(
    specs: &[tessera_fsdp::ParamSpec],
    mut params: ParamMap,
    kind: Kind,
) -> Result<ParamMap> {
    if !matches!(kind, Kind::Float | Kind::BFloat16) {
        return Err(ModelError::InvalidConfig(format!(
            "generation runs in f32 or bf16, not {kind:?}"
        )));
    }
    for spec in specs {
        match params.get_mut(&spec.name) {
            Some(t) if t.size() == spec.shape => *t = t.detach().to_kind(kind),
            Some(t) => {
                return Err(ModelError::InvalidConfig(format!(
                    "generation parameter `{}` has shape {:?}, the model needs {:?}",
                    spec.name,
                    t.size(),
                    spec.shape
                )))
            }
            None => {
                return Err(ModelError::InvalidConfig(format!(
                    "generation parameter `{}` is missing",
                    spec.name
                )))
            }
        }
    }
    Ok(params)
}

/// The next token from `logits` `[vocab]`: argmax at temperature 0, else a draw from the
/// top-p nucleus of softmax(logits / temperature).
fn pick(logits: &Tensor, options: &GenerateOptions, rng: &mut ChaCha8Rng) -> i64 {
    if options.temperature <= 0.0 {
        return logits.argmax(0, false).int64_value(&[]);
    }
    // A 1-d f32 tensor always converts; an empty list (never the case) picks token 0.
    let probs: Vec<f32> =
        Vec::try_from((logits / options.temperature).softmax(0, Kind::Float)).unwrap_or_default();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let mut kept = 0.0f64;
    let mut nucleus = Vec::new();
    for i in order {
        nucleus.push(i);
        kept += f64::from(probs[i]);
        if kept >= options.top_p {
            break;
        }
    }
    let mut u = rng.gen_range(0.0..kept);
    for &i in &nucleus {
        u -= f64::from(probs[i]);
        if u < 0.0 {
            return i as i64;
        }
    }
    nucleus.last().map_or(0, |&i| i as i64)
}
