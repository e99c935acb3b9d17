//! Loader image tests: `squash` / `pad` geometry, colour conversions, and DCT-scaled decoding
//! against a full decode + resize.
use anyhow::{ensure, Result};
use tessera_pipeline::loader::decode::{
    dct_scale_eighths, decode_rgb, decode_rgb_reusing, DecodePath, RgbImage,
};
use tessera_pipeline::loader::resize::{content_box, ChwResizer};
use tessera_pipeline::loader::ResizePolicy;

fn encode_jpeg(img: &image::DynamicImage, quality: u8) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality).encode_image(img)?;
    Ok(out)
}

fn encode_png(img: &image::DynamicImage) -> Result<Vec<u8>> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)?;
    Ok(out.into_inner())
}

/// Smooth, photo-like content: gradients plus low-frequency waves.
fn photo_like(w: u32, h: u32) -> image::DynamicImage {
    image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(w, h, |x, y| {
        let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
        let wave = ((fx * 9.0).sin() * (fy * 7.0).cos() * 60.0) as i32;
        let c = |base: f32| (base + wave as f32).clamp(0.0, 255.0) as u8;
        image::Rgb([c(255.0 * fx), c(255.0 * fy), c(128.0 + 60.0 * (fx - fy))])
    }))
}

fn to_chw(img: &RgbImage, size: u32, policy: ResizePolicy) -> Result<Vec<u8>> {
    let mut out = vec![0u8; 3 * (size * size) as usize];
    let dims = (img.width, img.height);
    ChwResizer::default()
        .resize_into(img, dims, size, policy, [127, 127, 127], &mut out)
        .map_err(anyhow::Error::msg)?;
    Ok(out)
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    let sum: u64 = a.iter().zip(b).map(|(&x, &y)| x.abs_diff(y) as u64).sum();
    sum as f64 / a.len() as f64
}

/// Solid-colour test image, decoded losslessly from PNG.
fn solid(w: u32, h: u32, rgb: [u8; 3]) -> Result<RgbImage> {
    let img = image::DynamicImage::ImageRgb8(image::RgbImage::from_pixel(w, h, image::Rgb(rgb)));
    let (img, path) = decode_rgb(&encode_png(&img)?, |w, h| (w, h)).map_err(anyhow::Error::msg)?;
    ensure!(path == DecodePath::Other);
    Ok(img)
}

#[test]
fn squash_fills_the_whole_square_and_writes_planes() -> Result<()> {
    let img = solid(60, 20, [200, 10, 90])?;
    let out = to_chw(&img, 16, ResizePolicy::Squash)?;
    assert_eq!(out.len(), 3 * 16 * 16);
    let (r, g, b) = (&out[..256], &out[256..512], &out[512..]);
    assert!(r.iter().all(|&v| v == 200) && g.iter().all(|&v| v == 10));
    assert!(b.iter().all(|&v| v == 90));
    Ok(())
}

#[test]
fn pad_centres_the_image_between_grey_borders() -> Result<()> {
    // 64x32 landscape -> 32x32: image rows 8..24, grey rows above and below.
    assert_eq!(content_box(64, 32, 32, ResizePolicy::Pad), [0, 8, 32, 16]);
    let img = solid(64, 32, [250, 0, 0])?;
    let out = to_chw(&img, 32, ResizePolicy::Pad)?;
    for c in 0..3 {
        for y in 0..32 {
            let row = &out[(c * 32 + y) * 32..(c * 32 + y + 1) * 32];
            let want = if (8..24).contains(&y) {
                [250, 0, 0][c]
            } else {
                127
            };
            ensure!(
                row.iter().all(|&v| v == want),
                "channel {c} row {y}: {row:?}"
            );
        }
    }
    // Portrait: grey columns left and right.
    assert_eq!(content_box(30, 60, 32, ResizePolicy::Pad), [8, 0, 16, 32]);
    let out = to_chw(&solid(30, 60, [0, 250, 0])?, 32, ResizePolicy::Pad)?;
    let green = &out[32 * 32..2 * 32 * 32];
    assert_eq!(&green[..8], &[127; 8]);
    assert_eq!(&green[8..24], &[250; 16]);
    assert_eq!(&green[24..32], &[127; 8]);
    Ok(())
}

