//! LLaVA-Pretrain's naming rules: 9-digit ids, the folder is the id's first five digits
//! (`00000`..`00659`), `image` is `FOLDER/ID.jpg`, the human turn is a short-caption instruction
//! with `<image>` on its own line; and how the json and each image are written.
use crate::SynthError;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The json's file name, as LLaVA-Pretrain ships it.
pub const JSON_FILE_NAME: &str = "blip_laion_cc_sbu_558k.json";
/// The last image folder of LLaVA-Pretrain (`00659`).
pub const MAX_FOLDER: u32 = 659;
/// Ids per folder: the four digits after the folder's five.
const IDS_PER_FOLDER: u32 = 10_000;
/// Number of distinct ids that fall in folders `00000..=00659`.
pub(crate) const ID_SPACE: u32 = (MAX_FOLDER + 1) * IDS_PER_FOLDER;

/// LLaVA's instructions for a brief image description (LLaVA paper, table 8).
pub const BRIEF_PROMPTS: [&str; 11] = [
    "Describe the image concisely.",
    "Provide a brief description of the given image.",
    "Offer a succinct explanation of the picture presented.",
    "Summarize the visual content of the image.",
    "Give a short and clear explanation of the subsequent image.",
    "Share a concise interpretation of the image provided.",
    "Present a compact description of the photo's key features.",
    "Relay a brief, clear account of the picture shown.",
    "Render a clear and concise summary of the photo.",
    "Write a terse but informative summary of the picture.",
    "Create a compact narrative representing the image presented.",
];

/// Share of image records whose human turn puts `<image>` before the instruction.
const IMAGE_FIRST_SHARE: f64 = 0.25;

/// One turn of a LLaVA conversation: `from` is `human` or `gpt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub from: String,
    pub value: String,
}

impl Turn {
    pub fn human(value: impl Into<String>) -> Self {
        Turn {
            from: "human".into(),
            value: value.into(),
        }
    }
    pub fn gpt(value: impl Into<String>) -> Self {
        Turn {
            from: "gpt".into(),
            value: value.into(),
        }
    }
}

/// One record of `blip_laion_cc_sbu_558k.json`; text-only records have no `image` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlavaRecord {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub conversations: Vec<Turn>,
}

/// The id of sample `index` of `samples`: ids rise with the index and are spread evenly over
/// the id space (so over all folders), each at a random offset inside its own stride.
pub(crate) fn sample_id(index: usize, samples: usize, rng: &mut impl Rng) -> String {
    let stride = (ID_SPACE as usize / samples.max(1)).max(1);
    let id = index * stride + rng.gen_range(0..stride);
    format!("{id:09}")
}

/// The folder of an id: its first five digits.
pub(crate) fn folder_of(id: &str) -> &str {
    &id[..5]
}

/// The `image` value of an id: `FOLDER/ID.jpg`.
pub(crate) fn image_path(id: &str) -> String {
    format!("{}/{id}.jpg", folder_of(id))
}

/// The human turn of an image record: a brief-caption instruction with `<image>` after it
/// (or, for a quarter of records, before it).
pub(crate) fn caption_request(rng: &mut impl Rng) -> String {
    let prompt = BRIEF_PROMPTS[rng.gen_range(0..BRIEF_PROMPTS.len())];
    if rng.gen_bool(IMAGE_FIRST_SHARE) {
        format!("<image>\n{prompt}")
    } else {
        format!("{prompt}\n<image>")
    }
}

/// Writes one image through a temporary name in the same folder, so no reader ever sees a
/// half-written file under the final name. Unlike the json and the zip it is not fsynced:
/// one fsync per image cost 8 ms against 0.1 ms for the write itself (ext4, measured), minutes
/// on a bench dataset; a dataset cut short by a power loss is remade by running synth again
/// with the same seed (the output is deterministic).
pub(crate) fn write_image(path: &Path, bytes: &[u8]) -> Result<(), SynthError> {
    let tmp = tessera_shards::temp_path(path);
    std::fs::write(&tmp, bytes).map_err(|e| SynthError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| SynthError::io(path, e))
}

/// Writes the record list as compact JSON, atomically and durably.
pub(crate) fn write_json(path: &Path, records: &[LlavaRecord]) -> Result<(), SynthError> {
    tessera_shards::write_atomically_with(path, |file, tmp| {
        serde_json::to_writer(file, records).map_err(|source| SynthError::Json {
            path: tmp.to_path_buf(),
            source,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ids_are_unique_nine_digits_in_range_folders() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let n = 5000;
        let ids: Vec<String> = (0..n).map(|i| sample_id(i, n, &mut rng)).collect();
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), n);
        for id in &ids {
            assert_eq!(id.len(), 9);
            let folder: u32 = folder_of(id).parse().expect("digits");
            assert!(folder <= MAX_FOLDER, "{id}");
        }
        assert_eq!(folder_of(&ids[n - 1]), "00659");
        assert_eq!(image_path("004539375"), "00453/004539375.jpg");
    }
}
