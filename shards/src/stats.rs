//! `tessera shards stats`: what a shard directory holds: samples by kind, images per sample
//! and by format,
//! token-length and image-size percentiles, odd images, and ingest's rejections by reason.
use crate::error::ShardError;
use crate::image_layout::{ImageLayout, Tower};
use crate::reader::Dataset;
use crate::schema::col;
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt8Type};
use arrow_array::{Array, ArrayRef};
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
    /// Images of all samples (a sample may hold several).
    pub images: u64,
    /// Image samples by how many images they hold ("1", "2", ...).
    pub images_per_sample: BTreeMap<String, u64>,
    /// Images by format.
    pub image_formats: BTreeMap<String, u64>,
    pub text_tokens: Percentiles,
    pub image_width: Percentiles,
    pub image_height: Percentiles,
    pub tiny_images: u64,
    pub extreme_aspect_images: u64,
    pub rejected: BTreeMap<String, u64>,
    /// With a layout ([`stats_under`]): what the samples cost under it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub under_layout: Option<LayoutStats>,
}

/// What the samples cost under an image layout, from the image sizes the shards hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LayoutStats {
    /// `single`, `anyres_max_9`, ...
    pub layout: String,
    /// The tower's tile and patch side in pixels.
    pub tile: u32,
    pub patch: u32,
    /// Tokens per sample: text plus every image's tokens (each placeholder expanded).
    pub sample_tokens: Percentiles,
    /// Tokens per image.
    pub image_tokens: Percentiles,
    /// Tiles the tower runs per image (the base view included).
    pub tiles_per_image: Percentiles,
    /// Tokens of all samples, and of their images.
    pub total_tokens: u64,
    pub total_image_tokens: u64,
}

/// One image's format and size, as the stats read them.
struct ImageFacts<'a> {
    format: &'a str,
    width: u32,
    height: u32,
}

impl DatasetStats {
    fn add_image(&mut self, image: ImageFacts, widths: &mut Vec<u32>, heights: &mut Vec<u32>) {
        self.images += 1;
        if !image.format.is_empty() {
            *self
                .image_formats
                .entry(image.format.to_string())
                .or_default() += 1;
        }
        let (width, height) = (image.width, image.height);
        widths.push(width);
        heights.push(height);
        let (short, long) = (width.min(height), width.max(height));
        self.tiny_images += u64::from(short < TINY_SIDE);
        self.extreme_aspect_images +=
            u64::from(short > 0 && long as f64 / short as f64 >= EXTREME_ASPECT);
    }
}

/// Computes [`DatasetStats`] reading only the small columns (never the image bytes: in format
/// 3 only the `format`, `width` and `height` leaves of `images`).
pub fn stats(dataset: &Dataset) -> Result<DatasetStats, ShardError> {
    stats_under(dataset, None)
}

/// [`stats`], and with `layout` what every sample costs under it (its tokens counted from its
/// images' sizes: see [`crate::image_layout`]).
pub fn stats_under(
    dataset: &Dataset,
    layout: Option<(&ImageLayout, Tower)>,
) -> Result<DatasetStats, ShardError> {
    scan(dataset, layout).map(|(stats, _)| stats)
}

/// What a sample's images become under a layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleImages {
    /// Language-model tokens of all its images (what its placeholders expand to).
    pub tokens: u64,
    /// Tiles the tower runs over (base views included).
    pub tiles: u32,
}

/// Each sample's [`SampleImages`] under `layout`, in the dataset's order (the order of
/// [`Dataset::metadata`]): what the planner counts a sample's images as.
pub fn sample_images(
    dataset: &Dataset,
    layout: &ImageLayout,
    tower: Tower,
) -> Result<Vec<SampleImages>, ShardError> {
    scan(dataset, Some((layout, tower))).map(|(_, samples)| samples.unwrap_or_default())
}

