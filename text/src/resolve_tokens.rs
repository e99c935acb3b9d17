//! A tokenizer's special tokens, from its own files: `tokenizer.json` (the vocabulary and its
//! added tokens) and, beside it when there is one, `tokenizer_config.json` (`eos_token`,
//! `pad_token`, as transformers reads them). What they resolve to is recorded in index.json
//! ([`crate::SpecialTokens`]) and read from there by every later step.
//!
//! * The image token: `<|image_pad|>` (Qwen's), else `<image>`; a tokenizer with neither gets
//!   `<image>` added after its last id, as LLaVA adds its image tokens (the language model then
//!   grows an embedding row for it, trained in stage 1).
//! * The frame: `<|vision_start|>` and `<|vision_end|>` when the tokenizer has both.
//! * The end of sequence: `eos_token` of tokenizer_config.json, else the first of the usual
//!   spellings the vocabulary holds (`<|endoftext|>`, `</s>`, `<|end_of_text|>`, `<eos>`).
//! * The padding: `pad_token`, else the end of sequence.
use crate::error::TextError;
use crate::special_tokens::{SpecialTokens, Token};
use std::path::Path;
use tokenizers::{AddedToken, Tokenizer};

/// The tokenizer_config.json beside `tokenizer` (a tokenizer.json path), if any.
pub(crate) fn tokenizer_config(tokenizer: &Path) -> Result<Option<serde_json::Value>, TextError> {
    let Some(path) = tokenizer.parent().map(|d| d.join("tokenizer_config.json")) else {
        return Ok(None);
    };
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| TextError::io(&path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TextError::Tokenizer {
            path: path.clone(),
            detail: format!("tokenizer_config.json is not valid JSON: {e}"),
        })
}

/// A token named in tokenizer_config.json: a string, or an object with its `content`.
pub(crate) fn config_token(config: Option<&serde_json::Value>, key: &str) -> Option<String> {
    let value = config?.get(key)?;
    value
        .as_str()
        .or_else(|| value.get("content").and_then(|c| c.as_str()))
        .map(str::to_string)
}

/// The usual spellings of an end of sequence, in the order they are tried without a config.
const EOS_SPELLINGS: [&str; 4] = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"];

/// Resolves `tokenizer`'s special tokens (see the module docs), adding `<image>` to it when it
/// has no image token. `path` names the tokenizer in errors.
pub(crate) fn resolve(
    tokenizer: &mut Tokenizer,
    config: Option<&serde_json::Value>,
    path: &Path,
) -> Result<SpecialTokens, TextError> {
    let token = |tokenizer: &Tokenizer, text: &str| {
        tokenizer.token_to_id(text).map(|id| Token::new(text, id))
    };
    let mut added = Vec::new();
    let image = match token(tokenizer, "<|image_pad|>").or_else(|| token(tokenizer, "<image>")) {
        Some(image) => image,
        None => {
            tokenizer.add_special_tokens(&[AddedToken::from("<image>", true)]);
            added.push("<image>".to_string());
            token(tokenizer, "<image>").ok_or_else(|| TextError::Tokenizer {
                path: path.to_path_buf(),
                detail: "adding <image> to it failed".into(),
            })?
        }
    };
    let image_frame = token(tokenizer, "<|vision_start|>").zip(token(tokenizer, "<|vision_end|>"));
    let eos = match config_token(config, "eos_token") {
        Some(text) => token(tokenizer, &text).ok_or_else(|| TextError::Tokenizer {
            path: path.to_path_buf(),
            detail: format!("tokenizer_config.json's eos_token {text:?} is not in its vocabulary"),
        })?,
        None => EOS_SPELLINGS
            .iter()
            .find_map(|t| token(tokenizer, t))
            .ok_or_else(|| TextError::Tokenizer {
                path: path.to_path_buf(),
                detail: format!(
                    "no end-of-sequence token: it has none of {EOS_SPELLINGS:?} and no \
                     tokenizer_config.json beside it names its eos_token"
                ),
            })?,
    };
    let pad_id = config_token(config, "pad_token")
        .and_then(|text| tokenizer.token_to_id(&text))
        .unwrap_or(eos.id);
    Ok(SpecialTokens {
        image,
        image_frame,
        eos,
        pad_id,
        added,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer with `vocab` (ids in order) and `special` added tokens after it.
    fn tokenizer(vocab: &[&str], special: &[&str]) -> Tokenizer {
        let vocab: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i.into()))
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": vocab.keys().next()},
        });
        let mut t: Tokenizer = json.to_string().parse().expect("a word-level tokenizer");
        let added: Vec<AddedToken> = special.iter().map(|s| AddedToken::from(*s, true)).collect();
        t.add_special_tokens(&added);
        t
    }

    #[test]
    fn a_tokenizer_without_an_image_token_gets_image_added_after_its_last_id() -> anyhow::Result<()>
    {
        let mut t = tokenizer(
            &["a", "b", "c"],
            &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        );
        let config = serde_json::json!({"eos_token": "<|im_end|>", "pad_token": null});
        let tokens = resolve(&mut t, Some(&config), Path::new("tokenizer.json"))?;
        assert_eq!(tokens.image, Token::new("<image>", 6));
        assert_eq!(tokens.added, ["<image>"]);
        assert_eq!(
            (tokens.eos, tokens.pad_id),
            (Token::new("<|im_end|>", 5), 5)
        );
        assert_eq!(tokens.image_frame, None);
        assert_eq!(t.token_to_id("<image>"), Some(6));
        Ok(())
    }

    #[test]
    fn qwen_spellings_are_found_without_a_config() -> anyhow::Result<()> {
        let mut t = tokenizer(
            &["a"],
            &[
                "<|endoftext|>",
                "<|vision_start|>",
                "<|vision_end|>",
                "<|image_pad|>",
            ],
        );
        let tokens = resolve(&mut t, None, Path::new("tokenizer.json"))?;
        assert_eq!(tokens.image, Token::new("<|image_pad|>", 4));
        assert!(tokens.added.is_empty());
        assert_eq!(tokens.eos, Token::new("<|endoftext|>", 1));
        let (start, end) = tokens.image_frame.expect("both frame tokens");
        assert_eq!((start.id, end.id), (2, 3));
        // An eos the config names but the vocabulary lacks is refused, naming it.
        let config = serde_json::json!({"eos_token": {"content": "</s>"}});
        let err = resolve(&mut t, Some(&config), Path::new("tok.json")).expect_err("no </s>");
        assert!(err.to_string().contains("tok.json"), "{err}");
        Ok(())
    }
}
