//! `VlmCtx`: what every unit reads from the micro-batch, built once per micro-batch on the
//! device: ids, labels, the block-diagonal causal mask of the packed rows, rotary tables from
//! the per-sample positions, the placeholder positions, and the normalised pixels. On CUDA
//! [`VlmCtx::prepare`] uploads them on a side stream (see `side_stream.rs`) and
//! [`VlmCtx::ready`] joins them to the compute stream, so the trainer prepares micro-batch k+1
//! while k computes; [`VlmCtx::new`] does both at once.
//!
//! Under a mixture the context also holds each supervised position's source (from the
//! micro-batch's `sample_sources`): the head then returns the loss summed by source next to
//! the loss itself (see `HeadUnit`), a plain output of the forward.
use super::attention::{block_causal_mask, row_spans, Span};
use super::config::VisionConfig;
use super::error::{ModelError, Result};
use super::lm_config::LmConfig;
use super::moe::RouterLog;
use super::rope::rotary_tables;
use super::side_stream::{upload, SideUpload};
use super::varlen::{use_varlen, Varlen};
use super::vision;
use std::sync::Mutex;
use tch::{Device, Kind, Tensor};
use tessera_batch::{MicroBatch, IGNORE_INDEX};
use tessera_shards::image_layout::ImageLayout;

/// The model's side of the micro-batch contract: what [`VlmCtx::prepare`] checks a micro-batch
/// against and shapes it by (`Vlm::batch_spec` gives a model's).
pub struct BatchSpec<'a> {
    pub vision: &'a VisionConfig,
    pub lm: &'a LmConfig,
    /// The placeholder id the image tokens are written at (`None`: the model has none, and a
    /// micro-batch with images is refused).
    pub image_token_id: Option<i64>,
    /// Tokens the dataset's tokenizer has past the checkpoint's vocabulary.
    pub added_tokens: i64,
    /// How images become features: `anyres_max_N` micro-batches carry image geometries.
    pub image_layout: &'a ImageLayout,
}

pub struct VlmCtx {
    pub rows: i64,
    pub row_len: i64,
    /// `[rows, len]` i64.
    pub input_ids: Tensor,
    /// `[rows, len]` i64, already shifted; `IGNORE_INDEX` where nothing is predicted.
    pub labels: Tensor,
    /// `[rows, 1, len, len]` bool, true where attention is allowed; built only off the CPU
    /// when the varlen kernels are not used (`TESSERA_DENSE_ATTENTION=1`). On the CPU
    /// attention runs span by span (`spans`) and never needs it.
    pub mask: Option<Tensor>,
    /// Each row's packed samples and padding runs.
    pub spans: Vec<Vec<Span>>,
    /// On CUDA: the packed samples as the varlen kernels' sequences (no mask is built).
    pub varlen: Option<Varlen>,
    /// `[rows, 1, len, head_dim]` f32 rotary tables.
    pub cos: Tensor,
    pub sin: Tensor,
    /// Flat (row-major) indices of the placeholder tokens, in order: `[num_images * tokens]`.
    pub placeholder_index: Tensor,
    /// Flat indices of supervised positions and their targets: `[supervised]` each.
    pub supervised_index: Tensor,
    pub targets: Tensor,
    /// Number of supervised positions.
    pub supervised: i64,
    /// Under `anyres_max_N`: each image's views and tokens, in placeholder order (the
    /// projector packs the views by them); empty under `single`.
    pub image_geometry: Vec<tessera_shards::image_layout::ImageTokens>,
    /// Normalised pixels `[views, 3, s, s]` f32 (see [`vision::normalize_pixels`]), `None` without
    /// images.
    pub pixel_values: Option<Tensor>,
    /// LoRA dropout seed for this micro-batch; `None` (the default) runs without dropout.
    pub dropout_seed: Option<u64>,
    /// Selective recompute (see `selective.rs`): the LM's norms and activations save only
    /// their inputs and run again in backward. Off by default.
    pub recompute_cheap_ops: bool,
    pub sample_ids: Vec<String>,
    /// Under a mixture (the micro-batch has `sample_sources`): each supervised position's source
    /// `[supervised]` i64, and how many sources the head sums the loss into (the highest
    /// source of the micro-batch, plus one).
    pub supervised_sources: Option<(Tensor, i64)>,
    /// Flat indices of the real tokens (segment id ≥ 0) when the micro-batch has padding:
    /// what a sparse layer routes.
    pub real_index: Option<Tensor>,
    /// The sparse layers' routing of the last forward (empty for dense LMs).
    pub router_log: RouterLog,
    /// What the balance loss weighs in this micro-batch's loss: `router_aux_loss_coef`, divided
    /// by the micro-batches of the optimizer step (see [`Self::share_balance_loss`]).
    pub balance_weight: f64,
    /// Uploads still on the side stream (CUDA, between `prepare` and `ready`).
    uploads: Option<SideUpload>,
    /// `cos`/`sin` cast to the decoder's compute dtype, made by the first layer that asks
    /// (every layer and its recompute reads the same pair: one cast per micro-batch instead of
    /// four per layer).
    rotary_cast: Mutex<Option<(Kind, Tensor, Tensor)>>,
}

