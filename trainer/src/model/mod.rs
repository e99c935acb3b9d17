//! The LLaVA-architecture model in tch, written in the functional style FSDP needs: no layer
//! owns storage; every forward reads full tensors from a [`ParamMap`](crate::unit::ParamMap)
//! keyed by Hugging Face checkpoint names.
//!
//! 1. [`config`]: `config.json` structs (HF field names, HF defaults for sparse Hub configs).
//! 2. [`weights`]: safetensors loading (single file or sharded index) and writing.
//! 3. [`siglip`] (vision tower), [`projector`] (`mlp2x_gelu`), [`qwen2`] (the LM, with
//!    [`rope`], [`attention`] and [`lora`] adapters), [`loss`] (chunked cross-entropy).
//! 4. [`vlm`]: the unit chain (`vision`, `projector`, `embed`, `layers.{i}`, `head`) that FSDP
//!    runs, the per-micro-batch context [`VlmCtx`], and [`Vlm::loss`], the plain composition.
//! 5. [`init`]: random-weight checkpoints for `tessera init-model`.
pub mod attention;
pub mod config;
pub mod ctx;
pub mod init;
pub mod lora;
pub mod loss;
pub mod projector;
pub mod qwen2;
pub mod rope;
pub mod siglip;
pub mod throughput;
pub mod units;
pub mod vlm;
pub mod weights;

pub use config::{LoraConfig, Qwen2Config, SiglipVisionConfig};
pub use vlm::{Vlm, VlmCtx, VlmOptions};

use std::path::PathBuf;

/// Everything that can go wrong loading, building or saving the model. Messages name the file
/// and tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: not a readable safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("{dir}: neither model.safetensors nor model.safetensors.index.json is present")]
    NoWeights { dir: PathBuf },
    #[error("{dir}: tensor `{name}` is missing from the checkpoint")]
    MissingTensor { dir: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        path: PathBuf,
        name: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    #[error("{path}: tensor `{name}` has dtype {dtype}; tessera loads F32, BF16 and F16")]
    UnsupportedDtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    #[error("micro-batch of samples {samples:?}: {reason}")]
    BadBatch {
        samples: Vec<String>,
        reason: String,
    },
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Reads a parameter a unit needs; a missing key is a bug in the caller (FSDP gathered the
/// wrong unit), so it panics naming the key.
pub(crate) fn param<'a>(params: &'a crate::unit::ParamMap, key: &str) -> &'a tch::Tensor {
    match params.get(key) {
        Some(t) => t,
        None => panic!("parameter `{key}` was not passed to the unit that reads it"),
    }
}
