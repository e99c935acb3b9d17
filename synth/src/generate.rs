//! The driver: plans which records are text-only, makes every sample on a pool of scoped worker
//! threads (each sample from its own RNG, so the thread count never changes the output), then
//! writes the json and, if asked, the zip.
use crate::layout::{self, LlavaRecord, Turn, JSON_FILE_NAME};
use crate::photos::PhotoLibrary;
use crate::{sample_rng, scene, sizes, text_only, SynthConfig, SynthError, SynthReport};
use image::codecs::jpeg::JpegEncoder;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// JPEG quality of every image (LLaVA-Pretrain's files are ordinary web JPEGs).
pub const JPEG_QUALITY: u8 = 90;
/// Samples a worker claims at a time.
const CHUNK: usize = 16;

/// A sample's index with its record and JPEG size, or why it failed.
type Made = (usize, Result<(LlavaRecord, u64), SynthError>);

struct Context<'a> {
    seed: u64,
    samples: usize,
    text_only: &'a [bool],
    photos: Option<&'a PhotoLibrary>,
    images_dir: &'a Path,
}

/// Writes the dataset `cfg` describes; see the module docs of [`super`].
pub fn generate(cfg: &SynthConfig) -> Result<SynthReport, SynthError> {
    cfg.validate()?;
    let images_dir = cfg.out.join("images");
    let json_path = cfg.out.join(JSON_FILE_NAME);
    if json_path.exists() {
        tracing::warn!(
            "{} exists: overwriting; images of earlier runs that this run does not rewrite stay",
            json_path.display()
        );
    }
    std::fs::create_dir_all(&images_dir).map_err(|e| SynthError::io(&images_dir, e))?;
    let photos = match &cfg.photos {
        Some(dir) => Some(PhotoLibrary::load(dir, cfg.workers)?),
        None => None,
    };
    let text_only = text_only_plan(cfg);
    let ctx = Context {
        seed: cfg.seed,
        samples: cfg.samples,
        text_only: &text_only,
        photos: photos.as_ref(),
        images_dir: &images_dir,
    };
    let progress = if cfg.progress {
        indicatif::ProgressBar::new(cfg.samples as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let made: Vec<Vec<Made>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cfg.workers)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let start = next.fetch_add(CHUNK, Ordering::Relaxed);
                        if start >= cfg.samples {
                            break;
                        }
                        for index in start..(start + CHUNK).min(cfg.samples) {
                            let result = make_sample(&ctx, index);
                            failed.fetch_or(result.is_err(), Ordering::Relaxed);
                            out.push((index, result));
                            progress.inc(1);
                        }
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    progress.finish_and_clear();

    let mut slots: Vec<Option<(LlavaRecord, u64)>> = vec![None; cfg.samples];
    let mut first_error: Option<(usize, SynthError)> = None;
    for (index, result) in made.into_iter().flatten() {
        match result {
            Ok(sample) => slots[index] = Some(sample),
            Err(e) if first_error.as_ref().is_none_or(|(i, _)| index < *i) => {
                first_error = Some((index, e))
            }
            Err(_) => {}
        }
    }
    if let Some((_, e)) = first_error {
        return Err(e);
    }
    let mut records = Vec::with_capacity(cfg.samples);
    let mut image_bytes = 0;
    for (index, slot) in slots.into_iter().enumerate() {
        let (record, bytes) = slot.ok_or_else(|| {
            SynthError::Config(format!(
                "sample {index} was not made (a worker thread panicked)"
            ))
        })?;
        image_bytes += bytes;
        records.push(record);
    }
    layout::write_json(&json_path, &records)?;
    let entries: Vec<&str> = records.iter().filter_map(|r| r.image.as_deref()).collect();
    let zip_path = if cfg.zip {
        let path = cfg.out.join("images.zip");
        crate::archive::write_zip(&path, &images_dir, &entries)?;
        Some(path)
    } else {
        None
    };
    Ok(SynthReport {
        json_path,
        zip_path,
        records: records.len(),
        images: entries.len(),
        text_only: records.len() - entries.len(),
        image_bytes,
    })
}

/// Exactly `round(samples * fraction)` text-only records, at seeded random positions.
fn text_only_plan(cfg: &SynthConfig) -> Vec<bool> {
    let count = ((cfg.samples as f64 * cfg.text_only_fraction).round() as usize).min(cfg.samples);
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    rng.set_stream(u64::MAX);
    let mut plan = vec![false; cfg.samples];
    for index in rand::seq::index::sample(&mut rng, cfg.samples, count) {
        plan[index] = true;
    }
    plan
}

/// Makes sample `index`: its record and the size of its JPEG (0 for text-only).
fn make_sample(ctx: &Context, index: usize) -> Result<(LlavaRecord, u64), SynthError> {
    let mut rng = sample_rng(ctx.seed, index);
    let id = layout::sample_id(index, ctx.samples, &mut rng);
    if ctx.text_only[index] {
        let conversations = text_only::conversation(&mut rng);
        return Ok((
            LlavaRecord {
                id,
                image: None,
                conversations,
            },
            0,
        ));
    }
    let (width, height) = sizes::sample_size(&mut rng);
    let request = layout::caption_request(&mut rng);
    let (image, caption) = match ctx.photos {
        Some(library) => library.crop(width, height, &mut rng),
        None => scene::draw_scene(width, height, &mut rng),
    };
    let relative = layout::image_path(&id);
    let path = ctx.images_dir.join(&relative);
    let mut jpeg = Vec::with_capacity(64 * 1024);
    JpegEncoder::new_with_quality(&mut jpeg, JPEG_QUALITY)
        .encode_image(&image)
        .map_err(|source| SynthError::Encode {
            id: id.clone(),
            path: path.clone(),
            source,
        })?;
    let folder = ctx.images_dir.join(layout::folder_of(&id));
    std::fs::create_dir_all(&folder).map_err(|e| SynthError::io(&folder, e))?;
    layout::write_image(&path, &jpeg)?;
    let record = LlavaRecord {
        id,
        image: Some(relative),
        conversations: vec![Turn::human(request), Turn::gpt(caption)],
    };
    Ok((record, jpeg.len() as u64))
}
