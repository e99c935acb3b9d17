//! The VLM as FSDP runs it: a chain of units (`vision.embeddings`, `vision.layers.{i}`,
//! `projector`, `embed`, `layers.{i}`, `head`), each a pure function of its parameters (full tensors keyed by Hugging Face
//! names), its input and the micro-batch context [`VlmCtx`].
//!
//! The chain, exactly as [`Vlm::loss`] runs it (FSDP runs the same, one unit at a time):
//! `x = ctx.first_input()` (normalised pixels, or an empty tensor for text-only micro-batches),
//! then for every unit that `runs_on(ctx)`: `x = unit.forward(params, &x, ctx)`. Vision and
//! projector units skip text-only micro-batches, so `embed` then receives the empty tensor.
use super::config::{LoraConfig, VisionConfig};
use super::ctx::{BatchSpec, VlmCtx};
use super::error::{ModelError, Result};
use super::feature_layers::FeatureLayers;
use super::feature_stats::FeatureStats;
use super::lm_config::LmConfig;
use super::lm_dir::check_lm_tensors;
use super::moe::ExpertGroup;
use super::vlm_units::{
    EmbedUnit, HeadUnit, LayerUnit, ProjectorUnit, VisionEmbedUnit, VisionLayerUnit,
};
use super::weights::{self, HfCheckpoint};
use super::{lora, projector, vision, vocab};
use std::collections::BTreeMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};
use tessera_fsdp::{ParamMap, ParamSpec, Unit};

/// Which part of the vision tower trains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VisionTraining {
    /// The tower is frozen (LLaVA-1.5, both stages).
    #[default]
    Frozen,
    /// Patch and position embeddings and every feature layer (ShareGPT4V, LLaVA-OneVision).
    All,
    /// The last K feature layers only (the embeddings and earlier layers stay frozen).
    LastLayers(usize),
}

/// Choices that are not in the checkpoints: what trains, the placeholder id, the loss chunk.
#[derive(Clone, Debug)]
pub struct VlmOptions {
    /// The id standing for one image in the token ids: the shards' `special_tokens.image`, or
    /// an export's `image_token_index`. Unset (the default), a micro-batch with images and an
    /// export are refused ([`crate::ModelError::NoImageToken`]).
    pub image_token_id: Option<i64>,
    /// Stage 1 and 2 train the projector.
    pub train_projector: bool,
    /// Stage 2: LoRA adapters on the LM (trainable); the LM's base weights stay frozen.
    pub lora: Option<LoraConfig>,
    /// Full fine-tuning of the LM: every LM parameter trains (a tied embedding/head once).
    /// Excludes `lora`.
    pub train_lm: bool,
    /// What of the vision tower trains.
    pub train_vision: VisionTraining,
    /// Tokens per chunk of the loss; `None` picks [`super::loss::default_chunk`].
    pub loss_chunk: Option<i64>,
    /// Tokens the dataset's tokenizer has past the checkpoint's `vocab_size` (the `<image>`
    /// ingest added to a tokenizer without an image token): the LM appends an embedding (and
    /// untied output) row for each, always trained (see `vocab.rs`).
    pub added_tokens: i64,
    /// Expert parallelism: the group the experts of every sparse layer are split over (an MoE
    /// LM only; the group's size divides the experts). This rank's units list its experts only.
    pub expert_parallel: Option<ExpertGroup>,
    /// The side images are fed at (`--image-size`); `None` takes the vision config's. Only a
    /// tower that interpolates its position embeddings (DINOv2) takes another.
    pub image_size: Option<i64>,
    /// The hidden states the image features are (`--vision-feature-layer`); `None`: -2.
    pub vision_feature_layer: Option<FeatureLayers>,
    /// How images become features (`--image-layout`): `single` (one tile each, LLaVA-1.5) or
    /// `anyres_max_N` (a base view plus tiles, packed with the learned `image_newline`, as
    /// LLaVA-OneVision does).
    pub image_layout: tessera_shards::image_layout::ImageLayout,
    /// `--standardize-features`: the per-channel statistics the projector standardises the
    /// features with (frozen projector tensors; see `feature_stats.rs`).
    pub feature_stats: Option<FeatureStats>,
}