#[test]
fn pad_matches_expand2square_then_resize() -> Result<()> {
    // LLaVA's way: paste into a grey square, then resize the square. Ours resizes into the box.
    let src = photo_like(96, 64);
    let img = decode_rgb(&encode_png(&src)?, |w, h| (w, h))
        .map_err(anyhow::Error::msg)?
        .0;
    let ours = to_chw(&img, 48, ResizePolicy::Pad)?;
    let mut square = image::RgbImage::from_pixel(96, 96, image::Rgb([127, 127, 127]));
    image::imageops::replace(&mut square, &src.to_rgb8(), 0, 16);
    let square = RgbImage {
        width: 96,
        height: 96,
        data: square.into_raw(),
    };
    let llava = to_chw(&square, 48, ResizePolicy::Squash)?;
    let diff = mean_abs_diff(&ours, &llava);
    assert!(diff < 2.0, "mean abs diff {diff}");
    Ok(())
}

#[test]
fn dct_scale_is_the_smallest_that_keeps_the_needed_size() {
    // 4000x3000 for 384x384: 1/8 gives 500x375 (too short), 1/4 gives 1000x750.
    assert_eq!(dct_scale_eighths(4000, 3000, 384, 384), 2);
    assert_eq!(dct_scale_eighths(4000, 3000, 384, 288), 1);
    // LLaVA-sized photos need every pixel.
    assert_eq!(dct_scale_eighths(448, 336, 384, 384), 8);
    assert_eq!(dct_scale_eighths(800, 800, 384, 384), 4);
}

#[test]
fn large_jpeg_is_decoded_scaled_and_close_to_a_full_decode() -> Result<()> {
    let src = photo_like(3200, 2400);
    let bytes = encode_jpeg(&src, 90)?;
    let (scaled, path) = decode_rgb(&bytes, |_, _| (384, 384)).map_err(anyhow::Error::msg)?;
    assert_eq!(path, DecodePath::JpegScaled { eighths: 2 });
    assert_eq!((scaled.width, scaled.height), (800, 600));
    let full = image::load_from_memory(&bytes)?.to_rgb8();
    let full = RgbImage {
        width: 3200,
        height: 2400,
        data: full.into_raw(),
    };
    for policy in [ResizePolicy::Squash, ResizePolicy::Pad] {
        let a = to_chw(&scaled, 384, policy)?;
        let b = to_chw(&full, 384, policy)?;
        let diff = mean_abs_diff(&a, &b);
        assert!(
            diff < 1.5,
            "{policy:?}: mean abs diff {diff} between scaled and full decode"
        );
    }
    Ok(())
}

#[test]
fn llava_sized_jpeg_takes_the_full_size_path() -> Result<()> {
    let bytes = encode_jpeg(&photo_like(448, 336), 90)?;
    let (img, path) = decode_rgb(&bytes, |_, _| (384, 384)).map_err(anyhow::Error::msg)?;
    assert_eq!(
        (path, img.width, img.height),
        (DecodePath::JpegFull, 448, 336)
    );
    let reference = image::load_from_memory(&bytes)?.to_rgb8().into_raw();
    assert!(
        img.data == reference,
        "same pixels as the image crate's decoder"
    );
    Ok(())
}

#[test]
fn decoding_into_a_reused_buffer_gives_the_same_pixels() -> Result<()> {
    let bytes = encode_jpeg(&photo_like(448, 336), 90)?;
    let (fresh, _) = decode_rgb(&bytes, |_, _| (384, 384)).map_err(anyhow::Error::msg)?;
    // A dirty buffer larger than the image, then one smaller: neither may leak into the output.
    for reuse in [vec![7u8; 3 * 600 * 500], vec![9u8; 100]] {
        let (img, path) =
            decode_rgb_reusing(&bytes, |_, _| (384, 384), reuse).map_err(anyhow::Error::msg)?;
        assert_eq!(path, DecodePath::JpegFull);
        assert!(img == fresh, "reused buffer gave other pixels or size");
    }
    Ok(())
}