impl VlmCtx {
    /// Validates `mb` against the model's `spec` (lengths, token ids, image size, placeholder
    /// count, sources) and builds the context on `device`, ready to use.
    pub fn new(mb: &MicroBatch, spec: &BatchSpec, device: Device) -> Result<Self> {
        let mut ctx = Self::prepare(mb, spec, device)?;
        ctx.ready()?;
        Ok(ctx)
    }

    /// [`Self::new`] with the uploads left in flight on a CUDA side stream: call
    /// [`Self::ready`] before the first unit runs on it. Same as `new` on the CPU.
    ///
    /// Two steps: `validate` checks the whole micro-batch on the host, then `Self::upload`
    /// makes its tensors on `device`; nothing reaches the device for a micro-batch it refuses.
    pub fn prepare(mb: &MicroBatch, spec: &BatchSpec, device: Device) -> Result<Self> {
        let placeholders = validate(mb, spec)?;
        Self::upload(mb, spec, &placeholders, device)
    }

    /// Makes the context of a validated micro-batch on `device` (on CUDA, on the side stream);
    /// `placeholders` are the flat indices of its image tokens.
    fn upload(
        mb: &MicroBatch,
        spec: &BatchSpec,
        placeholders: &[i64],
        device: Device,
    ) -> Result<Self> {
        let mut uploads = SideUpload::begin(device)?;
        let pixel_values = upload_pixels(mb, spec.vision, device)?;
        let rows = RowTensors::upload(mb, spec.lm, device)?;
        let placeholder_index = upload(Tensor::from_slice(placeholders), device)?;
        let real_index = upload_real_index(mb, device)?;
        let loss = LossTargets::upload(mb, device)?;
        if let Some(u) = uploads.as_mut() {
            u.end()?;
        }
        Ok(Self {
            rows: mb.rows as i64,
            row_len: mb.row_len as i64,
            input_ids: rows.input_ids,
            labels: rows.labels,
            mask: rows.mask,
            varlen: rows.varlen,
            spans: rows.spans,
            cos: rows.cos,
            sin: rows.sin,
            placeholder_index,
            supervised: loss.supervised,
            supervised_index: loss.supervised_index,
            targets: loss.targets,
            pixel_values,
            image_geometry: mb.image_geometry.clone(),
            dropout_seed: None,
            recompute_cheap_ops: false,
            sample_ids: mb.sample_ids.clone(),
            supervised_sources: loss.supervised_sources,
            real_index,
            router_log: RouterLog::default(),
            balance_weight: spec.lm.router_aux_loss_coef(),
            uploads,
            rotary_cast: Mutex::new(None),
        })
    }