impl Default for VlmOptions {
    fn default() -> Self {
        Self {
            image_token_id: None,
            train_projector: true,
            lora: None,
            train_lm: false,
            train_vision: VisionTraining::Frozen,
            loss_chunk: None,
            added_tokens: 0,
            expert_parallel: None,
            image_size: None,
            vision_feature_layer: None,
            image_layout: tessera_shards::image_layout::ImageLayout::Single,
            feature_stats: None,
        }
    }
}

/// Configs plus the unit chain.
pub struct Vlm {
    pub vision: VisionConfig,
    pub lm: LmConfig,
    /// The LM head reads `model.embed_tokens.weight` (no `lm_head.weight`).
    pub tied: bool,
    pub options: VlmOptions,
    units: Vec<Box<dyn Unit<VlmCtx>>>,
}

impl Vlm {
    pub fn new(
        vision: VisionConfig,
        lm: LmConfig,
        tied: bool,
        options: VlmOptions,
    ) -> Result<Self> {
        vision.validate()?;
        lm.validate()?;
        let vision = match options.image_size {
            Some(size) => vision.at_image_size(size)?,
            None => vision,
        };
        let vision = match &options.vision_feature_layer {
            Some(layers) => vision.at_feature_layers(layers)?,
            None => vision,
        };
        if let Some(stats) = &options.feature_stats {
            stats.check(vision.feature_size())?;
        }
        if let Some(l) = &options.lora {
            l.validate()?;
            if options.train_lm {
                return Err(ModelError::InvalidConfig(
                    "LoRA adapters and full LM training exclude each other: train the LM in \
                     full or through adapters"
                        .into(),
                ));
            }
        }
        if let Some(group) = &options.expert_parallel {
            check_expert_parallel(&lm, group.size())?;
        }
        let layers = vision.layers_run() as usize;
        let first_trained_layer = match options.train_vision {
            VisionTraining::Frozen => layers,
            VisionTraining::All => 0,
            VisionTraining::LastLayers(k) if (1..=layers).contains(&k) => layers - k,
            VisionTraining::LastLayers(k) => {
                return Err(ModelError::InvalidConfig(format!(
                    "vision:{k}: the tower's features come from its first {layers} layers (of \
                     {}), so K must be 1..={layers}",
                    vision.num_hidden_layers
                )))
            }
        };
        let train_embeddings = options.train_vision == VisionTraining::All;
        let mut units: Vec<Box<dyn Unit<VlmCtx>>> =
            vec![Box::new(VisionEmbedUnit::new(&vision, train_embeddings))];
        for i in 0..layers {
            let train = i >= first_trained_layer;
            units.push(Box::new(VisionLayerUnit::new(&vision, i as i64, train)));
        }
        units.push(Box::new(ProjectorUnit::new(
            &vision,
            lm.hidden_size,
            options.train_projector,
            (
                options.image_layout != tessera_shards::image_layout::ImageLayout::Single,
                options.feature_stats.is_some(),
            ),
        )));
        let train_lm = options.train_lm;
        units.push(Box::new(EmbedUnit::new(
            &lm,
            train_lm,
            options.added_tokens,
        )));
        for i in 0..lm.num_hidden_layers {
            units.push(Box::new(LayerUnit::new(
                &lm,
                i,
                options.lora.as_ref(),
                train_lm,
                options.expert_parallel.as_ref(),
            )));
        }
        let chunk = options
            .loss_chunk
            .unwrap_or_else(|| super::loss::default_chunk(lm.vocab_size));
        let added = options.added_tokens;
        units.push(Box::new(HeadUnit::new(&lm, tied, added, chunk, train_lm)));
        Ok(Self {
            vision,
            lm,
            tied,
            options,
            units,
        })
    }

    /// Reads both `config.json` files (refusing a model type or setting tessera does not
    /// implement, naming the folder) and checks the LM checkpoint's tensor names against what
    /// its config describes: none missing, none left over. The head is tied when the LM config
    /// says so (`tie_word_embeddings`).
    pub fn from_dirs(vision_dir: &Path, lm_dir: &Path, options: VlmOptions) -> Result<Self> {
        let vision = VisionConfig::from_dir(vision_dir)?;
        let lm = LmConfig::from_dir(lm_dir)?;
        let tied = lm.tie_word_embeddings;
        check_lm_tensors(lm_dir, &lm, &HfCheckpoint::open(lm_dir)?)?;
        Self::new(vision, lm, tied, options)
    }

