//! One micro-batch, start to end, on one thread: read its samples, check their stored crc32c
//! (image bytes and token ids), decode + resize every image of every sample into the pixel
//! tensor (a sample's images in placeholder order), apply the bad-image policy (to checksum
//! mismatches too: a sample with one bad image is dropped whole), assemble the tokens. A pure function of
//! (plan, samples, config), which is what makes the output identical for any thread count.
use super::anyres_views::{anyres_views, fitted_box};
use super::assemble::{assemble, check_tokens, RowSample};
use super::decode::{decode_rgb_reusing, RgbImage};
use super::resize::{content_box, ChwResizer, ResizeError};
use super::stats::StatCells;
use super::{BadImagePolicy, LoaderConfig, LoaderError, SampleSource};
use crate::{MicroBatch, MicroBatchPlan};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;
use tessera_shards::image_layout::{ImageLayout, ImageTokens};
use tessera_shards::{Kind, Sample};

pub(crate) struct Worker {
    source: Arc<dyn SampleSource>,
    config: Arc<LoaderConfig>,
    stats: Arc<StatCells>,
    resizer: ChwResizer,
    /// The last decoded image's buffer, reused by the next decode.
    decoded: Vec<u8>,
    /// The pinpoint canvas of `anyres_max_N` views, reused.
    canvas: Vec<u8>,
}

impl Worker {
    pub(super) fn new(
        source: Arc<dyn SampleSource>,
        config: Arc<LoaderConfig>,
        stats: Arc<StatCells>,
    ) -> Self {
        Worker {
            source,
            config,
            stats,
            resizer: ChwResizer::default(),
            decoded: Vec::new(),
            canvas: Vec::new(),
        }
    }

    pub(super) fn load(&mut self, plan: &MicroBatchPlan) -> Result<MicroBatch, LoaderError> {
        let started = Instant::now();
        let indices: Vec<u64> = plan.rows.iter().flatten().copied().collect();
        let samples = self.source.read(&indices)?;
        if samples.len() != indices.len() {
            return Err(LoaderError::ShortRead {
                asked: indices.len(),
                got: samples.len(),
                indices,
            });
        }
        // Checked as part of the read: a few GB/s of crc32c next to a decode's tens of MB/s.
        let checking = Instant::now();
        let mut corrupt: Vec<Option<LoaderError>> = if self.config.verify_checksums {
            samples
                .iter()
                .zip(&indices)
                .map(|(sample, &index)| self.check_checksums(sample, index))
                .collect()
        } else {
            Vec::new()
        };
        corrupt.resize_with(samples.len(), || None);
        StatCells::add_time(&self.stats.checksum_ns, checking.elapsed());
        StatCells::add_time(&self.stats.read_ns, started.elapsed());

        let image_bytes = 3 * self.config.image_size * self.config.image_size;
        let images: usize = samples.iter().map(|s| s.images.len()).sum();
        let mut pixels = Vec::with_capacity(images * image_bytes);
        let mut rows = Vec::with_capacity(plan.rows.len());
        let mut first_bad_image: Option<(Sample, u64)> = None;
        let mut samples = samples
            .into_iter()
            .zip(corrupt)
            .zip(indices.iter().copied());
        for planned_row in &plan.rows {
            let mut row = Vec::with_capacity(planned_row.len());
            for ((sample, corrupt), index) in samples.by_ref().take(planned_row.len()) {
                let added = match corrupt {
                    Some(e) => Err(e),
                    None => self.add_images(&sample, &mut pixels),
                };
                match added {
                    Ok(geometry) => row.push(RowSample {
                        sample,
                        source: self.source.mixture_source(index),
                        ignore_labels: plan.zero_loss,
                        geometry,
                    }),
                    Err(e) if self.config.on_bad_image == BadImagePolicy::Fail => return Err(e),
                    Err(e) => {
                        let why = tessera_errors::with_causes(&e);
                        tracing::warn!(sample = %sample.id, "dropped from its micro-batch: {why}");
                        self.stats.skipped.fetch_add(1, Relaxed);
                        // A stand-in keeps the sample's tokens: only when those are sound.
                        if e.is_bad_image() && first_bad_image.is_none() {
                            first_bad_image = Some((sample, index));
                        }
                    }
                }
            }
            if !row.is_empty() {
                rows.push(row);
            }
        }
        let images_ok = rows
            .iter()
            .flatten()
            .map(|r| r.sample.images.len())
            .sum::<usize>();
        if plan.kind == Kind::Image && images_ok == 0 {
            if let Some((sample, index)) = first_bad_image {
                // Every image of an image micro-batch failed. A rank without images would skip
                // the vision tower while the other ranks all-gather it (a hang), so keep one
                // failed sample with pad-colour images (one per placeholder) and no loss.
                tracing::warn!(
                    sample = %sample.id,
                    "every image of this micro-batch failed; it runs as a zero-loss stand-in"
                );
                self.stats.skipped.fetch_sub(1, Relaxed);
                let plane = image_bytes / 3;
                let images = sample.images.len();
                let geometry: Vec<_> = sample
                    .images
                    .iter()
                    .filter_map(|i| self.config.geometry(i.width, i.height, images))
                    .collect();
                let views = if geometry.is_empty() {
                    images
                } else {
                    geometry.iter().map(|g| g.tiles as usize).sum()
                };
                for _ in 0..views {
                    for &c in &self.config.pad_rgb {
                        pixels.extend(std::iter::repeat_n(c, plane));
                    }
                }
                rows.push(vec![RowSample {
                    sample,
                    source: self.source.mixture_source(index),
                    ignore_labels: true,
                    geometry,
                }]);
            }
        }

        let started = Instant::now();
        let samples_out: usize = rows.iter().map(Vec::len).sum();
        let batch = assemble(plan.kind, plan.zero_loss, rows, pixels, &self.config);
        StatCells::add_time(&self.stats.assemble_ns, started.elapsed());
        self.stats.samples.fetch_add(samples_out as u64, Relaxed);
        self.stats
            .images
            .fetch_add(batch.num_images as u64, Relaxed);
        self.stats.views.fetch_add(batch.views() as u64, Relaxed);
        Ok(batch)
    }

