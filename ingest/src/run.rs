//! The ingest run: a reader thread (input order, duplicate ids; a parquet input one row group
//! at a time), N worker threads, and the ordered writer on the calling thread, joined by
//! bounded channels carrying batches of records. A credit channel bounds how far the reader
//! may run ahead of the writer, so memory stays bounded even when one image is slow.
use crate::error::IngestError;
use crate::images::ImageSource;
use crate::layout::{Format, Input, Item};
use crate::ordered_writer::OrderedWriter;
use crate::report::{Summary, REPORT_FILE};
use crate::resume::{
    check_finished, remove_leftovers, Journal, Settings, JOURNAL_FILE, REJECTED_FILE,
};
use crate::workers::{Job, Outcome, Worker};
use crossbeam_channel::{bounded, Receiver, Sender};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tessera_shards::{
    IngestReport, Manifest, RowGroupLimits, FORMAT_VERSION, INDEX_FILE, TOKENIZER_FILE,
};
use tessera_text::chat::Template;
use tessera_text::Encoder;

/// Records per channel message between reader, workers and writer.
const BATCH: usize = 16;

/// Settings of one ingest run (the `tessera ingest` flags).
#[derive(Clone, Debug)]
pub struct IngestConfig {
    /// The input: a json file, a parquet file or folder, or a parquet URL (`s3://...`).
    pub input: String,
    /// The layout; `None` detects it (see [`crate::Format`]).
    pub format: Option<Format>,
    /// Where a layout that keeps images outside the input finds them: a folder or a zip.
    pub images: Option<PathBuf>,
    pub tokenizer: PathBuf,
    pub out: PathBuf,
    /// The chat template; `None`: the layout's own ([`Format::default_template`]: plain for
    /// LLaVA-Pretrain's json, chatml for the chat layouts).
    pub template: Option<Template>,
    /// A shard closes once its estimated size reaches this many bytes.
    pub shard_size: u64,
    pub workers: usize,
    /// Fully decode every image (default true; `--no-verify` turns it off).
    pub verify: bool,
    pub resume: bool,
    pub max_rejected_fraction: f64,
    /// Images with more pixels than this are rejected as decompression bombs.
    pub max_pixels: u64,
    /// Reject records longer than this many tokens (`too_long`), each image counted as
    /// `image_tokens`; `None`: no limit (train then skips or refuses them by its row length).
    pub max_tokens: Option<u64>,
    /// What an image counts for `max_tokens` (the vision tower's tokens per image: 729 for
    /// SigLIP-so400m at 384 px).
    pub image_tokens: u64,
    pub row_groups: RowGroupLimits,
    /// Show a progress bar (the caller decides: a terminal, and no `--quiet` or NO_PROGRESS).
    pub progress: bool,
}

impl IngestConfig {
    pub const DEFAULT_SHARD_SIZE: u64 = 256 << 20;
    pub const DEFAULT_MAX_PIXELS: u64 = 40_000_000;

    /// Defaults for everything but the paths: a LLaVA json (format detected) and its images.
    pub fn new(json: PathBuf, images: PathBuf, tokenizer: PathBuf, out: PathBuf) -> Self {
        let mut config = Self::for_input(json.to_string_lossy().into_owned(), tokenizer, out);
        config.images = Some(images);
        config
    }

    /// Defaults for everything but the input, tokenizer and output: no `--images`, the format
    /// detected.
    pub fn for_input(input: String, tokenizer: PathBuf, out: PathBuf) -> Self {
        IngestConfig {
            input,
            format: None,
            images: None,
            tokenizer,
            out,
            template: None,
            shard_size: Self::DEFAULT_SHARD_SIZE,
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            verify: true,
            resume: false,
            max_rejected_fraction: 0.01,
            max_pixels: Self::DEFAULT_MAX_PIXELS,
            max_tokens: None,
            image_tokens: 729,
            row_groups: RowGroupLimits::default(),
            progress: false,
        }
    }
}