    /// The units in execution order.
    /// Tokens per chunk of the head's loss.
    pub fn loss_chunk(&self) -> i64 {
        self.options
            .loss_chunk
            .unwrap_or_else(|| super::loss::default_chunk(self.lm.vocab_size))
    }

    pub fn units(&self) -> &[Box<dyn Unit<VlmCtx>>] {
        &self.units
    }

    /// Every parameter of the model, each expert included whichever experts this rank holds
    /// under expert parallelism (what identifies the model, at any EP size).
    pub fn whole_param_specs(&self) -> Result<Vec<ParamSpec>> {
        if self.options.expert_parallel.is_none() {
            return Ok(self.param_specs());
        }
        let options = VlmOptions {
            expert_parallel: None,
            ..self.options.clone()
        };
        let whole = Vlm::new(self.vision.clone(), self.lm.clone(), self.tied, options)?;
        Ok(whole.param_specs())
    }

    /// Every parameter once, in unit order (a tied embedding appears once, under `embed`).
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for unit in &self.units {
            for spec in unit.params() {
                if seen.insert(spec.name.clone()) {
                    out.push(spec.clone());
                }
            }
        }
        out
    }

    /// Parameters read by more than one unit, with the units reading them. With tied
    /// embeddings: `model.embed_tokens.weight` -> ["embed", "head"]. FSDP must keep one copy
    /// and add the gradients of every unit that reads it.
    pub fn shared_params(&self) -> Vec<(String, Vec<String>)> {
        let mut readers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for unit in &self.units {
            for spec in unit.params() {
                readers
                    .entry(spec.name.clone())
                    .or_default()
                    .push(unit.name().to_string());
            }
        }
        readers
            .into_iter()
            .filter(|(_, units)| units.len() > 1)
            .collect()
    }

    /// All parameters on the CPU: the vision tower and LM from their Hugging Face directories,
    /// the projector from `projector` (a safetensors file with `mm_projector.{0,2}.*` keys,
    /// optionally under `model.`) or freshly initialised, and fresh LoRA adapters when
    /// configured. `seed` drives the fresh initialisations.
    pub fn load_params(
        &self,
        vision_dir: &Path,
        lm_dir: &Path,
        projector_file: Option<&Path>,
        seed: u64,
    ) -> Result<ParamMap> {
        let mut params = self.load_params_as_stored(vision_dir, lm_dir, projector_file, seed)?;
        for t in params.values_mut() {
            *t = t.to_kind(Kind::Float);
        }
        Ok(params)
    }

    /// [`Self::load_params`] with the checkpoints' tensors in their stored dtypes (a Hub bf16
    /// checkpoint stays bf16: FSDP converts each tensor into its f32 shard, so the full model
    /// never exists in f32 next to the shards).
    pub fn load_params_as_stored(
        &self,
        vision_dir: &Path,
        lm_dir: &Path,
        projector_file: Option<&Path>,
        seed: u64,
    ) -> Result<ParamMap> {
        let mut params = HfCheckpoint::open(vision_dir)?
            .load_specs_as_stored(&vision::param_specs(&self.vision), Some("vision_model."))?;
        let lm_specs = self.lm_checkpoint_params();
        params.append(&mut HfCheckpoint::open(lm_dir)?.load_specs_as_stored(&lm_specs, None)?);
        params.append(&mut self.fresh_params(
            projector_file,
            seed,
            &HfCheckpoint::open(lm_dir)?,
        )?);
        Ok(params)
    }

    /// The LM's parameters its checkpoint provides: everything under `model.` and the untied
    /// head, without LoRA adapters.
    pub(super) fn lm_checkpoint_params(&self) -> Vec<ParamSpec> {
        self.param_specs()
            .into_iter()
            .filter(|s| s.name.starts_with("model.") || s.name == vocab::LM_HEAD)
            .filter(|s| !s.name.contains(".lora_"))
            .collect()
    }

    /// The parameters no Hugging Face checkpoint provides, in f32 (small next to the towers):
    /// the projector from `projector_file` or freshly initialised, the added tokens' rows
    /// (from `projector_file` when it holds them, else the mean of `lm`'s rows), and fresh
    /// LoRA adapters when configured. `seed` drives the fresh initialisations.
    pub(super) fn fresh_params(
        &self,
        projector_file: Option<&Path>,
        seed: u64,
        lm: &HfCheckpoint,
    ) -> Result<ParamMap> {
        let mut params = self.initial_projector(projector_file, seed)?;
        params.append(&mut self.initial_added_rows(projector_file, lm)?);
        if self.options.lora.is_some() {
            let specs = self.param_specs();
            params.append(&mut lora::init_adapters(&specs, seed.wrapping_add(1)));
        }
        Ok(params)
    }

    /// The added tokens' rows training starts from (f32; none without added tokens): those in
    /// `projector_file` (a stage-1 run's, which trained them) when it holds them, else each
    /// the mean of the rows of the matrix it extends in the checkpoint `lm`.
    pub fn initial_added_rows(
        &self,
        projector_file: Option<&Path>,
        lm: &HfCheckpoint,
    ) -> Result<ParamMap> {
        let added = self.options.added_tokens;
        let mut out = ParamMap::new();
        if added <= 0 {
            return Ok(out);
        }
        let stored = match projector_file {
            Some(path) => weights::load_safetensors(path)?,
            None => ParamMap::new(),
        };
        let shape = |rows| vec![rows, self.lm.hidden_size];
        let mut names = vec![(vocab::ADDED_EMBED, vocab::EMBED)];
        if !self.tied {
            names.push((vocab::ADDED_HEAD, vocab::LM_HEAD));
        }
        for (name, extends) in names {
            let rows = match stored.get(name) {
                Some(t) if t.size() == shape(added) => t.to_kind(Kind::Float),
                Some(t) => {
                    return Err(ModelError::ShapeMismatch {
                        path: projector_file.unwrap_or(Path::new("")).into(),
                        name: name.into(),
                        expected: shape(added),
                        found: t.size(),
                    })
                }
                None => vocab::mean_rows(&lm.tensor(extends, &shape(self.lm.vocab_size))?, added),
            };
            out.insert(name.to_string(), rows);
        }
        Ok(out)
    }

    /// The projector training starts from (f32): `projector_file`'s (`--init-projector`), or
    /// the fresh one `seed` draws (the same on every rank, and again here for an export of a
    /// run that never trained it).
    /// Under `anyres_max_N` it includes `image_newline`: the file's when it holds one (a
    /// stage-1 run's), else a fresh one.
    pub fn initial_projector(&self, projector_file: Option<&Path>, seed: u64) -> Result<ParamMap> {
        let features = self.vision.feature_size();
        let specs = projector::param_specs(features, self.lm.hidden_size, true);
        let mut params = match projector_file {
            Some(path) => load_projector(path, &specs)?,
            None => projector::init(features, self.lm.hidden_size, seed),
        };
        if self.has_image_newline() {
            let lm_hidden = self.lm.hidden_size;
            let stored = match projector_file {
                Some(path) => {
                    load_projector(path, &[projector::newline_spec(lm_hidden, true)]).ok()
                }
                None => None,
            };
            let newline = stored
                .and_then(|mut p| p.remove(projector::IMAGE_NEWLINE))
                .unwrap_or_else(|| projector::init_newline(lm_hidden, seed));
            params.insert(projector::IMAGE_NEWLINE.to_string(), newline);
        }
        if let Some(stats) = &self.options.feature_stats {
            for (name, tensor) in stats.tensors() {
                params.insert(name.to_string(), tensor);
            }
        }
        Ok(params)
    }

    /// Whether the model holds `image_newline` (its images are `anyres_max_N` grids).
    pub fn has_image_newline(&self) -> bool {
        self.options.image_layout != tessera_shards::image_layout::ImageLayout::Single
    }

    /// Sets `requires_grad` on the trainable parameters (for the single-process reference).
    pub fn mark_trainable(&self, params: &mut ParamMap) {
        for spec in self.param_specs().iter().filter(|s| s.trainable) {
            if let Some(t) = params.get_mut(&spec.name) {
                *t = t.detach().set_requires_grad(true);
            }
        }
    }

    /// What a micro-batch must match to run on this model (see [`VlmCtx::prepare`]).
    pub fn batch_spec(&self) -> BatchSpec<'_> {
        BatchSpec {
            vision: &self.vision,
            lm: &self.lm,
            image_token_id: self.options.image_token_id,
            added_tokens: self.options.added_tokens,
            image_layout: &self.options.image_layout,
        }
    }

    /// The context of `mb` on the device the parameters live on.
    pub fn ctx(&self, params: &ParamMap, mb: &tessera_batch::MicroBatch) -> Result<VlmCtx> {
        let device = params
            .values()
            .next()
            .map(|t| t.device())
            .unwrap_or(Device::Cpu);
        VlmCtx::new(mb, &self.batch_spec(), device)
    }

    /// Runs the whole chain in one process (the W=1 reference): the summed token loss over
    /// supervised labels and their count. `params` holds every parameter the micro-batch needs.
    pub fn loss(&self, params: &ParamMap, mb: &tessera_batch::MicroBatch) -> Result<(Tensor, i64)> {
        let (loss, supervised, _) = self.loss_and_balance(params, mb)?;
        Ok((loss, supervised))
    }

    /// [`Self::loss`] plus, for an MoE LM, the router balance loss of the same forward
    /// (transformers' `aux_loss`, without its coefficient; differentiable). transformers'
    /// training loss is `sum / supervised + router_aux_loss_coef · balance`.
    pub fn loss_and_balance(
        &self,
        params: &ParamMap,
        mb: &tessera_batch::MicroBatch,
    ) -> Result<(Tensor, i64, Option<Tensor>)> {
        let ctx = self.ctx(params, mb)?;
        let loss = summed_loss(run_chain(&self.units, params, &ctx)?);
        Ok((loss, ctx.supervised, ctx.router_log.aux_loss()))
    }

    /// Full logits `[rows, len, vocab]` (evaluation and tests; never used for training).
    pub fn logits(&self, params: &ParamMap, mb: &tessera_batch::MicroBatch) -> Result<Tensor> {
        let ctx = self.ctx(params, mb)?;
        let hidden = run_chain(&self.units[..self.units.len() - 1], params, &ctx)?;
        Ok(vocab::logits(&self.lm, params, self.tied, &hidden)?)
    }
}