    /// The sample's token ids and image bytes against the crc32c stored at ingest.
    fn check_checksums(&self, sample: &Sample, index: u64) -> Option<LoaderError> {
        let m = sample.checksum_mismatch()?;
        Some(LoaderError::Checksum {
            at: self.source.locate(index),
            sample_id: sample.id.clone(),
            column: m.column,
            image: m.image,
            stored: m.stored,
            computed: m.computed,
        })
    }

    /// Checks the sample and appends the `[3, S, S]` pixels of each of its images, in order
    /// (under `anyres_max_N` each image's views, with the geometry returned); if one fails,
    /// none of the sample's pixels stay.
    fn add_images(
        &mut self,
        sample: &Sample,
        pixels: &mut Vec<u8>,
    ) -> Result<Vec<ImageTokens>, LoaderError> {
        check_tokens(sample, self.config.placeholder_id)?;
        let start = pixels.len();
        let mut geometry = Vec::new();
        for image in 0..sample.images.len() {
            let added = match self.config.image_layout {
                ImageLayout::Single => self.add_image(sample, image, pixels),
                ImageLayout::AnyRes { .. } => self
                    .add_views(sample, image, pixels)
                    .map(|g| geometry.push(g)),
            };
            if let Err(e) = added {
                pixels.truncate(start);
                return Err(e);
            }
        }
        Ok(geometry)
    }

