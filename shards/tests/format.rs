//! The shard format on its own: write shards, read samples back by global index (random
//! order, repeats), scan metadata, verify, and catch a flipped byte.
use std::path::Path;
use tessera_shards::{
    Dataset, IngestReport, Manifest, RowGroupLimits, Sample, ShardWriter, FORMAT_VERSION,
};

/// Sample `i`: text-only when `i` is a multiple of 3, else `images_of(i)` images.
fn sample_with(i: u32, images_of: impl Fn(u32) -> u32) -> Sample {
    let count = if i.is_multiple_of(3) { 0 } else { images_of(i) };
    tessera_testing::sample(i, count, |k| {
        tessera_testing::pattern_bytes(i + k, 100 + i * 13 + k * 5)
    })
}

/// Sample `i` with one to three images (text-only every third).
fn sample(i: u32) -> Sample {
    sample_with(i, |i| 1 + (i / 3) % 3)
}

/// Writes `n` samples as shards of `per_shard` rows with row groups of 7 rows.
fn write_dataset(dir: &Path, n: u32, per_shard: u32) -> anyhow::Result<Vec<Sample>> {
    let samples: Vec<Sample> = (0..n).map(sample).collect();
    let mut infos = Vec::new();
    for (s, chunk) in samples.chunks(per_shard as usize).enumerate() {
        let limits = RowGroupLimits {
            max_rows: 7,
            max_bytes: 1 << 20,
        };
        let mut writer = ShardWriter::create(dir, s, limits)?;
        for x in chunk {
            writer.append(x.clone())?;
        }
        infos.push(writer.finish()?);
    }
    Manifest {
        format_version: FORMAT_VERSION,
        tokenizer_fingerprint: "t".repeat(64),
        template: "plain".into(),
        image_placeholder_id: 151_655,
        special_tokens: tessera_text::SpecialTokens::qwen(),
        source_tokenizer_fingerprint: None,
        num_samples: u64::from(n),
        shards: infos,
        ingest: IngestReport::default(),
        ingest_settings: None,
    }
    .save(dir)?;
    Ok(samples)
}

#[test]
fn samples_read_back_by_global_index_in_any_order() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let samples = write_dataset(dir.path(), 50, 20)?;
    let dataset = Dataset::open(dir.path())?;
    assert_eq!(dataset.len(), 50);
    assert_eq!(dataset.manifest().shards.len(), 3);
    assert_eq!(
        dataset.manifest().shards[0].row_groups.len(),
        3,
        "20 rows in groups of 7"
    );
    let order = [49u64, 0, 21, 21, 7, 6, 40, 19, 20];
    let read = dataset.read(&order)?;
    for (got, &i) in read.iter().zip(&order) {
        assert_eq!(got, &samples[i as usize]);
    }
    let meta = dataset.metadata()?;
    assert_eq!(meta.len(), 50);
    for (m, s) in meta.iter().zip(&samples) {
        assert_eq!(
            (
                m.kind,
                m.num_images,
                m.num_text_tokens,
                m.num_supervised_tokens
            ),
            (
                s.kind,
                s.images.len() as u32,
                s.num_text_tokens,
                s.num_supervised_tokens
            )
        );
    }
    assert!(
        samples.iter().any(|s| s.images.len() == 3),
        "the fixture holds samples of several images"
    );
    assert!(
        dataset.read(&[50]).is_err(),
        "index past the end is an error, not a panic"
    );
    let again = Dataset::open(dir.path())?;
    assert_eq!(dataset.fingerprint(), again.fingerprint());
    assert!(!dir
        .path()
        .read_dir()?
        .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".tmp"))));
    Ok(())
}

#[test]
fn reads_from_many_threads_agree() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let samples = write_dataset(dir.path(), 30, 30)?;
    let dataset = Dataset::open(dir.path())?;
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (dataset, samples) = (&dataset, &samples);
            scope.spawn(move || {
                let idx: Vec<u64> = (0..30).map(|i| (i * 7 + t) % 30).collect();
                let got = dataset.read(&idx).expect("read");
                for (g, i) in got.iter().zip(idx) {
                    assert_eq!(g, &samples[i as usize]);
                }
            });
        }
    });
    Ok(())
}

