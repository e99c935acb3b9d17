//! What the workspace's tests share: synthetic shard samples ([`sample`]) and the check that
//! an error prints its cause exactly once ([`assert_cause_printed_once`]). A dev-dependency
//! only; nothing here is part of tessera.
use tessera_shards::{Image, Kind, Sample, Turn};

/// `error` printed as the CLI prints it ([`tessera_errors::with_causes`]) and as anyhow's
/// `{:#}` prints a chain holds `cause`'s text exactly once in both.
pub fn assert_cause_printed_once<E>(error: E, cause: &str)
where
    E: std::error::Error + Send + Sync + 'static,
{
    let text = tessera_errors::with_causes(&error);
    assert_eq!(text.matches(cause).count(), 1, "{text}");
    let text = format!("{:#}", anyhow::Error::new(error));
    assert_eq!(text.matches(cause).count(), 1, "{text}");
}

/// Sample `i` of a synthetic dataset: `images` images whose bytes `image_bytes(k)` gives (each
/// with its crc32c, recorded as a `width x height` JPEG of made-up size), a user turn that holds
/// their placeholders and an assistant turn; ids are the image placeholders (Qwen's ids, as
/// shards written before the tokenizer's were recorded) then `5 + i % 11` text tokens, and the
/// loss covers every other text token.
pub fn sample(i: u32, images: u32, image_bytes: impl Fn(u32) -> Vec<u8>) -> Sample {
    let images: Vec<Image> = (0..images)
        .map(|k| {
            let bytes = image_bytes(k);
            Image {
                crc32c: Some(crc32c::crc32c(&bytes)),
                bytes,
                format: "jpeg".into(),
                width: 10 + i + k,
                height: 20 + i,
            }
        })
        .collect();
    let count = images.len();
    let placeholder = tessera_text::SpecialTokens::qwen().image.id;
    let mut ids: Vec<u32> = vec![placeholder; count];
    ids.extend((0..(5 + i % 11)).map(|t| t * 1000 + i));
    let mask: Vec<bool> = (0..ids.len()).map(|t| t >= count && t % 2 == 1).collect();
    Sample {
        id: format!("sample-{i:04}"),
        kind: if images.is_empty() {
            Kind::Text
        } else {
            Kind::Image
        },
        input_ids_crc32c: Some(tessera_shards::input_ids_crc32c(&ids)),
        images,
        conversation: vec![
            Turn {
                role: "user".into(),
                text: format!("question {i} {}", "<image>".repeat(count)),
            },
            Turn {
                role: "assistant".into(),
                text: format!("answer {i}"),
            },
        ],
        num_text_tokens: ids.len() as u32,
        num_supervised_tokens: mask.iter().skip(1).filter(|&&m| m).count() as u32,
        input_ids: ids,
        label_mask: mask,
    }
}

/// `len` bytes that compress well (a repeating pattern of `seed`).
pub fn pattern_bytes(seed: u32, len: u32) -> Vec<u8> {
    (0..len).map(|b| (b * 7 + seed) as u8).collect()
}

/// `len` bytes that do not compress (xorshift from `seed`), so a shard's size is its images'.
pub fn noise_bytes(seed: u32, len: u32) -> Vec<u8> {
    let mut state = 0x9e37_79b9_u32.wrapping_mul(seed.max(1));
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}
