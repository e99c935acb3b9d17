//! Token side of a `MicroBatch`: packed rows of samples -> input ids (placeholders expanded),
//! shifted labels, per-sample positions, segment ids, padding and counts.
//!
//! Per sample, after expanding each placeholder to its image's tokens (`image_tokens` copies
//! under `single`, the image's geometry's total under `anyres_max_N`; never targets):
//! `labels[t] = ids[t + 1]` when token t + 1 is supervised, else `IGNORE_INDEX`; the last token
//! of a sample has no target inside its sample, so packed samples never predict each other.
//! This makes a sample's supervised count equal to `Sample::num_supervised_tokens` (positions
//! t >= 1 with `label_mask[t]`), the count the planner hands the trainer for loss scaling.
use super::{LoaderConfig, LoaderError};
use crate::{MicroBatch, IGNORE_INDEX};
use tessera_shards::image_layout::ImageTokens;
use tessera_shards::{Kind, Sample};

/// One sample as it enters a row.
pub(super) struct RowSample {
    pub sample: Sample,
    /// Under a mixture, the source it comes from (see `SampleSource::mixture_source`).
    pub source: Option<usize>,
    /// All labels `IGNORE_INDEX` (a zero-loss plan, or a stand-in for a failed image).
    pub ignore_labels: bool,
    /// Under `anyres_max_N`: each of its images' views and tokens, in placeholder order
    /// (empty under `single`).
    pub geometry: Vec<ImageTokens>,
}

impl RowSample {
    /// The ids placeholder `image` of the sample expands to.
    fn image_tokens(&self, image: usize, config: &LoaderConfig) -> usize {
        self.geometry
            .get(image)
            .map_or(config.image_tokens, |g| g.total() as usize)
    }

    /// The sample's length once its placeholders are expanded.
    fn expanded_len(&self, config: &LoaderConfig) -> usize {
        let mut image = 0;
        self.sample
            .input_ids
            .iter()
            .map(|&t| {
                if t == config.placeholder_id {
                    image += 1;
                    self.image_tokens(image - 1, config)
                } else {
                    1
                }
            })
            .sum()
    }
}

/// Checks a sample's tokens against its kind before any image work is spent on it.
pub(super) fn check_tokens(sample: &Sample, placeholder_id: u32) -> Result<(), LoaderError> {
    let bad = |message: String| LoaderError::Sample {
        sample_id: sample.id.clone(),
        message,
    };
    if sample.label_mask.len() != sample.input_ids.len() {
        return Err(bad(format!(
            "label_mask has {} entries for {} input ids",
            sample.label_mask.len(),
            sample.input_ids.len()
        )));
    }
    if sample.input_ids.is_empty() {
        return Err(bad("no input ids".into()));
    }
    let placeholders = sample
        .input_ids
        .iter()
        .filter(|&&t| t == placeholder_id)
        .count();
    let images = sample.images.len();
    match (sample.kind, images) {
        (Kind::Image, 0) => return Err(bad("image sample without image bytes".into())),
        (Kind::Text, n) if n > 0 => return Err(bad(format!("text sample with {n} images"))),
        _ => {}
    }
    if placeholders != images {
        return Err(bad(format!(
            "{:?} sample holds {placeholders} image placeholders ({placeholder_id}) for {images} \
             images",
            sample.kind
        )));
    }
    Ok(())
}

/// Builds the token tensors of a micro-batch. `pixels` must already hold every image of every
/// sample, in row-major packing order (a sample's images in placeholder order).
pub(super) fn assemble(
    kind: Kind,
    zero_loss: bool,
    rows: Vec<Vec<RowSample>>,
    pixels: Vec<u8>,
    config: &LoaderConfig,
) -> MicroBatch {
    let placeholder = config.placeholder_id as i64;
    let row_len = rows
        .iter()
        .map(|row| row.iter().map(|rs| rs.expanded_len(config)).sum::<usize>())
        .max()
        .unwrap_or(0);
    let total = rows.len() * row_len;
    let mut input_ids = Vec::with_capacity(total);
    let mut labels = Vec::with_capacity(total);
    let mut positions = Vec::with_capacity(total);
    let mut segment_ids = Vec::with_capacity(total);
    let mut sample_ids = Vec::new();
    let mut sample_sources = Vec::new();
    let mut num_images = 0;
    let mut image_geometry = Vec::new();
    // Scratch for one expanded sample: (id, is target).
    let mut tokens: Vec<(i64, bool)> = Vec::new();
    for row in &rows {
        let row_start = input_ids.len();
        for (segment, rs) in row.iter().enumerate() {
            let s = &rs.sample;
            sample_ids.push(s.id.clone());
            sample_sources.extend(rs.source);
            tokens.clear();
            image_geometry.extend_from_slice(&rs.geometry);
            let mut image = 0;
            for (&t, &supervised) in s.input_ids.iter().zip(&s.label_mask) {
                if t == config.placeholder_id {
                    tokens.extend(std::iter::repeat_n(
                        (placeholder, false),
                        rs.image_tokens(image, config),
                    ));
                    image += 1;
                    num_images += 1;
                } else {
                    tokens.push((t as i64, supervised && !rs.ignore_labels && !zero_loss));
                }
            }
            for (pos, &(id, _)) in tokens.iter().enumerate() {
                input_ids.push(id);
                let target = tokens.get(pos + 1).filter(|next| next.1);
                labels.push(target.map_or(IGNORE_INDEX, |next| next.0));
                positions.push(pos as i64);
                segment_ids.push(segment as i32);
            }
        }
        let pad = row_len - (input_ids.len() - row_start);
        input_ids.extend(std::iter::repeat_n(config.pad_id as i64, pad));
        labels.extend(std::iter::repeat_n(IGNORE_INDEX, pad));
        positions.extend(std::iter::repeat_n(0, pad));
        segment_ids.extend(std::iter::repeat_n(-1, pad));
    }
    let real_tokens = segment_ids.iter().filter(|&&s| s >= 0).count();
    let supervised_tokens = labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
    MicroBatch {
        kind,
        rows: rows.len(),
        row_len,
        input_ids,
        labels,
        positions,
        segment_ids,
        pixels,
        num_images,
        image_size: config.image_size,
        image_tokens: config.image_tokens,
        image_geometry,
        sample_ids,
        sample_sources,
        real_tokens,
        pad_tokens: total - real_tokens,
        supervised_tokens,
        zero_loss,
    }
}
