//! Parquet/arrow schema of a shard row (v3; v1 and v2 still read), and the conversions between
//! arrow record batches and [`Sample`]s. Column order is part of the format: readers project
//! columns by name.
//!
//! * v1: one image per sample in flat columns (`image`, `image_format`, `width`, `height`,
//!   `image_crc32c`, null for text samples).
//! * v2 added `input_ids_crc32c` (crc32c of the token ids' little-endian bytes), checked by the
//!   loader beside the image checksum. A v1 shard lacks it: its samples read with
//!   `input_ids_crc32c: None` (the token check is skipped, the image check still runs).
//! * v3 holds any number of images per sample: `images` is a list of
//!   `{bytes, format, width, height, crc32c}` in placeholder order (empty for text samples), and
//!   `num_images` its length (what the planner reads without touching the image bytes). v1 and
//!   v2 samples read as samples of zero or one image.
use crate::error::ShardError;
use crate::sample::{Image, Kind, Sample, SampleMeta, Turn};
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
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format version this build still reads (v1: no `input_ids_crc32c` column).
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// Column names, in schema order.
pub mod col {
    pub const ID: &str = "id";
    pub const KIND: &str = "kind";
    /// Since format v3: the list of images.
    pub const IMAGES: &str = "images";
    /// Since format v3: the length of `images`.
    pub const NUM_IMAGES: &str = "num_images";
    pub const CONVERSATION: &str = "conversation";
    pub const INPUT_IDS: &str = "input_ids";
    pub const LABEL_MASK: &str = "label_mask";
    pub const NUM_TEXT_TOKENS: &str = "num_text_tokens";
    pub const NUM_SUPERVISED_TOKENS: &str = "num_supervised_tokens";
    /// Since format v2.
    pub const INPUT_IDS_CRC32C: &str = "input_ids_crc32c";
    /// Formats v1 and v2: the one image (null for text samples) and its facts.
    pub const IMAGE: &str = "image";
    pub const IMAGE_FORMAT: &str = "image_format";
    pub const WIDTH: &str = "width";
    pub const HEIGHT: &str = "height";
    pub const IMAGE_CRC32C: &str = "image_crc32c";
    /// The fields of an `images` entry (v3).
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

/// The schema this build writes (v3): `id`, `kind`, `images`, `num_images`, `conversation`,
/// the token columns, `input_ids_crc32c`.
pub fn schema_v3() -> SchemaRef {
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

/// Schema v2 (read, and written only on request: [`crate::ShardWriter::create_format`]): v1's
/// columns, then `input_ids_crc32c`.
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
        3 => Some(schema_v3()),
        _ => None,
    }
}

/// Schema v1 (format version 1, read but no longer written): one row per sample.
pub fn schema_v1() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let mut fields = vec![
                Field::new(col::ID, DataType::Utf8, false),
                Field::new(col::KIND, DataType::UInt8, false),
                Field::new(col::IMAGE, DataType::Binary, true),
                Field::new(col::IMAGE_FORMAT, DataType::Utf8, true),
                Field::new(col::WIDTH, DataType::UInt32, false),
                Field::new(col::HEIGHT, DataType::UInt32, false),
                conversation_field(),
            ];
            fields.extend(token_fields());
            fields.push(Field::new(col::IMAGE_CRC32C, DataType::UInt32, true));
            Arc::new(Schema::new(fields))
        })
        .clone()
}

