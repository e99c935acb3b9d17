//! TRL / prime-rl `messages` rows: `messages` is a list of `{role, content}`, `content` a list
//! of typed parts (`{type: "image"}` or `{type: "text", text}`, other fields ignored) or a
//! plain string; `images` holds the images (Image structs or paths), taken by the image parts
//! in order. A message's parts are joined without separators, an image part written as
//! `<image>`: `[image, image, text "What differs?"]` is `<image><image>What differs?`, the
//! same turn text the_cauldron's rule makes for those images (so the same sample gives the
//! same shard in either layout). Image parts that do not match the images one to one reject
//! the row as `image_placeholder_mismatch`; a video part as `video_unsupported`.
use super::columns::{field, list_at, str_at};
use super::images::images_of;
use crate::reason::Reason;
use crate::record::Record;
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use tessera_shards::Turn;
use tessera_text::chat::IMAGE_TAG;

/// The columns a messages row needs.
pub(crate) const COLUMNS: [&str; 2] = ["messages", "images"];

/// Record of `row` of `batch` (id already chosen).
pub(crate) fn record(batch: &RecordBatch, row: usize, id: String) -> Record {
    let refuse = |reason, detail: String| Record::refused(id.clone(), reason, detail);
    let Some(messages) = batch
        .column_by_name("messages")
        .and_then(|c| list_at(c.as_ref(), row))
    else {
        return refuse(Reason::BadConversation, "messages is null".into());
    };
    let Some(messages) = messages.as_struct_opt() else {
        return refuse(
            Reason::BadConversation,
            "messages is not a list of {role, content}".into(),
        );
    };
    let (Some(roles), Some(contents)) = (field(messages, "role"), field(messages, "content"))
    else {
        return refuse(
            Reason::BadConversation,
            "messages lacks a role or a content field".into(),
        );
    };
    let mut turns = Vec::with_capacity(messages.len());
    for m in 0..messages.len() {
        let Some(role) = str_at(roles.as_ref(), m) else {
            return refuse(Reason::BadConversation, format!("message {m} has no role"));
        };
        let text = match message_text(contents.as_ref(), m) {
            Ok(text) => text,
            Err((reason, detail)) => return refuse(reason, format!("message {m}: {detail}")),
        };
        turns.push(Turn {
            role: role.to_string(),
            text,
        });
    }
    if turns.is_empty() {
        return refuse(Reason::BadConversation, "messages is empty".into());
    }
    match images_of(batch, row) {
        Ok(images) => Record {
            id,
            images,
            conversations: turns,
            refused: None,
        },
        Err(detail) => refuse(Reason::MissingImage, detail),
    }
}

/// The text of message `m`: a string content as it is, typed parts joined.
fn message_text(contents: &dyn Array, m: usize) -> Result<String, (Reason, String)> {
    if let Some(text) = str_at(contents, m) {
        return Ok(text.to_string());
    }
    let bad = |detail: &str| (Reason::BadConversation, detail.to_string());
    let parts = list_at(contents, m).ok_or_else(|| bad("content is null"))?;
    let parts = parts
        .as_struct_opt()
        .ok_or_else(|| bad("content is neither a string nor a list of parts"))?;
    let types = field(parts, "type").ok_or_else(|| bad("content parts have no type"))?;
    let texts = field(parts, "text");
    let mut out = String::new();
    for p in 0..parts.len() {
        match str_at(types.as_ref(), p) {
            Some("image") => out.push_str(IMAGE_TAG),
            Some("text") => {
                let text = texts.and_then(|t| str_at(t.as_ref(), p));
                out.push_str(text.ok_or_else(|| bad(&format!("text part {p} has no text")))?);
            }
            Some("video") => {
                return Err((Reason::VideoUnsupported, format!("part {p} is a video")));
            }
            other => return Err(bad(&format!("part {p} has type {other:?}"))),
        }
    }
    Ok(out)
}