    /// Joins the uploads to the compute stream (the current one): its next kernels see them.
    /// A no-op on the CPU and once done.
    pub fn ready(&mut self) -> Result<()> {
        let Some(uploads) = self.uploads.take() else {
            return Ok(());
        };
        let mut tensors: Vec<&Tensor> = vec![
            &self.input_ids,
            &self.labels,
            &self.cos,
            &self.sin,
            &self.placeholder_index,
            &self.supervised_index,
            &self.targets,
        ];
        tensors.extend(self.mask.iter());
        tensors.extend(self.real_index.iter());
        tensors.extend(self.pixel_values.iter());
        tensors.extend(self.varlen.iter().map(|v| &v.cu_seqlens));
        tensors.extend(self.supervised_sources.iter().map(|(s, _)| s));
        uploads.wait(&tensors)
    }

    /// The rotary tables in `kind` (the decoder's compute dtype): `cos` and `sin` themselves
    /// for f32, else a cast made once and shared by every layer of the micro-batch.
    pub fn rotary_as(&self, kind: Kind) -> (Tensor, Tensor) {
        if self.cos.kind() == kind {
            return (self.cos.shallow_clone(), self.sin.shallow_clone());
        }
        let mut cached = self
            .rotary_cast
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match cached.as_ref() {
            Some((k, cos, sin)) if *k == kind => (cos.shallow_clone(), sin.shallow_clone()),
            _ => {
                let (cos, sin) = (self.cos.to_kind(kind), self.sin.to_kind(kind));
                *cached = Some((kind, cos.shallow_clone(), sin.shallow_clone()));
                (cos, sin)
            }
        }
    }

    /// The balance loss of a step of `micro_batches` micro-batches (over every rank): each
    /// weighs `router_aux_loss_coef / micro_batches`, so the step's loss holds the mean of their
    /// balance losses, as data-parallel transformers with gradient accumulation adds them.
    pub fn share_balance_loss(&mut self, coef: f64, micro_batches: usize) {
        self.balance_weight = coef / micro_batches.max(1) as f64;
    }

    /// Turns selective recompute on or off for this micro-batch's forward.
    pub fn set_recompute_cheap_ops(&mut self, on: bool) {
        self.recompute_cheap_ops = on;
    }

    /// Turns on LoRA dropout with masks drawn from `seed` (use a different seed per
    /// micro-batch; FSDP's recompute of a unit then draws the same masks).
    pub fn with_dropout_seed(mut self, seed: u64) -> Self {
        self.dropout_seed = Some(seed);
        self
    }

    pub fn has_images(&self) -> bool {
        self.pixel_values.is_some()
    }

    /// Input of the first unit that runs: the normalised pixels, or an empty f32 tensor for a
    /// text-only micro-batch (which `embed` then receives).
    pub fn first_input(&self) -> Tensor {
        match &self.pixel_values {
            Some(p) => p.shallow_clone(),
            None => Tensor::empty([0], (Kind::Float, self.input_ids.device())),
        }
    }
}

/// A micro-batch refused for `reason`, naming its samples.
fn bad(mb: &MicroBatch, reason: String) -> ModelError {
    ModelError::BadBatch {
        samples: mb.sample_ids.clone(),
        reason,
    }
}

/// Checks `mb` against the model's `spec` (lengths, token ids, image layout, sources,
/// placeholder count, image size) and returns the flat indices of its image placeholders.
fn validate(mb: &MicroBatch, spec: &BatchSpec) -> Result<Vec<i64>> {
    let image_token_id = match spec.image_token_id {
        Some(id) => id,
        // No image to place: no token id (all checked to be >= 0 below) equals it.
        None if mb.num_images == 0 => -1,
        None => {
            return Err(ModelError::NoImageToken {
                what: format!("micro-batch of samples {:?}", mb.sample_ids),
            })
        }
    };
    check_lengths(mb)?;
    check_token_ids(mb, spec, image_token_id)?;
    let placeholders: Vec<i64> = (0..mb.input_ids.len() as i64)
        .filter(|&i| mb.input_ids[i as usize] == image_token_id)
        .collect();
    check_image_layout(mb, spec.image_layout)?;
    if !mb.sample_sources.is_empty() && mb.sample_sources.len() != mb.sample_ids.len() {
        return Err(bad(
            mb,
            format!(
                "{} sample sources for {} samples",
                mb.sample_sources.len(),
                mb.sample_ids.len()
            ),
        ));
    }
    let expected = mb.image_token_count();
    if placeholders.len() != expected {
        return Err(bad(
            mb,
            format!(
                "{} placeholder tokens for {} images of {expected} tokens in all",
                placeholders.len(),
                mb.num_images,
            ),
        ));
    }
    if mb.num_images > 0 {
        check_images(mb, spec.vision)?;
    }
    Ok(placeholders)
}

