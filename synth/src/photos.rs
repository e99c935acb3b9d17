//! Crops of real photographs, for loader benchmarks on real image statistics. Every photo under
//! the folder (recursively: .jpg, .jpeg, .png, .webp) is decoded once, downscaled to at most
//! [`CACHE_LONG_SIDE`] px and kept in memory; each sample is a random crop of the sampled aspect
//! ratio, resized to the sampled size, with a generic caption built from what the crop shows
//! (orientation, how much of the photo, brightness, dominant colour).
use crate::SynthError;
use image::imageops::FilterType;
use image::{DynamicImage, RgbImage};
use rand::Rng;
use std::path::{Path, PathBuf};

/// Long side of the in-memory copy of each source photo: at least most sampled sizes, and
/// half of the common 1920 px wallpaper width, so such JPEGs decode at 1/2 DCT scale.
pub(crate) const CACHE_LONG_SIDE: u32 = 960;
const EXTENSIONS: [&str; 4] = ["jpg", "jpeg", "png", "webp"];

/// Decoded, downscaled source photographs, in path order.
pub(crate) struct PhotoLibrary {
    photos: Vec<(PathBuf, RgbImage)>,
}

impl PhotoLibrary {
    /// Finds and decodes every photo under `dir` on `workers` threads. A photo that fails to
    /// decode is logged and skipped; none at all is an error.
    pub(crate) fn load(dir: &Path, workers: usize) -> Result<Self, SynthError> {
        let mut paths = Vec::new();
        find_photos(dir, &mut paths)?;
        paths.sort();
        let chunk = paths.len().div_ceil(workers.max(1)).max(1);
        let decoded: Vec<Option<RgbImage>> = std::thread::scope(|scope| {
            let handles: Vec<_> = paths
                .chunks(chunk)
                .map(|part| {
                    let handle = scope.spawn(move || part.iter().map(|p| decode(p)).collect());
                    (part.len(), handle)
                })
                .collect();
            // A decoder panic loses that thread's photos but keeps paths and images aligned.
            handles
                .into_iter()
                .flat_map(|(len, h)| h.join().unwrap_or_else(|_| vec![None; len]))
                .collect()
        });
        let photos: Vec<(PathBuf, RgbImage)> = paths
            .into_iter()
            .zip(decoded)
            .filter_map(|(p, img)| img.map(|img| (p, img)))
            .collect();
        if photos.is_empty() {
            return Err(SynthError::NoPhotos(dir.to_path_buf()));
        }
        tracing::info!(
            "{} photographs decoded from {}",
            photos.len(),
            dir.display()
        );
        Ok(PhotoLibrary { photos })
    }

    /// A `width` x `height` crop of a random photo, with its caption.
    pub(crate) fn crop(&self, width: u32, height: u32, rng: &mut impl Rng) -> (RgbImage, String) {
        let (_, photo) = &self.photos[rng.gen_range(0..self.photos.len())];
        let (pw, ph) = photo.dimensions();
        let aspect = width as f64 / height as f64;
        // The largest crop of this aspect ratio that fits, then a random share of it.
        let (max_w, max_h) = if pw as f64 / ph as f64 > aspect {
            (ph as f64 * aspect, ph as f64)
        } else {
            (pw as f64, pw as f64 / aspect)
        };
        let share: f64 = rng.gen_range(0.35..=1.0);
        let cw = ((max_w * share) as u32).clamp(1, pw);
        let ch = ((max_h * share) as u32).clamp(1, ph);
        let x = rng.gen_range(0..=pw - cw);
        let y = rng.gen_range(0..=ph - ch);
        let view = image::imageops::crop_imm(photo, x, y, cw, ch).to_image();
        let image = image::imageops::resize(&view, width, height, FilterType::Triangle);
        let caption = caption(&image, share);
        (image, caption)
    }
}