/// Runs an ingest. `Ok` even when too many records were rejected: see [`Summary::complete`].
pub fn run(config: &IngestConfig) -> Result<Summary, IngestError> {
    let started = Instant::now();
    let opened = Opened::open(config)?;
    let settings = opened.settings(config)?;
    let dir = &config.out;
    if config.resume && dir.join(INDEX_FILE).exists() {
        let manifest = Manifest::load(dir)?;
        check_finished(dir, &manifest, &settings)?;
        tracing::info!("{} is already complete; nothing to resume", dir.display());
        return Ok(Summary::new(
            manifest.ingest,
            &manifest.shards,
            0.0,
            0,
            config.max_rejected_fraction,
        ));
    }
    let state = prepare_out_dir(dir, config.resume, &settings)?;
    let start = state.next_record;
    if start > 0 {
        tracing::info!(
            "resuming at record {start} with {} shards kept",
            state.shards.len()
        );
    }
    let progress = progress_bar(config.progress, opened.input.len());
    let earlier_s = state.elapsed_s;
    let writer = OrderedWriter::new(dir.clone(), state, config.row_groups, progress, started)?;
    let final_state = process(config, &opened, start, writer)?;
    finalize(
        config,
        &opened.encoder,
        final_state,
        started,
        start,
        earlier_s,
    )
}

/// What a run reads from: the input, its layout, the encoder and the images (if the layout
/// keeps them outside the input).
struct Opened {
    input: Input,
    format: Format,
    encoder: Arc<Encoder>,
    source: Option<ImageSource>,
}

impl Opened {
    fn open(config: &IngestConfig) -> Result<Self, IngestError> {
        let (input, format) = Input::open(&config.input, config.format)?;
        let template = config.template.unwrap_or(format.default_template());
        let encoder = Arc::new(Encoder::load(&config.tokenizer, template)?);
        let source = match &config.images {
            Some(images) => Some(ImageSource::open(images)?),
            None if format.images_outside() => {
                return Err(IngestError::Input {
                    input: config.input.clone(),
                    detail: format!(
                        "the {format} layout keeps its images outside the file: give --images \
                         (a folder or a .zip)"
                    ),
                })
            }
            None => None,
        };
        Ok(Opened {
            input,
            format,
            encoder,
            source,
        })
    }

    /// The settings a resume checks its inputs against: the inputs' fingerprints and the
    /// flags that change what is written.
    fn settings(&self, config: &IngestConfig) -> Result<Settings, IngestError> {
        Ok(Settings {
            format: self.format.name().to_string(),
            json_bytes: self.input.byte_len(),
            json_records: self.input.len(),
            json_sha256: self.input.fingerprint()?,
            images_fingerprint: match &self.source {
                Some(source) => source.fingerprint()?,
                None => String::new(),
            },
            tokenizer_fingerprint: self.encoder.fingerprint.clone(),
            template: self.encoder.template.name().to_string(),
            shard_size: config.shard_size,
            verify: config.verify,
            max_pixels: config.max_pixels,
            max_tokens: config.max_tokens,
            max_tokens_image_tokens: config.max_tokens.map(|_| config.image_tokens),
        })
    }

    fn worker(&self, config: &IngestConfig) -> Worker {
        Worker {
            source: self.source.clone(),
            encoder: self.encoder.clone(),
            format: self.format,
            verify: config.verify,
            max_pixels: config.max_pixels,
            max_tokens: config.max_tokens.map(|n| (n, config.image_tokens)),
        }
    }
}

/// Batches of records sent from the workers to the writer, by input position.
type Outcomes = Vec<(u64, Result<Outcome, IngestError>)>;

