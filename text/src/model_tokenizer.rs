//! The text side of a language model folder as transformers reads it: `tokenizer.json`,
//! `tokenizer_config.json` (its special tokens), the chat template (`chat_template.jinja` or
//! the config's `chat_template`) and `generation_config.json` (the ids generation stops at).
//! What `tessera generate --lm DIR` chats with, and what `train` compares the shards'
//! tokenizer against.
use crate::chat::Role;
use crate::chat_template::ChatTemplate;
use crate::error::TextError;
use crate::resolve_tokens::{config_token, tokenizer_config};
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// A model folder's tokenizer, chat template and stop ids.
pub struct ModelTokenizer {
    pub tokenizer: Tokenizer,
    /// `None` when the folder has no chat template (a base model).
    pub chat_template: Option<ChatTemplate>,
    /// Generation ends after one of these: the config's `eos_token` and every
    /// `eos_token_id` of generation_config.json.
    pub stop_ids: Vec<u32>,
    /// The folder's tokenizer.json.
    pub path: PathBuf,
}

impl ModelTokenizer {
    /// Reads the folder `dir` (its tokenizer.json is required).
    pub fn from_dir(dir: &Path) -> Result<Self, TextError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TextError::ModelFolder {
                dir: dir.to_path_buf(),
                detail: "no tokenizer.json (a language model folder as transformers saves it \
                         holds one)"
                    .into(),
            });
        }
        let tokenizer = Tokenizer::from_file(&path).map_err(|source| TextError::LoadTokenizer {
            path: path.clone(),
            source,
        })?;
        let config = tokenizer_config(&path)?;
        let chat_template = ChatTemplate::from_dir(dir, config.as_ref())?;
        let mut stop_ids: Vec<u32> = config_token(config.as_ref(), "eos_token")
            .and_then(|t| tokenizer.token_to_id(&t))
            .into_iter()
            .collect();
        for id in generation_eos_ids(dir)? {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        }
        Ok(ModelTokenizer {
            tokenizer,
            chat_template,
            stop_ids,
            path,
        })
    }

    /// The ids of one user turn through the model's chat template, ready for the assistant's
    /// answer (`add_generation_prompt`), tokenized as transformers' `apply_chat_template`
    /// does (no special tokens added: the template writes them).
    pub fn chat_prompt(&self, user: &str) -> Result<Vec<u32>, TextError> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or_else(|| TextError::ModelFolder {
                dir: self.path.parent().unwrap_or(&self.path).to_path_buf(),
                detail: "no chat template (chat_template.jinja, or tokenizer_config.json's \
                         chat_template): a base model has none to chat through"
                    .into(),
            })?;
        let text = template.render(&[(Role::User, user)], true)?;
        let encoding = self
            .tokenizer
            .encode(text.as_str(), false)
            .map_err(|source| TextError::Tokenize {
                id: "the chat prompt".into(),
                source,
            })?;
        Ok(encoding.get_ids().to_vec())
    }
}

/// The `eos_token_id` (one id or a list) of the folder's generation_config.json, if it has one.
fn generation_eos_ids(dir: &Path) -> Result<Vec<u32>, TextError> {
    let path = dir.join("generation_config.json");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| TextError::io(&path, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| TextError::ModelFolder {
            dir: dir.to_path_buf(),
            detail: format!("generation_config.json is not valid JSON: {e}"),
        })?;
    let ids = match value.get("eos_token_id") {
        Some(serde_json::Value::Array(list)) => list.iter().filter_map(|v| v.as_u64()).collect(),
        Some(v) => v.as_u64().into_iter().collect(),
        None => Vec::new(),
    };
    Ok(ids.into_iter().map(|id| id as u32).collect())
}
