//! Chat templates: a record's turns become one string with special tokens, plus the byte
//! ranges that are supervised; the string is tokenized once (so ids equal a fresh tokenization
//! of the rendered text) and a token is supervised when its first byte lies in such a range.
//!
//! * `plain` (LLaVA-Pretrain, stage 1). Image record: exactly one human turn holding `<image>`
//!   and one gpt turn (the caption). LLaVA renders `<image>` + caption + `\n` and supervises the
//!   caption part; Qwen has no BOS/EOS added by the tokenizer, so tessera appends
//!   `<|endoftext|>` (151643) to teach the model to stop:
//!   `<|image_pad|>` caption `\n` `<|endoftext|>`, supervised: caption, `\n`, `<|endoftext|>`.
//!   The human turn's text (the instruction) is dropped, as in LLaVA.
//!   Text-only record with `plain`: every turn's text followed by `\n`, then `<|endoftext|>`;
//!   the gpt turns (with their `\n`) and the `<|endoftext|>` are supervised.
//! * `chatml` (Qwen2.5 chat, multi-turn mixtures):
//!   `<|im_start|>{user|assistant|system}\n{text}<|im_end|>\n` per turn, no default system
//!   prompt added. `<image>` in a human turn becomes `<|vision_start|><|image_pad|><|vision_end|>`
//!   (Qwen2-VL's framing; only `<|image_pad|>` is expanded later to the vision tokens).
//!   Supervised: each assistant turn's text and its `<|im_end|>` (not the role header, not the
//!   newline after `<|im_end|>`).
//!
//! Every image record holds exactly one `<image>` (in a human turn) and so exactly one
//! `<|image_pad|>` id; text-only records hold none.
use crate::error::IngestError;
use crate::reason::Reason;
use crate::record::Record;
use std::ops::Range;
use std::path::Path;

pub(crate) const IMAGE_TAG: &str = "<image>";
pub(crate) const IMAGE_PAD: &str = "<|image_pad|>";
pub(crate) const END_OF_TEXT: &str = "<|endoftext|>";
pub(crate) const IM_START: &str = "<|im_start|>";
pub(crate) const IM_END: &str = "<|im_end|>";
pub(crate) const VISION_START: &str = "<|vision_start|>";
pub(crate) const VISION_END: &str = "<|vision_end|>";

/// Which chat template turns a record into tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Template {
    Plain,
    Chatml,
}

impl Template {
    pub fn name(self) -> &'static str {
        match self {
            Template::Plain => "plain",
            Template::Chatml => "chatml",
        }
    }

    fn special_tokens(self) -> &'static [&'static str] {
        match self {
            Template::Plain => &[IMAGE_PAD, END_OF_TEXT],
            Template::Chatml => &[IMAGE_PAD, IM_START, IM_END, VISION_START, VISION_END],
        }
    }
}

impl std::str::FromStr for Template {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "plain" => Ok(Template::Plain),
            "chatml" => Ok(Template::Chatml),
            other => Err(format!(
                "unknown template {other:?} (expected plain or chatml)"
            )),
        }
    }
}

/// A rendered record: the text and the byte ranges whose tokens are supervised.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub text: String,
    pub supervised: Vec<Range<usize>>,
}

/// A rejected record's reason and detail.
pub(crate) type TemplateError = (Reason, String);

#[derive(Clone, Copy, PartialEq)]
enum Role {
    User,
    Assistant,
    System,
}

fn role_of(from: &str) -> Result<Role, TemplateError> {
    match from {
        "human" | "user" => Ok(Role::User),
        "gpt" | "assistant" => Ok(Role::Assistant),
        "system" => Ok(Role::System),
        other => Err((
            Reason::UnknownRole,
            format!("turn from {other:?} is none of human, gpt, system"),
        )),
    }
}

/// Checks the turns: known roles, a non-empty gpt turn, and the `<image>` count.
fn check_turns(record: &Record) -> Result<Vec<Role>, TemplateError> {
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
    match (record.image.is_some(), tags) {
        (true, 0) => Err((
            Reason::MissingImagePlaceholder,
            "image record without <image> in its turns".into(),
        )),
        (true, 1) | (false, 0) => Ok(roles),
        (true, n) => Err((
            Reason::MultipleImagePlaceholders,
            format!("{n} <image> tags for one image"),
        )),
        (false, n) => Err((
            Reason::PlaceholderWithoutImage,
            format!("{n} <image> tags but no image"),
        )),
    }
}

/// Appends `text` to `out`, marking it supervised when asked.
fn push(out: &mut Rendered, text: &str, supervised: bool) {
    let start = out.text.len();
    out.text.push_str(text);
    if supervised && !text.is_empty() {
        out.supervised.push(start..out.text.len());
    }
}

