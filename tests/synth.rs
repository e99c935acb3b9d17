//! `tessera synth` checked the way a user of LLaVA-Pretrain would check the real download: the
//! json has LLaVA's record shape, every image decodes, the folder rule holds, the zip has no root
//! folder and the same bytes, sizes and the text-only share are as asked, and a seed pins the
//! output byte for byte.
use anyhow::{ensure, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use tessera_synth::{generate, SynthConfig, JSON_FILE_NAME, MAX_FOLDER};
use tessera_synth::{SizeStats, BRIEF_PROMPTS, MAX_SIDE, SHAPES};

const SAMPLES: usize = 400;
const TEXT_ONLY_FRACTION: f64 = 0.25;
const PHOTOS: &str = "/usr/share/backgrounds/mate";

fn load_json(dir: &Path) -> Result<Vec<Value>> {
    let path = dir.join(JSON_FILE_NAME);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a JSON list", path.display()))
}

fn text(v: &Value, key: &str) -> Result<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("record {v} has no string {key:?}"))
}

/// Every file under `dir`, by its path relative to `dir` with `/` separators.
fn files_under(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) -> Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else {
                let rel = path
                    .strip_prefix(root)?
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(rel, std::fs::read(&path)?);
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// Checks one record's shape; returns its image path for image records.
fn check_record(record: &Value) -> Result<Option<String>> {
    let obj = record
        .as_object()
        .with_context(|| format!("{record} is not an object"))?;
    let keys: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
    let id = text(record, "id")?;
    ensure!(
        id.len() == 9 && id.bytes().all(|b| b.is_ascii_digit()),
        "id {id} is not 9 digits"
    );
    let turns = record["conversations"]
        .as_array()
        .with_context(|| format!("{id}: no conversations"))?;
    ensure!(
        !turns.is_empty() && turns.len() % 2 == 0,
        "{id}: {} turns",
        turns.len()
    );
    for (i, turn) in turns.iter().enumerate() {
        ensure!(
            text(turn, "from")? == if i % 2 == 0 { "human" } else { "gpt" },
            "{id}: turn {i} out of order"
        );
        ensure!(
            !text(turn, "value")?.trim().is_empty(),
            "{id}: turn {i} is empty"
        );
    }
    if !keys.contains("image") {
        ensure!(
            keys == BTreeSet::from(["id", "conversations"]),
            "{id}: keys {keys:?}"
        );
        ensure!(turns.len() <= 8, "{id}: {} turns", turns.len());
        ensure!(
            turns
                .iter()
                .all(|t| !t["value"].as_str().unwrap_or("").contains("<image>")),
            "{id}: <image> in a text-only record"
        );
        return Ok(None);
    }
    ensure!(
        keys == BTreeSet::from(["id", "image", "conversations"]),
        "{id}: keys {keys:?}"
    );
    let image = text(record, "image")?;
    ensure!(
        image == format!("{}/{id}.jpg", &id[..5]),
        "{id}: image {image} breaks the folder rule"
    );
    let folder: u32 = id[..5].parse()?;
    ensure!(
        folder <= MAX_FOLDER,
        "{id}: folder {folder} past {MAX_FOLDER}"
    );
    ensure!(
        turns.len() == 2,
        "{id}: an image record has {} turns",
        turns.len()
    );
    let human = text(&turns[0], "value")?;
    let prompt = human
        .strip_suffix("\n<image>")
        .or_else(|| human.strip_prefix("<image>\n"))
        .with_context(|| format!("{id}: human turn {human:?} has no <image> line"))?;
    ensure!(
        BRIEF_PROMPTS.contains(&prompt),
        "{id}: {prompt:?} is not a LLaVA brief instruction"
    );
    let caption = text(&turns[1], "value")?;
    ensure!(!caption.contains("<image>"), "{id}: caption {caption:?}");
    Ok(Some(image))
}

#[test]
fn dataset_has_llava_pretrain_layout() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("llava");
    let status = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--quiet", "synth", "--out"])
        .arg(&out)
        .args([
            "--samples",
            &SAMPLES.to_string(),
            "--text-only-fraction",
            &TEXT_ONLY_FRACTION.to_string(),
        ])
        .args(["--zip", "--seed", "11"])
        .status()?;
    ensure!(status.success(), "tessera synth failed: {status}");

    let records = load_json(&out)?;
    ensure!(records.len() == SAMPLES, "{} records", records.len());
    let mut ids = BTreeSet::new();
    let mut images = Vec::new();
    for record in &records {
        ensure!(ids.insert(text(record, "id")?), "duplicate id in {record}");
        images.extend(check_record(record)?);
    }
    let text_only = SAMPLES - images.len();
    ensure!(
        text_only == (SAMPLES as f64 * TEXT_ONLY_FRACTION).round() as usize,
        "{text_only} text-only records"
    );

    // Exactly the listed images are on disk; each decodes; folders spread over 00000..00659.
    let files = files_under(&out.join("images"))?;
    ensure!(
        files.keys().cloned().collect::<Vec<_>>() == {
            let mut sorted = images.clone();
            sorted.sort();
            sorted
        },
        "images/ holds other files than the json lists"
    );
    let mut sizes = Vec::new();
    for (name, bytes) in &files {
        let img = image::load_from_memory_with_format(bytes, image::ImageFormat::Jpeg)
            .with_context(|| format!("{name} does not decode as JPEG"))?;
        sizes.push((img.width(), img.height()));
    }
    let folders: BTreeSet<&str> = images.iter().map(|p| &p[..5]).collect();
    ensure!(folders.len() > 150, "only {} folders used", folders.len());
    ensure!(
        folders.first() < Some(&"00010") && folders.last() > Some(&"00650"),
        "folders {:?}..{:?}",
        folders.first(),
        folders.last()
    );

    // Sizes like LLaVA-Pretrain's (tolerances ~4 standard errors for 300 images).
    let stats = SizeStats::of(&sizes).context("no images")?;
    ensure!((stats.short_side_share - 0.85).abs() < 0.08, "{stats:?}");
    ensure!(
        (stats.mean_width - 407.0).abs() < 30.0 && (stats.mean_height - 367.0).abs() < 25.0,
        "{stats:?}"
    );
    ensure!(stats.max_side <= MAX_SIDE, "{stats:?}");
    let mean_kb =
        files.values().map(|b| b.len()).sum::<usize>() as f64 / files.len() as f64 / 1024.0;
    ensure!(
        (30.0..=60.0).contains(&mean_kb),
        "mean JPEG {mean_kb:.1} KB is not photo-like"
    );

    // Captions describe drawn shapes on a named background.
    for record in records.iter().filter(|r| r.get("image").is_some()) {
        let caption = text(&record["conversations"][1], "value")?;
        ensure!(
            caption.starts_with("a ")
                && caption.ends_with(" background")
                && SHAPES.iter().any(|s| caption.contains(s)),
            "caption {caption:?}"
        );
    }

    // The zip: no root folder, the same names and the same bytes.
    let mut zip = zip::ZipArchive::new(std::fs::File::open(out.join("images.zip"))?)?;
    ensure!(
        zip.len() == files.len(),
        "zip has {} entries, images/ {}",
        zip.len(),
        files.len()
    );
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i)?;
        let name = entry.name().to_string();
        ensure!(
            !name.starts_with("images/") && name.split('/').count() == 2,
            "zip entry {name} is not FOLDER/ID.jpg"
        );
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        ensure!(
            files.get(&name) == Some(&bytes),
            "zip entry {name} differs from images/{name}"
        );
    }
    Ok(())
}

