//! Parquet/arrow schema of a shard row (v2; v1 still reads), and the conversions between arrow
//! record batches and [`Sample`]s. Column order is part of the format: readers project columns
//! by name.
//!
//! v2 added `input_ids_crc32c` (crc32c of the token ids' little-endian bytes), checked by the
//! loader beside `image_crc32c`. A v1 shard lacks the column: its samples read with
//! `input_ids_crc32c: None` (the token check is skipped, the image check still runs).
use crate::error::ShardError;
use crate::sample::{Kind, Sample, SampleMeta, Turn};
use arrow_array::builder::BinaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt8Type};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, ListArray, RecordBatch, StringArray, StructArray,
    UInt32Array, UInt8Array,
};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use std::sync::{Arc, OnceLock};

/// The format version written to index.json.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build still reads (v1: no `input_ids_crc32c` column).
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// Column names, in schema order.
pub mod col {
    pub const ID: &str = "id";
    pub const KIND: &str = "kind";
    pub const IMAGE: &str = "image";
    pub const IMAGE_FORMAT: &str = "image_format";
    pub const WIDTH: &str = "width";
    pub const HEIGHT: &str = "height";
    pub const CONVERSATION: &str = "conversation";
    pub const INPUT_IDS: &str = "input_ids";
    pub const LABEL_MASK: &str = "label_mask";
    pub const NUM_TEXT_TOKENS: &str = "num_text_tokens";
    pub const NUM_SUPERVISED_TOKENS: &str = "num_supervised_tokens";
    pub const IMAGE_CRC32C: &str = "image_crc32c";
    /// Since format v2.
    pub const INPUT_IDS_CRC32C: &str = "input_ids_crc32c";
}

/// crc32c of token ids as stored in `input_ids_crc32c`: over each id's 4 little-endian bytes.
pub fn input_ids_crc32c(ids: &[u32]) -> u32 {
    let mut crc = 0;
    let mut buf = [0u8; 1024];
    for chunk in ids.chunks(buf.len() / 4) {
        for (out, id) in buf.chunks_exact_mut(4).zip(chunk) {
            out.copy_from_slice(&id.to_le_bytes());
        }
        crc = crc32c::crc32c_append(crc, &buf[..4 * chunk.len()]);
    }
    crc
}

fn turn_fields() -> Fields {
    Fields::from(vec![
        Field::new("role", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, false),
    ])
}

fn item(data_type: DataType) -> Arc<Field> {
    Arc::new(Field::new("item", data_type, false))
}

/// The schema this build writes (v2): v1's columns, then `input_ids_crc32c`.
pub fn schema_v2() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let mut fields: Vec<Field> = schema_v1()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(Field::new(col::INPUT_IDS_CRC32C, DataType::UInt32, false));
            Arc::new(Schema::new(fields))
        })
        .clone()
}

/// The schema of a shard of `format_version` (`None` for versions this build cannot read).
pub fn schema_for(format_version: u32) -> Option<SchemaRef> {
    match format_version {
        1 => Some(schema_v1()),
        2 => Some(schema_v2()),
        _ => None,
    }
}

/// Schema v1 (format version 1, read but no longer written): one row per sample.
pub fn schema_v1() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            Arc::new(Schema::new(vec![
                Field::new(col::ID, DataType::Utf8, false),
                Field::new(col::KIND, DataType::UInt8, false),
                Field::new(col::IMAGE, DataType::Binary, true),
                Field::new(col::IMAGE_FORMAT, DataType::Utf8, true),
                Field::new(col::WIDTH, DataType::UInt32, false),
                Field::new(col::HEIGHT, DataType::UInt32, false),
                Field::new(
                    col::CONVERSATION,
                    DataType::List(item(DataType::Struct(turn_fields()))),
                    false,
                ),
                Field::new(
                    col::INPUT_IDS,
                    DataType::List(item(DataType::UInt32)),
                    false,
                ),
                Field::new(
                    col::LABEL_MASK,
                    DataType::List(item(DataType::Boolean)),
                    false,
                ),
                Field::new(col::NUM_TEXT_TOKENS, DataType::UInt32, false),
                Field::new(col::NUM_SUPERVISED_TOKENS, DataType::UInt32, false),
                Field::new(col::IMAGE_CRC32C, DataType::UInt32, true),
            ]))
        })
        .clone()
}

fn list(values: ArrayRef, lengths: impl Iterator<Item = usize>) -> ArrayRef {
    let field = item(values.data_type().clone());
    let offsets = arrow::buffer::OffsetBuffer::from_lengths(lengths);
    Arc::new(ListArray::new(field, offsets, values, None))
}

