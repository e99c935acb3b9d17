//! LoRA adapters on the LM's linear layers, in PEFT's conventions: `lora_A` `[r, in]`
//! (kaiming-uniform a=√5, i.e. U(±1/√in)), `lora_B` `[out, r]` (zeros), output
//! base(x) + B(A(dropout(x)))·(alpha/r), merged W' = W + (alpha/r)·B·A. Inside tessera the
//! parameters are named `{module}.lora_A.weight`; PEFT's files prefix `base_model.model.`.
//! The model passes in the linear layers an adapter may sit on; this file knows no model.
use super::config::LoraConfig;
use super::error::{ModelError, Result};
use super::keys::{KeyPath, LinearKeys};
use super::projector::uniform;
use super::{gemm, param, weights};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use tch::Tensor;
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
const PEFT_PREFIX: &str = "base_model.model.";

const LORA_A: &str = "lora_A.weight";
const LORA_B: &str = "lora_B.weight";

/// Whether `module` (`model.layers.3.mlp.up_proj`) carries an adapter under `cfg`.
pub(crate) fn targets(cfg: &LoraConfig, module: &KeyPath) -> bool {
    cfg.target_modules.iter().any(|t| t == module.leaf())
}

/// Adapter parameters (trainable) of those of `linears` that `cfg` targets.
pub(crate) fn adapter_specs(linears: &[&LinearKeys], cfg: &LoraConfig) -> Vec<ParamSpec> {
    let mut specs = Vec::new();
    for linear in linears.iter().filter(|l| targets(cfg, &l.path)) {
        specs.push(ParamSpec {
            name: linear.path.key(LORA_A),
            shape: vec![cfg.r, linear.in_features],
            trainable: true,
            expert: None,
        });
        specs.push(ParamSpec {
            name: linear.path.key(LORA_B),
            shape: vec![linear.out_features, cfg.r],
            trainable: true,
            expert: None,
        });
    }
    specs
}

/// The module an adapter key belongs to (`m` of `m.lora_A.weight`), `None` for other keys.
fn adapted_module(key: &str) -> Option<&str> {
    key.strip_suffix(LORA_A)
        .or_else(|| key.strip_suffix(LORA_B))
        .and_then(|m| m.strip_suffix('.'))
}

fn is_adapter(key: &str) -> bool {
    adapted_module(key).is_some()
}

/// B(A(dropout(x)))·(alpha/r). With `dropout_seed`, the dropout mask is drawn after seeding
/// torch's generator with it, so recomputing the same unit draws the same mask.
pub(crate) fn delta(
    cfg: &LoraConfig,
    params: &ParamMap,
    module: &KeyPath,
    x: &Tensor,
    dropout_seed: Option<u64>,
) -> Result<Tensor, ComputeError> {
    let a = param(params, &module.key(LORA_A))?;
    let b = param(params, &module.key(LORA_B))?;
    let x = match dropout_seed {
        Some(seed) if cfg.lora_dropout > 0.0 => {
            tch::manual_seed((seed >> 1) as i64);
            x.dropout(cfg.lora_dropout, true)
        }
        _ => x.shallow_clone(),
    };
    Ok(gemm::linear(&gemm::linear(&x, a, None)?, b, None)? * cfg.scaling())
}

/// Fresh values (PEFT init), seeded, for the adapter parameters among `specs` (the model's
/// parameter specs; the others are skipped): `lora_A` uniform in ±1/√in, `lora_B` zeros.
pub fn init_adapters(specs: &[ParamSpec], seed: u64) -> ParamMap {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = BTreeMap::new();
    for spec in specs.iter().filter(|s| is_adapter(&s.name)) {
        let t = if spec.name.ends_with(LORA_A) {
            uniform(&spec.shape, 1.0 / (spec.shape[1] as f64).sqrt(), &mut rng)
        } else {
            Tensor::zeros(spec.shape.as_slice(), (tch::Kind::Float, tch::Device::Cpu))
        };
        out.insert(spec.name.clone(), t);
    }
    out
}