#[test]
fn grayscale_jpeg_becomes_grey_rgb_on_both_paths() -> Result<()> {
    let luma =
        image::GrayImage::from_fn(1600, 1200, |x, y| image::Luma([((x + y) / 12 % 256) as u8]));
    let bytes = encode_jpeg(&image::DynamicImage::ImageLuma8(luma), 95)?;
    for need in [(1600, 1200), (200, 150)] {
        let (img, path) = decode_rgb(&bytes, |_, _| need).map_err(anyhow::Error::msg)?;
        assert_eq!(
            img.data.len(),
            (img.width * img.height * 3) as usize,
            "{path:?}"
        );
        let grey = img
            .data
            .chunks_exact(3)
            .all(|p| p[0] == p[1] && p[1] == p[2]);
        assert!(grey, "{path:?}: R, G and B differ");
    }
    Ok(())
}

#[test]
fn bytes_that_are_no_image_give_an_error_not_a_panic() {
    for bytes in [
        &b""[..],
        b"GIF89a",
        b"\xFF\xD8\xFF\xE0garbage",
        b"\x89PNG\r\n\x1a\n",
    ] {
        assert!(decode_rgb(bytes, |w, h| (w, h)).is_err(), "{bytes:?}");
    }
}

/// Photo-like `w x h` content as the decoder hands it over.
fn decoded_photo(w: u32, h: u32) -> RgbImage {
    RgbImage {
        width: w,
        height: h,
        data: photo_like(w, h).to_rgb8().into_raw(),
    }
}

/// The planar resize against `fast_image_resize` at `size`, both policies: the worst pixel and
/// the mean difference. Both are PIL's filter; they differ only in rounding and pass order.
fn planar_vs_fir(shapes: &[(u32, u32)], size: u32, mean_below: f64) -> Result<()> {
    use tessera_pipeline::loader::resize::ResizeBackend;
    let mut planar = ChwResizer::with_backend(ResizeBackend::Planar);
    let mut fir = ChwResizer::with_backend(ResizeBackend::FastImageResize);
    let len = 3 * (size * size) as usize;
    for &(w, h) in shapes {
        let img = decoded_photo(w, h);
        for policy in [ResizePolicy::Squash, ResizePolicy::Pad] {
            let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
            planar
                .resize_into(&img, (w, h), size, policy, [127; 3], &mut a)
                .map_err(anyhow::Error::msg)?;
            fir.resize_into(&img, (w, h), size, policy, [127; 3], &mut b)
                .map_err(anyhow::Error::msg)?;
            let worst = a.iter().zip(&b).map(|(x, y)| x.abs_diff(*y)).max();
            ensure!(
                worst <= Some(2),
                "{w}x{h} {policy:?}: worst pixel diff {worst:?}"
            );
            let mean = mean_abs_diff(&a, &b);
            ensure!(mean < mean_below, "{w}x{h} {policy:?}: mean diff {mean}");
        }
    }
    Ok(())
}

#[test]
fn planar_resize_matches_fast_image_resize_on_photo_content() -> Result<()> {
    // Up, down, mixed and DCT-scaled-like sizes.
    let shapes = [
        (448, 336),
        (336, 336),
        (336, 476),
        (505, 336),
        (1000, 750),
        (97, 61),
    ];
    planar_vs_fir(&shapes, 384, 0.3)
}

#[test]
fn planar_resize_handles_one_pixel_edges() -> Result<()> {
    let shapes = [(1, 1), (1, 5), (5, 1), (2, 2), (3, 700), (700, 3)];
    planar_vs_fir(&shapes, 32, 1.0)
}

#[test]
fn one_resizer_gives_the_same_pixels_across_hundreds_of_sizes() -> Result<()> {
    // More (input, output) lengths than the resizer keeps taps for: its cache must refill
    // without changing a pixel.
    let mut kept = ChwResizer::default();
    for i in 0..300u32 {
        let (w, h) = (40 + i, 30 + (i * 7) % 50);
        let img = decoded_photo(w, h);
        let mut a = vec![0u8; 3 * 32 * 32];
        kept.resize_into(&img, (w, h), 32, ResizePolicy::Pad, [127; 3], &mut a)
            .map_err(anyhow::Error::msg)?;
        ensure!(a == to_chw(&img, 32, ResizePolicy::Pad)?, "{w}x{h}");
    }
    Ok(())
}
