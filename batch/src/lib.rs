//! `MicroBatch`: what the loader (`pipeline`) hands the trainer and the model, and all the
//! model reads of the data. Rows are packed: several samples per row, each with its own
//! positions, and each sample carries the mixture source it comes from, so the model can sum
//! the loss by source without asking the trainer.
//!
//! A crate of its own, below `pipeline`: the model needs this type and nothing of the planner,
//! the loader or their image decoders. It is not part of `shards` either, whose subject is the
//! format on disk; it only borrows from it what a micro-batch holds: the sample kind and each
//! image's tokens under a layout (`tessera_shards::image_layout::ImageTokens`).
use tessera_shards::image_layout::ImageTokens;
use tessera_shards::Kind;

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
    pub image_geometry: Vec<ImageTokens>,
    /// Source sample ids, in packing order (for logs and error messages).
    pub sample_ids: Vec<String>,
    /// Under a mixture: the source each sample comes from (its place among the mixture's
    /// sources), in packing order, one per `sample_ids` entry. Empty when the samples come from
    /// one shard set: the loss is then not split by source.
    pub sample_sources: Vec<usize>,
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

    /// The source of each supervised position, in row-major order (the order the model's loss
    /// reads them in): its sample's entry of `sample_sources`. Empty without sources.
    pub fn supervised_sources(&self) -> Vec<usize> {
        if self.sample_sources.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(self.supervised_tokens);
        // The first sample of the current row, in packing order.
        let mut first = 0usize;
        for row in 0..self.rows {
            let span = row * self.row_len..(row + 1) * self.row_len;
            let (Some(segments), Some(labels)) =
                (self.segment_ids.get(span.clone()), self.labels.get(span))
            else {
                break;
            };
            let mut samples_in_row = 0usize;
            for (&segment, &label) in segments.iter().zip(labels) {
                let Ok(segment) = usize::try_from(segment) else {
                    continue;
                };
                samples_in_row = samples_in_row.max(segment + 1);
                if label != IGNORE_INDEX {
                    let source = self.sample_sources.get(first + segment);
                    out.push(source.copied().unwrap_or(0));
                }
            }
            first += samples_in_row;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rows: samples a (source 1) and b (source 0) packed in the first, then padding; c
    /// (source 2) alone in the second.
    fn packed() -> MicroBatch {
        let n = IGNORE_INDEX;
        MicroBatch {
            kind: Kind::Text,
            rows: 2,
            row_len: 5,
            input_ids: vec![1, 2, 3, 4, 0, 5, 6, 7, 8, 9],
            labels: vec![2, n, 4, n, n, n, 7, 8, 9, n],
            positions: vec![0, 1, 0, 1, 0, 0, 1, 2, 3, 4],
            segment_ids: vec![0, 0, 1, 1, -1, 0, 0, 0, 0, 0],
            pixels: Vec::new(),
            num_images: 0,
            image_size: 0,
            image_tokens: 0,
            image_geometry: Vec::new(),
            sample_ids: vec!["a".into(), "b".into(), "c".into()],
            sample_sources: vec![1, 0, 2],
            real_tokens: 9,
            pad_tokens: 1,
            supervised_tokens: 5,
            zero_loss: false,
        }
    }

    #[test]
    fn each_supervised_position_gets_its_samples_source_in_row_major_order() {
        assert_eq!(packed().supervised_sources(), vec![1, 0, 2, 2, 2]);
    }

    #[test]
    fn without_sources_nothing_is_split() {
        let mb = MicroBatch {
            sample_sources: Vec::new(),
            ..packed()
        };
        assert!(mb.supervised_sources().is_empty());
    }
}
