//! The model as transformers' `LlavaForConditionalGeneration` (5.x) stores it: its
//! `config.json` (`model_type` "llava", a `vision_config` for the SigLIP tower, a
//! `text_config` for the LM) and its checkpoint keys, which `save_pretrained` writes in the
//! Hub's layout (the conversion mapping of `transformers/conversion_mapping.py` renames them
//! to `model.vision_tower.*`, `model.multi_modal_projector.*`, `model.language_model.*` and
//! `lm_head.*` when loading):
//!
//! | tessera                        | llava-hf file                              |
//! |--------------------------------|--------------------------------------------|
//! | `vision_model.X`               | `vision_tower.X`                           |
//! | `mm_projector.0.{weight,bias}` | `multi_modal_projector.linear_1.*`         |
//! | `mm_projector.2.{weight,bias}` | `multi_modal_projector.linear_2.*`         |
//! | `model.X` (the LM)             | `language_model.model.X`                   |
//! | `lm_head.weight` (untied only) | `language_model.lm_head.weight`            |
use super::config::{read_json, LoraConfig, VisionArch, VisionConfig};
use super::error::{ModelError, Result};
use super::feature_layers::FeatureLayers;
use super::init::vision_config_json;
use super::lm_config::LmConfig;
use super::{lora, vision, vocab, weights, HfCheckpoint, Vlm, VlmOptions};
use std::path::Path;
use tch::{Kind, Tensor};
use tessera_fsdp::{ParamMap, ParamSpec};

/// Subdirectory of an unmerged export holding the PEFT adapter.
pub const LLAVA_ADAPTER_DIR: &str = "adapter";

/// The llava-hf key of a tessera parameter.
pub fn llava_key(key: &str) -> String {
    if let Some(rest) = key.strip_prefix("vision_model.") {
        format!("vision_tower.{rest}")
    } else if let Some(rest) = key.strip_prefix("mm_projector.0.") {
        format!("multi_modal_projector.linear_1.{rest}")
    } else if let Some(rest) = key.strip_prefix("mm_projector.2.") {
        format!("multi_modal_projector.linear_2.{rest}")
    } else if key.starts_with("model.") || key == "lm_head.weight" {
        format!("language_model.{key}")
    } else {
        key.to_string()
    }
}

/// Keys a llava-hf checkpoint may store a tessera parameter under: the Hub layout, the
/// in-memory layout of transformers 5, and the older nested tower (`vision_tower.vision_model.`).
fn stored_candidates(key: &str) -> Vec<String> {
    let hub = llava_key(key);
    let mut out = vec![hub.clone()];
    if let Some(rest) = hub.strip_prefix("language_model.model.") {
        out.push(format!("model.language_model.{rest}"));
    } else if hub == "language_model.lm_head.weight" {
        out.push("lm_head.weight".into());
    } else if let Some(rest) = hub.strip_prefix("vision_tower.") {
        out.push(format!("model.vision_tower.{rest}"));
        out.push(format!("vision_tower.vision_model.{rest}"));
    } else if hub.starts_with("multi_modal_projector.") {
        out.push(format!("model.{hub}"));
    }
    out
}

/// Every tensor an export holds, by tessera key: the complete SigLIP tower without its pooling
/// head (the last layer and `post_layernorm` included, which training never reads), the
/// projector and the LM's base weights (no adapters), its embedding (and untied head) with the
/// added tokens' rows appended (see [`added_rows_of`]).
pub fn export_specs(vlm: &Vlm) -> Vec<ParamSpec> {
    let mut specs = vision::checkpoint_specs(&vlm.vision);
    let added = vlm.options.added_tokens;
    specs.extend(
        vlm.param_specs()
            .into_iter()
            .filter(|s| !s.name.starts_with("vision_model.") && !s.name.contains(".lora_"))
            .filter(|s| !s.name.starts_with("added_tokens."))
            .map(|mut s| {
                if added_rows_of(vlm, &s.name).is_some() {
                    s.shape[0] += added;
                }
                s
            }),
    );
    specs
}

/// For the embedding (and an untied head) of a model with added tokens, the parameter holding
/// its added rows: the export writes the checkpoint's rows, then these.
pub fn added_rows_of(vlm: &Vlm, key: &str) -> Option<&'static str> {
    if vlm.options.added_tokens <= 0 {
        return None;
    }
    match key {
        vocab::EMBED => Some(vocab::ADDED_EMBED),
        vocab::LM_HEAD => Some(vocab::ADDED_HEAD),
        _ => None,
    }
}

