//! `anyres_max_9` views of real photographs (Debian's mate-backgrounds, cropped to tall, wide,
//! small and odd shapes, written as PNG so both sides decode the same pixels) against those
//! transformers' `LlavaOnevisionImageProcessor` cuts (`tests/oracles/anyres_views.py`): as many
//! views, the same base view and tiles to within the two bicubic implementations' rounding.
use anyhow::{ensure, Context, Result};
use safetensors::SafeTensors;
use std::path::Path;
use tessera_pipeline::loader::anyres_views::anyres_views;
use tessera_pipeline::loader::decode::decode_rgb;
use tessera_pipeline::loader::resize::ChwResizer;
use tessera_shards::image_layout::{ImageLayout, Tower};

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
        .with_context(|| format!("{PHOTO} (scripts/setup/setup.sh installs mate-backgrounds)"))?;
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
        "the oracle failed (run scripts/setup/setup.sh for .deps/hfvenv): {}",
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
            (384, [127; 3]),
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

/// A sample of `images` (PNG bytes with their sizes) and a few text tokens around one
/// placeholder (id 9) per image.
fn sample(id: &str, images: Vec<tessera_shards::Image>) -> tessera_shards::Sample {
    let mut input_ids = vec![1u32, 2];
    input_ids.extend(std::iter::repeat_n(9, images.len()));
    input_ids.extend([3, 4]);
    let n = input_ids.len();
    tessera_shards::Sample {
        id: id.into(),
        kind: tessera_shards::Kind::Image,
        images,
        conversation: vec![],
        label_mask: (0..n).map(|i| i >= n - 2).collect(),
        num_text_tokens: n as u32,
        num_supervised_tokens: 2,
        input_ids,
        input_ids_crc32c: None,
    }
}

/// The loader under `anyres_max_9`: each image decoded once into the views `anyres_views`
/// cuts (a lone image its grid, each image of a two-image sample its base view alone), the
/// micro-batch carrying each image's geometry, and every placeholder expanded to the tokens
/// the planner counts for it.
#[test]
fn the_loader_carries_each_images_views_geometry_and_tokens() -> Result<()> {
    let photo = image::open(PHOTO)
        .with_context(|| format!("{PHOTO} (scripts/setup/setup.sh installs mate-backgrounds)"))?;
    let png = |&(x, y, w, h): &(u32, u32, u32, u32)| -> Result<tessera_shards::Image> {
        let mut bytes = Vec::new();
        photo.crop_imm(x, y, w, h).write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )?;
        Ok(tessera_shards::Image {
            bytes,
            format: "png".into(),
            width: w,
            height: h,
            crc32c: None,
        })
    };
    let crops: Vec<tessera_shards::Image> = CROPS[..3].iter().map(png).collect::<Result<_>>()?;
    let samples = vec![
        sample("wide", vec![crops[0].clone()]),
        sample("pair", vec![crops[1].clone(), crops[2].clone()]),
    ];
    let layout = ImageLayout::AnyRes { max_tiles: 9 };
    let config = tessera_pipeline::loader::LoaderConfig::builder()
        .image_size(384)
        .image_tokens(729)
        .image_layout(layout.clone(), 14)
        .placeholder_id(9)
        .pad_id(0)
        .threads(1)
        .build()?;
    let plan = tessera_pipeline::MicroBatchPlan {
        kind: tessera_shards::Kind::Image,
        rows: vec![vec![0], vec![1]],
        zero_loss: false,
    };
    let source: std::sync::Arc<dyn tessera_pipeline::loader::SampleSource> =
        std::sync::Arc::new(samples.clone());
    let mb = tessera_pipeline::loader::Loader::new(source, vec![plan], config)
        .next()
        .context("one micro-batch")??;

    let geometry = vec![
        layout.tokens_in_sample(2560, 1600, 1, SO400M),
        layout.tokens_in_sample(600, 1600, 2, SO400M),
        layout.tokens_in_sample(200, 150, 2, SO400M),
    ];
    assert_eq!(mb.image_geometry, geometry);
    assert_eq!(mb.num_images, 3);
    assert_eq!(mb.views(), geometry[0].tiles as usize + 2);
    let (mut resizer, mut canvas) = (ChwResizer::default(), Vec::new());
    let view = 3 * 384 * 384;
    let mut want = Vec::new();
    for (image, g) in crops.iter().zip(&geometry) {
        let (img, _) = decode_rgb(&image.bytes, |w, h| (w, h)).map_err(anyhow::Error::msg)?;
        let mut out = vec![0u8; g.tiles as usize * view];
        anyres_views(
            &mut resizer,
            &img,
            (img.width, img.height),
            g,
            (384, [127; 3]),
            &mut canvas,
            &mut out,
        )?;
        want.extend(out);
    }
    ensure!(
        mb.pixels == want,
        "the loader's views differ from anyres_views'"
    );
    // Each row holds one sample: its text (4 tokens) and its images' tokens.
    for (row, images) in [(0usize, &geometry[..1]), (1, &geometry[1..])] {
        let ids = &mb.input_ids[row * mb.row_len..(row + 1) * mb.row_len];
        let placeholders = ids.iter().filter(|&&t| t == 9).count() as u64;
        let tokens: u64 = images.iter().map(|g| g.total()).sum();
        assert_eq!(placeholders, tokens, "row {row}");
    }
    assert_eq!(
        mb.image_token_count() as u64,
        geometry.iter().map(|g| g.total()).sum::<u64>()
    );
    // The pair's images are 729 + a newline each: the OneVision rule for several images.
    assert_eq!(geometry[1].total(), 730);
    Ok(())
}
