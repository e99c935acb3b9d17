//! Parquet/arrow schema of a shard row (format 3, the only one this build writes and reads),
//! and the conversions between arrow record batches and [`Sample`]s. Column order is part of
//! the format: readers project columns by name. A sample holds any number of images: `images`
//! is a list of `{bytes, format, width, height, crc32c}` in placeholder order (empty for text
//! samples), and `num_images` its length (what the planner reads without touching the image
//! bytes); `input_ids_crc32c` (crc32c of the token ids' little-endian bytes) is checked by the
//! loader beside each image's checksum. Shards of formats 1 and 2 (one image per sample in flat
//! columns) are refused when their index.json is read: re-ingest them.
use crate::error::ShardError;
use crate::sample::{Image, Kind, Sample, SampleMeta, Turn};
use arrow_array::builder::BinaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt8Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, ListArray, RecordBatch, StringArray, StructArray, UInt32Array,
    UInt8Array,
};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use std::sync::{Arc, OnceLock};

/// The format version written to index.json, and the only one read.
pub const FORMAT_VERSION: u32 = 3;

/// Column names, in schema order.
pub mod col {
    pub const ID: &str = "id";
    pub const KIND: &str = "kind";
    /// The list of images.
    pub const IMAGES: &str = "images";
    /// The length of `images`.
    pub const NUM_IMAGES: &str = "num_images";
    pub const CONVERSATION: &str = "conversation";
    pub const INPUT_IDS: &str = "input_ids";
    pub const LABEL_MASK: &str = "label_mask";
    pub const NUM_TEXT_TOKENS: &str = "num_text_tokens";
    pub const NUM_SUPERVISED_TOKENS: &str = "num_supervised_tokens";
    pub const INPUT_IDS_CRC32C: &str = "input_ids_crc32c";
    /// The fields of an `images` entry.
    pub mod image {
        pub const BYTES: &str = "bytes";
        pub const FORMAT: &str = "format";
        pub const WIDTH: &str = "width";
        pub const HEIGHT: &str = "height";
        pub const CRC32C: &str = "crc32c";
    }
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

fn image_fields() -> Fields {
    Fields::from(vec![
        Field::new(col::image::BYTES, DataType::Binary, false),
        Field::new(col::image::FORMAT, DataType::Utf8, false),
        Field::new(col::image::WIDTH, DataType::UInt32, false),
        Field::new(col::image::HEIGHT, DataType::UInt32, false),
        Field::new(col::image::CRC32C, DataType::UInt32, false),
    ])
}

fn item(data_type: DataType) -> Arc<Field> {
    Arc::new(Field::new("item", data_type, false))
}

/// The parquet leaf path of the image bytes in a v3 shard (`images.list.item.bytes`): the
/// column written uncompressed, without dictionary or statistics.
pub(crate) fn image_bytes_leaf() -> Vec<String> {
    [col::IMAGES, "list", "item", col::image::BYTES]
        .map(String::from)
        .to_vec()
}

fn conversation_field() -> Field {
    Field::new(
        col::CONVERSATION,
        DataType::List(item(DataType::Struct(turn_fields()))),
        false,
    )
}

fn token_fields() -> [Field; 4] {
    [
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
    ]
}

/// The schema of a shard (format 3): `id`, `kind`, `images`, `num_images`, `conversation`,
/// the token columns, `input_ids_crc32c`.
pub(crate) fn schema_v3() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let mut fields = vec![
                Field::new(col::ID, DataType::Utf8, false),
                Field::new(col::KIND, DataType::UInt8, false),
                Field::new(
                    col::IMAGES,
                    DataType::List(item(DataType::Struct(image_fields()))),
                    false,
                ),
                Field::new(col::NUM_IMAGES, DataType::UInt32, false),
                conversation_field(),
            ];
            fields.extend(token_fields());
            fields.push(Field::new(col::INPUT_IDS_CRC32C, DataType::UInt32, false));
            Arc::new(Schema::new(fields))
        })
        .clone()
}

fn list(values: ArrayRef, lengths: impl Iterator<Item = usize>) -> ArrayRef {
    let field = item(values.data_type().clone());
    let offsets = arrow_buffer::OffsetBuffer::from_lengths(lengths);
    Arc::new(ListArray::new(field, offsets, values, None))
}

/// The columns every format shares: the conversation and the token columns.
struct SharedColumns {
    conversation: ArrayRef,
    input_ids: ArrayRef,
    label_mask: ArrayRef,
    text_tokens: ArrayRef,
    supervised: ArrayRef,
    ids_crcs: ArrayRef,
}

fn shared_columns(samples: &[Sample]) -> SharedColumns {
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
    SharedColumns {
        conversation,
        input_ids,
        label_mask,
        text_tokens: Arc::new(UInt32Array::from_iter_values(
            samples.iter().map(|s| s.num_text_tokens),
        )),
        supervised: Arc::new(UInt32Array::from_iter_values(
            samples.iter().map(|s| s.num_supervised_tokens),
        )),
        ids_crcs: Arc::new(UInt32Array::from_iter_values(
            samples.iter().map(|s| input_ids_crc32c(&s.input_ids)),
        )),
    }
}