/// Writes `dir/adapter_model.safetensors` (PEFT keys) and `dir/adapter_config.json` from the
/// adapter tensors found in `params`, in f32.
pub fn save_adapter(
    dir: &Path,
    cfg: &LoraConfig,
    params: &ParamMap,
    base_model: &str,
) -> Result<()> {
    save_adapter_as(dir, cfg, params, base_model, tch::Kind::Float)
}

/// [`save_adapter`] with the weights written in `kind` (`BFloat16` or `Float`).
pub fn save_adapter_as(
    dir: &Path,
    cfg: &LoraConfig,
    params: &ParamMap,
    base_model: &str,
    kind: tch::Kind,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.into(),
        source,
    })?;
    let adapters: ParamMap = params
        .iter()
        .filter(|(k, _)| is_adapter(k))
        .map(|(k, t)| (format!("{PEFT_PREFIX}{k}"), t.detach()))
        .collect();
    weights::save_safetensors_as(&dir.join(ADAPTER_WEIGHTS), &adapters, kind)?;
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.r,
        "lora_alpha": cfg.lora_alpha,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": cfg.target_modules,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "modules_to_save": null,
    });
    let path = dir.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&config).map_err(|source| ModelError::Json {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, text).map_err(|source| ModelError::Io { path, source })
}

/// Reads a PEFT adapter directory: its config and tensors renamed to tessera's keys
/// (`base_model.model.` stripped; an adapter name such as `.default` dropped).
pub fn load_adapter(dir: &Path) -> Result<(LoraConfig, ParamMap)> {
    let path = dir.join(ADAPTER_CONFIG);
    let value = super::config::read_json(&path)?;
    if value.get("peft_type").and_then(|v| v.as_str()) != Some("LORA") {
        return Err(ModelError::InvalidConfig(format!(
            "{}: peft_type is not LORA",
            path.display()
        )));
    }
    let cfg: LoraConfig =
        serde_json::from_value(value).map_err(|source| ModelError::Json { path, source })?;
    cfg.validate()?;
    let raw = weights::load_safetensors(&dir.join(ADAPTER_WEIGHTS))?;
    let mut out = BTreeMap::new();
    for (key, t) in raw {
        let key = key
            .strip_prefix(PEFT_PREFIX)
            .unwrap_or(&key)
            .replace(".default.weight", ".weight");
        out.insert(key, t);
    }
    Ok((cfg, out))
}

/// Base weights with every adapter in `params` merged in (W' = W + (alpha/r)·B·A) and the
/// adapter tensors removed: the plain LM checkpoint a user can load without PEFT.
pub fn merge_adapters(cfg: &LoraConfig, params: &ParamMap) -> Result<ParamMap> {
    let mut out: ParamMap = params
        .iter()
        .filter(|(k, _)| !is_adapter(k))
        .map(|(k, t)| (k.clone(), t.detach().copy()))
        .collect();
    let modules: BTreeSet<&str> = params.keys().filter_map(|k| adapted_module(k)).collect();
    for module in modules {
        let get = |suffix: &str| {
            let key = format!("{module}.{suffix}");
            params.get(&key).ok_or(ModelError::InvalidConfig(format!(
                "cannot merge: `{key}` is missing"
            )))
        };
        let (a, b, w) = (get(LORA_A)?, get(LORA_B)?, get("weight")?);
        out.insert(format!("{module}.weight"), merge_weight(cfg, w, a, b));
    }
    Ok(out)
}

/// The keys of `module`'s adapter (`{module}.lora_A.weight`, `{module}.lora_B.weight`).
pub fn adapter_keys(module: &str) -> [String; 2] {
    [format!("{module}.{LORA_A}"), format!("{module}.{LORA_B}")]
}

/// One module's weight with its adapter merged in: W + (alpha/r)·B·A, in the dtype of W
/// promoted with A and B's (f32 for f32 adapters), for exports that merge one module at a time.
pub fn merge_weight(cfg: &LoraConfig, weight: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
    let delta = b.detach().matmul(&a.detach()) * cfg.scaling();
    weight.detach().to_kind(delta.kind()) + delta
}