/// Every per-token vector holds `rows * row_len` entries.
fn check_lengths(mb: &MicroBatch) -> Result<()> {
    let n = mb.rows * mb.row_len;
    for (name, len) in [
        ("input_ids", mb.input_ids.len()),
        ("labels", mb.labels.len()),
        ("positions", mb.positions.len()),
        ("segment_ids", mb.segment_ids.len()),
    ] {
        if len != n {
            return Err(bad(
                mb,
                format!("{name} has {len} entries, expected rows*row_len = {n}"),
            ));
        }
    }
    Ok(())
}

/// Ids and labels lie in the checkpoint's vocabulary plus the tokens ingest added past it, and
/// no label is the image placeholder.
fn check_token_ids(mb: &MicroBatch, spec: &BatchSpec, image_token_id: i64) -> Result<()> {
    let vocab = spec.lm.vocab_size + spec.added_tokens;
    if let Some(id) = mb.input_ids.iter().find(|&&id| id < 0 || id >= vocab) {
        return Err(bad(
            mb,
            format!("token id {id} is outside the vocabulary of {vocab}"),
        ));
    }
    if let Some(l) = mb
        .labels
        .iter()
        .find(|&&l| l != IGNORE_INDEX && (l < 0 || l >= vocab))
    {
        return Err(bad(
            mb,
            format!("label {l} is outside the vocabulary of {vocab}"),
        ));
    }
    if mb.labels.contains(&image_token_id) {
        return Err(bad(
            mb,
            "a label is the image placeholder id; image positions must not be targets".into(),
        ));
    }
    Ok(())
}

/// The micro-batch's images are laid out as the model's `layout` says: single tiles, or
/// anyres grids with one geometry per image.
fn check_image_layout(mb: &MicroBatch, layout: &ImageLayout) -> Result<()> {
    let anyres = *layout != ImageLayout::Single;
    if mb.num_images > 0 && anyres == mb.image_geometry.is_empty() {
        return Err(bad(
            mb,
            format!(
                "the model's image layout is {layout} but the micro-batch's images {}",
                if anyres {
                    "are single tiles"
                } else {
                    "are anyres grids"
                }
            ),
        ));
    }
    if anyres && mb.image_geometry.len() != mb.num_images {
        return Err(bad(
            mb,
            format!(
                "{} image geometries for {} images",
                mb.image_geometry.len(),
                mb.num_images
            ),
        ));
    }
    Ok(())
}

/// The images (of a micro-batch that has some) are the vision tower's size and token count,
/// and the pixel bytes fill their views.
fn check_images(mb: &MicroBatch, vision: &VisionConfig) -> Result<()> {
    let side = vision.image_size;
    if mb.image_size as i64 != side || mb.image_tokens as i64 != vision.num_patches() {
        return Err(bad(
            mb,
            format!(
                "images are {}px with {} tokens; the vision tower takes {side}px and makes {} tokens",
                mb.image_size,
                mb.image_tokens,
                vision.num_patches()
            ),
        ));
    }
    if let Some(g) = mb
        .image_geometry
        .iter()
        .find(|g| g.base as i64 != vision.num_patches())
    {
        return Err(bad(
            mb,
            format!(
                "an image's base view has {} features; the vision tower makes {}",
                g.base,
                vision.num_patches()
            ),
        ));
    }
    let views = mb.views();
    let numel = views * 3 * mb.image_size * mb.image_size;
    if mb.pixels.len() != numel {
        return Err(bad(
            mb,
            format!(
                "{} pixel bytes, expected {numel} ({views} views)",
                mb.pixels.len()
            ),
        ));
    }
    Ok(())
}

