//! `tessera export --format llava-hf`: one directory that transformers'
//! `LlavaForConditionalGeneration.from_pretrained` loads with no missing or unexpected keys
//! and `AutoProcessor.from_pretrained` turns into a `LlavaProcessor`:
//! - `config.json` (`model_type` "llava", see [`tessera_model::llava::llava_config_json`]) and the
//!   weights in the Hub's layout (`vision_tower.*`, `multi_modal_projector.linear_{1,2}.*`,
//!   `language_model.model.*`), bf16 by default, sharded past 5 GB with an index, streamed
//!   one tensor at a time (see [`write_llava_hf`]): the export's memory is one tensor, not the
//!   model, whatever the checkpoint (format 4's shards are read one parameter at a time);
//! - for a run that did not train the projector (`--train lm`), the one it started from
//!   (`run_weights::initial_projector`);
//! - the LoRA adapters merged into the LM (W + (alpha/r)·B·A, module by module), or with
//!   `merge: false` left in `adapter/` as a PEFT adapter for the LLaVA model (keys under
//!   `base_model.model.model.language_model.`, `target_modules` a regex restricted to the LM);
//! - the rows the LM appended for tokens ingest added (`<image>` past its vocabulary) written
//!   after the embedding's (and an untied head's) own, `text_config.vocab_size` counting them;
//! - with a tokenizer: `tokenizer.json` (the run's, `<image>` included when ingest added it),
//!   `tokenizer_config.json` (the run's special tokens: end of sequence, padding; the LM's
//!   own tokenizer class when its folder names one), `chat_template.jinja` (the run's
//!   template, `plain` or `chatml`, as Jinja that renders what `tessera_text::chat` renders for
//!   ingest and `tessera generate`, with the same tokens), `processor_config.json` (the image
//!   token, expanded to `image_seq_length` copies, as tessera's loader does),
//!   `preprocessor_config.json` (SigLIP: bicubic resize to the tower's size, mean/std 0.5) and
//!   `generation_config.json` (stop where `tessera generate` stops).
use crate::checkpoint::trained::TrainedTensors;
use crate::export::error::ExportError;
use crate::export::run_checkpoint::{newest_complete_trained, stored_config};
use crate::export::run_weights::{initial_projector, RunWeights};
use crate::run_dir::RunDir;
use crate::vlm_description::VlmDescription;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::Kind;
use tessera_fsdp::{ParamMap, ParamSpec};
use tessera_model::llava::{
    added_rows_of, export_specs, llava_config_json, llava_key, LLAVA_ADAPTER_DIR,
};
use tessera_model::{
    adapter_keys, merge_weight, write_hub_files, FeatureLayers, FeatureStats, LoraConfig,
    ModelError, Vlm, VlmOptions,
};
use tessera_shards::image_layout::ImageLayout;
use tessera_text::chat::{Template, IM_END};
use tessera_text::SpecialTokens;

/// How to write the export.
#[derive(Clone, Debug)]
pub struct LlavaHfOptions {
    /// Merge the LoRA adapters into the LM (the default) or keep them in `adapter/`.
    pub merge: bool,
    /// BFloat16 (the default), Half or Float.
    pub dtype: Kind,
    pub max_shard_bytes: u64,
    /// `tokenizer.json` to ship (and build the processor files around). [`export_llava_hf`]
    /// ships the run's own copy when this is `None`, and refuses one whose sha256 is not the
    /// run's tokenizer fingerprint; [`write_llava_hf`] writes no processor files without one.
    pub tokenizer: Option<PathBuf>,
    /// `--format llava-onevision`: the run must be an `anyres_max_N` one, and is written as a
    /// `LlavaOnevisionForConditionalGeneration` (`--format llava-hf` refuses such runs).
    pub onevision: bool,
}

impl Default for LlavaHfOptions {
    fn default() -> Self {
        Self {
            onevision: false,
            merge: true,
            dtype: Kind::BFloat16,
            max_shard_bytes: tessera_model::HUB_SHARD_BYTES,
            tokenizer: None,
        }
    }
}

/// The weight dtype named `bf16`, `f16` or `f32`.
pub fn weight_kind(name: &str) -> Option<Kind> {
    match name {
        "bf16" => Some(Kind::BFloat16),
        "f16" => Some(Kind::Half),
        "f32" => Some(Kind::Float),
        _ => None,
    }
}

