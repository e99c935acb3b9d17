//! Loader stage micro-benchmark (harness = false): per-image cost of each decode and resize
//! path on LLaVA-sized crops of real photographs, with a memcpy of the output as the floor.
//!
//! `cargo bench --bench loader [-- DIR]`: DIR holds JPEGs (default /usr/share/backgrounds/mate,
//! cropped to LLaVA sizes: shorter side 336). Last line: JSON of milliseconds per image.
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera_pipeline::loader::decode::{
    decode_jpeg_scaled, decode_rgb, decode_rgb_reusing, RgbImage,
};
use tessera_pipeline::loader::resize::{ChwResizer, ResizeBackend};
use tessera_pipeline::loader::ResizePolicy;

#[path = "support/photos.rs"]
mod photos;
use photos::jpegs_under;

const SIZE: u32 = 384;
/// LLaVA-Pretrain-like shapes (shorter side 336).
const SHAPES: [(u32, u32); 6] = [
    (448, 336),
    (500, 336),
    (336, 336),
    (336, 448),
    (504, 336),
    (400, 336),
];

/// Crops of every photo at each LLaVA shape, re-encoded as quality-90 JPEGs.
fn llava_sized_jpegs(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths = Vec::new();
    jpegs_under(dir, &mut paths);
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let Ok(img) = image::open(&path) else {
            continue;
        };
        for (i, &(w, h)) in SHAPES.iter().enumerate() {
            let scale = (w as f32 / img.width() as f32).max(h as f32 / img.height() as f32);
            let (sw, sh) = (
                (img.width() as f32 * scale).ceil() as u32,
                (img.height() as f32 * scale).ceil() as u32,
            );
            let resized =
                img.resize_exact(sw.max(w), sh.max(h), image::imageops::FilterType::Triangle);
            let x = (resized.width() - w) * i as u32 / 6;
            let crop = resized.crop_imm(x, 0, w, h).to_rgb8();
            let mut bytes = Vec::new();
            let mut enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90);
            if enc.encode_image(&crop).is_ok() {
                out.push(bytes);
            }
        }
    }
    out
}

/// Milliseconds per item of `f` over `items`, best of 7 passes (robust to a busy machine).
fn per_item<T>(items: &[T], mut f: impl FnMut(&T)) -> f64 {
    (0..7)
        .map(|_| {
            let t = Instant::now();
            items.iter().for_each(&mut f);
            t.elapsed().as_secs_f64() * 1e3 / items.len() as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let dir = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let dir = PathBuf::from(dir.unwrap_or_else(|| "/usr/share/backgrounds/mate".into()));
    let jpegs = llava_sized_jpegs(&dir);
    assert!(!jpegs.is_empty(), "no JPEGs under {}", dir.display());
    let decoded: Vec<RgbImage> = jpegs
        .iter()
        .filter_map(|b| decode_rgb(b, |w, h| (w, h)).ok().map(|(img, _)| img))
        .collect();
    let out_len = 3 * (SIZE * SIZE) as usize;
    let mut out = vec![0u8; out_len];
    let mut resizer = ChwResizer::default();

    let image_crate = per_item(&jpegs, |b| drop(black_box(image::load_from_memory(b))));
    let ours_decode = per_item(&jpegs, |b| {
        drop(black_box(decode_rgb(b, |_, _| (SIZE, SIZE))))
    });
    let mut reuse = Vec::new();
    let ours_reusing = per_item(&jpegs, |b| {
        let taken = std::mem::take(&mut reuse);
        if let Ok((img, _)) = decode_rgb_reusing(b, |_, _| (SIZE, SIZE), taken) {
            reuse = black_box(img).data;
        }
    });
    let jpeg_decoder = per_item(
        &decoded.iter().zip(&jpegs).collect::<Vec<_>>(),
        |(img, b)| {
            drop(black_box(decode_jpeg_scaled(b, img.width, img.height)));
        },
    );
    let mut resize = |backend, policy| {
        let mut resizer = ChwResizer::with_backend(backend);
        per_item(&decoded, |img| {
            let dims = (img.width, img.height);
            let r = resizer.resize_into(img, dims, SIZE, policy, [127; 3], &mut out);
            black_box(r.is_ok());
        })
    };
    let squash = resize(ResizeBackend::Planar, ResizePolicy::Squash);
    let pad = resize(ResizeBackend::Planar, ResizePolicy::Pad);
    let fir_squash = resize(ResizeBackend::FastImageResize, ResizePolicy::Squash);
    let fir_pad = resize(ResizeBackend::FastImageResize, ResizePolicy::Pad);
    let square = RgbImage {
        width: SIZE,
        height: SIZE,
        data: vec![9u8; out_len],
    };
    let copy_transpose = per_item(&decoded, |_| {
        let r = resizer.resize_into(
            &square,
            (SIZE, SIZE),
            SIZE,
            ResizePolicy::Squash,
            [127; 3],
            &mut out,
        );
        black_box(r.is_ok());
    });
    let src = vec![7u8; out_len];
    let memcpy = per_item(&decoded, |_| {
        out.copy_from_slice(black_box(&src));
        black_box(&out);
    });
    println!(
        "{} LLaVA-sized JPEGs from {}; ms per image, one thread:",
        jpegs.len(),
        dir.display()
    );
    println!("  decode: image crate {image_crate:.3}, tessera (zune direct) {ours_decode:.3}, into a reused buffer (the loader's path) {ours_reusing:.3}, jpeg-decoder {jpeg_decoder:.3}");
    println!("  resize to {SIZE} CHW, planar (the loader's path on AVX2): squash {squash:.3}, pad {pad:.3}");
    println!(
        "  resize with fast_image_resize: squash {fir_squash:.3} ({:.2}x planar's time), pad {fir_pad:.3} ({:.2}x)",
        fir_squash / squash,
        fir_pad / pad
    );
    println!("  memcpy of the output {memcpy:.4}, copy + CHW transpose only {copy_transpose:.3}");
    println!(
        "{}",
        serde_json::json!({
            "images": jpegs.len(), "decode_image_crate_ms": image_crate,
            "decode_tessera_ms": ours_decode, "decode_tessera_reused_buffer_ms": ours_reusing, "decode_jpeg_decoder_ms": jpeg_decoder,
            "resize_squash_ms": squash, "resize_pad_ms": pad,
            "fir_resize_squash_ms": fir_squash, "fir_resize_pad_ms": fir_pad, "memcpy_ms": memcpy, "copy_transpose_ms": copy_transpose,
        })
    );
}
