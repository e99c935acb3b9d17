//! [`ModelError`]: everything that can go wrong loading, building, running or saving the model.
use std::path::PathBuf;

/// Everything that can go wrong loading, building or saving the model. Messages name the file
/// and tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Images to place, but no id says where ([`crate::VlmOptions::image_token_id`]).
    #[error(
        "{what}: the model has no image token id (set it from the shards' index.json \
         special_tokens.image, or the export's image_token_index)"
    )]
    NoImageToken { what: String },
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: not a readable safetensors file")]
    Safetensors {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },
    #[error("{path}: not a usable safetensors checkpoint: {reason}")]
    SafetensorsLayout { path: PathBuf, reason: String },
    #[error("{dir}: neither model.safetensors nor model.safetensors.index.json is present")]
    NoWeights { dir: PathBuf },
    #[error("{dir}: tensor `{name}` is missing from the checkpoint")]
    MissingTensor { dir: PathBuf, name: String },
    #[error(
        "{dir}: tensor `{name}` is missing from the checkpoint (a {model_type} model with this \
         config.json has it)"
    )]
    MissingLmTensor {
        dir: PathBuf,
        model_type: String,
        name: String,
    },
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
    /// A config.json tessera reads but whose values do not hold together.
    #[error("{dir}/config.json: {reason}")]
    BadConfig { dir: PathBuf, reason: String },
    /// A model folder of a kind, or with a setting, tessera does not implement.
    #[error("{dir}: {reason} (model_type {model_type:?}; tessera supports {supported})")]
    Unsupported {
        dir: PathBuf,
        model_type: String,
        reason: String,
        supported: &'static str,
    },
    #[error(
        "{dir}: the checkpoint holds {} tensor(s) a {model_type} model with this config.json \
         does not have: {}", names.len(), names.iter().take(4).map(|n| format!("`{n}`"))
         .collect::<Vec<_>>().join(", ")
    )]
    UnexpectedTensors {
        dir: PathBuf,
        model_type: String,
        names: Vec<String>,
    },
    #[error("micro-batch of samples {samples:?}: {reason}")]
    BadBatch {
        samples: Vec<String>,
        reason: String,
    },
    /// One image's features do not fit its layout's geometry.
    #[error("image features: {0}")]
    ImageFeatures(String),
    /// Generation met logits that are not numbers (NaN or infinite): the weights or the
    /// prompt's embeddings are not finite, and no token can be picked.
    /// `--standardize-features`: statistics that do not fit the tower, or nothing to measure.
    #[error("feature statistics: {0}")]
    FeatureStats(String),
    #[error("generated token {step}: the logits are not finite (NaN or infinite weights?)")]
    NonFiniteLogits { step: usize },
    /// Code of the model read a parameter its unit was not given.
    #[error("parameter `{key}` was not passed to the unit that reads it")]
    MissingParam { key: String },
    #[error("torch")]
    Torch(#[from] tch::TchError),
    /// A unit of the chain failed computing its output (run whole, outside FSDP).
    #[error("unit '{unit}'")]
    Compute {
        unit: String,
        source: tessera_fsdp::ComputeError,
    },
    /// One of the C++ shims (the varlen attention kernel, the widened bf16 linear, a
    /// side-stream upload) failed.
    #[error(transparent)]
    Shim(#[from] tessera_sys::ShimError),
    /// A collective inside a forward (expert parallelism's all-to-all).
    #[error(transparent)]
    Collective(#[from] tessera_fsdp::dist::DistError),
    /// Writing a file through shards' atomic write (create, fsync, rename, fsync the folder;
    /// a full disk named as such).
    #[error(transparent)]
    Write(#[from] tessera_shards::ShardError),
}

impl From<tessera_fsdp::ComputeError> for ModelError {
    fn from(e: tessera_fsdp::ComputeError) -> Self {
        match e {
            tessera_fsdp::ComputeError::Torch(e) => ModelError::Torch(e),
            tessera_fsdp::ComputeError::Shim(e) => ModelError::Shim(e),
            tessera_fsdp::ComputeError::Collective(e) => ModelError::Collective(e),
            tessera_fsdp::ComputeError::MissingParam { key } => ModelError::MissingParam { key },
        }
    }
}

impl ModelError {
    /// An [`ModelError::InvalidConfig`] of the config.json in `dir`, said with the folder.
    pub(crate) fn in_dir(self, dir: &std::path::Path) -> Self {
        match self {
            ModelError::InvalidConfig(reason) => ModelError::BadConfig {
                dir: dir.to_path_buf(),
                reason,
            },
            other => other,
        }
    }
}

pub(crate) type Result<T, E = ModelError> = std::result::Result<T, E>;
