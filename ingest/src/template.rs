//! A record through its chat template: its turns are checked (known roles, a non-empty
//! assistant turn, one `<image>` per image), rendered by [`tessera_text::chat::Template::render`]
//! (the one definition of the templates and their special tokens) into one string with special
//! tokens plus the byte ranges that are supervised; [`tessera_text::Encoder`] tokenizes the string
//! once and counts its image tokens, and [`encode`] rejects a record whose count differs.
//!
//! A record holds one `<image>` (in a user or system turn) per image, taken by the images in
//! order, and so one image token id per image; text-only records hold none. A count that
//! differs is rejected as `image_placeholder_mismatch`; the `llava` layout keeps the names its
//! one-image records were always rejected under (`missing_image_placeholder`,
//! `multiple_image_placeholders`, `placeholder_without_image`). The special tokens are the
//! tokenizer's own (`tessera-text`'s `resolve_tokens.rs`).
use crate::error::IngestError;
use crate::layout::Format;
use crate::reason::Reason;
use crate::record::Record;
use tessera_text::chat::{Rendered, Role, Template, IMAGE_TAG};
use tessera_text::{Encoder, SpecialTokens, Tokenized};

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

/// Tokenizes `rendered` with `encoder`; `Ok(Err(..))` rejects a record whose own text smuggles
/// in an image token (the placeholder count must equal the image count), naming the mismatch
/// as `format` does.
pub(crate) fn encode(
    encoder: &Encoder,
    id: &str,
    rendered: &Rendered,
    images: usize,
    format: Format,
) -> Result<Result<Tokenized, TemplateError>, IngestError> {
    let tokenized = encoder.encode(id, rendered)?;
    let pads = tokenized.placeholders;
    if pads != images {
        let reason = match (format, images) {
            (Format::Llava, 0) => Reason::PlaceholderWithoutImage,
            (Format::Llava, 1) => Reason::MultipleImagePlaceholders,
            _ => Reason::ImagePlaceholderMismatch,
        };
        let image = &encoder.tokens.image.text;
        return Ok(Err((
            reason,
            format!("{pads} {image} tokens for {images} images"),
        )));
    }
    Ok(Ok(tokenized))
}
