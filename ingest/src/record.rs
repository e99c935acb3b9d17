//! What every input layout turns a row into: an id, its images (a path under `--images`, or
//! bytes embedded in the input) and its turns, with an `<image>` tag where each image goes.
//! Everything after the layout (template, image checks, tokenizing, shards) works on this.
use crate::reason::Reason;
use tessera_shards::Turn;

/// One image of a record, before it is fetched and checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ImageRef {
    /// A path relative to the `--images` folder or zip (LLaVA and LLaVA-OneVision json, a
    /// parquet image struct without bytes).
    Path(String),
    /// Bytes stored in the input itself (a `datasets` Image struct's `bytes`); `name` says
    /// which in rejections and notes: its `path` field, or `image K` (K counted from 0).
    Embedded { bytes: Vec<u8>, name: String },
}

/// One input record in the common form.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    pub id: String,
    /// In placeholder order; empty for text-only records.
    pub images: Vec<ImageRef>,
    /// Turns with the source's role names (`human`, `gpt`, `user`, ...) and `<image>` tags.
    pub conversations: Vec<Turn>,
    /// Set when the layout already knows the record cannot be used (a video, a row without
    /// text): it is rejected with this reason and detail before any other work.
    pub refused: Option<(Reason, String)>,
}

impl Record {
    /// A record the layout refuses outright.
    pub(crate) fn refused(id: String, reason: Reason, detail: String) -> Record {
        Record {
            id,
            images: Vec::new(),
            conversations: Vec::new(),
            refused: Some((reason, detail)),
        }
    }
}
