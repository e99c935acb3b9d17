//! One record in, one outcome out: the work each worker thread does, cheapest checks first
//! (duplicate id from the reader, what the layout refused, conversation and template, path
//! safety), then each image in turn (fetch or take the embedded bytes, header probe, pixel
//! limit, verification decode), then tokenization. A record is rejected for its first problem:
//! one bad image rejects it whole.
use crate::error::IngestError;
use crate::images::ImageSource;
use crate::layout::Format;
use crate::probe::{probe, verify_decode, ImageInfo};
use crate::reason::{Reason, Rejection};
use crate::record::{ImageRef, Record};
use crate::template::{encode, render};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use tessera_shards::{Image, Kind, Sample, Turn};
use tessera_text::Encoder;

/// A record handed to a worker, numbered in input order.
pub(crate) struct Job {
    pub seq: u64,
    pub record: Result<Record, IngestError>,
    /// The id appeared earlier in the input (decided by the reader, in order).
    pub duplicate: bool,
}

/// What became of a record.
#[derive(Debug)]
pub(crate) enum Outcome {
    Kept {
        sample: Box<Sample>,
        notes: Vec<&'static str>,
    },
    Rejected(Rejection),
}

/// Per-worker state: its own image source handle (where the layout keeps images outside the
/// input) and the shared encoder.
pub(crate) struct Worker {
    pub source: Option<ImageSource>,
    pub encoder: Arc<Encoder>,
    pub format: Format,
    pub verify: bool,
    pub max_pixels: u64,
    /// `--max-tokens` and what an image counts for it.
    pub max_tokens: Option<(u64, u64)>,
}

/// A rejected record's reason and detail.
type Refusal = (Reason, String);

impl Worker {
    /// Processes a job; only run-stopping failures (unreadable input, tokenizer) are errors.
    pub(crate) fn process(&mut self, job: Job) -> Result<Outcome, IngestError> {
        let record = job.record?;
        let id = record.id.clone();
        let rejected = |(reason, detail): Refusal| {
            Ok(Outcome::Rejected(Rejection {
                id: id.clone(),
                reason,
                detail,
            }))
        };
        if job.duplicate {
            return rejected((
                Reason::DuplicateId,
                format!("id {id} appeared earlier in the input"),
            ));
        }
        if let Some(refusal) = record.refused.clone() {
            return rejected(refusal);
        }
        let (rendered, roles) = match render(
            self.encoder.template,
            &self.encoder.tokens,
            &record,
            self.format,
        ) {
            Ok(r) => r,
            Err(refusal) => return rejected(refusal),
        };
        let mut notes = Vec::new();
        let mut images = Vec::with_capacity(record.images.len());
        for image in record.images {
            match self.check_image(image) {
                Ok((image, found)) => {
                    notes.extend(found);
                    images.push(image);
                }
                Err(refusal) => return rejected(refusal),
            }
        }
        let encoded = encode(&self.encoder, &id, &rendered, images.len(), self.format)?;
        let tokens = match encoded {
            Ok(t) => t,
            Err(refusal) => return rejected(refusal),
        };
        if let Some((limit, per_image)) = self.max_tokens {
            let n = images.len() as u64;
            let len = tokens.input_ids.len() as u64 - n + n * per_image;
            if len > limit {
                return rejected((
                    Reason::TooLong,
                    format!(
                        "{len} tokens ({} text, {n} image(s) x {per_image}) exceed --max-tokens \
                         {limit}",
                        tokens.input_ids.len() as u64 - n
                    ),
                ));
            }
        }
        let supervised = tokens.label_mask.iter().skip(1).filter(|&&m| m).count() as u32;
        // Roles are stored by their canonical names, whatever the layout called them.
        let conversation = roles
            .iter()
            .zip(record.conversations)
            .map(|(role, turn)| Turn {
                role: role.name().to_string(),
                text: turn.text,
            })
            .collect();
        let sample = Sample {
            id,
            kind: if images.is_empty() {
                Kind::Text
            } else {
                Kind::Image
            },
            images,
            conversation,
            num_text_tokens: tokens.input_ids.len() as u32,
            num_supervised_tokens: supervised,
            input_ids_crc32c: Some(tessera_shards::input_ids_crc32c(&tokens.input_ids)),
            input_ids: tokens.input_ids,
            label_mask: tokens.label_mask,
        };
        Ok(Outcome::Kept {
            sample: Box::new(sample),
            notes,
        })
    }

    /// Fetches (or takes) one image and checks it: header, pixel limit, full decode unless
    /// `--no-verify`. Returns it with its notes.
    fn check_image(&mut self, image: ImageRef) -> Result<(Image, Vec<&'static str>), Refusal> {
        let (bytes, name) = match image {
            ImageRef::Embedded { bytes, name } => (bytes, name),
            ImageRef::Path(path) => {
                let Some(source) = self.source.as_mut() else {
                    return Err((
                        Reason::MissingImage,
                        format!(
                            "{path}: the input stores no bytes for it and no --images was given"
                        ),
                    ));
                };
                let bytes = source.fetch(&path).map_err(|e| (e.reason, e.detail))?;
                (bytes, path)
            }
        };
        let checked = catch_unwind(AssertUnwindSafe(|| -> Result<ImageInfo, Refusal> {
            let found = probe(&bytes, &name, self.max_pixels)?;
            if self.verify {
                verify_decode(&bytes, &name, &found)?;
            }
            Ok(found)
        }))
        .unwrap_or_else(|_| {
            Err((
                Reason::CorruptImage,
                format!("{name}: the decoder panicked"),
            ))
        })?;
        let image = Image {
            format: checked.format.as_str().to_string(),
            width: checked.width,
            height: checked.height,
            crc32c: Some(crc32c::crc32c(&bytes)),
            bytes,
        };
        Ok((image, checked.notes))
    }
}