/// `config.json` of the export: `vision_source` / `lm_source` are the source checkpoints'
/// configs (their extra fields are kept), completed from the parsed configs. `vlm` must have
/// its image token id set.
pub fn llava_config_json(
    vlm: &Vlm,
    vision_source: &serde_json::Value,
    lm_source: &serde_json::Value,
    dtype: &str,
) -> Result<serde_json::Value> {
    let image_token_id = vlm
        .options
        .image_token_id
        .ok_or_else(|| ModelError::NoImageToken {
            what: "the llava-hf config.json".into(),
        })?;
    let mut vision = vision_config_json(&vlm.vision);
    let source = vision_source.get("vision_config").unwrap_or(vision_source);
    overlay(&mut vision, source);
    let select = match vlm.vision.arch {
        VisionArch::Siglip => {
            vision["model_type"] = "siglip_vision_model".into();
            vision["vision_use_head"] = false.into();
            "full"
        }
        // LLaVA's "default" drops the CLS token, as tessera's features do.
        VisionArch::Dinov2 { .. } => "default",
    };
    let mut text = vlm.lm.hf_json();
    overlay(&mut text, lm_source);
    text["tie_word_embeddings"] = vlm.tied.into();
    text["vocab_size"] = (vlm.lm.vocab_size + vlm.options.added_tokens).into();
    for config in [&mut vision, &mut text] {
        if let Some(map) = config.as_object_mut() {
            for key in [
                "architectures",
                "torch_dtype",
                "dtype",
                "transformers_version",
            ] {
                map.remove(key);
            }
        }
    }
    Ok(serde_json::json!({
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": image_token_id,
        "image_seq_length": vlm.vision.num_patches(),
        "projector_hidden_act": "gelu",
        "vision_feature_layer": vlm.vision.feature_layers,
        "vision_feature_select_strategy": select,
        "multimodal_projector_bias": true,
        "tie_word_embeddings": vlm.tied,
        "dtype": dtype,
        "vision_config": vision,
        "text_config": text,
    }))
}

fn overlay(base: &mut serde_json::Value, source: &serde_json::Value) {
    if let (Some(base), Some(source)) = (base.as_object_mut(), source.as_object()) {
        for (k, v) in source {
            base.insert(k.clone(), v.clone());
        }
    }
}

/// A llava-hf directory read back: the model (configs, tie, placeholder id, the adapter's LoRA
/// config when an unmerged adapter sits in `adapter/`) and its parameters by tessera key (in
/// their stored dtypes).
pub fn load_llava_dir(dir: &Path) -> Result<(Vlm, ParamMap)> {
    load_llava_dir_as(dir, None)
}

