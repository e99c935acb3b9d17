//! Ingest, then read every sample back: same ids, conversations and image bytes, and token ids
//! equal to a fresh tokenization of the template, written out by hand here.
use crate::common;

use common::*;
use std::collections::HashMap;
use tessera_shards::{Dataset, Kind, RowGroupLimits, Sample};
use tessera_text::chat::Role;
use tessera_text::chat::Template;

fn fixture(samples: usize) -> (Fixture, HashMap<String, Vec<u8>>) {
    let mut f = Fixture::new();
    let mut images = HashMap::new();
    for i in 0..samples {
        let id = format!("{:09}", 4_539_375 + i);
        if i % 5 == 4 {
            f.records.push(text_record(
                &id,
                &[
                    ("human", "Name a prime number."),
                    ("gpt", &format!("{} is prime.", [2, 3, 5, 7][i % 4])),
                ],
            ));
        } else {
            let bytes = jpeg(40 + (i as u32 % 7) * 9, 30 + (i as u32 % 3) * 11, i as u32);
            f.add_image(
                &id,
                &bytes,
                &format!("select luxury furniture {i} - inch gel memory foam mattress topper."),
            );
            images.insert(id, bytes);
        }
    }
    (f, images)
}

fn read_all(out: &std::path::Path) -> anyhow::Result<(Dataset, Vec<Sample>)> {
    let dataset = Dataset::open(out)?;
    // Read in a scrambled order to exercise the reader's reordering.
    let mut order: Vec<u64> = (0..dataset.len() as u64).collect();
    order.reverse();
    let shift = 7 % order.len().max(1);
    order.rotate_left(shift);
    let mut samples = dataset.read(&order)?;
    let mut by_index: Vec<(u64, Sample)> = order.into_iter().zip(samples.drain(..)).collect();
    by_index.sort_by_key(|(i, _)| *i);
    Ok((dataset, by_index.into_iter().map(|(_, s)| s).collect()))
}

fn supervised_text(tokenizer: &tokenizers::Tokenizer, s: &Sample) -> anyhow::Result<String> {
    let ids: Vec<u32> = s
        .input_ids
        .iter()
        .zip(&s.label_mask)
        .filter(|(_, &m)| m)
        .map(|(&t, _)| t)
        .collect();
    tokenizer
        .decode(&ids, false)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The sample's ids equal a fresh tokenization of `text`, and its supervised tokens decode to
/// `supervised`.
fn assert_tokens(
    tokenizer: &tokenizers::Tokenizer,
    sample: &Sample,
    text: &str,
    supervised: &str,
) -> anyhow::Result<()> {
    let fresh = tokenizer
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(sample.input_ids, fresh.get_ids(), "ids of {}", sample.id);
    assert_eq!(
        supervised_text(tokenizer, sample)?,
        supervised,
        "supervised part of {}",
        sample.id
    );
    Ok(())
}

#[test]
fn plain_template_round_trips_every_sample() -> anyhow::Result<()> {
    let (f, images) = fixture(60);
    let mut config = f.config(Template::Plain);
    config.shard_size = 40_000;
    config.row_groups = RowGroupLimits {
        max_rows: 8,
        max_bytes: 1 << 20,
    };
    let summary = tessera_ingest::run(&config)?;
    assert!(
        summary.shards >= 3,
        "small --shard-size gives several shards, got {}",
        summary.shards
    );
    let tokenizer =
        tokenizers::Tokenizer::from_file(tokenizer_path()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (dataset, samples) = read_all(&f.out())?;
    assert_eq!(samples.len(), 60);
    assert_eq!(dataset.metadata()?.len(), 60);
    for (sample, record) in samples.iter().zip(&f.records) {
        assert_eq!(sample.id, record["id"].as_str().unwrap_or_default());
        let turns: Vec<(String, String)> = sample
            .conversation
            .iter()
            .map(|t| (t.role.clone(), t.text.clone()))
            .collect();
        let expected_turns: Vec<(String, String)> = record["conversations"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| {
                        // Roles are stored by their canonical names: human -> user, gpt ->
                        // assistant.
                        let from = t["from"].as_str().unwrap_or_default();
                        let role = Role::from_llava(from)
                            .map_or(from.to_string(), |r| r.name().to_string());
                        (role, t["value"].as_str().unwrap_or_default().into())
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(turns, expected_turns, "conversation of {}", sample.id);
        let caption = &expected_turns[expected_turns.len() - 1].1;
        let (expected_text, expected_supervised) = if sample.kind == Kind::Image {
            assert_eq!(sample.images.len(), 1, "one image in {}", sample.id);
            let image = &sample.images[0];
            assert_eq!(
                Some(&image.bytes),
                images.get(&sample.id),
                "image bytes of {}",
                sample.id
            );
            assert_eq!(image.crc32c, Some(crc32c::crc32c(&image.bytes)));
            (
                format!("<|image_pad|>{caption}\n<|endoftext|>"),
                format!("{caption}\n<|endoftext|>"),
            )
        } else {
            assert!(sample.images.is_empty());
            let question = &expected_turns[0].1;
            (
                format!("{question}\n{caption}\n<|endoftext|>"),
                format!("{caption}\n<|endoftext|>"),
            )
        };
        assert_tokens(&tokenizer, sample, &expected_text, &expected_supervised)?;
        let placeholders = sample
            .input_ids
            .iter()
            .filter(|&&t| t == 151_655) // Qwen's <|image_pad|>
            .count();
        assert_eq!(placeholders, usize::from(sample.kind == Kind::Image));
        assert_eq!(sample.num_text_tokens as usize, sample.input_ids.len());
        let targets = sample.label_mask.iter().skip(1).filter(|&&m| m).count();
        assert_eq!(sample.num_supervised_tokens as usize, targets);
    }
    let verify = tessera_shards::verify(&f.out())?;
    assert!(verify.is_ok(), "{:?}", verify.problems);
    Ok(())
}

#[test]
fn chatml_template_supervises_only_assistant_turns() -> anyhow::Result<()> {
    let mut f = Fixture::new();
    let bytes = jpeg(48, 48, 3);
    f.put_image("coco/1.jpg", &bytes);
    f.records.push(serde_json::json!({"id": "m1", "image": "coco/1.jpg", "conversations": [
        {"from": "human", "value": "<image>\nWhat is shown?"}, {"from": "gpt", "value": "A gradient."},
        {"from": "human", "value": "Which colours?"}, {"from": "gpt", "value": "Red and green."}]}));
    f.records.push(text_record(
        "t1",
        &[("system", "Be brief."), ("human", "Hi"), ("gpt", "Hello!")],
    ));
    tessera_ingest::run(&f.config(Template::Chatml))?;
    let tokenizer =
        tokenizers::Tokenizer::from_file(tokenizer_path()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (_, samples) = read_all(&f.out())?;
    let expected = [
        (
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\nWhat is shown?<|im_end|>\n<|im_start|>assistant\nA gradient.<|im_end|>\n<|im_start|>user\nWhich colours?<|im_end|>\n<|im_start|>assistant\nRed and green.<|im_end|>\n",
            "A gradient.<|im_end|>Red and green.<|im_end|>",
        ),
        (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
            "Hello!<|im_end|>",
        ),
    ];
    for (sample, (text, supervised)) in samples.iter().zip(expected) {
        assert_tokens(&tokenizer, sample, text, supervised)?;
    }
    assert_eq!(samples[0].images[0].bytes, bytes);
    Ok(())
}
