//! Why a record was rejected, and what was notable about a record that was kept. The names
//! are what `rejected.jsonl`, the summary and index.json's ingest report say.

/// A rejection reason. Each record is rejected for its first problem found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The `id` appeared earlier in the json (the first occurrence is the one kept).
    DuplicateId,
    /// `image` is absolute or climbs out of the images root; never opened.
    UnsafeImagePath,
    MissingImage,
    /// The image exists but could not be read (permissions, a broken zip entry).
    UnreadableImage,
    /// The bytes are not a JPEG, PNG or WebP (e.g. an HTML error page named .jpg).
    NotAnImage,
    /// The header is unreadable or the full decode failed (truncated or corrupt data).
    CorruptImage,
    /// The header announces more pixels than the limit: rejected before decoding.
    DecompressionBomb,
    /// An image record whose conversation holds no `<image>`.
    MissingImagePlaceholder,
    /// An image record with two or more `<image>` (one image, one placeholder).
    MultipleImagePlaceholders,
    /// A text-only record that mentions `<image>`.
    PlaceholderWithoutImage,
    /// The `<image>` tags (image parts, for `messages`) do not match the images one to one
    /// (layouts other than `llava`, whose one-image records keep the three names above).
    ImagePlaceholderMismatch,
    /// A record with a video: tessera trains on images.
    VideoUnsupported,
    /// A gpt turn that is empty or whitespace only.
    EmptyCaption,
    /// No conversation turns, no gpt turn, a turn without text, an unknown content part, or
    /// (plain template) not one human + one gpt turn.
    BadConversation,
    /// A turn's `from` is none of human/user, gpt/assistant, system.
    UnknownRole,
    /// Longer than `--max-tokens` (text tokens plus `--image-tokens` per image).
    TooLong,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::DuplicateId => "duplicate_id",
            Reason::UnsafeImagePath => "unsafe_image_path",
            Reason::MissingImage => "missing_image",
            Reason::UnreadableImage => "unreadable_image",
            Reason::NotAnImage => "not_an_image",
            Reason::CorruptImage => "corrupt_image",
            Reason::DecompressionBomb => "decompression_bomb",
            Reason::MissingImagePlaceholder => "missing_image_placeholder",
            Reason::MultipleImagePlaceholders => "multiple_image_placeholders",
            Reason::PlaceholderWithoutImage => "placeholder_without_image",
            Reason::ImagePlaceholderMismatch => "image_placeholder_mismatch",
            Reason::VideoUnsupported => "video_unsupported",
            Reason::EmptyCaption => "empty_caption",
            Reason::BadConversation => "bad_conversation",
            Reason::UnknownRole => "unknown_role",
            Reason::TooLong => "too_long",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected record: its id, why, and a human-readable detail.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    pub id: String,
    pub reason: Reason,
    pub detail: String,
}