/// Builds one record batch (schema v2) from samples, in order. `input_ids_crc32c` is computed
/// here from the ids (a sample's own field is what a reader found, not an input).
pub fn samples_to_batch(samples: &[Sample]) -> Result<RecordBatch, ShardError> {
    let ids = StringArray::from_iter_values(samples.iter().map(|s| s.id.as_str()));
    let kinds = UInt8Array::from_iter_values(samples.iter().map(|s| s.kind as u8));
    let image_bytes = samples
        .iter()
        .map(|s| s.image.as_ref().map_or(0, |i| i.len()))
        .sum();
    let mut images = BinaryBuilder::with_capacity(samples.len(), image_bytes);
    for sample in samples {
        images.append_option(sample.image.as_deref());
    }
    let images = images.finish();
    let formats = StringArray::from_iter(samples.iter().map(|s| s.image_format.as_deref()));
    let widths = UInt32Array::from_iter_values(samples.iter().map(|s| s.width));
    let heights = UInt32Array::from_iter_values(samples.iter().map(|s| s.height));
    let turns: Vec<&Turn> = samples.iter().flat_map(|s| s.conversation.iter()).collect();
    let roles = StringArray::from_iter_values(turns.iter().map(|t| t.role.as_str()));
    let texts = StringArray::from_iter_values(turns.iter().map(|t| t.text.as_str()));
    let turn_struct = StructArray::new(
        turn_fields(),
        vec![Arc::new(roles) as ArrayRef, Arc::new(texts)],
        None,
    );
    let conversation = list(
        Arc::new(turn_struct),
        samples.iter().map(|s| s.conversation.len()),
    );
    let ids_flat =
        UInt32Array::from_iter_values(samples.iter().flat_map(|s| s.input_ids.iter().copied()));
    let input_ids = list(
        Arc::new(ids_flat),
        samples.iter().map(|s| s.input_ids.len()),
    );
    let mask_flat: BooleanArray = samples
        .iter()
        .flat_map(|s| s.label_mask.iter().map(|&b| Some(b)))
        .collect();
    let label_mask = list(
        Arc::new(mask_flat),
        samples.iter().map(|s| s.label_mask.len()),
    );
    let text_tokens = UInt32Array::from_iter_values(samples.iter().map(|s| s.num_text_tokens));
    let supervised = UInt32Array::from_iter_values(samples.iter().map(|s| s.num_supervised_tokens));
    let crcs = UInt32Array::from_iter(samples.iter().map(|s| s.image_crc32c));
    let ids_crcs =
        UInt32Array::from_iter_values(samples.iter().map(|s| input_ids_crc32c(&s.input_ids)));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids),
        Arc::new(kinds),
        Arc::new(images),
        Arc::new(formats),
        Arc::new(widths),
        Arc::new(heights),
        conversation,
        input_ids,
        label_mask,
        Arc::new(text_tokens),
        Arc::new(supervised),
        Arc::new(crcs),
        Arc::new(ids_crcs),
    ];
    RecordBatch::try_new(schema_v2(), columns).map_err(|e| ShardError::arrow("record batch", e))
}

/// Where rows of a batch came from, for error messages.
pub(crate) struct RowOrigin<'a> {
    pub shard: &'a str,
    pub first_row: u64,
}

impl RowOrigin<'_> {
    fn bad(&self, row: usize, detail: impl Into<String>) -> ShardError {
        ShardError::BadRow {
            shard: self.shard.to_string(),
            row: self.first_row + row as u64,
            detail: detail.into(),
        }
    }

    fn column<'b>(&self, batch: &'b RecordBatch, name: &str) -> Result<&'b ArrayRef, ShardError> {
        batch
            .column_by_name(name)
            .ok_or_else(|| ShardError::Schema {
                shard: self.shard.to_string(),
                detail: format!("column `{name}` is missing"),
            })
    }

    fn typed<'b, T: 'static>(
        &self,
        batch: &'b RecordBatch,
        name: &str,
    ) -> Result<&'b T, ShardError> {
        self.column(batch, name)?
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| ShardError::Schema {
                shard: self.shard.to_string(),
                detail: format!("column `{name}` has an unexpected type"),
            })
    }
}

fn kind_of(origin: &RowOrigin, row: usize, value: u8) -> Result<Kind, ShardError> {
    match value {
        0 => Ok(Kind::Text),
        1 => Ok(Kind::Image),
        other => Err(origin.bad(
            row,
            format!("kind {other} is neither 0 (text) nor 1 (image)"),
        )),
    }
}