fn list(values: ArrayRef, lengths: impl Iterator<Item = usize>) -> ArrayRef {
    let field = item(values.data_type().clone());
    let offsets = arrow::buffer::OffsetBuffer::from_lengths(lengths);
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
pub fn samples_to_batch(samples: &[Sample]) -> Result<RecordBatch, ShardError> {
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

/// Builds one record batch of schema v2 (one image at most per sample): for datasets read by a
/// tessera older than format 3. A sample with two or more images is refused, naming it.
pub fn samples_to_batch_v2(samples: &[Sample]) -> Result<RecordBatch, ShardError> {
    if let Some(s) = samples.iter().find(|s| s.images.len() > 1) {
        return Err(ShardError::Mismatch {
            shard: "record batch".into(),
            detail: format!(
                "sample {} holds {} images; format 2 holds at most one",
                s.id,
                s.images.len()
            ),
        });
    }
    fn first(s: &Sample) -> Option<&Image> {
        s.images.first()
    }
    let ids = StringArray::from_iter_values(samples.iter().map(|s| s.id.as_str()));
    let kinds = UInt8Array::from_iter_values(samples.iter().map(|s| s.kind as u8));
    let image_bytes = samples
        .iter()
        .map(|s| first(s).map_or(0, |i| i.bytes.len()))
        .sum();
    let mut images = BinaryBuilder::with_capacity(samples.len(), image_bytes);
    for sample in samples {
        images.append_option(first(sample).map(|i| &i.bytes));
    }
    let formats = StringArray::from_iter(samples.iter().map(|s| first(s).map(|i| &i.format)));
    let widths =
        UInt32Array::from_iter_values(samples.iter().map(|s| first(s).map_or(0, |i| i.width)));
    let heights =
        UInt32Array::from_iter_values(samples.iter().map(|s| first(s).map_or(0, |i| i.height)));
    let crcs = UInt32Array::from_iter(
        samples
            .iter()
            .map(|s| first(s).map(|i| crc32c::crc32c(&i.bytes))),
    );
    let shared = shared_columns(samples);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids),
        Arc::new(kinds),
        Arc::new(images.finish()),
        Arc::new(formats),
        Arc::new(widths),
        Arc::new(heights),
        shared.conversation,
        shared.input_ids,
        shared.label_mask,
        shared.text_tokens,
        shared.supervised,
        Arc::new(crcs),
        shared.ids_crcs,
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

/// Each row's images: from the `images` list (v3), or the flat `image` columns (v1, v2).
enum ImageColumns<'a> {
    List {
        images: &'a ListArray,
    },
    Flat {
        bytes: &'a BinaryArray,
        formats: &'a StringArray,
        widths: &'a UInt32Array,
        heights: &'a UInt32Array,
        crcs: &'a UInt32Array,
    },
}

impl<'a> ImageColumns<'a> {
    fn of(batch: &'a RecordBatch, origin: &RowOrigin) -> Result<Self, ShardError> {
        if batch.column_by_name(col::IMAGES).is_some() {
            return Ok(ImageColumns::List {
                images: origin.typed(batch, col::IMAGES)?,
            });
        }
        Ok(ImageColumns::Flat {
            bytes: origin.typed(batch, col::IMAGE)?,
            formats: origin.typed(batch, col::IMAGE_FORMAT)?,
            widths: origin.typed(batch, col::WIDTH)?,
            heights: origin.typed(batch, col::HEIGHT)?,
            crcs: origin.typed(batch, col::IMAGE_CRC32C)?,
        })
    }

    fn row(&self, origin: &RowOrigin, row: usize) -> Result<Vec<Image>, ShardError> {
        match self {
            ImageColumns::Flat {
                bytes,
                formats,
                widths,
                heights,
                crcs,
            } => Ok(bytes
                .is_valid(row)
                .then(|| Image {
                    bytes: bytes.value(row).to_vec(),
                    format: if formats.is_valid(row) {
                        formats.value(row).to_string()
                    } else {
                        String::new()
                    },
                    width: widths.value(row),
                    height: heights.value(row),
                    crc32c: crcs.is_valid(row).then(|| crcs.value(row)),
                })
                .into_iter()
                .collect()),
            ImageColumns::List { images } => {
                let entries = images.value(row);
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
    }
}

/// Decodes the rows `rows` (indices into the batch) of a full batch (schema v1, v2 or v3).
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
            input_ids_crc32c: ids_crcs.map(|c| c.value(row)),
        });
    }
    Ok(out)
}

/// The metadata columns the planner reads: `num_images` only where the shard has it (v3).
pub(crate) fn meta_columns(format_version: u32) -> &'static [&'static str] {
    if format_version >= 3 {
        &[
            col::KIND,
            col::NUM_IMAGES,
            col::NUM_TEXT_TOKENS,
            col::NUM_SUPERVISED_TOKENS,
        ]
    } else {
        &[col::KIND, col::NUM_TEXT_TOKENS, col::NUM_SUPERVISED_TOKENS]
    }
}

/// Decodes the planner's metadata columns of every row of a projected batch. Without a
/// `num_images` column (formats 1 and 2) an image sample holds one image.
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
    let images: Option<&UInt32Array> = match batch.column_by_name(col::NUM_IMAGES) {
        Some(_) => Some(origin.typed(batch, col::NUM_IMAGES)?),
        None => None,
    };
    for row in 0..batch.num_rows() {
        let kind = kind_of(origin, row, kinds.value(row))?;
        out.push(SampleMeta {
            kind,
            num_images: images.map_or(u32::from(kind == Kind::Image), |n| n.value(row)),
            num_text_tokens: text.value(row),
            num_supervised_tokens: sup.value(row),
        });
    }
    Ok(())
}
