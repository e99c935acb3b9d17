//! A language model folder as transformers saves it: its `config.json` (the family and its
//! switches, refused when tessera does not implement them: `lm_config.rs`) and its checkpoint,
//! whose tensor names must be exactly those the config describes, so a checkpoint of another
//! architecture (a Qwen2 folder whose config says `qwen3`, a truncated download) is refused by
//! name before anything is loaded or any rank starts.
use super::error::{ModelError, Result};
use super::init::lm_checkpoint_specs;
use super::lm_config::LmConfig;
use super::weights::HfCheckpoint;
use super::{vocab, Dtype, Generator};
use std::path::Path;
use tch::Kind;
use tessera_fsdp::ParamMap;

/// Every tensor `cfg` describes is in `checkpoint`, and nothing else is (but the rotary tables
/// old Llama checkpoints store, and an `lm_head.weight` a tied model ignores, as transformers
/// does). `dir` names the folder in errors.
pub(super) fn check_lm_tensors(
    dir: &Path,
    cfg: &LmConfig,
    checkpoint: &HfCheckpoint,
) -> Result<()> {
    let expected: std::collections::BTreeSet<String> = lm_checkpoint_specs(cfg)
        .into_iter()
        .map(|s| s.name)
        .collect();
    let model_type = cfg.family().model_type().to_string();
    if let Some(name) = expected.iter().find(|n| !checkpoint.contains(n)) {
        return Err(ModelError::MissingLmTensor {
            dir: dir.into(),
            model_type,
            name: name.clone(),
        });
    }
    let ignored = |n: &str| {
        n.ends_with(".rotary_emb.inv_freq") || (cfg.tie_word_embeddings && n == vocab::LM_HEAD)
    };
    let mut extra: Vec<String> = checkpoint
        .names()
        .filter(|n| !expected.contains(*n) && !ignored(n))
        .map(String::from)
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    extra.sort();
    Err(ModelError::UnexpectedTensors {
        dir: dir.into(),
        model_type,
        names: extra,
    })
}

/// A language model folder read whole: its config and every tensor of its checkpoint, each
/// converted to `kind` as it is read (kept in its stored dtype when `None`).
pub(crate) fn load_language_model(dir: &Path, kind: Option<Kind>) -> Result<(LmConfig, ParamMap)> {
    let cfg = LmConfig::from_dir(dir)?;
    let checkpoint = HfCheckpoint::open(dir)?;
    check_lm_tensors(dir, &cfg, &checkpoint)?;
    let mut params = ParamMap::new();
    for spec in lm_checkpoint_specs(&cfg) {
        let t = checkpoint.tensor_as_stored(&spec.name, &spec.shape)?;
        let t = match kind {
            Some(kind) => t.to_kind(kind),
            None => t,
        };
        params.insert(spec.name, t);
    }
    Ok((cfg, params))
}

impl Generator {
    /// The language model folder `dir` alone, ready to generate, its weights held in `dtype`
    /// (default: the widest its checkpoint stores, bf16 only if every tensor is).
    pub fn from_lm_dir(dir: &Path, dtype: Option<Dtype>) -> Result<Generator> {
        let kind = HfCheckpoint::load_kind(dir, dtype)?;
        let (cfg, params) = load_language_model(dir, Some(kind))?;
        Generator::language_model(&cfg, params, kind)
    }
}