/// Decodes the rows `rows` (indices into the batch) of a full batch (schema v1 or v2).
pub(crate) fn batch_to_samples(
    batch: &RecordBatch,
    rows: &[usize],
    origin: &RowOrigin,
) -> Result<Vec<Sample>, ShardError> {
    let ids: &StringArray = origin.typed(batch, col::ID)?;
    let kinds: &UInt8Array = origin.typed(batch, col::KIND)?;
    let images: &BinaryArray = origin.typed(batch, col::IMAGE)?;
    let formats: &StringArray = origin.typed(batch, col::IMAGE_FORMAT)?;
    let widths: &UInt32Array = origin.typed(batch, col::WIDTH)?;
    let heights: &UInt32Array = origin.typed(batch, col::HEIGHT)?;
    let conversation: &ListArray = origin.typed(batch, col::CONVERSATION)?;
    let input_ids: &ListArray = origin.typed(batch, col::INPUT_IDS)?;
    let label_mask: &ListArray = origin.typed(batch, col::LABEL_MASK)?;
    let text_tokens: &UInt32Array = origin.typed(batch, col::NUM_TEXT_TOKENS)?;
    let supervised: &UInt32Array = origin.typed(batch, col::NUM_SUPERVISED_TOKENS)?;
    let crcs: &UInt32Array = origin.typed(batch, col::IMAGE_CRC32C)?;
    // Absent from v1 shards: their samples carry no token checksum.
    let ids_crcs: Option<&UInt32Array> = match batch.column_by_name(col::INPUT_IDS_CRC32C) {
        Some(_) => Some(origin.typed(batch, col::INPUT_IDS_CRC32C)?),
        None => None,
    };
    let mut out = Vec::with_capacity(rows.len());
    for &row in rows {
        let turns = conversation.value(row);
        let turns = turns
            .as_struct_opt()
            .ok_or_else(|| origin.bad(row, "conversation is not a list of structs"))?;
        let roles = turns
            .column(0)
            .as_string_opt::<i32>()
            .ok_or_else(|| origin.bad(row, "role is not utf8"))?;
        let texts = turns
            .column(1)
            .as_string_opt::<i32>()
            .ok_or_else(|| origin.bad(row, "text is not utf8"))?;
        let ids_row = input_ids.value(row);
        let ids_row = ids_row
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| origin.bad(row, "input_ids is not list<u32>"))?;
        let mask_row = label_mask.value(row);
        let mask_row = mask_row
            .as_boolean_opt()
            .ok_or_else(|| origin.bad(row, "label_mask is not list<bool>"))?;
        out.push(Sample {
            id: ids.value(row).to_string(),
            kind: kind_of(origin, row, kinds.value(row))?,
            image: images.is_valid(row).then(|| images.value(row).to_vec()),
            image_format: formats
                .is_valid(row)
                .then(|| formats.value(row).to_string()),
            width: widths.value(row),
            height: heights.value(row),
            conversation: (0..turns.len())
                .map(|t| Turn {
                    role: roles.value(t).to_string(),
                    text: texts.value(t).to_string(),
                })
                .collect(),
            input_ids: ids_row.values().to_vec(),
            label_mask: mask_row.values().iter().collect(),
            num_text_tokens: text_tokens.value(row),
            num_supervised_tokens: supervised.value(row),
            image_crc32c: crcs.is_valid(row).then(|| crcs.value(row)),
            input_ids_crc32c: ids_crcs.map(|c| c.value(row)),
        });
    }
    Ok(out)
}

/// Decodes the planner's metadata columns of every row of a projected batch.
pub(crate) fn batch_to_meta(
    batch: &RecordBatch,
    origin: &RowOrigin,
    out: &mut Vec<SampleMeta>,
) -> Result<(), ShardError> {
    let kinds = origin
        .column(batch, col::KIND)?
        .as_primitive_opt::<UInt8Type>();
    let text = origin
        .column(batch, col::NUM_TEXT_TOKENS)?
        .as_primitive_opt::<UInt32Type>();
    let sup = origin
        .column(batch, col::NUM_SUPERVISED_TOKENS)?
        .as_primitive_opt::<UInt32Type>();
    let (Some(kinds), Some(text), Some(sup)) = (kinds, text, sup) else {
        return Err(ShardError::Schema {
            shard: origin.shard.to_string(),
            detail: "kind / num_text_tokens / num_supervised_tokens have unexpected types".into(),
        });
    };
    for row in 0..batch.num_rows() {
        out.push(SampleMeta {
            kind: kind_of(origin, row, kinds.value(row))?,
            num_text_tokens: text.value(row),
            num_supervised_tokens: sup.value(row),
        });
    }
    Ok(())
}
