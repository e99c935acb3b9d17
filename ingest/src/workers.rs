//! One record in, one outcome out: the work each worker thread does, cheapest checks first
//! (duplicate id from the reader, conversation and template, path safety), then the image
//! (fetch, header probe, pixel limit, verification decode), then tokenization.
use crate::error::IngestError;
use crate::images::ImageSource;
use crate::probe::{probe, verify_decode};
use crate::reason::{Reason, Rejection};
use crate::record::Record;
use crate::template::{render, Encoder};
use shards::{Kind, Sample};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// A record handed to a worker, numbered in json order.
pub(crate) struct Job {
    pub seq: u64,
    pub record: Result<Record, IngestError>,
    /// The id appeared earlier in the json (decided by the reader, in order).
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

/// Per-worker state: its own image source handle and the shared encoder.
pub(crate) struct Worker {
    pub source: ImageSource,
    pub encoder: Arc<Encoder>,
    pub verify: bool,
    pub max_pixels: u64,
}

impl Worker {
    /// Processes a job; only run-stopping failures (malformed json, tokenizer) are errors.
    pub(crate) fn process(&mut self, job: Job) -> Result<Outcome, IngestError> {
        let record = job.record?;
        let reject = |reason: Reason, detail: String| {
            Ok(Outcome::Rejected(Rejection {
                id: record.id.clone(),
                reason,
                detail,
            }))
        };
        if job.duplicate {
            return reject(
                Reason::DuplicateId,
                format!("id {} appeared earlier in the json", record.id),
            );
        }
        let rendered = match render(self.encoder.template, &self.encoder.tokens, &record) {
            Ok(r) => r,
            Err((reason, detail)) => return reject(reason, detail),
        };
        let mut notes = Vec::new();
        let (mut image, mut info) = (None, None);
        if let Some(path) = &record.image {
            let bytes = match self.source.fetch(path) {
                Ok(b) => b,
                Err(e) => return reject(e.reason, e.detail),
            };
            let checked = catch_unwind(AssertUnwindSafe(|| {
                let found = probe(&bytes, path, self.max_pixels)?;
                if self.verify {
                    verify_decode(&bytes, path, &found)?;
                }
                Ok(found)
            }))
            .unwrap_or_else(|_| {
                Err((
                    Reason::CorruptImage,
                    format!("{path}: the decoder panicked"),
                ))
            });
            match checked {
                Ok(found) => {
                    notes.extend(found.notes.iter().copied());
                    info = Some(found);
                    image = Some(bytes);
                }
                Err((reason, detail)) => return reject(reason, detail),
            }
        }
        let tokens =
            match self
                .encoder
                .encode(&record.id, &rendered, usize::from(image.is_some()))?
            {
                Ok(t) => t,
                Err((reason, detail)) => return reject(reason, detail),
            };
        let supervised = tokens.label_mask.iter().skip(1).filter(|&&m| m).count() as u32;
        let sample = Sample {
            id: record.id,
            kind: if image.is_some() {
                Kind::Image
            } else {
                Kind::Text
            },
            image_crc32c: image.as_deref().map(crc32c::crc32c),
            input_ids_crc32c: Some(shards::input_ids_crc32c(&tokens.input_ids)),
            image_format: info.as_ref().map(|i| i.format.as_str().to_string()),
            width: info.as_ref().map_or(0, |i| i.width),
            height: info.as_ref().map_or(0, |i| i.height),
            image,
            conversation: record.conversations,
            num_text_tokens: tokens.input_ids.len() as u32,
            num_supervised_tokens: supervised,
            input_ids: tokens.input_ids,
            label_mask: tokens.label_mask,
        };
        Ok(Outcome::Kept {
            sample: Box::new(sample),
            notes,
        })
    }
}
