//! Loader integration tests: micro-batch assembly (labels, positions, padding), thread-count
//! independence, and the bad-image policies.
use anyhow::{ensure, Context, Result};
use std::sync::Arc;
use tessera_pipeline::loader::{BadImagePolicy, Loader, LoaderConfig, SampleSource};
use tessera_pipeline::{MicroBatch, MicroBatchPlan, IGNORE_INDEX};
use tessera_shards::{Image, Kind, Sample};

const PH: u32 = 151_655;
const PAD: i64 = 151_643;
const N: i64 = IGNORE_INDEX;

fn text_sample(id: &str, ids: &[u32], mask: &[bool]) -> Sample {
    Sample {
        id: id.into(),
        kind: Kind::Text,
        images: vec![],
        conversation: vec![],
        input_ids: ids.to_vec(),
        label_mask: mask.to_vec(),
        num_text_tokens: ids.len() as u32,
        num_supervised_tokens: mask.iter().skip(1).filter(|&&m| m).count() as u32,
        input_ids_crc32c: None,
    }
}

fn jpeg_image(bytes: Vec<u8>, w: u32, h: u32) -> Image {
    Image {
        bytes,
        format: "jpeg".into(),
        width: w,
        height: h,
        crc32c: None,
    }
}

fn image_sample(id: &str, ids: &[u32], mask: &[bool], bytes: Vec<u8>, w: u32, h: u32) -> Sample {
    Sample {
        kind: Kind::Image,
        images: vec![jpeg_image(bytes, w, h)],
        ..text_sample(id, ids, mask)
    }
}

/// A JPEG of a smooth colour pattern that depends on `seed`.
fn jpeg(w: u32, h: u32, seed: u32) -> Result<Vec<u8>> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let v = |k: u32| ((x * (k + seed) + y * (3 + k * seed)) / 3 % 256) as u8;
        image::Rgb([v(1), v(2), v(5)])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90).encode_image(&img)?;
    Ok(out)
}

fn config(threads: usize, image_tokens: usize, size: usize) -> Result<LoaderConfig> {
    Ok(LoaderConfig::builder()
        .placeholder_id(PH)
        .pad_id(PAD as u32)
        .threads(threads)
        .image_tokens(image_tokens)
        .image_size(size)
        .build()?)
}

fn load_all(
    source: Vec<Sample>,
    plans: Vec<MicroBatchPlan>,
    config: LoaderConfig,
) -> Result<(Vec<MicroBatch>, tessera_pipeline::loader::LoaderStats)> {
    let source: Arc<dyn SampleSource> = Arc::new(source);
    let mut loader = Loader::new(source, plans, config);
    let batches = loader.by_ref().collect::<Result<Vec<_>, _>>()?;
    Ok((batches, loader.stats()))
}

fn plan(kind: Kind, rows: Vec<Vec<u64>>) -> MicroBatchPlan {
    MicroBatchPlan {
        kind,
        rows,
        zero_loss: false,
    }
}

#[test]
fn packed_text_row_of_two_samples_has_hand_computed_labels_and_positions() -> Result<()> {
    // Sample a: prompt 1 2, answer 3 4. Sample b: prompt 5, answer 6. Second row: sample c.
    let a = text_sample("a", &[1, 2, 3, 4], &[false, false, true, true]);
    let b = text_sample("b", &[5, 6], &[false, true]);
    let c = text_sample("c", &[7, 8, 9], &[false, true, false]);
    let plans = vec![plan(Kind::Text, vec![vec![0, 1], vec![2]])];
    let (batches, _) = load_all(vec![a, b, c], plans, config(1, 4, 8)?)?;
    let mb = &batches[0];
    assert_eq!((mb.rows, mb.row_len), (2, 6));
    assert_eq!(mb.input_ids, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, PAD, PAD, PAD]);
    // Token 4 ends sample a: it must not predict sample b's first token.
    assert_eq!(mb.labels, vec![N, 3, 4, N, 6, N, 8, N, N, N, N, N]);
    assert_eq!(mb.positions, vec![0, 1, 2, 3, 0, 1, 0, 1, 2, 0, 0, 0]);
    assert_eq!(mb.segment_ids, vec![0, 0, 0, 0, 1, 1, 0, 0, 0, -1, -1, -1]);
    assert_eq!(
        (mb.real_tokens, mb.pad_tokens, mb.supervised_tokens),
        (9, 3, 4)
    );
    assert_eq!(mb.sample_ids, vec!["a", "b", "c"]);
    assert_eq!((mb.num_images, mb.pixels.len()), (0, 0));
    Ok(())
}

