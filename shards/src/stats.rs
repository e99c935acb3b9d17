//! `tessera shards stats`: what a shard directory holds: samples by kind and image format,
//! token-length and image-size percentiles, odd images, and ingest's rejections by reason.
use crate::error::ShardError;
use crate::reader::Dataset;
use crate::schema::col;
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt8Type};
use arrow_array::Array;
use serde::Serialize;
use std::collections::BTreeMap;

/// Images whose shorter side is below this many pixels are counted as tiny (a SigLIP patch is
/// 14-16 px, so such an image carries next to no signal after resizing).
pub const TINY_SIDE: u32 = 16;
/// Images whose long:short side ratio is at least this are counted as extreme.
pub const EXTREME_ASPECT: f64 = 5.0;

/// p50 / p90 / p99 / max of one quantity.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values` (sorted in place); zeros when empty.
    pub fn of(values: &mut [u32]) -> Self {
        values.sort_unstable();
        let at = |q: f64| -> u32 {
            if values.is_empty() {
                return 0;
            }
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
            values[rank - 1]
        };
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// Summary of a shard directory.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DatasetStats {
    pub samples: u64,
    pub by_kind: BTreeMap<String, u64>,
    pub image_formats: BTreeMap<String, u64>,
    pub text_tokens: Percentiles,
    pub image_width: Percentiles,
    pub image_height: Percentiles,
    pub tiny_images: u64,
    pub extreme_aspect_images: u64,
    pub rejected: BTreeMap<String, u64>,
}

/// Computes [`DatasetStats`] reading only the small columns (never the image bytes).
pub fn stats(dataset: &Dataset) -> Result<DatasetStats, ShardError> {
    let mut out = DatasetStats {
        rejected: dataset.manifest().ingest.rejected.clone(),
        ..Default::default()
    };
    let (mut tokens, mut widths, mut heights) = (Vec::new(), Vec::new(), Vec::new());
    let columns = [
        col::KIND,
        col::IMAGE_FORMAT,
        col::WIDTH,
        col::HEIGHT,
        col::NUM_TEXT_TOKENS,
    ];
    for shard in dataset.shards() {
        for batch in shard.read_columns(&columns)? {
            let bad = || ShardError::Schema {
                shard: shard.name.clone(),
                detail: "stats columns have unexpected types".into(),
            };
            let get = |name: &str| batch.column_by_name(name).ok_or_else(bad);
            let kinds = get(col::KIND)?
                .as_primitive_opt::<UInt8Type>()
                .ok_or_else(bad)?;
            let formats = get(col::IMAGE_FORMAT)?
                .as_string_opt::<i32>()
                .ok_or_else(bad)?;
            let w = get(col::WIDTH)?
                .as_primitive_opt::<UInt32Type>()
                .ok_or_else(bad)?;
            let h = get(col::HEIGHT)?
                .as_primitive_opt::<UInt32Type>()
                .ok_or_else(bad)?;
            let t = get(col::NUM_TEXT_TOKENS)?
                .as_primitive_opt::<UInt32Type>()
                .ok_or_else(bad)?;
            for row in 0..batch.num_rows() {
                out.samples += 1;
                tokens.push(t.value(row));
                let kind = if kinds.value(row) == 1 {
                    "image"
                } else {
                    "text"
                };
                *out.by_kind.entry(kind.into()).or_default() += 1;
                if kinds.value(row) != 1 {
                    continue;
                }
                if formats.is_valid(row) {
                    *out.image_formats
                        .entry(formats.value(row).to_string())
                        .or_default() += 1;
                }
                let (width, height) = (w.value(row), h.value(row));
                widths.push(width);
                heights.push(height);
                let (short, long) = (width.min(height), width.max(height));
                out.tiny_images += u64::from(short < TINY_SIDE);
                out.extreme_aspect_images +=
                    u64::from(short > 0 && long as f64 / short as f64 >= EXTREME_ASPECT);
            }
        }
    }
    out.text_tokens = Percentiles::of(&mut tokens);
    out.image_width = Percentiles::of(&mut widths);
    out.image_height = Percentiles::of(&mut heights);
    Ok(out)
}
