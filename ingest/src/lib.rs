//! LLaVA / LLaVA-OneVision json + images (folder or zip), or Hugging Face `datasets` parquet
//! with the images inside (the_cauldron and FineVision's `images` + `texts`, TRL's `messages`)
//! -> tessera shards.
//!
//! An ingest run ([`run`]):
//! 1. opens the input in its layout ([`Format`], detected or given: `layout/`): a json is
//!    mapped and split into records (a syntax error stops the run, naming the byte offset),
//!    parquet files are read a row group at a time; a reader thread turns rows into records in
//!    order and marks repeated ids;
//! 2. worker threads check each record's conversation (one `<image>` per image), render the
//!    chat template, refuse unsafe image paths, fetch each image (folder or zip read in place,
//!    or the bytes embedded in the parquet), probe its header (format, size, pixel limit),
//!    decode it unless `verify` is off, and tokenize;
//! 3. one writer puts outcomes back in json order: samples go to `shard-NNNNN.parquet`,
//!    rejections (id + reason) to `rejected.jsonl`; after each shard a journal makes the run
//!    resumable; the tokenizer is copied beside them (`tokenizer.json`, so the shards carry
//!    it to `train`'s run folder) and `index.json` is written last, recording the special
//!    tokens the ids were made with (the tokenizer's own, resolved by [`tessera_text::Encoder`]).
//!
//! The templates, the special tokens and the tokenizer are `tessera-text`'s: ingest checks
//! a record's turns and picks the reason it is rejected for (`template.rs`).
mod error;
mod images;
mod jpeg_check;
mod layout;
mod ordered_writer;
mod probe;
mod reason;
mod record;
mod report;
mod resume;
mod run;
mod template;
mod workers;

pub use error::IngestError;
pub use layout::Format;
pub use reason::{Reason, Rejection};
pub use report::Summary;
pub use run::{run, IngestConfig};