/// What the export is made of.
pub struct LlavaSources<'a> {
    pub vision_dir: &'a Path,
    pub lm_dir: &'a Path,
    /// The trained tensors by tessera key: the projector (unless `initial_projector` stands
    /// for it), LoRA adapters when `lora` is set, the LM's and tower's of a full fine-tune.
    pub trainable: &'a TrainedTensors,
    /// The projector of a run that did not train one: the one it started from
    /// ([`TrainedTensors`] hold none then).
    pub initial_projector: Option<&'a ParamMap>,
    /// A `--standardize-features` run's statistics, folded into the projector's first layer.
    pub feature_stats: Option<&'a FeatureStats>,
    pub lora: Option<LoraConfig>,
    /// The special tokens the run's shards were tokenized with (the image token's id is the
    /// export's `image_token_index`).
    pub tokens: &'a SpecialTokens,
    /// Rows the LM appended for tokens ingest added (their tensors are among `trainable`).
    pub added_tokens: i64,
    /// `plain` or `chatml`.
    pub template: &'a str,
    /// The side the run fed images at (`None`: the tower config's own).
    pub image_size: Option<i64>,
    /// The hidden states the run's features are (`None`: -2).
    pub vision_feature_layer: Option<FeatureLayers>,
    /// `single` writes a `LlavaForConditionalGeneration`, `anyres_max_N` a
    /// `LlavaOnevisionForConditionalGeneration` (with `image_newline` and its pinpoints).
    pub image_layout: ImageLayout,
}

/// What was written.
#[derive(Debug)]
pub struct LlavaHfReport {
    pub weight_files: Vec<PathBuf>,
    pub adapter: Option<PathBuf>,
    pub tensors: usize,
    /// Where the projector came from when the run did not train it.
    pub projector_from: Option<String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), ExportError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| ExportError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, text + "\n").map_err(io(path))
}

/// Exports the newest complete checkpoint of `run` (see the module docs), with the run's
/// tokenizer unless `options.tokenizer` names one (which must be the same tokenizer).
pub fn export_llava_hf(
    run: &Path,
    out: &Path,
    options: &LlavaHfOptions,
) -> Result<(u64, LlavaHfReport), ExportError> {
    let run_dir = RunDir::new(run);
    let description = VlmDescription::load(&run_dir.vlm())?;
    let options = LlavaHfOptions {
        tokenizer: Some(run_dir.tokenizer_for(options.tokenizer.as_deref())?),
        ..options.clone()
    };
    match (&description.image_layout, options.onevision) {
        (ImageLayout::Single, true) => {
            return Err(refused(
                run,
                "it sees each image as one tile (--image-layout single): export it with \
                 --format llava-hf"
                    .into(),
            ))
        }
        (ImageLayout::AnyRes { .. }, false) => {
            return Err(refused(
                run,
                format!(
                    "it sees images as {} tiles, a LLaVA-OneVision model: export it with \
                     --format llava-onevision",
                    description.image_layout
                ),
            ))
        }
        _ => {}
    }
    let (ckpt, trainable) = newest_complete_trained(run)?;
    let cfg = stored_config(run, &ckpt)?;
    let vlm = Vlm::from_dirs(
        &description.mm_vision_tower,
        &description.language_model,
        description.tower_options(),
    )?;
    let initial = initial_projector(run, &cfg, &vlm)?;
    // Stage 2 (finetune) trains LoRA adapters; stage 1 only the projector.
    let lora = match description.stage {
        2 => description.lora.clone(),
        _ => None,
    };
    let tokens = description.special_tokens();
    let sources = LlavaSources {
        vision_dir: &description.mm_vision_tower,
        lm_dir: &description.language_model,
        trainable: &trainable,
        initial_projector: initial.as_ref().map(|(p, _)| p),
        feature_stats: description.feature_stats.as_ref(),
        lora,
        tokens: &tokens,
        added_tokens: description.added_tokens,
        template: &description.template,
        image_size: Some(description.image_size),
        vision_feature_layer: Some(description.mm_vision_select_layer.clone()),
        image_layout: description.image_layout.clone(),
    };
    let mut report = write_llava_hf(&sources, out, &options)?;
    report.projector_from = initial.map(|(_, from)| from);
    Ok((ckpt.meta.step, report))
}

