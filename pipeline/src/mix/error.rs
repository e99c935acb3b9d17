//! `MixError`: what a mixture file or a mixture of shard sets can get wrong, naming the file
//! and the source.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MixError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a mixture file")]
    Toml {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("mixture source {name}: {detail}")]
    Source { name: String, detail: String },
    #[error("mixture source {name}")]
    Shards {
        name: String,
        source: tessera_shards::ShardError,
    },
}
