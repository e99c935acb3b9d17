//! One sample as stored in a shard row (schema v3): the contract between `ingest` (writes it),
//! `pipeline` (reads it) and `trainer`.

/// What a sample carries: the planner never mixes kinds within one micro-step.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[repr(u8)]
pub enum Kind {
    /// No image: `images` is empty, `input_ids` holds no placeholder.
    Text = 0,
    /// One or more images: `input_ids` holds one image token (the placeholder) per image, and
    /// the placeholders take the images in order.
    Image = 1,
}

/// One conversation turn: its role (`user`, `assistant` or `system` as ingest writes it;
/// shards of format 1 and 2 kept the source's `from`: `human`, `gpt`) and its text, with an
/// `<image>` tag where each image goes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

/// One image of a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The source file's bytes, untouched (JPEG, PNG or WebP).
    pub bytes: Vec<u8>,
    /// "jpeg", "png" or "webp", detected from the bytes (not the file name); empty where
    /// nothing checked it (a prompt image of `tessera generate`).
    pub format: String,
    pub width: u32,
    pub height: u32,
    /// crc32c of `bytes` as read from the shard; `None` where nothing stored one. Writers
    /// ignore it (they compute it from the bytes).
    pub crc32c: Option<u32>,
}

impl Image {
    /// An image whose format and size nobody checked (the loader decodes it as it comes).
    pub fn unchecked(bytes: Vec<u8>) -> Image {
        Image {
            bytes,
            format: String::new(),
            width: 0,
            height: 0,
            crc32c: None,
        }
    }
}

/// A full shard row.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub id: String,
    pub kind: Kind,
    /// The images, in the order of their placeholders; empty for text-only samples.
    pub images: Vec<Image>,
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
    /// crc32c of `input_ids` (see [`crate::input_ids_crc32c`]) as read from the shard; `None`
    /// for shards of format v1, which predate the column. Writers ignore it (they compute it).
    pub input_ids_crc32c: Option<u32>,
}

/// A stored crc32c that the sample's data no longer matches (the shard changed on disk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChecksumMismatch {
    /// The checked column: [`crate::col::INPUT_IDS`] or [`crate::col::IMAGES`].
    pub column: &'static str,
    /// For an image: which of the sample's images (from 0), and how many it holds.
    pub image: Option<(u32, u32)>,
    pub stored: u32,
    pub computed: u32,
}

impl ChecksumMismatch {
    /// What failed, for messages: `input_ids`, `image` (a sample of one), `image 2 of 3`.
    pub fn what(&self) -> String {
        match self.image {
            Some((k, n)) if n > 1 => format!("image {} of {n}", k + 1),
            Some(_) => "image".into(),
            None => self.column.into(),
        }
    }
}

impl Sample {
    /// The first stored checksum this sample's data fails: token ids first (so an image
    /// mismatch always comes with sound tokens), then each image's bytes in order. A checksum
    /// that is absent (format-1 shards' token ids) is not checked.
    pub fn checksum_mismatch(&self) -> Option<ChecksumMismatch> {
        let check = |column, image, stored: Option<u32>, computed: &dyn Fn() -> u32| {
            let stored = stored?;
            let computed = computed();
            (computed != stored).then_some(ChecksumMismatch {
                column,
                image,
                stored,
                computed,
            })
        };
        check(crate::col::INPUT_IDS, None, self.input_ids_crc32c, &|| {
            crate::input_ids_crc32c(&self.input_ids)
        })
        .or_else(|| {
            let n = self.num_images();
            self.images.iter().zip(0..).find_map(|(image, k)| {
                check(crate::col::IMAGES, Some((k, n)), image.crc32c, &|| {
                    crc32c::crc32c(&image.bytes)
                })
            })
        })
    }

    /// Image count as a `u32` (the `num_images` column).
    pub fn num_images(&self) -> u32 {
        self.images.len() as u32
    }
}

/// What the planner needs of a sample; loaded for the whole dataset by reading only the
/// `kind`, `num_images`, `num_text_tokens` and `num_supervised_tokens` columns (formats 1 and
/// 2 have no `num_images`: an image sample there holds one image).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleMeta {
    pub kind: Kind,
    pub num_images: u32,
    pub num_text_tokens: u32,
    pub num_supervised_tokens: u32,
}