/// Writes the llava-hf directory `out` (created if missing) from `sources`, one tensor at a
/// time: every file's header is planned from the shapes, then each tensor is read (trained,
/// or from the source directories), merged with its adapter when it has one, converted,
/// written and dropped before the next is read. No map of the model's weights is ever built.
pub fn write_llava_hf(
    sources: &LlavaSources,
    out: &Path,
    options: &LlavaHfOptions,
) -> Result<LlavaHfReport, ExportError> {
    let vlm = exported_vlm(sources)?;
    std::fs::create_dir_all(out).map_err(io(out))?;
    let specs = keyed_specs(&vlm);
    check_trained_are_held(sources.trainable, &specs)?;
    let merge = match &sources.lora {
        Some(lora) if options.merge => Some(lora),
        _ => None,
    };
    let adapter = match (&sources.lora, merge) {
        (Some(lora), None) => Some(write_unmerged_adapter(out, lora, sources.trainable)?),
        _ => None,
    };
    let entries: Vec<(String, Vec<i64>)> = specs
        .iter()
        .map(|(key, s)| (key.clone(), s.shape.clone()))
        .collect();
    let weights = RunWeights::open(
        sources.vision_dir,
        sources.lm_dir,
        sources.trainable,
        (sources.initial_projector, sources.feature_stats),
    )?;
    let tensors = ExportTensors {
        weights,
        specs: &specs,
        vlm: &vlm,
        sources,
        merge,
        dtype: options.dtype,
    };
    let weight_files = write_hub_files(
        out,
        &entries,
        options.dtype,
        options.max_shard_bytes,
        |key| tensors.tensor(key),
    )?;
    write_config(out, &vlm, sources, options.dtype)?;
    if let Some(tokenizer) = &options.tokenizer {
        write_processor(out, tokenizer, &vlm, sources)?;
    }
    Ok(LlavaHfReport {
        weight_files,
        adapter,
        tensors: entries.len(),
        projector_from: None,
    })
}

/// The model `sources` describe, with the run's image token, adapters, added rows and layout.
fn exported_vlm(sources: &LlavaSources) -> Result<Vlm, ExportError> {
    Ok(Vlm::from_dirs(
        sources.vision_dir,
        sources.lm_dir,
        VlmOptions {
            image_token_id: Some(i64::from(sources.tokens.image.id)),
            lora: sources.lora.clone(),
            added_tokens: sources.added_tokens,
            image_size: sources.image_size,
            vision_feature_layer: sources.vision_feature_layer.clone(),
            image_layout: sources.image_layout.clone(),
            ..Default::default()
        },
    )?)
}

/// Every tensor the export holds (the whole tower, the projector, the LM's base weights), by
/// its llava-hf key, in key order (as `save_pretrained` sorts them).
fn keyed_specs(vlm: &Vlm) -> BTreeMap<String, ParamSpec> {
    export_specs(vlm)
        .into_iter()
        .map(|s| (llava_key(&s.name), s))
        .collect()
}

/// Refuses a checkpoint that trained a tensor the export does not hold (a full fine-tune's LM
/// and vision layers replace the directories' weights; adapters and added rows go elsewhere).
fn check_trained_are_held(
    trainable: &TrainedTensors,
    specs: &BTreeMap<String, ParamSpec>,
) -> Result<(), ExportError> {
    let held: std::collections::HashSet<&str> = specs.values().map(|s| s.name.as_str()).collect();
    for name in trainable.names() {
        let appended = name.starts_with("added_tokens.");
        if !name.contains(".lora_") && !appended && !held.contains(name.as_str()) {
            return Err(ExportError::Model(ModelError::InvalidConfig(format!(
                "the checkpoint trained `{name}`, which the export does not hold"
            ))));
        }
    }
    Ok(())
}

/// The LoRA adapters left unmerged, written as a PEFT adapter in `out/adapter`.
fn write_unmerged_adapter(
    out: &Path,
    lora: &LoraConfig,
    trainable: &TrainedTensors,
) -> Result<PathBuf, ExportError> {
    let adapters = trainable.collect(|k| k.contains(".lora_"))?;
    let dir = out.join(LLAVA_ADAPTER_DIR);
    write_adapter(&dir, lora, &adapters)?;
    Ok(dir)
}

