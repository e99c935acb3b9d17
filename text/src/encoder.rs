//! A record through its chat template: its turns are checked (known roles, a non-empty
//! assistant turn, one `<image>` per image), rendered by [`shards::chat::Template::render`]
//! (the one definition of the templates and their special tokens) into one string with special
//! tokens plus the byte ranges that are supervised; the string is tokenized once (so ids equal
//! a fresh tokenization of the rendered text) and a token is supervised when its first byte
//! lies in such a range.
//!
//! A record holds one `<image>` (in a user or system turn) per image, taken by the images in
//! order, and so one image token id per image; text-only records hold none. A count that
//! differs is rejected as `image_placeholder_mismatch`; the `llava` layout keeps the names its
//! one-image records were always rejected under (`missing_image_placeholder`,
//! `multiple_image_placeholders`, `placeholder_without_image`). The special tokens are the
//! tokenizer's own (`special_tokens.rs`), and its post-processor decides whether a BOS leads
//! the ids, as transformers' `tokenizer(text)` does.
use crate::error::IngestError;
use crate::layout::Format;
use crate::reason::Reason;
use crate::record::Record;
use crate::special_tokens;
use shards::chat::{Rendered, Role, IMAGE_TAG};
use shards::SpecialTokens;
use std::path::Path;

pub use shards::chat::Template;

/// A rejected record's reason and detail.
pub(crate) type TemplateError = (Reason, String);

fn role_of(from: &str) -> Result<Role, TemplateError> {
    Role::from_llava(from).ok_or_else(|| {
        (
            Reason::UnknownRole,
            format!("turn from {from:?} is none of human, gpt, system"),
        )
    })
}

/// The reason for `tags` `<image>` tags against `images` images (they differ).
fn mismatch(format: Format, images: usize, tags: usize) -> TemplateError {
    let detail = format!("{tags} <image> tags for {images} images");
    let reason = match (format, images, tags) {
        (Format::Llava, 1, 0) => Reason::MissingImagePlaceholder,
        (Format::Llava, 1, _) => Reason::MultipleImagePlaceholders,
        (Format::Llava, 0, _) => Reason::PlaceholderWithoutImage,
        _ => Reason::ImagePlaceholderMismatch,
    };
    let detail = match reason {
        Reason::MissingImagePlaceholder => "image record without <image> in its turns".into(),
        Reason::MultipleImagePlaceholders => format!("{tags} <image> tags for one image"),
        Reason::PlaceholderWithoutImage => format!("{tags} <image> tags but no image"),
        _ => detail,
    };
    (reason, detail)
}

/// Checks the turns: known roles, a non-empty gpt turn, and the `<image>` count.
fn check_turns(record: &Record, format: Format) -> Result<Vec<Role>, TemplateError> {
    let roles = record
        .conversations
        .iter()
        .map(|t| role_of(&t.role))
        .collect::<Result<Vec<_>, _>>()?;
    if !roles.contains(&Role::Assistant) {
        return Err((Reason::BadConversation, "no gpt turn".into()));
    }
    let mut tags = 0;
    for (turn, role) in record.conversations.iter().zip(&roles) {
        let n = turn.text.matches(IMAGE_TAG).count();
        if *role == Role::Assistant {
            if n > 0 {
                return Err((Reason::BadConversation, "<image> inside a gpt turn".into()));
            }
            if turn.text.trim().is_empty() {
                return Err((Reason::EmptyCaption, "a gpt turn is empty".into()));
            }
        }
        tags += n;
    }
    let images = record.images.len();
    if tags != images {
        return Err(mismatch(format, images, tags));
    }
    Ok(roles)
}

/// Renders `record` with `template` and `tokens`, or says why it is rejected. Also returns each turn's
/// role, which the shard stores by its canonical name (`user`, `assistant`, `system`).
pub(crate) fn render(
    template: Template,
    tokens: &SpecialTokens,
    record: &Record,
    format: Format,
) -> Result<(Rendered, Vec<Role>), TemplateError> {
    let roles = check_turns(record, format)?;
    let images = record.images.len();
    if template == Template::Plain && images > 0 && roles != [Role::User, Role::Assistant] {
        return Err((
            Reason::BadConversation,
            "plain template needs one human turn and one gpt turn".into(),
        ));
    }
    let turns: Vec<(Role, &str)> = roles
        .iter()
        .zip(&record.conversations)
        .map(|(&role, turn)| (role, turn.text.as_str()))
        .collect();
    Ok((template.render(&turns, images, tokens), roles))
}

