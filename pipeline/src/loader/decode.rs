//! Image bytes -> interleaved RGB8, as small as the output allows.
//!
//! JPEG: when a DCT-domain scale (1/2, 1/4, 1/8) still leaves at least the needed size in both
//! axes, `jpeg-decoder` decodes at that scale (a 4000x3000 photo bound for 384x384 is decoded
//! at 1000x750, never at full size); otherwise `zune-jpeg` (the `image` crate's own JPEG
//! decoder, faster than `jpeg-decoder` at full size) decodes straight to RGB. Grayscale and
//! CMYK become RGB. PNG and WebP go through `image`. The format comes from the bytes.

/// Larger images are refused as decompression bombs (PIL warns at 89 M pixels).
pub const MAX_PIXELS: u64 = 100_000_000;

/// Why bytes did not become an RGB image. A decoder's own error is the `source()`.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a JPEG, PNG or WebP (unknown magic bytes)")]
    UnknownFormat,
    #[error("empty image {width}x{height}")]
    Empty { width: u32, height: u32 },
    #[error("{width}x{height} is over {MAX_PIXELS} pixels (decompression bomb guard)")]
    TooManyPixels { width: u32, height: u32 },
    #[error("JPEG header has no frame size")]
    NoFrameSize,
    #[error("JPEG: a {width}x{height} decode asks for a side of {requested}, over JPEG's 65535")]
    TooWide {
        width: u32,
        height: u32,
        requested: u32,
    },
    /// `zune-jpeg` (full-size decodes) failed.
    #[error("JPEG")]
    Zune {
        source: zune_jpeg::errors::DecodeErrors,
    },
    /// `jpeg-decoder` (DCT-scaled decodes, CMYK) failed.
    #[error("JPEG")]
    JpegDecoder { source: jpeg_decoder::Error },
    #[error("JPEG decoded without frame info")]
    NoFrameInfo,
    /// The decoder's output does not hold `width x height` pixels of its format.
    #[error("JPEG decoder gives {got} bytes for {width}x{height}x{channels}")]
    OutputLength {
        got: usize,
        width: u32,
        height: u32,
        channels: usize,
    },
    /// PNG or WebP, through the `image` crate.
    #[error("{format:?}")]
    Image {
        format: image::ImageFormat,
        source: image::ImageError,
    },
}

/// An interleaved RGB8 image.
#[derive(Clone, Debug, PartialEq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    /// `width * height * 3` bytes, row-major.
    pub data: Vec<u8>,
}

/// Which path decoded an image (for benchmarks and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodePath {
    /// `zune-jpeg`, full size.
    JpegFull,
    /// `jpeg-decoder` with DCT scaling by `eighths / 8` (4 = 1/2, 2 = 1/4, 1 = 1/8).
    JpegScaled { eighths: u32 },
    /// PNG or WebP through `image`.
    Other,
}

/// Decodes `bytes` to RGB. `needed(w, h)` tells, from the full size, the smallest width and
/// height the caller will resize from; a DCT scale is used only when it keeps both.
pub fn decode_rgb(
    bytes: &[u8],
    needed: impl Fn(u32, u32) -> (u32, u32),
) -> Result<(RgbImage, DecodePath), DecodeError> {
    decode_rgb_reusing(bytes, needed, Vec::new())
}

/// [`decode_rgb`], decoding full-size JPEGs into `reuse`'s allocation (give back the previous
/// image's `data`): a worker then decodes without a fresh half-megabyte allocation, and its
/// page faults, per image.
pub fn decode_rgb_reusing(
    bytes: &[u8],
    needed: impl Fn(u32, u32) -> (u32, u32),
    reuse: Vec<u8>,
) -> Result<(RgbImage, DecodePath), DecodeError> {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        decode_jpeg(bytes, needed, reuse)
    } else if bytes.starts_with(b"\x89PNG") {
        decode_with_image(bytes, image::ImageFormat::Png).map(|i| (i, DecodePath::Other))
    } else if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        decode_with_image(bytes, image::ImageFormat::WebP).map(|i| (i, DecodePath::Other))
    } else {
        Err(DecodeError::UnknownFormat)
    }
}

/// The DCT scale (in eighths: 8, 4, 2 or 1) that reduces most while keeping at least
/// `need_w x need_h`. Scaled sizes round up, as libjpeg's and `jpeg-decoder`'s do.
pub fn dct_scale_eighths(width: u32, height: u32, need_w: u32, need_h: u32) -> u32 {
    for eighths in [1u32, 2, 4] {
        if scaled_len(width, eighths) >= need_w && scaled_len(height, eighths) >= need_h {
            return eighths;
        }
    }
    8
}

fn scaled_len(len: u32, eighths: u32) -> u32 {
    (len * eighths).div_ceil(8)
}