/// [`load_llava_dir`] with every parameter converted to `kind` as it is read (so a bf16 export
/// loaded as f32, or the reverse, is never in memory in both dtypes).
pub fn load_llava_dir_as(dir: &Path, kind: Option<Kind>) -> Result<(Vlm, ParamMap)> {
    let convert = |t: Tensor| match kind {
        Some(kind) => t.to_kind(kind),
        None => t,
    };
    let path = dir.join("config.json");
    let config = read_json(&path)?;
    let field = |name: &str| {
        config
            .get(name)
            .cloned()
            .ok_or_else(|| ModelError::InvalidConfig(format!("{}: no `{name}`", path.display())))
    };
    if config.get("model_type").and_then(|v| v.as_str()) != Some("llava") {
        return Err(ModelError::InvalidConfig(format!(
            "{}: model_type is not \"llava\"",
            path.display()
        )));
    }
    let vision = VisionConfig::from_json(&path, field("vision_config")?)?;
    let image_size = run_image_size(dir, &vision)?;
    let lm = LmConfig::from_json(field("text_config")?, dir)?;
    let image_token_id = field("image_token_index")?.as_i64().ok_or_else(|| {
        ModelError::InvalidConfig(format!(
            "{}: image_token_index is not an integer",
            path.display()
        ))
    })?;
    let checkpoint = HfCheckpoint::open(dir)?;
    let tied = config
        .get("tie_word_embeddings")
        .and_then(|v| v.as_bool())
        .unwrap_or(lm.tie_word_embeddings)
        && !stored_candidates("lm_head.weight")
            .iter()
            .any(|k| checkpoint.contains(k));
    let adapter_dir = dir.join(LLAVA_ADAPTER_DIR);
    let (lora, adapters): (Option<LoraConfig>, ParamMap) =
        if adapter_dir.join(lora::ADAPTER_CONFIG).is_file() {
            let (cfg, tensors) = load_llava_adapter(&adapter_dir)?;
            (Some(cfg), tensors)
        } else {
            (None, ParamMap::new())
        };
    let vision_feature_layer = match config.get("vision_feature_layer") {
        Some(value) => Some(
            serde_json::from_value::<FeatureLayers>(value.clone()).map_err(|e| {
                ModelError::InvalidConfig(format!(
                    "{}: vision_feature_layer is not a layer or a list of layers: {e}",
                    path.display()
                ))
            })?,
        ),
        None => None,
    };
    let options = VlmOptions {
        image_token_id: Some(image_token_id),
        lora,
        image_size,
        vision_feature_layer,
        ..Default::default()
    };
    let vlm = Vlm::new(vision, lm, tied, options)?;
    let mut params = ParamMap::new();
    for spec in vlm.param_specs() {
        if spec.name.contains(".lora_") {
            let t = adapters
                .get(&spec.name)
                .ok_or_else(|| ModelError::MissingTensor {
                    dir: adapter_dir.clone(),
                    name: spec.name.clone(),
                })?;
            params.insert(spec.name.clone(), convert(t.shallow_clone()));
            continue;
        }
        let candidates = stored_candidates(&spec.name);
        let stored = candidates
            .iter()
            .find(|k| checkpoint.contains(k))
            .unwrap_or(&candidates[0]);
        params.insert(
            spec.name.clone(),
            convert(checkpoint.tensor_as_stored(stored, &spec.shape)?),
        );
    }
    Ok((vlm, params))
}

/// The side the export's images are fed at: for a tower that interpolates its positions
/// (DINOv2), the image processor's `size` in `preprocessor_config.json`; else the tower's own.
fn run_image_size(dir: &Path, vision: &VisionConfig) -> Result<Option<i64>> {
    if vision.arch == VisionArch::Siglip {
        return Ok(None);
    }
    let path = dir.join("preprocessor_config.json");
    let config = read_json(&path)?;
    let height = config.pointer("/size/height").and_then(|v| v.as_i64());
    match height {
        Some(side) => Ok(Some(side)),
        None => Err(ModelError::InvalidConfig(format!(
            "{}: no size.height (the side images are resized to)",
            path.display()
        ))),
    }
}

/// PEFT prefix of the LM's modules inside `LlavaForConditionalGeneration`.
const ADAPTER_PREFIX: &str = "base_model.model.model.language_model.";

/// Reads the adapter an unmerged export holds (see `train::llava_hf`): its LoRA config (a
/// regex `target_modules` ending in `(q_proj|v_proj|...)`, or a list) and its tensors under
/// tessera's keys (`model.layers.N....lora_A.weight`).
fn load_llava_adapter(dir: &Path) -> Result<(LoraConfig, ParamMap)> {
    let path = dir.join(lora::ADAPTER_CONFIG);
    let mut value = read_json(&path)?;
    if let Some(regex) = value.get("target_modules").and_then(|v| v.as_str()) {
        let modules: Vec<String> = regex
            .rsplit_once('(')
            .and_then(|(_, group)| group.strip_suffix(')'))
            .map(|group| group.split('|').map(str::to_string).collect())
            .ok_or_else(|| {
                ModelError::InvalidConfig(format!(
                    "{}: target_modules {regex:?} does not end in a (module|module) group",
                    path.display()
                ))
            })?;
        value["target_modules"] = modules.into();
    }
    let cfg: LoraConfig =
        serde_json::from_value(value).map_err(|source| ModelError::Json { path, source })?;
    cfg.validate()?;
    let mut out = ParamMap::new();
    for (key, t) in weights::load_safetensors(&dir.join(lora::ADAPTER_WEIGHTS))? {
        let inner = key.strip_prefix(ADAPTER_PREFIX).unwrap_or(&key);
        out.insert(
            format!("model.{inner}").replace(".default.weight", ".weight"),
            t,
        );
    }
    Ok((cfg, out))
}