fn generate_into(dir: PathBuf, seed: u64, workers: usize) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut cfg = SynthConfig::new(&dir, 120);
    cfg.text_only_fraction = 0.2;
    cfg.seed = seed;
    cfg.workers = workers;
    cfg.zip = true;
    generate(&cfg)?;
    files_under(&dir)
}

#[test]
fn same_seed_gives_identical_bytes_whatever_the_workers() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let a = generate_into(tmp.path().join("a"), 5, 2)?;
    let b = generate_into(tmp.path().join("b"), 5, 1)?;
    ensure!(a.len() > 90, "{} files", a.len());
    ensure!(
        a == b,
        "seed 5 gave different files with 2 workers and with 1"
    );
    let c = generate_into(tmp.path().join("c"), 6, 2)?;
    ensure!(
        a[JSON_FILE_NAME] != c[JSON_FILE_NAME],
        "seeds 5 and 6 gave the same json"
    );
    let shared: Vec<&String> = a
        .keys()
        .filter(|k| k.ends_with(".jpg") && c.contains_key(*k))
        .collect();
    ensure!(
        shared.iter().all(|k| a[*k] != c[*k]),
        "seeds 5 and 6 drew the same picture"
    );
    Ok(())
}

#[test]
fn photo_crops_decode_at_photo_sizes() -> Result<()> {
    ensure!(
        Path::new(PHOTOS).is_dir(),
        "{PHOTOS} (Debian's mate-backgrounds, the photographs of --photos) is missing: \
         scripts/setup/setup.sh installs it"
    );
    let tmp = tempfile::tempdir()?;
    let mut cfg = SynthConfig::new(tmp.path(), 60);
    cfg.photos = Some(PHOTOS.into());
    let report = generate(&cfg)?;
    ensure!(report.images == 60, "{report:?}");
    let records = load_json(tmp.path())?;
    for record in &records {
        let image = check_record(record)?.context("a photo record without image")?;
        let img = image::open(tmp.path().join("images").join(&image))
            .with_context(|| format!("{image} does not decode"))?;
        let (w, h) = (img.width(), img.height());
        ensure!(w.max(h) <= MAX_SIDE && w.min(h) >= 160, "{image}: {w}x{h}");
        let caption = text(&record["conversations"][1], "value")?;
        ensure!(
            caption.contains("photograph"),
            "{image}: caption {caption:?}"
        );
    }
    let mean_kb = report.image_bytes as f64 / report.images as f64 / 1024.0;
    ensure!(mean_kb > 10.0, "mean photo JPEG {mean_kb:.1} KB");
    Ok(())
}
