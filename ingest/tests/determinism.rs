//! The shards are a function of the inputs alone: byte-identical for 1 and 4 workers, and for
//! images read from a folder or from a zip of that folder (index.json too, but for the images'
//! fingerprint it records for `--resume`: a folder listing's differs from a zip directory's).
use crate::common;

use common::*;
use std::io::Write;
use tessera_text::chat::Template;

fn zip_folder(root: &std::path::Path, zip_path: &std::path::Path) -> anyhow::Result<()> {
    let mut writer = zip::ZipWriter::new(std::fs::File::create(zip_path)?);
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let mut files = Vec::new();
    for dir in std::fs::read_dir(root)? {
        for file in std::fs::read_dir(dir?.path())? {
            files.push(file?.path());
        }
    }
    files.sort();
    for path in files {
        let name = path
            .strip_prefix(root)?
            .to_string_lossy()
            .replace('\\', "/");
        writer.start_file(name, stored)?;
        writer.write_all(&std::fs::read(&path)?)?;
    }
    writer.finish()?;
    Ok(())
}

/// The folder's files with index.json's `ingest_settings.images_fingerprint` taken out.
fn without_images_fingerprint(
    files: &[(String, Vec<u8>)],
) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for (name, bytes) in files {
        if name != "index.json" {
            out.push((name.clone(), bytes.clone()));
            continue;
        }
        let mut index: serde_json::Value = serde_json::from_slice(bytes)?;
        let removed = index["ingest_settings"]
            .as_object_mut()
            .and_then(|settings| settings.remove("images_fingerprint"));
        anyhow::ensure!(
            removed.is_some_and(|f| f.as_str().is_some_and(|f| f.len() == 64)),
            "index.json records the images' fingerprint"
        );
        out.push((name.clone(), serde_json::to_vec_pretty(&index)?));
    }
    Ok(out)
}

#[test]
fn shards_are_identical_across_worker_counts_and_image_sources() -> anyhow::Result<()> {
    let mut f = Fixture::new();
    for i in 0..80u32 {
        let id = format!("{:09}", 100_000 + i * 37);
        if i % 9 == 0 {
            f.records
                .push(image_record(&id, "00100/missing.jpg", "gone"));
        } else {
            f.add_image(
                &id,
                &jpeg(24 + i % 13 * 5, 24 + i % 5 * 7, i),
                &format!("caption number {i}"),
            );
        }
    }
    let mut runs = Vec::new();
    for (workers, zipped) in [(1usize, false), (4, false), (3, true)] {
        let mut config = f.config(Template::Plain);
        config.workers = workers;
        config.shard_size = 30_000;
        config.out = f.root.path().join(format!("out-{workers}"));
        if zipped {
            let zip_path = f.root.path().join("images.zip");
            zip_folder(&f.images(), &zip_path)?;
            config.images = Some(zip_path);
        }
        tessera_ingest::run(&config)?;
        runs.push((dir_bytes(&config.out), rejected(&config.out)));
    }
    assert!(
        runs[0].0.len() >= 3,
        "expected several shards, got {}",
        runs[0].0.len()
    );
    assert!(runs[0] == runs[1], "1 and 4 workers differ");
    assert_eq!(runs[0].1, runs[2].1, "rejections: folder vs zip");
    let (folder, zipped) = (
        without_images_fingerprint(&runs[0].0)?,
        without_images_fingerprint(&runs[2].0)?,
    );
    assert_eq!(
        folder.iter().map(|(n, b)| (n, b.len())).collect::<Vec<_>>(),
        zipped.iter().map(|(n, b)| (n, b.len())).collect::<Vec<_>>()
    );
    assert!(folder == zipped, "folder and zip differ");
    assert_eq!(runs[0].1.len(), 9, "every 9th record's image is missing");
    Ok(())
}