/// Token ids and label mask of a rendered record.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenized {
    pub input_ids: Vec<u32>,
    pub label_mask: Vec<bool>,
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
    pub fn load(path: &Path, template: Template) -> Result<Self, IngestError> {
        let mut tokenizer = load_tokenizer(path)?;
        let config = special_tokens::tokenizer_config(path)?;
        let tokens = special_tokens::resolve(&mut tokenizer, config.as_ref(), path)?;
        Self::new(path, tokenizer, template, tokens)
    }

    /// The tokenizer at `path` with the special tokens a dataset recorded (index.json's, a
    /// run's): each must be the tokenizer's token of that id, so a tokenizer other than the
    /// dataset's is refused.
    pub fn with_tokens(
        path: &Path,
        template: Template,
        tokens: SpecialTokens,
    ) -> Result<Self, IngestError> {
        let tokenizer = load_tokenizer(path)?;
        let mut recorded = vec![&tokens.image, &tokens.eos];
        if let Some((start, end)) = &tokens.image_frame {
            recorded.extend([start, end]);
        }
        for token in recorded {
            let found = tokenizer.token_to_id(&token.text);
            if found != Some(token.id) {
                return Err(IngestError::Tokenizer {
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
    ) -> Result<Self, IngestError> {
        let (fingerprint, _) = shards::sha256_file(path)?;
        for token in template.markers() {
            if tokenizer.token_to_id(token).is_none() {
                return Err(IngestError::MissingToken {
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
    pub fn tokenizer_json(&self, source: Vec<u8>) -> Result<Vec<u8>, IngestError> {
        if self.tokens.added.is_empty() {
            return Ok(source);
        }
        self.tokenizer
            .to_string(true)
            .map(String::into_bytes)
            .map_err(|e| IngestError::Tokenizer {
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

    /// Tokenizes rendered text; `Ok(Err(..))` rejects a record whose own text smuggles in an
    /// image token (the placeholder count must equal the image count).
    pub fn encode(
        &self,
        id: &str,
        rendered: &Rendered,
        images: usize,
    ) -> Result<Result<Tokenized, TemplateError>, IngestError> {
        self.encode_as(id, rendered, images, Format::Llava)
    }

    /// [`Self::encode`], naming a placeholder mismatch as `format` does.
    pub(crate) fn encode_as(
        &self,
        id: &str,
        rendered: &Rendered,
        images: usize,
        format: Format,
    ) -> Result<Result<Tokenized, TemplateError>, IngestError> {
        let tokenizer = if rendered.text.is_ascii() {
            &self.ascii
        } else {
            &self.tokenizer
        };
        let encoding = tokenizer
            .encode(rendered.text.as_str(), true)
            .map_err(|source| IngestError::Tokenize {
                id: id.to_string(),
                source,
            })?;
        let input_ids = encoding.get_ids().to_vec();
        let image = &self.tokens.image;
        let pads = input_ids.iter().filter(|&&t| t == image.id).count();
        if pads != images {
            let reason = match (format, images) {
                (Format::Llava, 0) => Reason::PlaceholderWithoutImage,
                (Format::Llava, 1) => Reason::MultipleImagePlaceholders,
                _ => Reason::ImagePlaceholderMismatch,
            };
            return Ok(Err((
                reason,
                format!("{pads} {} tokens for {images} images", image.text),
            )));
        }
        let label_mask = encoding
            .get_offsets()
            .iter()
            .map(|&(start, _)| rendered.supervised.iter().any(|r| r.contains(&start)))
            .collect();
        Ok(Ok(Tokenized {
            input_ids,
            label_mask,
        }))
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }
}

fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer, IngestError> {
    tokenizers::Tokenizer::from_file(path).map_err(|source| IngestError::LoadTokenizer {
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
