//! Measurements behind `tessera bench loader`: the loader on a dataset prefix, the decode-only
//! bound on the same image bytes, and an export of those images as a LLaVA json + folder for
//! the PIL reference loader. Only `tessera-pipeline`'s public loader API is used: the measuring
//! lives with the command, not in the library.
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_pipeline::loader::{Loader, LoaderConfig, LoaderError, LoaderStats, SampleSource};
use tessera_pipeline::MicroBatchPlan;
use tessera_shards::Kind;

/// The micro-batches of a bench run and the samples they cover.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Workload {
    pub(super) plans: Vec<MicroBatchPlan>,
    /// Image samples, in dataset order.
    pub(super) image_indices: Vec<u64>,
    /// All samples planned (image and text).
    pub(super) samples: usize,
}

/// The dataset prefix that holds the first `image_limit` image samples, planned the way the
/// planner would at one rank: each micro-batch one kind, `per_row` samples per packed row,
/// `rows` rows per micro-batch.
pub(super) fn workload(
    kinds: &[Kind],
    image_limit: usize,
    per_row: usize,
    rows: usize,
) -> Workload {
    let (per_row, rows) = (per_row.max(1), rows.max(1));
    let mut by_kind: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for (i, &kind) in kinds.iter().enumerate() {
        if by_kind[1].len() >= image_limit {
            break;
        }
        by_kind[kind as usize].push(i as u64);
    }
    let mut plans = Vec::new();
    for (kind, indices) in [(Kind::Image, &by_kind[1]), (Kind::Text, &by_kind[0])] {
        for batch in indices.chunks(per_row * rows) {
            plans.push(MicroBatchPlan {
                kind,
                rows: batch.chunks(per_row).map(<[u64]>::to_vec).collect(),
                zero_loss: false,
            });
        }
    }
    Workload {
        samples: by_kind[0].len() + by_kind[1].len(),
        image_indices: by_kind[1].clone(),
        plans,
    }
}

/// Runs the loader over `plans` to the end; returns its counters and the wall time.
pub(super) fn run_loader(
    source: Arc<dyn SampleSource>,
    plans: Vec<MicroBatchPlan>,
    config: LoaderConfig,
) -> Result<(LoaderStats, Duration), LoaderError> {
    let started = Instant::now();
    let mut loader = Loader::new(source, plans, config);
    for batch in loader.by_ref() {
        std::hint::black_box(batch?);
    }
    Ok((loader.stats(), started.elapsed()))
}

/// Full decodes of `images` with the `image` crate (its JPEG decoder is zune-jpeg), split
/// evenly over `threads`: the CPU bound of any loader that must decode every image. Returns
/// the wall time and how many images failed to decode.
pub(super) fn run_decode_only(images: &[Vec<u8>], threads: usize) -> (Duration, usize) {
    let per_thread = images.len().div_ceil(threads.max(1)).max(1);
    let started = Instant::now();
    let failed = std::thread::scope(|scope| {
        let handles: Vec<_> = images
            .chunks(per_thread)
            .map(|chunk| {
                scope.spawn(move || {
                    let mut failed = 0;
                    for bytes in chunk {
                        match image::load_from_memory(bytes) {
                            Ok(img) => drop(std::hint::black_box(img)),
                            Err(_) => failed += 1,
                        }
                    }
                    failed
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    (started.elapsed(), failed)
}

/// Image bytes of `indices` (every image of a sample of several), read in chunks.
pub(super) fn read_images(
    source: &dyn SampleSource,
    indices: &[u64],
) -> Result<Vec<(String, Vec<u8>)>, LoaderError> {
    let mut out = Vec::with_capacity(indices.len());
    for chunk in indices.chunks(256) {
        for sample in source.read(chunk)? {
            let count = sample.images.len();
            for (k, image) in sample.images.into_iter().enumerate() {
                let id = if count > 1 {
                    format!("{}#{k}", sample.id)
                } else {
                    sample.id.clone()
                };
                out.push((id, image.bytes));
            }
        }
    }
    Ok(out)
}

/// Writes `images` as `dir/images/NNNNNNNN.<ext>` plus `dir/llava.json` (LLaVA's record
/// layout), the input of the PIL reference loader. Returns the json path.
pub(super) fn export_llava(
    dir: &Path,
    images: &[(String, Vec<u8>)],
) -> std::io::Result<std::path::PathBuf> {
    let image_dir = dir.join("images");
    std::fs::create_dir_all(&image_dir)?;
    let mut records = Vec::with_capacity(images.len());
    for (i, (id, bytes)) in images.iter().enumerate() {
        let ext = match bytes.get(..4) {
            Some(b"\x89PNG") => "png",
            Some(b"RIFF") => "webp",
            _ => "jpg",
        };
        let name = format!("{i:08}.{ext}");
        std::fs::write(image_dir.join(&name), bytes)?;
        records.push(serde_json::json!({
            "id": id,
            "image": name,
            "conversations": [
                {"from": "human", "value": "<image>"},
                {"from": "gpt", "value": ""}
            ]
        }));
    }
    let json = dir.join("llava.json");
    std::fs::write(&json, serde_json::to_vec(&records)?)?;
    Ok(json)
}
