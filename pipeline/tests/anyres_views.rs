//! `anyres_max_9` views of real photographs (Debian's mate-backgrounds, cropped to tall, wide,
//! small and odd shapes, written as PNG so both sides decode the same pixels) against those
//! transformers' `LlavaOnevisionImageProcessor` cuts (`tests/oracles/anyres_views.py`): as many
//! views, the same base view and tiles to within the two bicubic implementations' rounding.
use anyhow::{ensure, Context, Result};
use pipeline::loader::anyres_views::anyres_views;
use pipeline::loader::decode::decode_rgb;
use pipeline::loader::resize::ChwResizer;
use safetensors::SafeTensors;
use shards::image_layout::{ImageLayout, Tower};
use std::path::Path;

const PHOTO: &str = "/usr/share/backgrounds/mate/nature/Garden.jpg";
const SO400M: Tower = Tower {
    tile: 384,
    patch: 14,
};

/// (x, y, width, height) crops of the 2560 x 1600 photo.
const CROPS: [(u32, u32, u32, u32); 6] = [
    (0, 0, 2560, 1600),
    (900, 0, 600, 1600),
    (100, 100, 200, 150),
    (1000, 500, 777, 333),
    (300, 300, 1000, 1000),
    (0, 700, 2560, 200),
];

#[test]
fn views_match_the_llava_onevision_image_processors() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let photo = image::open(PHOTO)
        .with_context(|| format!("{PHOTO} (scripts/setup.sh installs mate-backgrounds)"))?;
    let dir = tempfile::tempdir()?;
    let mut paths = Vec::new();
    for (i, &(x, y, w, h)) in CROPS.iter().enumerate() {
        let path = dir.path().join(format!("crop{i}.png"));
        photo.crop_imm(x, y, w, h).to_rgb8().save(&path)?;
        paths.push(path);
    }
    let views_file = dir.path().join("views.safetensors");
    let out = std::process::Command::new(root.join(".deps/hfvenv/bin/python"))
        .arg(root.join("tests/oracles/anyres_views.py"))
        .arg(&views_file)
        .args(&paths)
        .output()
        .context("running tests/oracles/anyres_views.py")?;
    ensure!(
        out.status.success(),
        "the oracle failed (run scripts/setup.sh for .deps/hfvenv): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&views_file)?;
    let want = SafeTensors::deserialize(&bytes)?;
    let layout = ImageLayout::AnyRes { max_tiles: 9 };
    let (mut resizer, mut canvas) = (ChwResizer::default(), Vec::new());
    for (i, path) in paths.iter().enumerate() {
        let (img, _) =
            decode_rgb(&std::fs::read(path)?, |w, h| (w, h)).map_err(anyhow::Error::msg)?;
        let dims = (img.width, img.height);
        let geometry = layout.tokens(dims.0, dims.1, SO400M);
        let mut views = vec![0u8; geometry.tiles as usize * 3 * 384 * 384];
        anyres_views(
            &mut resizer,
            &img,
            dims,
            &geometry,
            384,
            &mut canvas,
            &mut views,
        )
        .map_err(anyhow::Error::msg)?;
        let theirs = want.tensor(&format!("views.{i}"))?;
        let shape = theirs.shape().to_vec();
        ensure!(
            shape == [geometry.tiles as usize, 3, 384, 384],
            "{dims:?}: the processor cut {shape:?}, the planner counts {} views",
            geometry.tiles
        );
        let theirs: Vec<f32> = theirs
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let diffs: Vec<f32> = views
            .iter()
            .zip(&theirs)
            .map(|(&a, &b)| (f32::from(a) - b).abs())
            .collect();
        let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
        let over_2 = diffs.iter().filter(|&&d| d > 2.0).count() as f32 / diffs.len() as f32;
        let max = diffs.iter().copied().fold(0.0, f32::max);
        eprintln!(
            "{dims:?}: {} views, mean |diff| {mean:.3}, over 2: {over_2:.5}, max {max}",
            geometry.tiles
        );
        ensure!(
            mean <= 0.1 && over_2 <= 1e-4,
            "{dims:?}: mean |difference| {mean:.3} levels, {:.3}% of bytes more than 2 apart (max {max})",
            over_2 * 100.0
        );
    }
    Ok(())
}
