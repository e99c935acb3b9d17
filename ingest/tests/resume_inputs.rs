//! `--resume` checks the inputs, not only their size: the journal fingerprints the json
//! (sha256) and the images (folder names, sizes, mtimes); a changed input is refused, named.
//! A finishing resume reports the whole ingest's time. A resume into a finished folder checks
//! the inputs against the fingerprint index.json records, and changes nothing there.
use crate::common;

use common::*;
use tessera_text::chat::Template;

/// Two good records and one whose image is missing: over a 1% threshold the run stops before
/// index.json, leaving a journal to resume from.
fn interrupted() -> anyhow::Result<(Fixture, tessera_ingest::IngestConfig)> {
    let mut f = Fixture::new();
    f.add_image("000000001", &jpeg(32, 32, 1), "a red square");
    f.add_image("000000002", &jpeg(32, 32, 2), "a blue circle");
    f.records
        .push(image_record("000000003", "00000/missing.jpg", "missing"));
    let mut config = f.config(Template::Plain);
    config.max_rejected_fraction = 0.01;
    let summary = tessera_ingest::run(&config)?;
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
    let err = tessera_ingest::run(&config)
        .expect_err("changed json")
        .to_string();
    assert!(
        err.contains("the --input content (json_sha256)") && !err.contains("json_bytes"),
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
    let err = tessera_ingest::run(&config)
        .expect_err("changed image")
        .to_string();
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
    let summary = tessera_ingest::run(&config)?;
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
    let reported = report["seconds"]
        .as_f64()
        .expect("the report records seconds");
    assert!((reported - summary.seconds).abs() <= 1e-9 * summary.seconds.max(1.0));
    Ok(())
}

/// A finished ingest (index.json written) of two good records.
fn finished() -> anyhow::Result<(Fixture, tessera_ingest::IngestConfig)> {
    let mut f = Fixture::new();
    f.add_image("000000001", &jpeg(32, 32, 1), "a red square");
    f.add_image("000000002", &jpeg(32, 32, 2), "a blue circle");
    let mut config = f.config(Template::Plain);
    let summary = tessera_ingest::run(&config)?;
    anyhow::ensure!(summary.complete && f.out().join("index.json").exists());
    config.resume = true;
    Ok((f, config))
}

/// Every file of the output folder: name, bytes and modification time.
fn snapshot(
    out: &std::path::Path,
) -> anyhow::Result<Vec<(String, Vec<u8>, std::time::SystemTime)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(out)? {
        let path = entry?.path();
        files.push((
            path.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            std::fs::read(&path)?,
            std::fs::metadata(&path)?.modified()?,
        ));
    }
    files.sort();
    Ok(files)
}

#[test]
fn a_resume_into_a_finished_folder_with_the_same_inputs_is_ok_and_touches_nothing(
) -> anyhow::Result<()> {
    let (f, config) = finished()?;
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.out().join("index.json"))?)?;
    assert!(
        index["ingest_settings"]["json_sha256"].is_string(),
        "index.json records the inputs' fingerprint: {index}"
    );
    let before = snapshot(&f.out())?;
    std::thread::sleep(std::time::Duration::from_millis(20));
    let summary = tessera_ingest::run(&config)?;
    assert!(summary.complete);
    assert_eq!(summary.report.samples_written, 2);
    assert!(snapshot(&f.out())? == before, "the finished folder changed");
    Ok(())
}

#[test]
fn a_resume_into_a_finished_folder_whose_json_changed_is_refused_naming_the_json(
) -> anyhow::Result<()> {
    let (f, config) = finished()?;
    let before = snapshot(&f.out())?;
    let text = std::fs::read_to_string(f.json())?;
    let changed = text.replacen("a blue circle", "a blue square", 1);
    assert_eq!(changed.len(), text.len());
    std::fs::write(f.json(), changed)?;
    let err = tessera_ingest::run(&config)
        .expect_err("a changed json must be refused")
        .to_string();
    assert!(
        err.contains("changed since the finished run")
            && err.contains("the --input content (json_sha256)")
            && !err.contains("json_bytes"),
        "{err}"
    );
    assert!(snapshot(&f.out())? == before, "the finished folder changed");
    Ok(())
}

#[test]
fn a_resume_into_a_finished_folder_with_other_settings_or_images_is_refused() -> anyhow::Result<()>
{
    let (f, config) = finished()?;
    let before = snapshot(&f.out())?;
    let mut other = config.clone();
    other.shard_size = 12_345;
    other.template = Some(Template::Chatml);
    let err = tessera_ingest::run(&other)
        .expect_err("other settings")
        .to_string();
    assert!(
        err.contains("--shard-size (shard_size)") && err.contains("--template (template)"),
        "{err}"
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    f.put_image("00000/000000002.jpg", &jpeg(32, 32, 9));
    let err = tessera_ingest::run(&config)
        .expect_err("changed image")
        .to_string();
    assert!(err.contains("the --images"), "{err}");
    assert!(snapshot(&f.out())? == before, "the finished folder changed");
    Ok(())
}

/// An index.json written before it recorded the ingest's settings: what it does record
/// (tokenizer, template, record count) is still checked; the rest cannot be, and the folder is
/// reported complete as before.
#[test]
fn a_resume_into_an_older_finished_folder_checks_what_its_index_records() -> anyhow::Result<()> {
    let (f, config) = finished()?;
    let path = f.out().join("index.json");
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    index
        .as_object_mut()
        .and_then(|o| o.remove("ingest_settings"))
        .expect("ingest_settings");
    std::fs::write(&path, serde_json::to_vec_pretty(&index)?)?;
    let before = snapshot(&f.out())?;
    assert!(tessera_ingest::run(&config)?.complete);
    let mut other = config.clone();
    other.template = Some(Template::Chatml);
    let err = tessera_ingest::run(&other)
        .expect_err("other template")
        .to_string();
    assert!(
        err.contains("--template (template): plain -> chatml"),
        "{err}"
    );
    let mut f = f;
    f.add_image("000000003", &jpeg(32, 32, 3), "a green line");
    f.write_json();
    let err = tessera_ingest::run(&config)
        .expect_err("one more record")
        .to_string();
    assert!(
        err.contains("the --input record count (json_records): 2 -> 3"),
        "{err}"
    );
    assert!(snapshot(&f.out())? == before, "the finished folder changed");
    Ok(())
}