fn find_photos(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), SynthError> {
    let entries = std::fs::read_dir(dir).map_err(|e| SynthError::io(dir, e))?;
    for entry in entries {
        let path = entry.map_err(|e| SynthError::io(dir, e))?.path();
        if path.is_dir() {
            find_photos(&path, out)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// Decodes one source photo and downscales it to at most [`CACHE_LONG_SIDE`]; `None` (with a
/// warning) for a file that does not decode.
fn decode(path: &Path) -> Option<RgbImage> {
    let is_jpeg = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "jpg" | "jpeg"));
    // JPEGs decode straight at a reduced DCT scale (a 5640x3172 photo decodes at 1/4 size);
    // anything jpeg-decoder cannot do (CMYK, progressive quirks) goes through `image`.
    let decoded = match is_jpeg.then(|| decode_jpeg_scaled(path)).flatten() {
        Some(img) => Ok(img),
        None => image::open(path),
    };
    match decoded {
        Ok(img) => {
            let long = img.width().max(img.height());
            let img = if long > CACHE_LONG_SIDE {
                let scale = CACHE_LONG_SIDE as f64 / long as f64;
                let w = ((img.width() as f64 * scale).round() as u32).max(1);
                let h = ((img.height() as f64 * scale).round() as u32).max(1);
                img.thumbnail_exact(w, h)
            } else {
                img
            };
            Some(img.to_rgb8())
        }
        Err(err) => {
            tracing::warn!("skipping photo {}: {err}", path.display());
            None
        }
    }
}

/// A JPEG decoded at the smallest DCT scale that keeps its long side at least
/// [`CACHE_LONG_SIDE`]; `None` where jpeg-decoder cannot (the caller falls back to `image`).
fn decode_jpeg_scaled(path: &Path) -> Option<DynamicImage> {
    let file = std::fs::File::open(path).ok()?;
    let mut decoder = jpeg_decoder::Decoder::new(std::io::BufReader::new(file));
    decoder.read_info().ok()?;
    let info = decoder.info()?;
    let (w, h) = (info.width as f64, info.height as f64);
    let scale = (CACHE_LONG_SIDE as f64 / w.max(h)).min(1.0);
    decoder
        .scale((w * scale).ceil() as u16, (h * scale).ceil() as u16)
        .ok()?;
    let pixels = decoder.decode().ok()?;
    let info = decoder.info()?;
    let (w, h) = (info.width as u32, info.height as u32);
    match info.pixel_format {
        jpeg_decoder::PixelFormat::RGB24 => {
            RgbImage::from_raw(w, h, pixels).map(DynamicImage::ImageRgb8)
        }
        jpeg_decoder::PixelFormat::L8 => {
            image::GrayImage::from_raw(w, h, pixels).map(DynamicImage::ImageLuma8)
        }
        _ => None,
    }
}

/// "a close-up crop of a dark, mostly green photograph": generic, but true of the crop.
fn caption(image: &RgbImage, share: f64) -> String {
    let n = (image.width() * image.height()).max(1) as f64;
    let mut sum = [0f64; 3];
    for p in image.pixels() {
        for k in 0..3 {
            sum[k] += p[k] as f64;
        }
    }
    let mean = sum.map(|s| s / n);
    let luma = 0.299 * mean[0] + 0.587 * mean[1] + 0.114 * mean[2];
    let tone = if luma < 70.0 {
        "dark"
    } else if luma > 170.0 {
        "bright"
    } else {
        "softly lit"
    };
    let framing = if share < 0.6 {
        "a close-up crop"
    } else {
        "a wide view"
    };
    let shape = match image.width().cmp(&image.height()) {
        std::cmp::Ordering::Greater => "landscape",
        std::cmp::Ordering::Less => "portrait",
        std::cmp::Ordering::Equal => "square",
    };
    format!(
        "{framing} of a {tone} photograph in {shape} format, mostly {}",
        colour_name(mean)
    )
}

/// The nearest of a few colour names to a mean RGB colour.
fn colour_name(rgb: [f64; 3]) -> &'static str {
    const NAMES: [(&str, [f64; 3]); 10] = [
        ("red", [170.0, 50.0, 45.0]),
        ("orange", [200.0, 120.0, 50.0]),
        ("yellow", [200.0, 190.0, 70.0]),
        ("green", [70.0, 130.0, 60.0]),
        ("blue", [60.0, 90.0, 160.0]),
        ("purple", [120.0, 60.0, 140.0]),
        ("brown", [110.0, 80.0, 55.0]),
        ("grey", [128.0, 128.0, 128.0]),
        ("black", [25.0, 25.0, 25.0]),
        ("white", [225.0, 225.0, 225.0]),
    ];
    let dist = |c: &[f64; 3]| (0..3).map(|k| (c[k] - rgb[k]).powi(2)).sum::<f64>();
    NAMES
        .iter()
        .min_by(|a, b| dist(&a.1).total_cmp(&dist(&b.1)))
        .map_or("grey", |n| n.0)
}