/// `config.json`: the LLaVA config of `vlm` over its two directories' configs, as a
/// LLaVA-OneVision one under `anyres_max_N`.
fn write_config(
    out: &Path,
    vlm: &Vlm,
    sources: &LlavaSources,
    kind: Kind,
) -> Result<(), ExportError> {
    let read = |dir: &Path| tessera_model::read_config_json(&dir.join("config.json"));
    let dtype = match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    };
    let mut config = llava_config_json(
        vlm,
        &read(sources.vision_dir)?,
        &read(sources.lm_dir)?,
        dtype,
    )?;
    if let ImageLayout::AnyRes { .. } = &sources.image_layout {
        as_onevision_config(&mut config, vlm, &sources.image_layout);
    }
    write_json(&out.join("config.json"), &config)
}

/// Where each exported tensor comes from, read one at a time.
struct ExportTensors<'a> {
    weights: RunWeights<'a>,
    /// The export's tensors by llava-hf key.
    specs: &'a BTreeMap<String, ParamSpec>,
    vlm: &'a Vlm,
    sources: &'a LlavaSources<'a>,
    /// The adapters to merge into the LM's weights, when they are merged.
    merge: Option<&'a LoraConfig>,
    dtype: Kind,
}

impl ExportTensors<'_> {
    /// The tensor of llava-hf key `key`: an embedding (or untied head) with the added tokens'
    /// rows after its own, a weight with its adapter merged, or the weight as stored.
    fn tensor(&self, key: &str) -> Result<tch::Tensor, ExportError> {
        let spec = self.specs.get(key).ok_or_else(|| {
            ExportError::Model(ModelError::InvalidConfig(format!(
                "`{key}` is not a tensor of the export"
            )))
        })?;
        let adapter = self.adapter_of(spec)?;
        if let Some(rows) = added_rows_of(self.vlm, &spec.name) {
            return self.with_added_rows(spec, rows);
        }
        match adapter {
            Some((lora, a, b)) => {
                let w = self.weights.tensor(&spec.name, &spec.shape, None)?;
                Ok(merge_weight(lora, &w, &a, &b))
            }
            None => self
                .weights
                .tensor(&spec.name, &spec.shape, Some(self.dtype)),
        }
    }

    /// The checkpoint's rows of `spec`, then the added tokens' (`rows`, trained beside the
    /// projector).
    fn with_added_rows(&self, spec: &ParamSpec, rows: &str) -> Result<tch::Tensor, ExportError> {
        let mut base = spec.shape.clone();
        base[0] -= self.sources.added_tokens;
        let w = self.weights.tensor(&spec.name, &base, Some(self.dtype))?;
        let added = self
            .sources
            .trainable
            .get_as(rows, self.dtype)?
            .ok_or_else(|| {
                ExportError::Model(ModelError::InvalidConfig(format!(
                    "the checkpoint holds no `{rows}`, the rows of the tokens ingest added"
                )))
            })?;
        Ok(tch::Tensor::cat(&[w, added], 0))
    }

    /// The adapter pair (A, B) to merge into weight `spec`, when adapters are merged and the
    /// checkpoint trained one for its module; an error when it holds only one of the two.
    fn adapter_of(
        &self,
        spec: &ParamSpec,
    ) -> Result<Option<(&LoraConfig, tch::Tensor, tch::Tensor)>, ExportError> {
        let (Some(lora), Some(module)) = (self.merge, spec.name.strip_suffix(".weight")) else {
            return Ok(None);
        };
        let [a, b] = adapter_keys(module);
        let trained = self.sources.trainable;
        match (trained.get(&a)?, trained.get(&b)?) {
            (Some(a), Some(b)) => Ok(Some((lora, a, b))),
            (None, None) => Ok(None),
            (Some(_), None) | (None, Some(_)) => {
                Err(ExportError::Model(ModelError::InvalidConfig(format!(
                    "cannot merge `{module}`: the checkpoint holds only one of {a} and {b}"
                ))))
            }
        }
    }
}

