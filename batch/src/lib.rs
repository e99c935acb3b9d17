//! `MicroBatch`: what the loader hands the trainer (the contract between `pipeline` and
//! `trainer`). Rows are packed: several samples per row, each with its own positions.
use shards::Kind;

/// Label value for tokens that are not targets (PyTorch's cross-entropy ignore index).
pub const IGNORE_INDEX: i64 = -100;

/// One rank's micro-batch, ready for the model. All token tensors are `[rows, row_len]`
/// row-major, padded at the end of each row to `row_len` (the longest row).
#[derive(Clone, Debug, PartialEq)]
pub struct MicroBatch {
    pub kind: Kind,
    pub rows: usize,
    pub row_len: usize,
    /// Input ids with every image placeholder expanded to `image_tokens` copies of the
    /// placeholder id; padding uses `pad_id`.
    pub input_ids: Vec<i64>,
    /// Already shifted: `labels[t]` is the target predicted at position t (the next token of
    /// the same sample when it is supervised), else `IGNORE_INDEX`. The trainer does not shift.
    pub labels: Vec<i64>,
    /// Position within its sample (restarts at 0 for every packed sample); 0 on padding.
    pub positions: Vec<i64>,
    /// Which packed sample of its row a token belongs to (0, 1, ...); -1 on padding. Attention
    /// is causal and only within equal, non-negative ids.
    pub segment_ids: Vec<i32>,
    /// Images in the order their placeholders appear (row-major; a sample of several images
    /// gives them in its placeholders' order): u8, CHW, `[views, 3, s, s]` (one view per image
    /// under `single`; see `image_geometry`).
    pub pixels: Vec<u8>,
    pub num_images: usize,
    pub image_size: usize,
    /// Vision tokens per image under the `single` layout (each placeholder expands to this
    /// many ids).
    pub image_tokens: usize,
    /// Under `anyres_max_N`: each image's views and tokens, in placeholder order (its
    /// placeholder expands to `total()` ids; `pixels` then holds every image's `tiles` views,
    /// base view first). Empty under `single`: one view of `image_tokens` per image.
    pub image_geometry: Vec<shards::image_layout::ImageTokens>,
    /// Source sample ids, in packing order (for logs and error messages).
    pub sample_ids: Vec<String>,
    /// The samples' global indices (as the plan names them), in packing order: which shard
    /// set of a mixture each comes from.
    pub sample_indices: Vec<u64>,
    /// Non-padding tokens.
    pub real_tokens: usize,
    /// Padding tokens (`rows * row_len - real_tokens`).
    pub pad_tokens: usize,
    /// Positions whose label is not `IGNORE_INDEX`.
    pub supervised_tokens: usize,
    /// A filler micro-batch at an epoch's end: carries real images (so the vision tower runs on
    /// every rank) but every label is `IGNORE_INDEX`.
    pub zero_loss: bool,
}

/// The planner's decision for one rank at one micro-step: which samples, packed into which
/// rows. The loader turns it into a `MicroBatch`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MicroBatchPlan {
    pub kind: Kind,
    /// Global sample indices (as `shards` numbers them: shard order, then row order), one
    /// inner list per packed row, in packing order.
    pub rows: Vec<Vec<u64>>,
    /// Filler at an epoch's end: real samples (images included) whose labels are all ignored.
    pub zero_loss: bool,
}

impl MicroBatch {
    /// Views of `image_size` the pixels hold: one per image, or the tiles of `image_geometry`.
    pub fn views(&self) -> usize {
        if self.image_geometry.is_empty() {
            self.num_images
        } else {
            self.image_geometry.iter().map(|g| g.tiles as usize).sum()
        }
    }

    /// Placeholder tokens in all (the image features the model writes in).
    pub fn image_token_count(&self) -> usize {
        if self.image_geometry.is_empty() {
            self.num_images * self.image_tokens
        } else {
            self.image_geometry.iter().map(|g| g.total() as usize).sum()
        }
    }
}
