//! Why a tokenizer, a model folder or a chat template could not be used, or a text not
//! tokenized. Each message names the file, folder or record; a wrapped library error is the
//! `source()`, never part of the message.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot load tokenizer")]
    LoadTokenizer {
        path: PathBuf,
        source: tokenizers::Error,
    },
    #[error("{path}: cannot load tokenizer: {detail}")]
    Tokenizer { path: PathBuf, detail: String },
    #[error("tokenizer {path} has no token {token}, which the {template} template needs")]
    MissingToken {
        path: PathBuf,
        token: String,
        template: String,
    },
    #[error("{path}: chat template: {detail}")]
    ChatTemplate { path: PathBuf, detail: String },
    #[error("{dir}: {detail}")]
    ModelFolder { dir: PathBuf, detail: String },
    #[error("record {id}: tokenizer failed")]
    Tokenize {
        id: String,
        source: tokenizers::Error,
    },
}

impl TextError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TextError::Io {
            path: path.into(),
            source,
        }
    }
}