fn refused(run: &Path, what: String) -> ExportError {
    ExportError::BadRun {
        run: run.to_path_buf(),
        what,
    }
}

/// The pinpoints of an `anyres_max_N` model as transformers lists them: [height, width] pairs.
fn pinpoints(vlm: &Vlm, layout: &ImageLayout) -> serde_json::Value {
    let tower = tessera_shards::image_layout::Tower {
        tile: vlm.vision.image_size as u32,
        patch: vlm.vision.patch_size as u32,
    };
    layout
        .pinpoints(tower)
        .into_iter()
        .map(|(h, w)| serde_json::json!([h, w]))
        .collect()
}

/// A llava config made LLaVA-OneVision's (`LlavaOnevisionConfig`): its model type, the
/// pinpoints and `vision_aspect_ratio` (the `anyres_max_N` the run trained with).
fn as_onevision_config(config: &mut serde_json::Value, vlm: &Vlm, layout: &ImageLayout) {
    config["architectures"] = serde_json::json!(["LlavaOnevisionForConditionalGeneration"]);
    config["model_type"] = "llava_onevision".into();
    config["image_grid_pinpoints"] = pinpoints(vlm, layout);
    config["vision_aspect_ratio"] = layout.to_string().into();
    if let Some(map) = config.as_object_mut() {
        map.remove("image_seq_length");
    }
}

/// The PEFT adapter for the LLaVA model: keys and `target_modules` name the LM's modules
/// inside `LlavaForConditionalGeneration` (`model.language_model.layers.N....`), so the
/// SigLIP tower's `q_proj`/`k_proj`/`v_proj` are not targeted.
fn write_adapter(dir: &Path, lora: &LoraConfig, adapters: &ParamMap) -> Result<(), ExportError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let renamed: BTreeMap<String, tch::Tensor> = adapters
        .iter()
        .map(|(k, t)| {
            let inner = k.strip_prefix("model.").unwrap_or(k);
            (
                format!("base_model.model.model.language_model.{inner}"),
                t.shallow_clone(),
            )
        })
        .collect();
    tessera_model::save_safetensors(&dir.join(tessera_model::ADAPTER_WEIGHTS), &renamed)?;
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": null,
        "base_model_name_or_path": "..",
        "r": lora.r,
        "lora_alpha": lora.lora_alpha,
        "lora_dropout": lora.lora_dropout,
        "target_modules": lm_target_regex(&lora.target_modules),
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "modules_to_save": null,
    });
    write_json(&dir.join(tessera_model::ADAPTER_CONFIG), &config)
}

/// PEFT full-matches a string `target_modules` against module names.
pub(crate) fn lm_target_regex(modules: &[String]) -> String {
    format!(
        r"model\.language_model\.layers\.\d+\.(?:self_attn|mlp)\.({})",
        modules.join("|")
    )
}

/// The LM folder's own tokenizer class (its tokenizer_config.json's `tokenizer_class`), else
/// the class that reads any tokenizer.json.
fn tokenizer_class(lm_dir: &Path) -> String {
    let path = lm_dir.join("tokenizer_config.json");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|c| c.get("tokenizer_class")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "PreTrainedTokenizerFast".into())
}

