//! Every kind of bad input the issue lists: each is rejected with its reason in
//! `rejected.jsonl` (or kept, with the real format and a note), and none stops the run.
use crate::common;

use common::*;
use serde_json::json;
use std::collections::HashMap;
use tessera_shards::Dataset;
use tessera_text::chat::Template;

#[test]
fn bad_records_are_rejected_with_their_reason_and_odd_images_are_kept() -> anyhow::Result<()> {
    let mut f = Fixture::new();
    f.add_image("000000001", &jpeg(64, 48, 1), "a good photo");
    // Rejected.
    f.records.push(image_record(
        "000000002",
        "00000/nowhere.jpg",
        "missing file",
    ));
    let truncated = jpeg(96, 96, 2);
    f.add_image("000000003", &truncated[..truncated.len() / 2], "truncated");
    f.add_image(
        "000000004",
        b"<!DOCTYPE html><html><body>404 Not Found</body></html>",
        "html page",
    );
    f.add_image("000000005", &jpeg_claiming(60000, 60000), "bomb");
    f.put_image("00000/000000006.jpg", &jpeg(32, 32, 6));
    f.records.push(json!({"id": "000000006", "image": "00000/000000006.jpg", "conversations": [
        {"from": "human", "value": "Describe the photo."}, {"from": "gpt", "value": "no placeholder"}]}));
    f.put_image("00000/000000007.jpg", &jpeg(32, 32, 7));
    f.records.push(json!({"id": "000000007", "image": "00000/000000007.jpg", "conversations": [
        {"from": "human", "value": "<image>\nDescribe.\n<image>"}, {"from": "gpt", "value": "two placeholders"}]}));
    f.add_image("000000008", &jpeg(32, 32, 8), "   ");
    f.records.push(image_record(
        "000000001",
        "00000/000000001.jpg",
        "duplicate id",
    ));
    f.records
        .push(image_record("000000009", "../../etc/passwd", "climbs out"));
    f.records
        .push(image_record("000000010", "/etc/passwd", "absolute"));
    // Kept, with notes.
    f.add_image("000000011", &png(40, 30), "a png named jpg");
    f.add_image("000000012", &webp(30, 40), "a webp named jpg");
    f.add_image("000000013", &cmyk_jpeg(), "a cmyk jpeg");
    f.add_image("000000014", &gray_jpeg(50, 40), "a grayscale jpeg");
    f.add_image("000000015", &jpeg(1, 1, 15), "one pixel");
    f.add_image("000000016", &jpeg(200, 20, 16), "ten to one");
    f.records.push(text_record(
        "000000017",
        &[("human", "What is 2+2?"), ("gpt", "4")],
    ));

    let summary = tessera_ingest::run(&f.config(Template::Plain))?;
    let expected: HashMap<&str, &str> = HashMap::from([
        ("000000002", "missing_image"),
        ("000000003", "corrupt_image"),
        ("000000004", "not_an_image"),
        ("000000005", "decompression_bomb"),
        ("000000006", "missing_image_placeholder"),
        ("000000007", "multiple_image_placeholders"),
        ("000000008", "empty_caption"),
        ("000000001", "duplicate_id"),
        ("000000009", "unsafe_image_path"),
        ("000000010", "unsafe_image_path"),
    ]);
    let rejected = rejected(&f.out());
    assert_eq!(rejected.len(), expected.len(), "{rejected:?}");
    for (id, reason) in &rejected {
        assert_eq!(
            Some(&reason.as_str()),
            expected.get(id.as_str()),
            "record {id}"
        );
    }
    let report = &summary.report;
    assert_eq!(report.records_read, 18);
    assert_eq!(report.samples_written, 8);
    assert_eq!(report.rejected.get("unsafe_image_path"), Some(&2));
    for note in [
        "misnamed_image",
        "cmyk_jpeg",
        "grayscale_image",
        "tiny_image",
        "extreme_aspect",
    ] {
        assert!(
            report.notes.get(note).copied().unwrap_or(0) >= 1,
            "note {note} in {:?}",
            report.notes
        );
    }
    assert!(
        summary.complete,
        "fraction 1.0 accepts any number of rejections"
    );

    let dataset = Dataset::open(&f.out())?;
    let all: Vec<u64> = (0..dataset.len() as u64).collect();
    let samples = dataset.read(&all)?;
    let by_id: HashMap<&str, &tessera_shards::Sample> =
        samples.iter().map(|s| (s.id.as_str(), s)).collect();
    let format = |id: &str| {
        by_id
            .get(id)
            .and_then(|s| Some(s.images.first()?.format.clone()))
    };
    assert_eq!(
        format("000000011").as_deref(),
        Some("png"),
        "real format recorded, not the name's"
    );
    assert_eq!(format("000000012").as_deref(), Some("webp"));
    assert_eq!(format("000000013").as_deref(), Some("jpeg"));
    let size = |id: &str| {
        let image = by_id.get(id)?.images.first()?;
        Some((image.width, image.height))
    };
    assert_eq!(size("000000015"), Some((1, 1)));
    assert_eq!(size("000000016"), Some((200, 20)));
    assert_eq!(size("000000013"), Some((24, 16)));
    assert_eq!(
        by_id.get("000000017").map(|s| s.kind),
        Some(tessera_shards::Kind::Text)
    );
    let stats = tessera_shards::stats(&dataset)?;
    assert_eq!((stats.tiny_images, stats.extreme_aspect_images), (1, 1));
    assert_eq!(stats.rejected.values().sum::<u64>(), 10);
    Ok(())
}