    /// Decodes image `image` of `sample` once and appends its `anyres_max_N` views (the base
    /// view, then the pinpoint's tiles row by row): its geometry, from its size, is returned.
    fn add_views(
        &mut self,
        sample: &Sample,
        image: usize,
        pixels: &mut Vec<u8>,
    ) -> Result<ImageTokens, LoaderError> {
        let stored = &sample.images[image];
        let (image_u32, images) = (image as u32, sample.images.len() as u32);
        let cfg = Arc::clone(&self.config);
        let tile = cfg.image_size as u32;
        let geometry = std::cell::Cell::new(None);
        let needed = |w, h| {
            let Some(g) = cfg.geometry(w, h, sample.images.len()) else {
                return (tile, tile);
            };
            geometry.set(Some((w, h, g)));
            if g.tiles == 1 {
                return (tile, tile);
            }
            let [_, _, bw, bh] = fitted_box((w, h), (g.grid.1 * tile, g.grid.0 * tile));
            (bw.max(tile), bh.max(tile))
        };
        let img = self.decode(sample, image, needed)?;
        let (w, h, g) = match geometry.get() {
            Some(found) => found,
            None => {
                let (w, h) = (img.width, img.height);
                let g = cfg.geometry(w, h, sample.images.len()).ok_or_else(|| {
                    LoaderError::Config("anyres views under the single layout".into())
                })?;
                (w, h, g)
            }
        };
        // The planner counted the tokens from the stored size: the pixels must agree.
        if (stored.width, stored.height) != (0, 0) && (stored.width, stored.height) != (w, h) {
            return Err(LoaderError::Sample {
                sample_id: sample.id.clone(),
                message: format!(
                    "image {image_u32} of {images} decodes at {w}x{h} but the shard stores \
                     {}x{} (its token count was planned from the stored size)",
                    stored.width, stored.height
                ),
            });
        }
        let started = Instant::now();
        let offset = pixels.len();
        pixels.resize(offset + g.tiles as usize * 3 * (tile * tile) as usize, 0);
        let views = anyres_views(
            &mut self.resizer,
            &img,
            (w, h),
            &g,
            (tile, cfg.pad_rgb),
            &mut self.canvas,
            &mut pixels[offset..],
        );
        StatCells::add_time(&self.stats.resize_ns, started.elapsed());
        self.decoded = img.data;
        views.map(|()| g).map_err(|source| {
            pixels.truncate(offset);
            resize_error(sample, image, source)
        })
    }

    /// Decodes image `image` of `sample` into the buffer the last decode left (`needed`: the
    /// size the caller resizes to, from the full size, as `decode_rgb` takes it), timed; a
    /// failure names the sample and the image.
    fn decode(
        &mut self,
        sample: &Sample,
        image: usize,
        needed: impl Fn(u32, u32) -> (u32, u32),
    ) -> Result<RgbImage, LoaderError> {
        let started = Instant::now();
        let reuse = std::mem::take(&mut self.decoded);
        let decoded = decode_rgb_reusing(&sample.images[image].bytes, needed, reuse);
        StatCells::add_time(&self.stats.decode_ns, started.elapsed());
        decoded
            .map(|(img, _)| img)
            .map_err(|source| LoaderError::Decode {
                sample_id: sample.id.clone(),
                image: image as u32,
                images: sample.images.len() as u32,
                source,
            })
    }

    /// Decodes and resizes image `image` of `sample` onto the end of `pixels`.
    fn add_image(
        &mut self,
        sample: &Sample,
        image: usize,
        pixels: &mut Vec<u8>,
    ) -> Result<(), LoaderError> {
        let cfg = Arc::clone(&self.config);
        let size = cfg.image_size as u32;
        // The full size (before DCT scaling) sets the aspect ratio `pad` keeps.
        let full_dims = std::cell::Cell::new(None);
        let needed = |w, h| {
            full_dims.set(Some((w, h)));
            let [_, _, bw, bh] = content_box(w, h, size, cfg.resize);
            (bw, bh)
        };
        let img = self.decode(sample, image, needed)?;

        let started = Instant::now();
        let offset = pixels.len();
        pixels.resize(offset + 3 * cfg.image_size * cfg.image_size, 0);
        let source_dims = full_dims.get().unwrap_or((img.width, img.height));
        let out = &mut pixels[offset..];
        let resized =
            self.resizer
                .resize_into(&img, source_dims, size, cfg.resize, cfg.pad_rgb, out);
        StatCells::add_time(&self.stats.resize_ns, started.elapsed());
        self.decoded = img.data;
        resized.map_err(|source| {
            pixels.truncate(offset);
            resize_error(sample, image, source)
        })
    }
}

/// A failed resize of image `image` of `sample`, named.
fn resize_error(sample: &Sample, image: usize, source: ResizeError) -> LoaderError {
    LoaderError::Resize {
        sample_id: sample.id.clone(),
        image: image as u32,
        images: sample.images.len() as u32,
        source,
    }
}
