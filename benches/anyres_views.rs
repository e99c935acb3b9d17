//! AnyRes views (harness = false): decode + base view + `anyres_max_9` tiles per second on real
//! photographs, against transformers' own `LlavaOnevisionImageProcessor` on the same files in
//! the same run (`scripts/baselines/llava_onevision_views.py`), both on THREADS (default 2).
//!
//! `cargo bench --bench anyres_views [-- DIR]`: DIR holds JPEGs (default
//! /usr/share/backgrounds/mate); each photo is used whole, cropped tall (1:2) and cropped to a
//! wide strip (4:1), re-encoded as quality-90 JPEGs, so the pinpoints vary. Ours: read the
//! file, decode (DCT-scaled where the fitted pinpoint is much smaller than the photo), the
//! base view and the tiles as u8, on THREADS threads; the processor's views are normalised
//! floats (ours are normalised on the device). Last line: JSON.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use tessera_pipeline::loader::anyres_views::{anyres_views, fitted_box};
use tessera_pipeline::loader::decode::decode_rgb;
use tessera_pipeline::loader::resize::ChwResizer;
use tessera_shards::image_layout::{ImageLayout, Tower};

#[path = "support/photos.rs"]
mod photos;
use photos::jpegs_under;

const TOWER: Tower = Tower {
    tile: 384,
    patch: 14,
};
const ROUNDS: usize = 3;

/// Each photo whole, a tall crop and a wide strip, as quality-90 JPEG files under `out`.
fn photo_files(dir: &Path, out: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    jpegs_under(dir, &mut paths);
    paths.sort();
    let mut files = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let Ok(img) = image::open(path) else {
            continue;
        };
        let (w, h) = (img.width(), img.height());
        let crops = [
            (0, 0, w, h),
            (w / 3, 0, (h / 2).min(w), h),
            (0, h / 3, w, (w / 4).min(h)),
        ];
        for (j, (x, y, cw, ch)) in crops.into_iter().enumerate() {
            let file = out.join(format!("photo{i}-{j}.jpg"));
            let crop = img.crop_imm(x, y, cw, ch).to_rgb8();
            let mut bytes = Vec::new();
            let mut enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90);
            if enc.encode_image(&crop).is_ok() && std::fs::write(&file, bytes).is_ok() {
                files.push(file);
            }
        }
    }
    files
}

/// Views (tiles, the base view included) made from `files` by one thread.
fn views_of(files: &[&PathBuf]) -> u64 {
    let layout = ImageLayout::AnyRes { max_tiles: 9 };
    let (mut resizer, mut canvas, mut views) = (ChwResizer::default(), Vec::new(), Vec::new());
    let mut made = 0u64;
    for file in files {
        let bytes = std::fs::read(file).expect("reading a photo");
        let geometry = std::cell::Cell::new(None);
        let decoded = decode_rgb(&bytes, |w, h| {
            let g = layout.tokens(w, h, TOWER);
            let pinpoint = (g.grid.1 * TOWER.tile, g.grid.0 * TOWER.tile);
            let [_, _, fw, fh] = fitted_box((w, h), pinpoint);
            geometry.set(Some(((w, h), g)));
            (fw.max(TOWER.tile), fh.max(TOWER.tile))
        });
        let (img, _) = decoded.expect("decoding a photo");
        let (dims, geometry) = geometry.get().expect("the decoder reports the size");
        views.resize(geometry.tiles as usize * 3 * 384 * 384, 0);
        anyres_views(
            &mut resizer,
            &img,
            dims,
            &geometry,
            (384, [127; 3]),
            &mut canvas,
            &mut views,
        )
        .expect("cutting views");
        made += u64::from(geometry.tiles);
    }
    made
}

fn main() {
    let dir = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let dir = PathBuf::from(dir.unwrap_or_else(|| "/usr/share/backgrounds/mate".into()));
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let files = photo_files(&dir, tmp.path());
    assert!(!files.is_empty(), "no JPEGs under {}", dir.display());
    views_of(&files.iter().take(threads).collect::<Vec<_>>()); // warm-up
    let started = Instant::now();
    let mut tiles = 0;
    for _ in 0..ROUNDS {
        tiles += std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let mine: Vec<&PathBuf> = files.iter().skip(t).step_by(threads).collect();
                    s.spawn(move || views_of(&mine))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a view thread"))
                .sum::<u64>()
        });
    }
    let ours = tiles as f64 / started.elapsed().as_secs_f64();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let baseline = Command::new(root.join(".deps/hfvenv/bin/python"))
        .arg(root.join("scripts/baselines/llava_onevision_views.py"))
        .args([threads.to_string(), ROUNDS.to_string()])
        .args(&files)
        .output()
        .expect("running the processor baseline");
    let line = String::from_utf8_lossy(&baseline.stdout);
    assert!(
        baseline.status.success(),
        "baseline failed: {line}{}",
        String::from_utf8_lossy(&baseline.stderr)
    );
    let field = |key: &str| -> f64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in: {line}"))
    };
    let (theirs, their_tiles) = (field("tiles_per_s="), field("tiles="));
    let backend = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("processor="))
        .unwrap_or("unknown");
    assert_eq!(
        their_tiles as u64, tiles,
        "the processor cut another number of views"
    );
    println!(
        "photos {} x {ROUNDS} rounds, {threads} threads: ours {ours:.1} views/s, processor \
         ({backend}) {theirs:.1} views/s",
        files.len()
    );
    println!(
        "{{\"images\": {}, \"views\": {tiles}, \"threads\": {threads}, \"ours_views_per_s\": {ours:.2}, \"processor_views_per_s\": {theirs:.2}, \"processor\": \"{backend}\", \"ratio\": {:.2}}}",
        files.len() * ROUNDS,
        ours / theirs
    );
}