/// The scan behind [`stats_under`] and [`sample_images`].
fn scan(
    dataset: &Dataset,
    layout: Option<(&ImageLayout, Tower)>,
) -> Result<(DatasetStats, Option<Vec<SampleImages>>), ShardError> {
    let mut costs = layout.map(|(layout, tower)| LayoutCosts {
        layout: layout.clone(),
        tower,
        ..LayoutCosts::default()
    });
    let mut out = DatasetStats {
        rejected: dataset.manifest().ingest.rejected.clone(),
        ..Default::default()
    };
    let (mut tokens, mut widths, mut heights) = (Vec::new(), Vec::new(), Vec::new());
    let columns = [
        col::KIND,
        col::NUM_TEXT_TOKENS,
        "images.list.item.format",
        "images.list.item.width",
        "images.list.item.height",
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
            let t = get(col::NUM_TEXT_TOKENS)?
                .as_primitive_opt::<UInt32Type>()
                .ok_or_else(bad)?;
            let u32s = |a: &ArrayRef| a.as_primitive_opt::<UInt32Type>().cloned().ok_or_else(bad);
            // (formats, widths, heights) of all images, and each row's range of them.
            let images = get(col::IMAGES)?.as_list_opt::<i32>().ok_or_else(bad)?;
            let entries = images.values().as_struct_opt().ok_or_else(bad)?;
            let field = |name: &str| entries.column_by_name(name).ok_or_else(bad);
            let formats = field("format")?.as_string_opt::<i32>().ok_or_else(bad)?;
            let (w, h) = (u32s(field("width")?)?, u32s(field("height")?)?);
            let ranges = images
                .value_offsets()
                .windows(2)
                .map(|o| o[0] as usize..o[1] as usize);
            for (row, range) in ranges.enumerate() {
                out.samples += 1;
                tokens.push(t.value(row));
                if let Some(costs) = costs.as_mut() {
                    let sizes = range.clone().map(|i| (w.value(i), h.value(i)));
                    costs.add_sample(t.value(row), sizes);
                }
                let kind = if kinds.value(row) == 1 {
                    "image"
                } else {
                    "text"
                };
                *out.by_kind.entry(kind.into()).or_default() += 1;
                if range.is_empty() {
                    continue;
                }
                *out.images_per_sample
                    .entry(range.len().to_string())
                    .or_default() += 1;
                for i in range {
                    let format = if formats.is_valid(i) {
                        formats.value(i)
                    } else {
                        ""
                    };
                    let image = ImageFacts {
                        format,
                        width: w.value(i),
                        height: h.value(i),
                    };
                    out.add_image(image, &mut widths, &mut heights);
                }
            }
        }
    }
    out.text_tokens = Percentiles::of(&mut tokens);
    out.image_width = Percentiles::of(&mut widths);
    out.image_height = Percentiles::of(&mut heights);
    let per_sample = costs.as_mut().map(|c| std::mem::take(&mut c.per_sample));
    out.under_layout = costs.map(LayoutCosts::finish);
    Ok((out, per_sample))
}

/// [`LayoutStats`] being gathered.
#[derive(Default)]
struct LayoutCosts {
    layout: ImageLayout,
    tower: Tower,
    sample_tokens: Vec<u32>,
    image_tokens: Vec<u32>,
    tiles: Vec<u32>,
    total: u64,
    total_image: u64,
    /// Each sample's images, in the dataset's order.
    per_sample: Vec<SampleImages>,
}

impl LayoutCosts {
    /// A sample of `text` tokens (one placeholder per image among them) and its images' sizes.
    fn add_sample(&mut self, text: u32, images: impl ExactSizeIterator<Item = (u32, u32)>) {
        let mut sample = u64::from(text);
        let count = images.len();
        let mut images_here = SampleImages::default();
        for (width, height) in images {
            let t = self
                .layout
                .tokens_in_sample(width, height, count, self.tower);
            images_here.tokens += t.total();
            images_here.tiles += t.tiles;
            sample = sample - 1 + t.total();
            self.total_image += t.total();
            self.image_tokens.push(clamp(t.total()));
            self.tiles.push(t.tiles);
        }
        self.total += sample;
        self.sample_tokens.push(clamp(sample));
        self.per_sample.push(images_here);
    }

    fn finish(mut self) -> LayoutStats {
        LayoutStats {
            layout: self.layout.to_string(),
            tile: self.tower.tile,
            patch: self.tower.patch,
            sample_tokens: Percentiles::of(&mut self.sample_tokens),
            image_tokens: Percentiles::of(&mut self.image_tokens),
            tiles_per_image: Percentiles::of(&mut self.tiles),
            total_tokens: self.total,
            total_image_tokens: self.total_image,
        }
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