/// The normalised pixels `[views, 3, s, s]` on `device`, `None` without images.
fn upload_pixels(mb: &MicroBatch, vision: &VisionConfig, device: Device) -> Result<Option<Tensor>> {
    if mb.num_images == 0 {
        return Ok(None);
    }
    let side = vision.image_size;
    let shape = [mb.views() as i64, 3, side, side];
    let raw = upload(Tensor::from_slice(&mb.pixels).view(shape), device)?;
    Ok(Some(vision::normalize_pixels(vision, &raw)))
}

/// The flat indices of the real tokens on `device`, `None` when the micro-batch has no padding.
fn upload_real_index(mb: &MicroBatch, device: Device) -> Result<Option<Tensor>> {
    if !mb.segment_ids.iter().any(|&s| s < 0) {
        return Ok(None);
    }
    let real: Vec<i64> = (0..mb.segment_ids.len() as i64)
        .filter(|&i| mb.segment_ids[i as usize] >= 0)
        .collect();
    Ok(Some(upload(Tensor::from_slice(&real), device)?))
}

/// The `[rows, len]` side of the context: ids, labels, and the attention layout and rotary
/// tables of the packed rows.
struct RowTensors {
    input_ids: Tensor,
    labels: Tensor,
    mask: Option<Tensor>,
    spans: Vec<Vec<Span>>,
    varlen: Option<Varlen>,
    cos: Tensor,
    sin: Tensor,
}

impl RowTensors {
    fn upload(mb: &MicroBatch, lm: &LmConfig, device: Device) -> Result<Self> {
        let shape = [mb.rows as i64, mb.row_len as i64];
        let ids = |v: &[i64]| upload(Tensor::from_slice(v).view(shape), device);
        let positions = ids(&mb.positions)?;
        let segments = upload(Tensor::from_slice(&mb.segment_ids).view(shape), device)?;
        let spans = row_spans(&mb.segment_ids, mb.rows, mb.row_len);
        let varlen = use_varlen(device);
        let (cos, sin) = rotary_tables(&positions, lm.head_dim(), lm.rope_theta());
        let input_ids = ids(&mb.input_ids)?;
        let labels = ids(&mb.labels)?;
        let mask = (device != Device::Cpu && !varlen).then(|| block_causal_mask(&segments));
        let varlen = varlen
            .then(|| Varlen::from_spans(&spans, shape[1], device))
            .transpose()?;
        Ok(Self {
            input_ids,
            labels,
            mask,
            spans,
            varlen,
            cos,
            sin,
        })
    }
}

/// What the head's loss reads: the supervised positions, their targets and (under a mixture)
/// their sources.
struct LossTargets {
    supervised: i64,
    supervised_index: Tensor,
    targets: Tensor,
    supervised_sources: Option<(Tensor, i64)>,
}

impl LossTargets {
    fn upload(mb: &MicroBatch, device: Device) -> Result<Self> {
        let supervised: Vec<i64> = (0..mb.labels.len() as i64)
            .filter(|&i| mb.labels[i as usize] != IGNORE_INDEX)
            .collect();
        let targets: Vec<i64> = supervised.iter().map(|&i| mb.labels[i as usize]).collect();
        let supervised_index = upload(Tensor::from_slice(&supervised), device)?;
        let targets = upload(Tensor::from_slice(&targets), device)?;
        let supervised_sources = match mb.sample_sources.iter().max() {
            Some(&last) => {
                let sources: Vec<i64> = mb
                    .supervised_sources()
                    .into_iter()
                    .map(|s| s as i64)
                    .collect();
                let sources = upload(Tensor::from_slice(&sources), device)?;
                Some((sources, last as i64 + 1))
            }
            None => None,
        };
        Ok(Self {
            supervised: supervised.len() as i64,
            supervised_index,
            targets,
            supervised_sources,
        })
    }
}