#[test]
fn packed_image_row_expands_placeholders_and_keeps_images_in_order() -> Result<()> {
    // Plain template: <image> caption. Three image tokens per image, 8x8 pixels.
    let a = image_sample(
        "a",
        &[PH, 20, 21],
        &[false, true, true],
        jpeg(40, 30, 1)?,
        40,
        30,
    );
    let b = image_sample(
        "b",
        &[30, PH, 31],
        &[false, false, true],
        jpeg(30, 40, 2)?,
        30,
        40,
    );
    let plans = vec![plan(Kind::Image, vec![vec![0, 1]])];
    let samples = vec![a.clone(), b.clone()];
    let (batches, _) = load_all(samples, plans, config(1, 3, 8)?)?;
    let mb = &batches[0];
    let ph = PH as i64;
    assert_eq!(mb.input_ids, vec![ph, ph, ph, 20, 21, 30, ph, ph, ph, 31]);
    // The last image token predicts the first caption token, as in LLaVA.
    assert_eq!(mb.labels, vec![N, N, 20, 21, N, N, N, N, 31, N]);
    assert_eq!(mb.positions, vec![0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
    assert_eq!(mb.segment_ids, vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
    let planned = (a.num_supervised_tokens + b.num_supervised_tokens) as usize;
    assert_eq!(
        mb.supervised_tokens, planned,
        "loss scaling uses the planner's count"
    );
    assert_eq!(
        (mb.num_images, mb.image_size, mb.pixels.len()),
        (2, 8, 2 * 3 * 8 * 8)
    );
    // Each image's pixels come from its own sample: compare with loading them one by one.
    for (i, s) in [a, b].into_iter().enumerate() {
        let (alone, _) = load_all(
            vec![s],
            vec![plan(Kind::Image, vec![vec![0]])],
            config(1, 3, 8)?,
        )?;
        ensure!(
            alone[0].pixels == mb.pixels[i * 192..(i + 1) * 192],
            "image {i} out of order"
        );
    }
    Ok(())
}

#[test]
fn a_sample_of_three_images_expands_each_placeholder_with_its_own_image_in_order() -> Result<()> {
    // chatml-like: prompt 10, image, 11, image, image, 12, answer 40 41.
    let photos = [jpeg(40, 30, 1)?, jpeg(30, 40, 2)?, jpeg(50, 50, 3)?];
    let ids = [10, PH, 11, PH, PH, 12, 40, 41];
    let mask = [false, false, false, false, false, false, true, true];
    let mut three = text_sample("three", &ids, &mask);
    three.kind = Kind::Image;
    three.images = photos.iter().map(|b| jpeg_image(b.clone(), 0, 0)).collect();
    let one = image_sample("one", &[PH, 50], &[false, true], jpeg(20, 20, 4)?, 20, 20);
    let plans = vec![plan(Kind::Image, vec![vec![0, 1]])];
    let (batches, stats) = load_all(vec![three.clone(), one], plans, config(1, 2, 8)?)?;
    let mb = &batches[0];
    let ph = PH as i64;
    assert_eq!(
        mb.input_ids,
        vec![10, ph, ph, 11, ph, ph, ph, ph, 12, 40, 41, ph, ph, 50]
    );
    assert_eq!(mb.labels, vec![N, N, N, N, N, N, N, N, 40, 41, N, N, 50, N]);
    assert_eq!((mb.num_images, stats.images), (4, 4));
    let per_image = 3 * 8 * 8;
    assert_eq!(mb.pixels.len(), 4 * per_image);
    // Image k of the sample is the k-th image block: compare with each photo alone.
    for (k, photo) in photos.iter().enumerate() {
        let alone = image_sample("alone", &[PH, 5], &[false, true], photo.clone(), 0, 0);
        let (got, _) = load_all(
            vec![alone],
            vec![plan(Kind::Image, vec![vec![0]])],
            config(1, 2, 8)?,
        )?;
        ensure!(
            got[0].pixels == mb.pixels[k * per_image..(k + 1) * per_image],
            "image {k} of the sample is out of place"
        );
    }
    // One undecodable image drops the whole sample under `skip` (its placeholders would have
    // no pixels), and names which image under `fail`.
    three.images[1].bytes = b"\xFF\xD8\xFFnot a jpeg".to_vec();
    let keep = image_sample("keep", &[PH, 50], &[false, true], jpeg(20, 20, 4)?, 20, 20);
    let plans = vec![plan(Kind::Image, vec![vec![0], vec![1]])];
    let (batches, stats) = load_all(vec![three.clone(), keep], plans.clone(), config(1, 2, 8)?)?;
    assert_eq!(batches[0].sample_ids, vec!["keep"]);
    assert_eq!(
        (batches[0].num_images, batches[0].pixels.len()),
        (1, per_image)
    );
    assert_eq!(stats.skipped, 1);
    let fail = LoaderConfig::builder()
        .placeholder_id(PH)
        .pad_id(PAD as u32)
        .threads(1)
        .image_tokens(2)
        .image_size(8)
        .on_bad_image(BadImagePolicy::Fail)
        .build()?;
    let only = vec![plan(Kind::Image, vec![vec![0]])];
    let err = Loader::new(Arc::new(vec![three.clone()]), only.clone(), fail)
        .next()
        .context("one result")?
        .err()
        .context("the bad image fails the micro-batch")?;
    assert!(
        err.to_string()
            .starts_with("sample three: decoding image 2 of 3"),
        "{err}"
    );
    // Alone in its micro-batch, it runs as a zero-loss stand-in with three grey images.
    let (batches, _) = load_all(vec![three], only, config(1, 2, 8)?)?;
    assert_eq!(
        (batches[0].num_images, batches[0].supervised_tokens),
        (3, 0)
    );
    assert!(batches[0].pixels.iter().all(|&p| p == 127));
    Ok(())
}

#[test]
fn zero_loss_plan_keeps_pixels_but_ignores_every_label() -> Result<()> {
    let a = image_sample(
        "a",
        &[PH, 20, 21],
        &[false, true, true],
        jpeg(40, 30, 1)?,
        40,
        30,
    );
    let mut p = plan(Kind::Image, vec![vec![0]]);
    p.zero_loss = true;
    let (batches, _) = load_all(vec![a], vec![p], config(1, 3, 8)?)?;
    let mb = &batches[0];
    assert!(mb.zero_loss);
    assert!(mb.labels.iter().all(|&l| l == IGNORE_INDEX));
    assert_eq!((mb.supervised_tokens, mb.num_images), (0, 1));
    assert!(
        mb.pixels.iter().any(|&p| p != 0),
        "pixels are the real image"
    );
    Ok(())
}

/// 40 samples (30 images of assorted sizes, 10 texts) in 12 micro-batches.
fn mixed_dataset() -> Result<(Vec<Sample>, Vec<MicroBatchPlan>)> {
    let mut samples = Vec::new();
    for i in 0..30u32 {
        let (w, h) = (48 + 13 * (i % 7), 40 + 11 * (i % 5));
        let ids = [100 + i, PH, 200 + i, 201, 202 + i % 3];
        let mask = [false, false, true, true, true];
        samples.push(image_sample(
            &format!("img{i}"),
            &ids,
            &mask,
            jpeg(w, h, i)?,
            w,
            h,
        ));
    }
    for i in 0..10u32 {
        let ids: Vec<u32> = (0..5 + i).collect();
        let mask: Vec<bool> = (0..5 + i).map(|t| t % 2 == 1).collect();
        samples.push(text_sample(&format!("txt{i}"), &ids, &mask));
    }
    let mut plans: Vec<MicroBatchPlan> = (0..10u64)
        .map(|m| plan(Kind::Image, vec![vec![3 * m, 3 * m + 1], vec![3 * m + 2]]))
        .collect();
    plans.push(plan(Kind::Text, vec![vec![30, 31, 32], vec![33, 34]]));
    plans.push(plan(Kind::Text, (35..40).map(|i| vec![i]).collect()));
    Ok((samples, plans))
}

#[test]
fn one_and_four_threads_give_identical_micro_batches() -> Result<()> {
    let (samples, plans) = mixed_dataset()?;
    let (one, _) = load_all(samples.clone(), plans.clone(), config(1, 16, 32)?)?;
    let (four, stats) = load_all(samples, plans.clone(), config(4, 16, 32)?)?;
    assert_eq!(one.len(), plans.len());
    assert!(one == four, "1-thread and 4-thread outputs differ");
    let kinds: Vec<Kind> = four.iter().map(|b| b.kind).collect();
    assert_eq!(
        kinds,
        plans.iter().map(|p| p.kind).collect::<Vec<_>>(),
        "plan order kept"
    );
    assert_eq!((stats.batches, stats.samples, stats.images), (12, 40, 30));
    Ok(())
}

#[test]
fn small_prefetch_still_delivers_everything_in_order() -> Result<()> {
    let (samples, plans) = mixed_dataset()?;
    let cfg = LoaderConfig::builder()
        .placeholder_id(PH)
        .pad_id(PAD as u32)
        .threads(3)
        .prefetch(1)
        .image_tokens(16)
        .image_size(32);
    let (tight, _) = load_all(samples.clone(), plans.clone(), cfg.build()?)?;
    let (one, _) = load_all(samples, plans, config(1, 16, 32)?)?;
    assert!(tight == one);
    Ok(())
}

fn with_bad_image() -> Result<Vec<Sample>> {
    let ids = [PH, 20, 21];
    let mask = [false, true, true];
    Ok(vec![
        image_sample("good-0", &ids, &mask, jpeg(40, 30, 1)?, 40, 30),
        image_sample(
            "broken-7",
            &ids,
            &mask,
            b"\xFF\xD8\xFFnot really a jpeg".to_vec(),
            40,
            30,
        ),
        image_sample("good-2", &ids, &mask, jpeg(30, 40, 2)?, 30, 40),
    ])
}

#[test]
fn bad_image_is_skipped_and_counted_under_skip_policy() -> Result<()> {
    for threads in [1, 2] {
        let plans = vec![plan(Kind::Image, vec![vec![0, 1], vec![2]])];
        let (batches, stats) = load_all(with_bad_image()?, plans, config(threads, 3, 8)?)?;
        let mb = &batches[0];
        assert_eq!(mb.sample_ids, vec!["good-0", "good-2"]);
        assert_eq!((mb.num_images, mb.pixels.len()), (2, 2 * 3 * 64));
        assert_eq!((mb.rows, mb.supervised_tokens), (2, 4));
        assert_eq!((stats.skipped, stats.samples), (1, 2));
    }
    Ok(())
}

#[test]
fn bad_image_stops_the_run_with_its_id_under_fail_policy() -> Result<()> {
    for threads in [1, 2] {
        let source: Arc<dyn SampleSource> = Arc::new(with_bad_image()?);
        let plans = vec![
            plan(Kind::Image, vec![vec![0]]),
            plan(Kind::Image, vec![vec![1, 2]]),
            plan(Kind::Image, vec![vec![2]]),
        ];
        let cfg = LoaderConfig::builder()
            .placeholder_id(PH)
            .pad_id(PAD as u32)
            .threads(threads)
            .image_tokens(3)
            .image_size(8)
            .on_bad_image(BadImagePolicy::Fail)
            .build()?;
        let results: Vec<_> = Loader::new(source, plans, cfg).collect();
        assert_eq!(results.len(), 2, "the run stops at the failing micro-batch");
        assert!(results[0].is_ok());
        let err = results[1]
            .as_ref()
            .err()
            .context("second micro-batch must fail")?;
        assert_eq!(err.sample_id(), Some("broken-7"));
        assert!(err.to_string().contains("broken-7"), "{err}");
    }
    Ok(())
}

#[test]
fn image_micro_batch_whose_images_all_fail_keeps_a_zero_loss_stand_in() -> Result<()> {
    let samples = with_bad_image()?;
    let plans = vec![
        plan(Kind::Image, vec![vec![1]]),
        plan(Kind::Image, vec![vec![0]]),
    ];
    let (batches, _) = load_all(samples, plans, config(1, 3, 8)?)?;
    let mb = &batches[0];
    // The vision tower must still run on this rank: one grey image, nothing to learn.
    assert_eq!((mb.num_images, mb.supervised_tokens), (1, 0));
    assert!(mb.pixels.iter().all(|&p| p == 127));
    assert_eq!(mb.sample_ids, vec!["broken-7"]);
    assert_eq!(batches[1].sample_ids, vec!["good-0"]);
    Ok(())
}

#[test]
fn sample_whose_tokens_disagree_with_its_kind_is_reported() -> Result<()> {
    // An image sample with two placeholders cannot be spliced: under `fail` it names itself.
    let bytes = jpeg(40, 30, 1)?;
    let bad = image_sample("two-ph", &[PH, PH, 5], &[false, false, true], bytes, 40, 30);
    let source: Arc<dyn SampleSource> = Arc::new(vec![bad]);
    let cfg = LoaderConfig::builder()
        .placeholder_id(PH)
        .pad_id(PAD as u32)
        .threads(1)
        .on_bad_image(BadImagePolicy::Fail)
        .build()?;
    let mut loader = Loader::new(source, vec![plan(Kind::Image, vec![vec![0]])], cfg);
    let err = loader
        .next()
        .context("one result")?
        .err()
        .context("must fail")?;
    assert!(err.to_string().contains("two-ph") && err.to_string().contains("placeholders"));
    Ok(())
}

/// Image samples whose stored crc32c are right, except: `flipped-img` has a byte appended to
/// its image after ingest (it still decodes) and `flipped-ids` one token id changed.
fn with_corrupt_samples() -> Result<Vec<Sample>> {
    let ids = [PH, 20, 21];
    let mask = [false, true, true];
    let sound = |id: &str, seed: u32| -> Result<Sample> {
        let bytes = jpeg(40, 30, seed)?;
        let mut s = image_sample(id, &ids, &mask, bytes, 40, 30);
        for image in &mut s.images {
            image.crc32c = Some(crc32c::crc32c(&image.bytes));
        }
        s.input_ids_crc32c = Some(tessera_shards::input_ids_crc32c(&s.input_ids));
        Ok(s)
    };
    let mut flipped_img = sound("flipped-img", 2)?;
    flipped_img.images[0].bytes.push(0);
    let mut flipped_ids = sound("flipped-ids", 3)?;
    flipped_ids.input_ids[2] ^= 1;
    Ok(vec![sound("good-0", 1)?, flipped_img, flipped_ids])
}

#[test]
fn a_checksum_mismatch_fails_under_fail_naming_the_sample_and_column() -> Result<()> {
    for (index, id, column) in [(1, "flipped-img", "image"), (2, "flipped-ids", "input_ids")] {
        let source: Arc<dyn SampleSource> = Arc::new(with_corrupt_samples()?);
        let cfg = LoaderConfig::builder()
            .placeholder_id(PH)
            .pad_id(PAD as u32)
            .threads(1)
            .image_tokens(3)
            .image_size(8)
            .on_bad_image(BadImagePolicy::Fail)
            .build()?;
        let plans = vec![plan(Kind::Image, vec![vec![0, index]])];
        let err = Loader::new(source, plans, cfg)
            .next()
            .context("one result")?
            .err()
            .context("a corrupt sample must fail the micro-batch")?;
        let msg = err.to_string();
        assert_eq!(err.sample_id(), Some(id));
        assert!(
            msg.contains(&format!(
                "sample index {index} (sample {id}): {column} fails its crc32c"
            )),
            "{msg}"
        );
    }
    Ok(())
}

#[test]
fn checksum_mismatches_are_dropped_under_skip_and_unchecked_when_turned_off() -> Result<()> {
    let plans = || vec![plan(Kind::Image, vec![vec![0, 1], vec![2]])];
    let (batches, stats) = load_all(with_corrupt_samples()?, plans(), config(1, 3, 8)?)?;
    assert_eq!(batches[0].sample_ids, vec!["good-0"]);
    assert_eq!(stats.skipped, 2);
    let off = LoaderConfig::builder()
        .placeholder_id(PH)
        .pad_id(PAD as u32)
        .threads(1)
        .image_tokens(3)
        .image_size(8)
        .verify_checksums(false)
        .build()?;
    let (batches, stats) = load_all(with_corrupt_samples()?, plans(), off)?;
    assert_eq!(batches[0].sample_ids.len(), 3);
    assert_eq!(stats.skipped, 0);
    Ok(())
}

#[test]
fn a_sample_without_a_token_checksum_still_has_its_image_checked() -> Result<()> {
    // Format-v1 shards carry no input_ids crc32c: the image check still runs.
    let mut samples = with_corrupt_samples()?;
    for s in &mut samples {
        s.input_ids_crc32c = None;
    }
    let plans = vec![plan(Kind::Image, vec![vec![0, 1, 2]])];
    let (batches, stats) = load_all(samples, plans, config(1, 3, 8)?)?;
    assert_eq!(batches[0].sample_ids, vec!["good-0", "flipped-ids"]);
    assert_eq!(stats.skipped, 1);
    Ok(())
}