fn decode_jpeg(
    bytes: &[u8],
    needed: impl Fn(u32, u32) -> (u32, u32),
    reuse: Vec<u8>,
) -> Result<(RgbImage, DecodePath), DecodeError> {
    use zune_core::{bytestream::ZCursor, colorspace::ColorSpace, options::DecoderOptions};
    let options = DecoderOptions::default()
        .set_strict_mode(false)
        .set_max_width(u16::MAX as usize)
        .set_max_height(u16::MAX as usize)
        .jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut zune = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    zune.decode_headers()
        .map_err(|source| DecodeError::Zune { source })?;
    let (w, h) = zune.dimensions().ok_or(DecodeError::NoFrameSize)?;
    let (w, h) = (w as u32, h as u32);
    check_size(w, h)?;
    let (need_w, need_h) = needed(w, h);
    let eighths = dct_scale_eighths(w, h, need_w, need_h);
    if eighths < 8 {
        let img = decode_jpeg_scaled(bytes, scaled_len(w, eighths), scaled_len(h, eighths))?;
        return Ok((img, DecodePath::JpegScaled { eighths }));
    }
    let colorspace = zune.output_colorspace();
    if colorspace != Some(ColorSpace::RGB) {
        // zune cannot give RGB for this input (e.g. some CMYK files): take the general path.
        let img = decode_jpeg_scaled(bytes, w, h)?;
        return Ok((img, DecodePath::JpegScaled { eighths: 8 }));
    }
    let len = w as usize * h as usize * 3;
    let wanted = zune.output_buffer_size();
    if wanted != Some(len) {
        return Err(DecodeError::OutputLength {
            got: wanted.unwrap_or(0),
            width: w,
            height: h,
            channels: 3,
        });
    }
    let mut data = reuse;
    // Every byte is overwritten by the decoder: only growth needs filling.
    if data.len() > len {
        data.truncate(len);
    } else {
        data.resize(len, 0);
    }
    zune.decode_into(&mut data)
        .map_err(|source| DecodeError::Zune { source })?;
    Ok((
        RgbImage {
            width: w,
            height: h,
            data,
        },
        DecodePath::JpegFull,
    ))
}

/// `jpeg-decoder` at the DCT scale that gives `req_w x req_h` (or the nearest larger); with
/// the full size it is a plain full decode.
pub fn decode_jpeg_scaled(bytes: &[u8], req_w: u32, req_h: u32) -> Result<RgbImage, DecodeError> {
    use jpeg_decoder::PixelFormat;
    let mut dec = jpeg_decoder::Decoder::new(bytes);
    let side = |requested: u32| {
        u16::try_from(requested).map_err(|_| DecodeError::TooWide {
            width: req_w,
            height: req_h,
            requested,
        })
    };
    let (w, h) = dec
        .scale(side(req_w)?, side(req_h)?)
        .map_err(|source| DecodeError::JpegDecoder { source })?;
    let raw = dec
        .decode()
        .map_err(|source| DecodeError::JpegDecoder { source })?;
    let info = dec.info().ok_or(DecodeError::NoFrameInfo)?;
    let (w, h) = (w as u32, h as u32);
    let px = w as usize * h as usize;
    let bpp = info.pixel_format.pixel_bytes();
    if raw.len() != px * bpp {
        return Err(DecodeError::OutputLength {
            got: raw.len(),
            width: w,
            height: h,
            channels: bpp,
        });
    }
    let data = match info.pixel_format {
        PixelFormat::RGB24 => raw,
        PixelFormat::L8 => raw.iter().flat_map(|&l| [l, l, l]).collect(),
        // 16-bit grayscale comes big-endian: keep the high byte.
        PixelFormat::L16 => raw
            .chunks_exact(2)
            .flat_map(|l| [l[0], l[0], l[0]])
            .collect(),
        PixelFormat::CMYK32 => raw.chunks_exact(4).flat_map(cmyk_to_rgb).collect(),
    };
    Ok(RgbImage {
        width: w,
        height: h,
        data,
    })
}

/// Naive CMYK -> RGB (as PIL's `convert("RGB")`): channel = (255 - c) * (255 - k) / 255.
fn cmyk_to_rgb(p: &[u8]) -> [u8; 3] {
    let k = 255 - p[3] as u32;
    let ch = |c: u8| (((255 - c as u32) * k + 127) / 255) as u8;
    [ch(p[0]), ch(p[1]), ch(p[2])]
}

fn decode_with_image(bytes: &[u8], format: image::ImageFormat) -> Result<RgbImage, DecodeError> {
    let failed = |source| DecodeError::Image { format, source };
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    reader.no_limits();
    let (w, h) = reader.into_dimensions().map_err(failed)?;
    check_size(w, h)?;
    let img = image::load_from_memory_with_format(bytes, format)
        .map_err(failed)?
        .into_rgb8();
    let (width, height) = img.dimensions();
    Ok(RgbImage {
        width,
        height,
        data: img.into_raw(),
    })
}

fn check_size(width: u32, height: u32) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::Empty { width, height });
    }
    if width as u64 * height as u64 > MAX_PIXELS {
        return Err(DecodeError::TooManyPixels { width, height });
    }
    Ok(())
}
