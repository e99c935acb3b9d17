//! Test fixtures: small real images written with the `image` crate, LLaVA-shaped json records,
//! and helpers to run an ingest and read back what it wrote.
#![allow(dead_code)]
use image::{ImageEncoder, RgbImage};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tessera_ingest::IngestConfig;
use tessera_text::chat::Template;

/// The Qwen tokenizer under the workspace's `.deps/` (these fixtures serve both the `ingest`
/// crate's tests and the workspace root's).
pub(crate) fn tokenizer_path() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let here = manifest.join(".deps/tokenizer/tokenizer.json");
    if here.exists() {
        here
    } else {
        manifest.join("../.deps/tokenizer/tokenizer.json")
    }
}

/// A photo-like RGB image: smooth gradients plus a seed-dependent pattern.
pub(crate) fn rgb(width: u32, height: u32, seed: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let v = (x * 7 + y * 3 + seed * 31) % 256;
        image::Rgb([v as u8, ((x ^ y) + seed) as u8, (y * 5 + seed) as u8])
    })
}

pub(crate) fn jpeg(width: u32, height: u32, seed: u32) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85)
        .encode_image(&rgb(width, height, seed))
        .expect("encode jpeg");
    out
}

pub(crate) fn gray_jpeg(width: u32, height: u32) -> Vec<u8> {
    let img = image::GrayImage::from_fn(width, height, |x, y| image::Luma([((x + y) % 256) as u8]));
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85)
        .encode_image(&img)
        .expect("encode gray jpeg");
    out
}

pub(crate) fn png(width: u32, height: u32) -> Vec<u8> {
    let img = rgb(width, height, 3);
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(img.as_raw(), width, height, image::ExtendedColorType::Rgb8)
        .expect("encode png");
    out
}

pub(crate) fn webp(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbaImage::from_fn(width, height, |x, y| {
        image::Rgba([x as u8, y as u8, 9, 255])
    });
    let mut out = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut out)
        .write_image(img.as_raw(), width, height, image::ExtendedColorType::Rgba8)
        .expect("encode webp");
    out
}

/// A CMYK JPEG made once with Pillow (`Image.new("CMYK", ...).save(...)`), checked in.
pub(crate) fn cmyk_jpeg() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cmyk.jpg"))
        .expect("cmyk fixture")
}

/// A JPEG whose frame header claims `width` x `height` (a decompression bomb's header).
pub(crate) fn jpeg_claiming(width: u16, height: u16) -> Vec<u8> {
    let mut bytes = jpeg(16, 16, 1);
    let sof = bytes
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("baseline SOF0 marker");
    bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    bytes
}

/// A LLaVA-Pretrain-shaped image record.
pub(crate) fn image_record(id: &str, image: &str, caption: &str) -> Value {
    json!({"id": id, "image": image, "conversations": [
        {"from": "human", "value": "Render a clear and concise summary of the photo.\n<image>"},
        {"from": "gpt", "value": caption}]})
}

/// A text-only record with the given (from, value) turns.
pub(crate) fn text_record(id: &str, turns: &[(&str, &str)]) -> Value {
    let turns: Vec<Value> = turns
        .iter()
        .map(|(f, v)| json!({"from": f, "value": v}))
        .collect();
    json!({"id": id, "conversations": turns})
}

/// A dataset under construction in a temp dir: `images/`, `data.json`, and `out/`.
pub(crate) struct Fixture {
    pub root: tempfile::TempDir,
    pub records: Vec<Value>,
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("images")).expect("images dir");
        Fixture {
            root,
            records: Vec::new(),
        }
    }

    pub(crate) fn images(&self) -> PathBuf {
        self.root.path().join("images")
    }

    pub(crate) fn json(&self) -> PathBuf {
        self.root.path().join("data.json")
    }

    pub(crate) fn out(&self) -> PathBuf {
        self.root.path().join("out")
    }

    /// Writes `bytes` at `images/<relative>`.
    pub(crate) fn put_image(&self, relative: &str, bytes: &[u8]) {
        let path = self.images().join(relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write image");
    }

    /// An image record plus its file, LLaVA style (`00453/004539375.jpg`).
    pub(crate) fn add_image(&mut self, id: &str, bytes: &[u8], caption: &str) -> String {
        let relative = format!("{}/{id}.jpg", &id[..id.len().min(5)]);
        self.put_image(&relative, bytes);
        self.records.push(image_record(id, &relative, caption));
        relative
    }

    pub(crate) fn write_json(&self) {
        std::fs::write(
            self.json(),
            serde_json::to_vec_pretty(&self.records).expect("json"),
        )
        .expect("write json");
    }

    /// A config for this fixture (json written first), small shards and row groups.
    pub(crate) fn config(&self, template: Template) -> IngestConfig {
        self.write_json();
        let mut config =
            IngestConfig::new(self.json(), self.images(), tokenizer_path(), self.out());
        config.template = Some(template);
        config.workers = 2;
        config.max_rejected_fraction = 1.0;
        config
    }
}

/// `(id, reason)` pairs of `rejected.jsonl`.
pub(crate) fn rejected(out: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(out.join("rejected.jsonl")).expect("rejected.jsonl");
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("rejected line is json");
            (
                v["id"].as_str().unwrap_or_default().to_string(),
                v["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The files of a shard directory with their bytes (for byte-identity checks).
pub(crate) fn dir_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("shard-") || n == "index.json")
        })
        .map(|p| {
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read(&p).expect("read"),
            )
        })
        .collect();
    out.sort();
    out
}