#[test]
fn verify_passes_and_then_names_the_shard_with_a_flipped_byte() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    write_dataset(dir.path(), 40, 15)?;
    let report = tessera_shards::verify(dir.path())?;
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!((report.shards_checked, report.samples_checked), (3, 40));
    let victim = dir.path().join("shard-00001.parquet");
    let mut bytes = std::fs::read(&victim)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&victim, bytes)?;
    let report = tessera_shards::verify(dir.path())?;
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].starts_with("shard-00001.parquet: sha256 mismatch"),
        "{}",
        report.problems[0]
    );
    Ok(())
}

#[test]
fn stats_percentiles_and_kinds() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    write_dataset(dir.path(), 30, 30)?;
    let stats = tessera_shards::stats(&Dataset::open(dir.path())?)?;
    assert_eq!(stats.samples, 30);
    assert_eq!(stats.by_kind.get("text"), Some(&10));
    assert_eq!(stats.by_kind.get("image"), Some(&20));
    // Image samples i (not a multiple of 3) hold 1 + (i / 3) % 3 images: 8, 6 and 6 samples
    // of 1, 2 and 3.
    let per_sample: Vec<(&str, u64)> = stats
        .images_per_sample
        .iter()
        .map(|(k, &v)| (k.as_str(), v))
        .collect();
    assert_eq!(per_sample, [("1", 8), ("2", 6), ("3", 6)]);
    assert_eq!(stats.images, 8 + 2 * 6 + 3 * 6);
    assert_eq!(stats.image_formats.get("jpeg"), Some(&stats.images));
    // Sample 29's one image is the widest (39); 26's three are 36, 37, 38.
    assert_eq!(stats.image_width.max, 10 + 29);
    assert_eq!(stats.text_tokens.max, 16);
    Ok(())
}

#[test]
fn a_dataset_of_an_older_format_is_refused_naming_its_index_and_the_remedy() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    write_dataset(dir.path(), 10, 10)?;
    // What a format-2 index.json holds where it matters: its version.
    let index = dir.path().join(tessera_shards::INDEX_FILE);
    let mut value: serde_json::Value = serde_json::from_slice(&std::fs::read(&index)?)?;
    value["format_version"] = 2.into();
    std::fs::write(&index, serde_json::to_vec(&value)?)?;
    let Err(err) = Dataset::open(dir.path()) else {
        anyhow::bail!("a format-2 dataset opened");
    };
    let msg = err.to_string();
    assert!(
        msg.contains(&index.display().to_string())
            && msg.contains("shard format 2")
            && msg.contains("reads shard format 3 only")
            && msg.contains("re-ingest"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn verify_reports_a_shard_file_that_index_json_does_not_list() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    write_dataset(dir.path(), 20, 10)?;
    std::fs::copy(
        dir.path().join("shard-00001.parquet"),
        dir.path().join("shard-00002.parquet"),
    )?;
    let report = tessera_shards::verify(dir.path())?;
    assert_eq!(
        report.problems,
        vec!["shard-00002.parquet: not listed in index.json (not part of this dataset)"]
    );
    Ok(())
}

#[test]
fn a_missing_shard_file_is_an_io_error_naming_its_path_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    write_dataset(dir.path(), 20, 10)?;
    let missing = dir.path().join("shard-00001.parquet");
    std::fs::remove_file(&missing)?;
    let Err(err) = Dataset::open(dir.path()) else {
        anyhow::bail!("a dataset missing a shard opened");
    };
    // The cause is kept as the source, not copied into the message.
    let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<std::io::Error>());
    assert_eq!(
        source.map(std::io::Error::kind),
        Some(std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    let cause = std::io::Error::from(std::io::ErrorKind::NotFound).to_string();
    let cause = source.map_or(cause, ToString::to_string);
    assert_eq!(err.to_string(), missing.display().to_string());
    // As the CLI prints it (and as anyhow's `{:#}` does): the path, then the cause, once each.
    let printed = tessera_errors::with_causes(&err);
    assert_eq!(printed, format!("{}: {cause}", missing.display()));
    assert_eq!(format!("{:#}", anyhow::Error::new(err)), printed);
    // verify names it the same way.
    let report = tessera_shards::verify(dir.path())?;
    assert_eq!(report.problems, vec![printed]);
    Ok(())
}