#[test]
fn malformed_json_fails_the_run_naming_the_byte_offset() -> anyhow::Result<()> {
    let f = Fixture::new();
    let config = f.config(Template::Plain);
    let good = serde_json::to_string(&image_record("000000001", "00000/a.jpg", "fine"))?;
    let text = format!("[{good},\n{{\"id\": \"000000002\", \"conversations\": [}}]");
    std::fs::write(&config.input, &text)?;
    let err = tessera_ingest::run(&config).expect_err("malformed json must fail the run");
    let message = err.to_string();
    assert!(message.contains("malformed JSON at byte"), "{message}");
    let tessera_ingest::IngestError::Json { offset, .. } = err else {
        panic!("not a json error: {message}")
    };
    let bad_record_start = good.len() as u64 + 3;
    assert!(
        offset >= bad_record_start && offset < text.len() as u64,
        "offset {offset} not inside the bad record"
    );
    Ok(())
}

#[test]
fn a_record_that_is_not_a_llava_record_fails_the_run() -> anyhow::Result<()> {
    let f = Fixture::new();
    let config = f.config(Template::Plain);
    std::fs::write(&config.input, br#"[{"id": "1", "image": "x.jpg"}]"#)?;
    let err = tessera_ingest::run(&config).expect_err("no conversations");
    let message = tessera_errors::with_causes(&err);
    assert!(message.contains("conversations"), "{message}");
    Ok(())
}

#[test]
fn too_many_rejections_write_the_report_but_no_index() -> anyhow::Result<()> {
    let mut f = Fixture::new();
    f.add_image("000000001", &jpeg(32, 32, 1), "good");
    f.records
        .push(image_record("000000002", "00000/missing.jpg", "missing"));
    let mut config = f.config(Template::Plain);
    config.max_rejected_fraction = 0.01;
    let summary = tessera_ingest::run(&config)?;
    assert!(!summary.complete);
    assert!((summary.rejected_fraction - 0.5).abs() < 1e-9);
    assert!(f.out().join("ingest_report.json").exists());
    assert!(
        !f.out().join("index.json").exists(),
        "an over-threshold run must not look complete"
    );
    // Accepting the rejections later needs no re-processing: --resume finalises.
    config.resume = true;
    config.max_rejected_fraction = 0.6;
    let summary = tessera_ingest::run(&config)?;
    assert!(summary.complete);
    assert_eq!(Dataset::open(&f.out())?.len(), 1);
    Ok(())
}
