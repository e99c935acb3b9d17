//! `--resume` checks the inputs, not only their size: the journal fingerprints the json
//! (sha256) and the images (folder names, sizes, mtimes); a changed input is refused, named.
//! A finishing resume reports the whole ingest's time.
mod common;

use common::*;
use ingest::Template;

/// Two good records and one whose image is missing: over a 1% threshold the run stops before
/// index.json, leaving a journal to resume from.
fn interrupted() -> anyhow::Result<(Fixture, ingest::IngestConfig)> {
    let mut f = Fixture::new();
    f.add_image("000000001", &jpeg(32, 32, 1), "a red square");
    f.add_image("000000002", &jpeg(32, 32, 2), "a blue circle");
    f.records
        .push(image_record("000000003", "00000/missing.jpg", "missing"));
    let mut config = f.config(Template::Plain);
    config.max_rejected_fraction = 0.01;
    let summary = ingest::run(&config)?;
    anyhow::ensure!(
        !summary.complete,
        "the fixture must stop short of index.json"
    );
    config.resume = true;
    config.max_rejected_fraction = 0.5;
    Ok((f, config))
}

#[test]
fn a_resume_whose_json_changed_at_the_same_length_is_refused_naming_the_json() -> anyhow::Result<()>
{
    let (f, config) = interrupted()?;
    let text = std::fs::read_to_string(f.json())?;
    let changed = text.replacen("a blue circle", "A BLUE CIRCLE", 1);
    assert_eq!(changed.len(), text.len());
    std::fs::write(f.json(), changed)?;
    let err = ingest::run(&config).expect_err("changed json").to_string();
    assert!(
        err.contains("the --json content (json_sha256)") && !err.contains("json_bytes"),
        "{err}"
    );
    assert!(!f.out().join("index.json").exists());
    Ok(())
}

#[test]
fn a_resume_whose_images_changed_is_refused_naming_the_images() -> anyhow::Result<()> {
    let (f, config) = interrupted()?;
    std::thread::sleep(std::time::Duration::from_millis(20));
    f.put_image("00000/000000002.jpg", &jpeg(32, 32, 9));
    let err = ingest::run(&config).expect_err("changed image").to_string();
    assert!(err.contains("the --images"), "{err}");
    Ok(())
}

#[test]
fn a_finishing_resume_reports_the_whole_ingest() -> anyhow::Result<()> {
    let (f, config) = interrupted()?;
    let journal: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.out().join("ingest.journal.json"))?)?;
    let earlier = journal["elapsed_s"].as_f64().unwrap_or(0.0);
    assert!(earlier > 0.0, "the journal records the first run's time");
    let summary = ingest::run(&config)?;
    assert!(summary.complete);
    assert_eq!(summary.resumed_at_record, 3);
    assert!(summary.seconds >= earlier + summary.this_run_seconds - 1e-9);
    assert!(
        summary.text().contains("whole ingest"),
        "{}",
        summary.text()
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.out().join("ingest_report.json"))?)?;
    // serde_json's default float parser may land one ulp away from the written value.
    let reported = report["seconds"].as_f64().expect("the report records seconds");
    assert!((reported - summary.seconds).abs() <= 1e-9 * summary.seconds.max(1.0));
    Ok(())
}