/// Builds one record batch (schema v3) from samples, in order. Every image's `crc32c` and the
/// `input_ids_crc32c` are computed here from the bytes and ids (a sample's own checksums are
/// what a reader found, not an input).
pub(crate) fn samples_to_batch(samples: &[Sample]) -> Result<RecordBatch, ShardError> {
    let ids = StringArray::from_iter_values(samples.iter().map(|s| s.id.as_str()));
    let kinds = UInt8Array::from_iter_values(samples.iter().map(|s| s.kind as u8));
    let all: Vec<&Image> = samples.iter().flat_map(|s| s.images.iter()).collect();
    let byte_count = all.iter().map(|i| i.bytes.len()).sum();
    let mut bytes = BinaryBuilder::with_capacity(all.len(), byte_count);
    for image in &all {
        bytes.append_value(&image.bytes);
    }
    let image_columns: Vec<ArrayRef> = vec![
        Arc::new(bytes.finish()),
        Arc::new(StringArray::from_iter_values(
            all.iter().map(|i| i.format.as_str()),
        )),
        Arc::new(UInt32Array::from_iter_values(all.iter().map(|i| i.width))),
        Arc::new(UInt32Array::from_iter_values(all.iter().map(|i| i.height))),
        Arc::new(UInt32Array::from_iter_values(
            all.iter().map(|i| crc32c::crc32c(&i.bytes)),
        )),
    ];
    let images = list(
        Arc::new(StructArray::new(image_fields(), image_columns, None)),
        samples.iter().map(|s| s.images.len()),
    );
    let num_images = UInt32Array::from_iter_values(samples.iter().map(Sample::num_images));
    let shared = shared_columns(samples);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids),
        Arc::new(kinds),
        images,
        Arc::new(num_images),
        shared.conversation,
        shared.input_ids,
        shared.label_mask,
        shared.text_tokens,
        shared.supervised,
        shared.ids_crcs,
    ];
    RecordBatch::try_new(schema_v3(), columns).map_err(|e| ShardError::arrow("record batch", e))
}

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

/// Each row's images, from the `images` list.
struct ImageColumns<'a> {
    images: &'a ListArray,
}

impl<'a> ImageColumns<'a> {
    fn of(batch: &'a RecordBatch, origin: &RowOrigin) -> Result<Self, ShardError> {
        Ok(ImageColumns {
            images: origin.typed(batch, col::IMAGES)?,
        })
    }

    fn row(&self, origin: &RowOrigin, row: usize) -> Result<Vec<Image>, ShardError> {
        let entries = self.images.value(row);
        let bad = |what: &str| origin.bad(row, format!("images: {what}"));
        let entries = entries
            .as_struct_opt()
            .ok_or_else(|| bad("not a list of structs"))?;
        let field = |name: &str| {
            entries
                .column_by_name(name)
                .ok_or_else(|| bad(&format!("no field `{name}`")))
        };
        let bytes = field(col::image::BYTES)?
            .as_binary_opt::<i32>()
            .ok_or_else(|| bad("bytes is not binary"))?;
        let formats = field(col::image::FORMAT)?
            .as_string_opt::<i32>()
            .ok_or_else(|| bad("format is not utf8"))?;
        let u32s = |name: &str| {
            field(name)?
                .as_primitive_opt::<UInt32Type>()
                .ok_or_else(|| bad(&format!("{name} is not u32")))
        };
        let (widths, heights, crcs) = (
            u32s(col::image::WIDTH)?,
            u32s(col::image::HEIGHT)?,
            u32s(col::image::CRC32C)?,
        );
        Ok((0..entries.len())
            .map(|i| Image {
                bytes: bytes.value(i).to_vec(),
                format: formats.value(i).to_string(),
                width: widths.value(i),
                height: heights.value(i),
                crc32c: Some(crcs.value(i)),
            })
            .collect())
    }
}

/// Decodes the rows `rows` (indices into the batch) of a full batch.
pub(crate) fn batch_to_samples(
    batch: &RecordBatch,
    rows: &[usize],
    origin: &RowOrigin,
) -> Result<Vec<Sample>, ShardError> {
    let ids: &StringArray = origin.typed(batch, col::ID)?;
    let kinds: &UInt8Array = origin.typed(batch, col::KIND)?;
    let images = ImageColumns::of(batch, origin)?;
    let conversation: &ListArray = origin.typed(batch, col::CONVERSATION)?;
    let input_ids: &ListArray = origin.typed(batch, col::INPUT_IDS)?;
    let label_mask: &ListArray = origin.typed(batch, col::LABEL_MASK)?;
    let text_tokens: &UInt32Array = origin.typed(batch, col::NUM_TEXT_TOKENS)?;
    let supervised: &UInt32Array = origin.typed(batch, col::NUM_SUPERVISED_TOKENS)?;
    let ids_crcs: &UInt32Array = origin.typed(batch, col::INPUT_IDS_CRC32C)?;
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
            images: images.row(origin, row)?,
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
            input_ids_crc32c: Some(ids_crcs.value(row)),
        });
    }
    Ok(out)
}

/// The metadata columns the planner reads.
pub(crate) const META_COLUMNS: [&str; 4] = [
    col::KIND,
    col::NUM_IMAGES,
    col::NUM_TEXT_TOKENS,
    col::NUM_SUPERVISED_TOKENS,
];

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
    let images: &UInt32Array = origin.typed(batch, col::NUM_IMAGES)?;
    for row in 0..batch.num_rows() {
        let kind = kind_of(origin, row, kinds.value(row))?;
        out.push(SampleMeta {
            kind,
            num_images: images.value(row),
            num_text_tokens: text.value(row),
            num_supervised_tokens: sup.value(row),
        });
    }
    Ok(())
}