/// Reads from record `start` on with a reader thread and `config.workers` workers, and writes
/// their outcomes in input order on this thread; returns the finished run's journal.
fn process(
    config: &IngestConfig,
    opened: &Opened,
    start: u64,
    mut writer: OrderedWriter,
) -> Result<Journal, IngestError> {
    let workers = config.workers.max(1);
    // Records travel in batches of BATCH (one channel message, one wake-up, one credit each).
    let window = (64 * workers + 256).div_ceil(BATCH);
    let (job_tx, job_rx) = bounded::<Vec<Job>>(2 * workers);
    let (out_tx, out_rx) = bounded::<Outcomes>(2 * workers);
    let (credit_tx, credit_rx) = bounded::<()>(window);
    std::thread::scope(|scope| {
        let input = &opened.input;
        scope.spawn(move || read_jobs(input, start, credit_tx, job_tx));
        for _ in 0..workers {
            let worker = opened.worker(config);
            let (job_rx, out_tx) = (job_rx.clone(), out_tx.clone());
            scope.spawn(move || work(worker, job_rx, out_tx));
        }
        drop((job_rx, out_tx));
        let mut written = 0;
        for done in out_rx {
            for (seq, outcome) in done {
                written += writer.push(seq, outcome)?;
            }
            // One credit back per BATCH records written, so the reader runs at most `window`
            // batches ahead of the writer.
            for _ in 0..written / BATCH {
                let _ = credit_rx.recv();
            }
            written %= BATCH;
        }
        if writer.waiting() > 0 {
            return Err(IngestError::WorkerPanic(
                "records were lost between workers and writer".into(),
            ));
        }
        writer.finish()
    })
}

/// The reader thread: sends the records from `start` on in batches of BATCH, each after taking
/// a credit, marking the ids seen before; stops after a record it cannot read, or when the
/// writer hangs up. Dropping `job_tx` at the end tells the workers there is no more.
fn read_jobs(input: &Input, start: u64, credit_tx: Sender<()>, job_tx: Sender<Vec<Job>>) {
    let total = input.len();
    let mut seen = HashSet::new();
    let mut batch = Vec::with_capacity(BATCH);
    input.read_from(start, &mut |n, item| {
        let record = match item {
            Item::Earlier(id) => {
                seen.insert(id_key(&id));
                return true;
            }
            Item::Record(record) => record,
        };
        let duplicate = match &record {
            Ok(r) => !seen.insert(id_key(&r.id)),
            Err(_) => false,
        };
        let stop = record.is_err();
        batch.push(Job {
            seq: n,
            record,
            duplicate,
        });
        if batch.len() == BATCH || stop || n + 1 == total {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
            if credit_tx.send(()).is_err() || job_tx.send(full).is_err() || stop {
                return false;
            }
        }
        true
    });
}

/// A worker thread: processes batches of jobs until the reader is done or the writer hangs up;
/// a panic on one record becomes that record's error.
fn work(mut worker: Worker, job_rx: Receiver<Vec<Job>>, out_tx: Sender<Outcomes>) {
    for jobs in job_rx {
        let mut done = Vec::with_capacity(jobs.len());
        for job in jobs {
            let seq = job.seq;
            let outcome =
                catch_unwind(AssertUnwindSafe(|| worker.process(job))).unwrap_or_else(|_| {
                    Err(IngestError::WorkerPanic(format!(
                        "while processing record {seq}"
                    )))
                });
            done.push((seq, outcome));
        }
        if out_tx.send(done).is_err() {
            return;
        }
    }
}