/// `--expert-parallel N` needs a sparse LM whose expert count N divides.
fn check_expert_parallel(lm: &LmConfig, n: usize) -> Result<()> {
    let experts = lm.num_experts();
    if !(0..lm.num_hidden_layers).any(|i| lm.is_sparse_layer(i)) {
        return Err(ModelError::InvalidConfig(format!(
            "expert parallelism ({n} ranks) needs a mixture-of-experts LM; this one \
             ({:?}) has no sparse layer",
            lm.model_type
        )));
    }
    if n == 0 || experts % n as i64 != 0 {
        return Err(ModelError::InvalidConfig(format!(
            "expert parallelism over {n} ranks: the LM's {experts} experts do not split evenly \
             (pick a divisor of {experts})"
        )));
    }
    Ok(())
}

/// The summed token loss of the head's output: the output itself, or its first element when
/// the loss by source follows it (a mixture's micro-batch; see `HeadUnit`).
fn summed_loss(head: Tensor) -> Tensor {
    if head.dim() == 0 {
        head
    } else {
        head.get(0)
    }
}

/// The output of `units` (those that run on `ctx`, in order) from the micro-batch's first
/// input; a failing unit is named.
fn run_chain(units: &[Box<dyn Unit<VlmCtx>>], params: &ParamMap, ctx: &VlmCtx) -> Result<Tensor> {
    let mut x = ctx.first_input();
    for unit in units.iter().filter(|u| u.runs_on(ctx)) {
        x = unit
            .forward(params, &x, ctx)
            .map_err(|source| ModelError::Compute {
                unit: unit.name().to_string(),
                source,
            })?;
    }
    Ok(x)
}

fn load_projector(path: &Path, specs: &[ParamSpec]) -> Result<ParamMap> {
    let raw = weights::load_safetensors(path)?;
    let mut out = BTreeMap::new();
    for spec in specs {
        let t = raw
            .get(&spec.name)
            .or_else(|| raw.get(&format!("model.{}", spec.name)))
            .ok_or_else(|| ModelError::MissingTensor {
                dir: path.into(),
                name: spec.name.clone(),
            })?;
        if t.size() != spec.shape {
            return Err(ModelError::ShapeMismatch {
                path: path.into(),
                name: spec.name.clone(),
                expected: spec.shape.clone(),
                found: t.size(),
            });
        }
        out.insert(spec.name.clone(), t.to_kind(Kind::Float));
    }
    Ok(out)
}