fn write_processor(
    out: &Path,
    tokenizer: &Path,
    vlm: &Vlm,
    sources: &LlavaSources,
) -> Result<(), ExportError> {
    let target = out.join("tokenizer.json");
    std::fs::copy(tokenizer, &target).map_err(io(tokenizer))?;
    let tokens = sources.tokens;
    let template: Template = sources
        .template
        .parse()
        .map_err(|e: String| ExportError::Model(ModelError::InvalidConfig(e)))?;
    let loaded = tokenizers::Tokenizer::from_file(tokenizer).map_err(|e| ExportError::Io {
        path: tokenizer.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    // What `tessera generate` stops at: a chatml turn ends with <|im_end|>.
    let im_end_id = (template == Template::Chatml)
        .then(|| loaded.token_to_id(IM_END))
        .flatten();
    // The run's end of sequence, as the shards spell it (so `generate --model` resolves the
    // same tokens as `generate --run`); generation_config.json lists every stop.
    let stop_ids = template.stop_ids(tokens, im_end_id);
    let processor_class = match sources.image_layout {
        ImageLayout::Single => "LlavaProcessor",
        ImageLayout::AnyRes { .. } => "LlavaOnevisionProcessor",
    };
    let pad = loaded
        .id_to_token(tokens.pad_id)
        .unwrap_or_else(|| tokens.eos.text.clone());
    write_json(
        &out.join("tokenizer_config.json"),
        &serde_json::json!({
            "tokenizer_class": tokenizer_class(sources.lm_dir),
            "processor_class": processor_class,
            "bos_token": null,
            "eos_token": tokens.eos.text,
            "pad_token": pad,
            "unk_token": null,
            "extra_special_tokens": {"image_token": tokens.image.text},
            "model_max_length": vlm.lm.max_position_embeddings,
            "add_prefix_space": false,
            "clean_up_tokenization_spaces": false,
            "errors": "replace",
            "split_special_tokens": false,
        }),
    )?;
    let jinja = out.join("chat_template.jinja");
    std::fs::write(&jinja, chat_template(template, tokens)).map_err(io(&jinja))?;
    if let ImageLayout::AnyRes { .. } = &sources.image_layout {
        return write_onevision_processor(out, vlm, sources, &stop_ids);
    }
    write_json(
        &out.join("processor_config.json"),
        &serde_json::json!({
            "processor_class": "LlavaProcessor",
            "image_token": tokens.image.text,
            "patch_size": vlm.vision.patch_size,
            // A CLS token (DINOv2) counts as an additional token that "default" drops.
            "vision_feature_select_strategy": match vlm.vision.prefix_tokens() {
                0 => "full",
                _ => "default",
            },
            "num_additional_image_tokens": vlm.vision.prefix_tokens(),
        }),
    )?;
    write_json(
        &out.join("preprocessor_config.json"),
        &image_processor_json(vlm, "SiglipImageProcessor", "LlavaProcessor"),
    )?;
    write_generation_config(out, tokens, &stop_ids)
}

/// `preprocessor_config.json`'s common part: bicubic resize to the tower's size, rescale and
/// the tower's mean and std.
fn image_processor_json(
    vlm: &Vlm,
    processor_type: &str,
    processor_class: &str,
) -> serde_json::Value {
    let side = vlm.vision.image_size;
    let (mean, std) = vlm.vision.pixel_mean_std();
    serde_json::json!({
        "image_processor_type": processor_type,
        "processor_class": processor_class,
        "do_convert_rgb": true,
        "do_resize": true,
        "size": {"height": side, "width": side},
        "resample": 3,
        "do_rescale": true,
        "rescale_factor": 1.0 / 255.0,
        "do_normalize": true,
        "image_mean": mean,
        "image_std": std,
    })
}

/// `generation_config.json`: greedy, stopping where `tessera generate` stops.
fn write_generation_config(
    out: &Path,
    tokens: &SpecialTokens,
    stop_ids: &[u32],
) -> Result<(), ExportError> {
    write_json(
        &out.join("generation_config.json"),
        &serde_json::json!({
            "bos_token_id": null,
            "eos_token_id": stop_ids,
            "pad_token_id": tokens.pad_id,
            "do_sample": false,
        }),
    )
}

/// The processor files of a LLaVA-OneVision export: `LlavaOnevisionProcessor` (its image
/// token, the tokens of one view, the feature selection and `vision_aspect_ratio`, which
/// together give each image's token count), `LlavaOnevisionImageProcessor` (the tower's tile,
/// the pinpoints, bicubic, padding to the pinpoint) and the generation stops.
fn write_onevision_processor(
    out: &Path,
    vlm: &Vlm,
    sources: &LlavaSources,
    stop_ids: &[u32],
) -> Result<(), ExportError> {
    let tokens = sources.tokens;
    let prefix = vlm.vision.prefix_tokens();
    write_json(
        &out.join("processor_config.json"),
        &serde_json::json!({
            "processor_class": "LlavaOnevisionProcessor",
            "image_token": tokens.image.text,
            "num_image_tokens": vlm.vision.num_patches() + prefix,
            "vision_feature_select_strategy": if prefix == 0 { "full" } else { "default" },
            "vision_aspect_ratio": sources.image_layout.to_string(),
        }),
    )?;
    let mut image_processor = image_processor_json(
        vlm,
        "LlavaOnevisionImageProcessor",
        "LlavaOnevisionProcessor",
    );
    image_processor["image_grid_pinpoints"] = pinpoints(vlm, &sources.image_layout);
    image_processor["do_pad"] = true.into();
    write_json(&out.join("preprocessor_config.json"), &image_processor)?;
    write_generation_config(out, tokens, stop_ids)
}

/// The run's template as Jinja for transformers: [`PLAIN_TEMPLATE`] or [`CHATML_TEMPLATE`]
/// with the run's tokens written in.
fn chat_template(template: Template, tokens: &SpecialTokens) -> String {
    match template {
        Template::Plain => PLAIN_TEMPLATE
            .replace("@IMAGE@", &tokens.image.text)
            .replace("@EOS@", &tokens.eos.text),
        Template::Chatml => {
            CHATML_TEMPLATE.replace("@IMAGE@", &tessera_text::chat::framed_image(tokens))
        }
    }
}

/// LLaVA's `plain` template as `tessera_text::chat::Template::Plain` renders it (ingest, generate): a
/// user turn with an image becomes the image token (`@IMAGE@`) alone (its text dropped), other
/// turns their text and `\n`; a finished conversation ends with the end of sequence (`@EOS@`).
/// Jinja for transformers, so written out here; `tests::the_jinja_templates_render_what_shards_chat_renders`
/// renders it and compares.
const PLAIN_TEMPLATE: &str = r#"{%- for message in messages -%}
{%- if message['content'] is string -%}{%- set parts = [{'type': 'text', 'text': message['content']}] -%}{%- else -%}{%- set parts = message['content'] -%}{%- endif -%}
{%- set images = parts | selectattr('type', 'equalto', 'image') | list -%}
{%- if message['role'] != 'assistant' and images -%}{%- for _ in images -%}@IMAGE@{%- endfor -%}
{%- else -%}{%- for part in parts -%}{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}{{ '\n' }}{%- endif -%}
{%- endfor -%}
{%- if not add_generation_prompt and messages and messages[-1]['role'] == 'assistant' -%}@EOS@{%- endif -%}
"#;

/// ChatML as `tessera_text::chat::Template::Chatml` renders it: an image is the image token, framed
/// when the tokenizer has Qwen's frame (`@IMAGE@`). See [`PLAIN_TEMPLATE`] on how it is checked.
const CHATML_TEMPLATE: &str = r#"{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' -}}
{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}{%- for part in message['content'] -%}{%- if part['type'] == 'image' -%}@IMAGE@{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"#;

#[cfg(test)]
mod tests {
    use super::chat_template;
    use tessera_text::chat::{Role, Template};
    use tessera_text::SpecialTokens;

    /// Each exported Jinja template, rendered as transformers renders it (minijinja with
    /// `trim_blocks` and `lstrip_blocks`, through ingest's `ChatTemplate`), gives what
    /// `tessera_text::chat` renders for ingest and generation: the whole conversation and the prompt,
    /// with Qwen's tokens and with SmolLM2's.
    #[test]
    fn the_jinja_templates_render_what_shards_chat_renders() -> anyhow::Result<()> {
        let question = (Role::User, "<image>\nWhat is shown?");
        let answered = [question, (Role::Assistant, "A gradient.")];
        // The same conversation as transformers' messages: the image as a content part.
        let messages = serde_json::json!([
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nWhat is shown?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A gradient."}]},
        ]);
        for tokens in [SpecialTokens::qwen(), SpecialTokens::smollm2_instruct()] {
            for template in [Template::Plain, Template::Chatml] {
                let jinja = tessera_text::ChatTemplate::new(
                    chat_template(template, &tokens),
                    None,
                    None,
                    std::path::Path::new("chat_template.jinja"),
                )?;
                let whole = jinja.render_json(&messages, false)?;
                assert_eq!(whole, template.render(&answered, 1, &tokens).text);
                let prompt = jinja.render_json(&serde_json::json!([messages[0]]), true)?;
                assert_eq!(prompt, template.generation_prompt(&[question], 1, &tokens));
            }
        }
        Ok(())
    }
}