/// A record id as the duplicate check keeps it: 128 bits of two SipHash-1-3 hashes (16 bytes
/// a record whatever the id's length; two different ids collide with probability about
/// 2^-128 per pair, some 10^-27 over LLaVA-Pretrain's 558,128 records).
fn id_key(id: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        id.hash(&mut h);
        h.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// Creates the output directory, or restores the state an interrupted run left in it.
fn prepare_out_dir(dir: &Path, resume: bool, settings: &Settings) -> Result<Journal, IngestError> {
    std::fs::create_dir_all(dir).map_err(|e| IngestError::io(dir, e))?;
    let fresh = Journal {
        settings: settings.clone(),
        shards: Vec::new(),
        next_record: 0,
        rejected_bytes: 0,
        report: IngestReport::default(),
        stamps: Vec::new(),
        elapsed_s: 0.0,
    };
    if resume {
        if let Some(journal) = Journal::load(dir)? {
            journal.restore(dir, settings)?;
            return Ok(journal);
        }
    } else {
        let mut entries = std::fs::read_dir(dir).map_err(|e| IngestError::io(dir, e))?;
        if entries.next().is_some() {
            return Err(IngestError::OutDir {
                dir: dir.to_path_buf(),
                detail:
                    "output directory is not empty (pass --resume to continue an interrupted run)"
                        .into(),
            });
        }
    }
    remove_leftovers(dir, 0)?;
    let rejected = dir.join(REJECTED_FILE);
    std::fs::write(&rejected, b"").map_err(|e| IngestError::io(&rejected, e))?;
    Ok(fresh)
}

/// Writes the report and, when the rejected fraction is acceptable, index.json.
fn finalize(
    config: &IngestConfig,
    encoder: &Encoder,
    mut state: Journal,
    started: Instant,
    start: u64,
    earlier_s: f64,
) -> Result<Summary, IngestError> {
    let dir = &config.out;
    state.report.images_verified = config.verify;
    // A resumed ingest reports the whole ingest: the journal carries the earlier runs' time
    // (up to their last completed shard; the work after it was redone by this run).
    let this_run = started.elapsed().as_secs_f64();
    let mut summary = Summary::new(
        state.report.clone(),
        &state.shards,
        earlier_s + this_run,
        state.next_record,
        config.max_rejected_fraction,
    );
    summary.resumed_at_record = start;
    summary.this_run_seconds = this_run;
    let report_json =
        serde_json::to_vec_pretty(&summary).map_err(|source| IngestError::Report {
            path: dir.join(REPORT_FILE),
            source,
        })?;
    tessera_shards::write_atomically(&dir.join(REPORT_FILE), &report_json)?;
    if summary.complete {
        let kept = keep_tokenizer(config, encoder)?;
        let added = !encoder.tokens.added.is_empty();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            tokenizer_fingerprint: kept,
            source_tokenizer_fingerprint: added.then(|| encoder.fingerprint.clone()),
            template: encoder.template.name().to_string(),
            image_placeholder_id: encoder.tokens.image.id,
            special_tokens: encoder.tokens.clone(),
            num_samples: state.shards.iter().map(|s| s.rows).sum(),
            shards: state.shards,
            ingest: state.report,
            // What a later `--resume` into this finished directory checks its inputs against.
            ingest_settings: Some(state.settings),
        };
        manifest.save(dir)?;
        let journal = dir.join(JOURNAL_FILE);
        std::fs::remove_file(&journal).map_err(|e| IngestError::io(&journal, e))?;
    }
    Ok(summary)
}

/// Copies the tokenizer the ids were made with beside index.json (before it is written), so the
/// shards carry it: `train` keeps it in the run folder for export and generate. Refused if the
/// file changed since the encoder loaded it. With tokens added (`<image>`), the copy is the
/// tokenizer with them. Returns the copy's sha256 (index.json's `tokenizer_fingerprint`).
fn keep_tokenizer(config: &IngestConfig, encoder: &Encoder) -> Result<String, IngestError> {
    let bytes =
        std::fs::read(&config.tokenizer).map_err(|e| IngestError::io(&config.tokenizer, e))?;
    let found = hex::encode(Sha256::digest(&bytes));
    if found != encoder.fingerprint {
        return Err(IngestError::Tokenizer {
            path: config.tokenizer.clone(),
            detail: format!(
                "it changed during the ingest (sha256 {found}, the ids were made with {})",
                encoder.fingerprint
            ),
        });
    }
    let bytes = encoder.tokenizer_json(bytes)?;
    tessera_shards::write_atomically(&config.out.join(TOKENIZER_FILE), &bytes)?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {pos}/{len} records  {per_sec}  ETA {eta}")
    {
        bar.set_style(style);
    }
    bar
}