/// Renders `record` with `template` (see the module docs), or says why it is rejected.
pub(crate) fn render(template: Template, record: &Record) -> Result<Rendered, TemplateError> {
    let roles = check_turns(record)?;
    let mut out = Rendered {
        text: String::new(),
        supervised: Vec::new(),
    };
    match template {
        Template::Plain if record.image.is_some() => {
            if roles != [Role::User, Role::Assistant] {
                return Err((
                    Reason::BadConversation,
                    "plain template needs one human turn and one gpt turn".into(),
                ));
            }
            push(&mut out, IMAGE_PAD, false);
            push(&mut out, &record.conversations[1].text, true);
            push(&mut out, "\n", true);
            push(&mut out, END_OF_TEXT, true);
        }
        Template::Plain => {
            for (turn, role) in record.conversations.iter().zip(&roles) {
                let supervised = *role == Role::Assistant;
                push(&mut out, &turn.text, supervised);
                push(&mut out, "\n", supervised);
            }
            push(&mut out, END_OF_TEXT, true);
        }
        Template::Chatml => {
            for (turn, role) in record.conversations.iter().zip(&roles) {
                let name = match role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::System => "system",
                };
                push(&mut out, &format!("{IM_START}{name}\n"), false);
                let assistant = *role == Role::Assistant;
                if assistant {
                    push(&mut out, &turn.text, true);
                } else {
                    let framed = format!("{VISION_START}{IMAGE_PAD}{VISION_END}");
                    push(&mut out, &turn.text.replace(IMAGE_TAG, &framed), false);
                }
                push(&mut out, IM_END, assistant);
                push(&mut out, "\n", false);
            }
        }
    }
    Ok(out)
}

/// Token ids and label mask of a rendered record.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenized {
    pub input_ids: Vec<u32>,
    pub label_mask: Vec<bool>,
}

/// The tokenizer plus the ids the templates need; shared by all workers.
pub struct Encoder {
    tokenizer: tokenizers::Tokenizer,
    /// The same tokenizer without its normalizer, for all-ASCII text: Qwen's normalizer is
    /// NFC, the identity on ASCII, so ids and offsets are the same and the per-character
    /// Unicode composition pass (a tenth of the tokenizing time on captions) is skipped.
    ascii: tokenizers::Tokenizer,
    pub template: Template,
    pub image_pad_id: u32,
    /// Hex sha256 of tokenizer.json.
    pub fingerprint: String,
}

impl Encoder {
    pub fn load(path: &Path, template: Template) -> Result<Self, IngestError> {
        let (fingerprint, _) = shards::sha256_file(path)?;
        let tokenizer =
            tokenizers::Tokenizer::from_file(path).map_err(|e| IngestError::Tokenizer {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
        for token in template.special_tokens() {
            if tokenizer.token_to_id(token).is_none() {
                return Err(IngestError::MissingToken {
                    path: path.to_path_buf(),
                    token: token.to_string(),
                    template: template.name().to_string(),
                });
            }
        }
        let image_pad_id = tokenizer.token_to_id(IMAGE_PAD).unwrap_or_default();
        let mut ascii = tokenizer.clone();
        if is_identity_on_ascii(tokenizer.get_normalizer()) {
            ascii.with_normalizer(None::<tokenizers::NormalizerWrapper>);
        }
        Ok(Encoder {
            tokenizer,
            ascii,
            template,
            image_pad_id,
            fingerprint,
        })
    }

    /// Tokenizes rendered text; `Ok(Err(..))` rejects a record whose own text smuggles in a
    /// `<|image_pad|>` (the placeholder count must equal the image count).
    pub fn encode(
        &self,
        id: &str,
        rendered: &Rendered,
        images: usize,
    ) -> Result<Result<Tokenized, TemplateError>, IngestError> {
        let tokenizer = if rendered.text.is_ascii() {
            &self.ascii
        } else {
            &self.tokenizer
        };
        let encoding = tokenizer
            .encode(rendered.text.as_str(), false)
            .map_err(|e| IngestError::Tokenize {
                id: id.to_string(),
                detail: e.to_string(),
            })?;
        let input_ids = encoding.get_ids().to_vec();
        let pads = input_ids
            .iter()
            .filter(|&&t| t == self.image_pad_id)
            .count();
        if pads != images {
            let reason = if images == 0 {
                Reason::PlaceholderWithoutImage
            } else {
                Reason::MultipleImagePlaceholders
            };
            return Ok(Err((
                reason,
                format!("{pads} {IMAGE_PAD} tokens for {images} images"),
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

/// Whether a normalizer leaves ASCII text unchanged (none, or one of the Unicode normal
/// forms); anything else (lowercasing, replacements, ...) keeps the full tokenizer.
fn is_identity_on_ascii(normalizer: Option<&tokenizers::NormalizerWrapper>) -> bool {
    use tokenizers::NormalizerWrapper as N;
    matches!(
        normalizer,
        None | Some(N::NFC(_) | N::NFD(_) | N::NFKC(_) | N::NFKD(_))
    )
}
