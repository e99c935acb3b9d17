//! The_cauldron / FineVision rows (Hugging Face `datasets` parquet): `images` is a list of Image
//! structs `{bytes, path}`, `texts` a list of turns `{user, assistant[, source]}` (FineVision
//! adds per-turn rating fields, which are ignored). Fields are read by name.
//!
//! The texts carry no image placeholders. The rule, nanoVLM's: every image goes before the
//! first user turn, in list order, as one `<image>` tag each directly in front of its text
//! (`<image><image>What differs?`), so a row of N images is a record whose first user turn
//! starts with N tags. A `<image>` inside the texts themselves makes the count differ, and the
//! row is rejected as `image_placeholder_mismatch`.
use super::columns::{field, list_at, str_at};
use super::images::images_of;
use crate::reason::Reason;
use crate::record::Record;
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use tessera_shards::Turn;
use tessera_text::chat::IMAGE_TAG;

/// The columns a cauldron row needs.
pub(crate) const COLUMNS: [&str; 2] = ["images", "texts"];

/// Record of `row` of `batch` (id already chosen).
pub(crate) fn record(batch: &RecordBatch, row: usize, id: String) -> Record {
    let refuse = |reason, detail: String| Record::refused(id.clone(), reason, detail);
    let images = match images_of(batch, row) {
        Ok(images) => images,
        Err(detail) => return refuse(Reason::MissingImage, detail),
    };
    let Some(texts) = batch
        .column_by_name("texts")
        .and_then(|c| list_at(c.as_ref(), row))
    else {
        return refuse(Reason::BadConversation, "texts is null".into());
    };
    let Some(texts) = texts.as_struct_opt() else {
        return refuse(
            Reason::BadConversation,
            "texts is not a list of {user, assistant}".into(),
        );
    };
    let (Some(users), Some(answers)) = (field(texts, "user"), field(texts, "assistant")) else {
        return refuse(
            Reason::BadConversation,
            "texts lacks a user or an assistant field".into(),
        );
    };
    let mut turns = Vec::with_capacity(2 * texts.len());
    for t in 0..texts.len() {
        let Some(user) = str_at(users.as_ref(), t) else {
            return refuse(
                Reason::BadConversation,
                format!("turn {t} has no user text"),
            );
        };
        // A null answer is an empty one: the template check rejects it as `empty_caption`.
        let answer = str_at(answers.as_ref(), t).unwrap_or_default();
        let user = if t == 0 {
            format!("{}{user}", IMAGE_TAG.repeat(images.len()))
        } else {
            user.to_string()
        };
        turns.push(Turn {
            role: "user".into(),
            text: user,
        });
        turns.push(Turn {
            role: "assistant".into(),
            text: answer.to_string(),
        });
    }
    if turns.is_empty() {
        return refuse(Reason::BadConversation, "texts is empty".into());
    }
    Record {
        id,
        images,
        conversations: turns,
        refused: None,
    }
}

/// Whether `texts` has the shape this layout reads (a list of structs with `user`).
pub(crate) fn looks_like(batch_schema: &arrow_schema::Schema) -> bool {
    use arrow_schema::DataType;
    let Ok(texts) = batch_schema.field_with_name("texts") else {
        return false;
    };
    match texts.data_type() {
        DataType::List(item) | DataType::LargeList(item) => matches!(
            item.data_type(),
            DataType::Struct(fields) if fields.iter().any(|f| f.name() == "user")
        ),
        _ => false,
    }
}
