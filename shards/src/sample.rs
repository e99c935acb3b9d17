//! One sample as stored in a shard row (schema v2): the contract between `ingest` (writes it),
//! `pipeline` (reads it) and `trainer`.

/// What a sample carries: the planner never mixes kinds within one micro-step.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[repr(u8)]
pub enum Kind {
    /// No image: `image` is null, `input_ids` holds no placeholder.
    Text = 0,
    /// One image: `input_ids` holds exactly one image token (the placeholder).
    Image = 1,
}

/// One conversation turn as in the source json (`from` is kept verbatim: human, gpt, system).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

/// A full shard row.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub id: String,
    pub kind: Kind,
    /// The source file's bytes, untouched (JPEG, PNG or WebP); `None` for text-only samples.
    pub image: Option<Vec<u8>>,
    /// "jpeg", "png" or "webp", detected from the bytes (not the file name).
    pub image_format: Option<String>,
    pub width: u32,
    pub height: u32,
    pub conversation: Vec<Turn>,
    /// Token ids of the templated text, with one placeholder id per image.
    pub input_ids: Vec<u32>,
    /// Same length as `input_ids`: true where the token is a supervised target.
    pub label_mask: Vec<bool>,
    /// `input_ids.len()`.
    pub num_text_tokens: u32,
    /// Targets the loss sees: positions t >= 1 with `label_mask[t]` (the first token has no
    /// predecessor inside its sample, so it is never a target).
    pub num_supervised_tokens: u32,
    pub image_crc32c: Option<u32>,
    /// crc32c of `input_ids` (see [`crate::input_ids_crc32c`]) as read from the shard; `None`
    /// for shards of format v1, which predate the column. Writers ignore it (they compute it).
    pub input_ids_crc32c: Option<u32>,
}

/// A stored crc32c that the sample's data no longer matches (the shard changed on disk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChecksumMismatch {
    /// The checked column: [`crate::col::INPUT_IDS`] or [`crate::col::IMAGE`].
    pub column: &'static str,
    pub stored: u32,
    pub computed: u32,
}

impl Sample {
    /// The first stored checksum this sample's data fails: token ids first (so an image
    /// mismatch always comes with sound tokens), then image bytes. A checksum that is absent
    /// (text samples' image, format-1 shards' token ids) is not checked.
    pub fn checksum_mismatch(&self) -> Option<ChecksumMismatch> {
        let check = |column, stored: Option<u32>, computed: &dyn Fn() -> u32| {
            let stored = stored?;
            let computed = computed();
            (computed != stored).then_some(ChecksumMismatch {
                column,
                stored,
                computed,
            })
        };
        check(crate::col::INPUT_IDS, self.input_ids_crc32c, &|| {
            crate::input_ids_crc32c(&self.input_ids)
        })
        .or_else(|| {
            let bytes = self.image.as_deref()?;
            check(crate::col::IMAGE, self.image_crc32c, &|| {
                crc32c::crc32c(bytes)
            })
        })
    }
}

/// What the planner needs of a sample; loaded for the whole dataset by reading only the
/// `kind`, `num_text_tokens` and `num_supervised_tokens` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleMeta {
    pub kind: Kind,
    pub num_text_tokens: u32,
    pub num_supervised_tokens: u32,
}
