//! Image checks, cheapest first: the format from magic bytes (never the file name), width and
//! height from the header, the pixel limit (a decompression bomb is refused before any
//! decoding), then, unless `--no-verify`, a decode of the whole file. JPEGs are verified with a
//! DCT-scaled decode (libjpeg-turbo at 1/8 scale, `jpeg_check.rs`): every entropy-coded bit is
//! read, so truncated or corrupt data still fails, but most of the inverse DCT and colour
//! conversion is skipped. PNG and WebP are decoded fully with `image`.
use crate::reason::Reason;
use std::io::Cursor;

/// Formats tessera stores (the loader decodes these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImageFormat {
    Jpeg,
    Png,
    Webp,
}

impl ImageFormat {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Png => "png",
            ImageFormat::Webp => "webp",
        }
    }

    /// Whether a file name's extension matches this format.
    fn matches_extension(self, path: &str) -> bool {
        let ext = path
            .rsplit_once('.')
            .map(|(_, e)| e.to_ascii_lowercase())
            .unwrap_or_default();
        match self {
            ImageFormat::Jpeg => matches!(ext.as_str(), "jpg" | "jpeg" | "jpe" | "jfif"),
            ImageFormat::Png => ext == "png",
            ImageFormat::Webp => ext == "webp",
        }
    }
}

/// What the header says about an image, plus kept-but-notable facts for the report.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ImageInfo {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    /// Note names (e.g. `misnamed_image`, `cmyk_jpeg`, `grayscale_image`, `tiny_image`).
    pub notes: Vec<&'static str>,
}

/// A rejected image: reason and detail.
pub(crate) type ProbeError = (Reason, String);

/// The format from magic bytes.
pub(crate) fn detect_format(bytes: &[u8]) -> Option<ImageFormat> {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(ImageFormat::Jpeg)
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(ImageFormat::Png)
    } else if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some(ImageFormat::Webp)
    } else {
        None
    }
}

/// Format, size and notes from the header only; refuses images above `max_pixels`.
pub(crate) fn probe(bytes: &[u8], path: &str, max_pixels: u64) -> Result<ImageInfo, ProbeError> {
    let Some(format) = detect_format(bytes) else {
        let head = String::from_utf8_lossy(&bytes[..bytes.len().min(16)]).into_owned();
        return Err((
            Reason::NotAnImage,
            format!("{path}: not a JPEG, PNG or WebP (starts with {head:?})"),
        ));
    };
    let mut notes = Vec::new();
    let (width, height) = match format {
        ImageFormat::Jpeg => {
            let mut decoder = jpeg_decoder::Decoder::new(bytes);
            decoder
                .read_info()
                .map_err(|e| (Reason::CorruptImage, format!("{path}: jpeg header: {e}")))?;
            let info = decoder.info().ok_or_else(|| {
                (
                    Reason::CorruptImage,
                    format!("{path}: jpeg without a frame header"),
                )
            })?;
            match info.pixel_format {
                jpeg_decoder::PixelFormat::CMYK32 => notes.push("cmyk_jpeg"),
                jpeg_decoder::PixelFormat::L8 | jpeg_decoder::PixelFormat::L16 => {
                    notes.push("grayscale_image")
                }
                jpeg_decoder::PixelFormat::RGB24 => {}
            }
            (u32::from(info.width), u32::from(info.height))
        }
        ImageFormat::Png | ImageFormat::Webp => {
            let reader =
                image::ImageReader::with_format(Cursor::new(bytes), to_image_format(format));
            reader.into_dimensions().map_err(|e| {
                (
                    Reason::CorruptImage,
                    format!("{path}: {} header: {e}", format.as_str()),
                )
            })?
        }
    };
    if width == 0 || height == 0 {
        return Err((
            Reason::CorruptImage,
            format!("{path}: header says {width}x{height}"),
        ));
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err((
            Reason::DecompressionBomb,
            format!("{path}: {width}x{height} = {pixels} pixels, above the limit of {max_pixels}"),
        ));
    }
    // A name without an extension (an image embedded in parquet without a path) names no
    // format to disagree with.
    let named = path
        .rsplit('/')
        .next()
        .is_some_and(|file| file.contains('.'));
    if named && !format.matches_extension(path) {
        notes.push("misnamed_image");
    }
    let (short, long) = (width.min(height), width.max(height));
    if short < tessera_shards::TINY_SIDE {
        notes.push("tiny_image");
    }
    if long as f64 / short as f64 >= tessera_shards::EXTREME_ASPECT {
        notes.push("extreme_aspect");
    }
    Ok(ImageInfo {
        format,
        width,
        height,
        notes,
    })
}

fn to_image_format(format: ImageFormat) -> image::ImageFormat {
    match format {
        ImageFormat::Jpeg => image::ImageFormat::Jpeg,
        ImageFormat::Png => image::ImageFormat::Png,
        ImageFormat::Webp => image::ImageFormat::WebP,
    }
}

/// Decodes the whole file (JPEG at 1/8 DCT scale); fails on truncated or corrupt data.
pub(crate) fn verify_decode(bytes: &[u8], path: &str, info: &ImageInfo) -> Result<(), ProbeError> {
    let corrupt = |e: String| {
        (
            Reason::CorruptImage,
            format!("{path}: {} decode: {e}", info.format.as_str()),
        )
    };
    match info.format {
        ImageFormat::Jpeg => crate::jpeg_check::check_jpeg(bytes).map_err(corrupt)?,
        ImageFormat::Png | ImageFormat::Webp => {
            image::load_from_memory_with_format(bytes, to_image_format(info.format))
                .map_err(|e| corrupt(e.to_string()))?;
        }
    }
    Ok(())
}
