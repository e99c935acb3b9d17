//! The tokenizer and the special tokens the templates write ([`Encoder`]): rendered text
//! ([`crate::chat::Rendered`]) is tokenized once (so ids equal a fresh tokenization of the
//! rendered text) and a token is supervised when its first byte lies in a supervised range.
//! The special tokens are the tokenizer's own (`resolve_tokens.rs`), and its post-processor
//! decides whether a BOS leads the ids, as transformers' `tokenizer(text)` does.
//!
//! [`Encoder::encode`] counts the image tokens in the ids ([`Tokenized::placeholders`]) and
//! leaves the verdict to the caller: ingest rejects a record whose count is not its image count,
//! under the reason its layout names.
use crate::chat::{Rendered, Template};
use crate::error::TextError;
use crate::resolve_tokens;
use crate::special_tokens::SpecialTokens;
use sha2::{Digest, Sha256};
use std::path::Path;

/// Token ids and label mask of a rendered record.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenized {
    pub input_ids: Vec<u32>,
    pub label_mask: Vec<bool>,
    /// How many of the ids are the image token: one per image, unless the record's own text
    /// smuggled one in (the caller decides what a differing count means).
    pub placeholders: usize,
}

/// The tokenizer plus the special tokens the templates write; shared by all workers.
pub struct Encoder {
    tokenizer: tokenizers::Tokenizer,
    /// The same tokenizer without its normalizer, for all-ASCII text: Qwen's normalizer is
    /// NFC, the identity on ASCII, so ids and offsets are the same and the per-character
    /// Unicode composition pass (a tenth of the tokenizing time on captions) is skipped.
    ascii: tokenizers::Tokenizer,
    pub template: Template,
    /// The tokenizer's special tokens (`<image>` added to it when it had no image token).
    pub tokens: SpecialTokens,
    /// Hex sha256 of the tokenizer.json given (before any token was added).
    pub fingerprint: String,
}

impl Encoder {
    /// Loads the tokenizer at `path` (and the tokenizer_config.json beside it, when there is
    /// one), resolves its special tokens, and checks it knows the template's markers.
    pub fn load(path: &Path, template: Template) -> Result<Self, TextError> {
        let mut tokenizer = load_tokenizer(path)?;
        let config = resolve_tokens::tokenizer_config(path)?;
        let tokens = resolve_tokens::resolve(&mut tokenizer, config.as_ref(), path)?;
        Self::new(path, tokenizer, template, tokens)
    }

    /// The tokenizer at `path` with the special tokens a dataset recorded (index.json's, a
    /// run's): each must be the tokenizer's token of that id, so a tokenizer other than the
    /// dataset's is refused.
    pub fn with_tokens(
        path: &Path,
        template: Template,
        tokens: SpecialTokens,
    ) -> Result<Self, TextError> {
        let tokenizer = load_tokenizer(path)?;
        let mut recorded = vec![&tokens.image, &tokens.eos];
        if let Some((start, end)) = &tokens.image_frame {
            recorded.extend([start, end]);
        }
        for token in recorded {
            let found = tokenizer.token_to_id(&token.text);
            if found != Some(token.id) {
                return Err(TextError::Tokenizer {
                    path: path.to_path_buf(),
                    detail: format!(
                        "{} is {found:?} in it, but the dataset's ids say {}: not the \
                         tokenizer the ids were made with",
                        token.text, token.id
                    ),
                });
            }
        }
        Self::new(path, tokenizer, template, tokens)
    }

    fn new(
        path: &Path,
        tokenizer: tokenizers::Tokenizer,
        template: Template,
        tokens: SpecialTokens,
    ) -> Result<Self, TextError> {
        let fingerprint = sha256_file(path)?;
        for token in template.markers() {
            if tokenizer.token_to_id(token).is_none() {
                return Err(TextError::MissingToken {
                    path: path.to_path_buf(),
                    token: token.to_string(),
                    template: template.name().to_string(),
                });
            }
        }
        let mut ascii = tokenizer.clone();
        if is_identity_on_ascii(tokenizer.get_normalizer()) {
            ascii.with_normalizer(None::<tokenizers::NormalizerWrapper>);
        }
        Ok(Encoder {
            tokenizer,
            ascii,
            template,
            tokens,
            fingerprint,
        })
    }

    /// The tokenizer.json the ids are made with: `source` (the bytes of the file given) as
    /// is, or, when tokens were added to it, the tokenizer with them, serialized.
    pub fn tokenizer_json(&self, source: Vec<u8>) -> Result<Vec<u8>, TextError> {
        if self.tokens.added.is_empty() {
            return Ok(source);
        }
        self.tokenizer
            .to_string(true)
            .map(String::into_bytes)
            .map_err(|e| TextError::Tokenizer {
                path: "tokenizer.json".into(),
                detail: format!(
                    "cannot serialize it with {:?} added: {e}",
                    self.tokens.added
                ),
            })
    }

    /// The ids of `text` as the tokenizer makes them (its post-processor adds a BOS when it
    /// has one), without a label mask: a generation prompt.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, tokenizers::Error> {
        Ok(self.tokenizer.encode(text, true)?.get_ids().to_vec())
    }

    /// Tokenizes rendered text (`id` names the record in errors): its ids, the label mask of
    /// the supervised ranges, and how many image tokens the ids hold.
    pub fn encode(&self, id: &str, rendered: &Rendered) -> Result<Tokenized, TextError> {
        let tokenizer = if rendered.text.is_ascii() {
            &self.ascii
        } else {
            &self.tokenizer
        };
        let encoding = tokenizer
            .encode(rendered.text.as_str(), true)
            .map_err(|source| TextError::Tokenize {
                id: id.to_string(),
                source,
            })?;
        let input_ids = encoding.get_ids().to_vec();
        let placeholders = input_ids
            .iter()
            .filter(|&&t| t == self.tokens.image.id)
            .count();
        let label_mask = encoding
            .get_offsets()
            .iter()
            .map(|&(start, _)| rendered.supervised.iter().any(|r| r.contains(&start)))
            .collect();
        Ok(Tokenized {
            input_ids,
            label_mask,
            placeholders,
        })
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }
}

/// Hex sha256 of the file at `path`.
fn sha256_file(path: &Path) -> Result<String, TextError> {
    let mut file = std::fs::File::open(path).map_err(|e| TextError::io(path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| TextError::io(path, e))?;
    Ok(hex::encode(hasher.finalize()))
}

fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer, TextError> {
    tokenizers::Tokenizer::from_file(path).map_err(|source| TextError::LoadTokenizer {
        path: path.to_path_buf(),
        source,
    })
}

/// Whether a normalizer leaves ASCII text unchanged (none, or one of the Unicode normal
/// forms); anything else (lowercasing, replacements, ...) keeps the full tokenizer.
fn is_identity_on_ascii(normalizer: Option<&tokenizers::NormalizerWrapper>) -> bool {
    use tokenizers::NormalizerWrapper as N;
    matches!(
        normalizer,
        None | Some(N::NFC(_) | N::NFD(_) | N::NFKC(_) | N::NFKD(_))
    )
}
