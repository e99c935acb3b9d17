//! The single writer: takes worker outcomes in any order, puts them back in input order, and
//! writes kept samples into shards and rejected records into `rejected.jsonl`. A shard closes
//! as soon as its estimated size reaches `--shard-size`, a function of the records alone, so
//! the output is byte-identical whatever the number of workers or the timing. After each
//! shard the resume journal is rewritten.
use crate::error::IngestError;
use crate::reason::Rejection;
use crate::resume::{FileStamp, Journal, REJECTED_FILE};
use crate::workers::Outcome;
use indicatif::ProgressBar;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use tessera_shards::{RowGroupLimits, ShardWriter};

pub(crate) struct OrderedWriter {
    dir: PathBuf,
    shard_size: u64,
    limits: RowGroupLimits,
    current: Option<ShardWriter>,
    /// Completed state; `state.next_record` is the next record to be written in order.
    state: Journal,
    waiting: BTreeMap<u64, Result<Outcome, IngestError>>,
    rejected: BufWriter<File>,
    progress: ProgressBar,
    /// When this run started, and the journal's time of the runs before it.
    started: std::time::Instant,
    earlier_s: f64,
}

impl OrderedWriter {
    /// Continues from `state` (a fresh journal, or the one an interrupted run left).
    pub(crate) fn new(
        dir: PathBuf,
        state: Journal,
        limits: RowGroupLimits,
        progress: ProgressBar,
        started: std::time::Instant,
    ) -> Result<Self, IngestError> {
        let path = dir.join(REJECTED_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| IngestError::io(&path, e))?;
        progress.set_position(state.next_record);
        Ok(OrderedWriter {
            earlier_s: state.elapsed_s,
            started,
            shard_size: state.settings.shard_size,
            dir,
            limits,
            current: None,
            state,
            waiting: BTreeMap::new(),
            rejected: BufWriter::new(file),
            progress,
        })
    }

    /// Takes the outcome of record `seq`; writes every outcome now in order. Returns how many
    /// records were written (the reader may send that many more).
    pub(crate) fn push(
        &mut self,
        seq: u64,
        outcome: Result<Outcome, IngestError>,
    ) -> Result<usize, IngestError> {
        self.waiting.insert(seq, outcome);
        let mut written = 0;
        while let Some(outcome) = self.waiting.remove(&self.state.next_record) {
            self.write(outcome?)?;
            written += 1;
        }
        self.progress.inc(written as u64);
        Ok(written)
    }

    /// Records handed over but still waiting for an earlier one.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn write(&mut self, outcome: Outcome) -> Result<(), IngestError> {
        let report = &mut self.state.report;
        report.records_read += 1;
        self.state.next_record += 1;
        match outcome {
            Outcome::Rejected(rejection) => {
                *report
                    .rejected
                    .entry(rejection.reason.as_str().to_string())
                    .or_default() += 1;
                self.write_rejection(&rejection)?;
            }
            Outcome::Kept { sample, notes } => {
                report.samples_written += 1;
                for note in notes {
                    *report.notes.entry(note.to_string()).or_default() += 1;
                }
                for image in &sample.images {
                    *report
                        .image_formats
                        .entry(image.format.clone())
                        .or_default() += 1;
                }
                let writer = match &mut self.current {
                    Some(w) => w,
                    None => {
                        let mut w =
                            ShardWriter::create(&self.dir, self.state.shards.len(), self.limits)?;
                        // What a full disk's message says the shard needs.
                        w.expect_bytes(self.shard_size);
                        self.current.insert(w)
                    }
                };
                writer.append(*sample)?;
                if writer.estimated_bytes() >= self.shard_size {
                    self.close_shard()?;
                }
            }
        }
        Ok(())
    }

    fn write_rejection(&mut self, r: &Rejection) -> Result<(), IngestError> {
        let line =
            serde_json::json!({ "id": r.id, "reason": r.reason.as_str(), "detail": r.detail });
        let path = self.dir.join(REJECTED_FILE);
        writeln!(self.rejected, "{line}").map_err(|e| IngestError::io(&path, e))?;
        self.state.rejected_bytes += line.to_string().len() as u64 + 1;
        Ok(())
    }

    /// Finishes the open shard (if any) and checkpoints the journal.
    fn close_shard(&mut self) -> Result<(), IngestError> {
        if let Some(writer) = self.current.take() {
            let info = writer.finish()?;
            tracing::debug!(shard = %info.file, rows = info.rows, "shard complete");
            let stamp = FileStamp::of(&self.dir.join(&info.file))?;
            self.state.shards.push(info);
            self.state.stamps.push(stamp);
        }
        let path = self.dir.join(REJECTED_FILE);
        self.rejected
            .flush()
            .map_err(|e| IngestError::io(&path, e))?;
        self.rejected
            .get_ref()
            .sync_data()
            .map_err(|e| IngestError::io(&path, e))?;
        self.state.elapsed_s = self.earlier_s + self.started.elapsed().as_secs_f64();
        self.state.save(&self.dir)
    }

    /// After the last record: closes the last shard and returns the final state.
    pub(crate) fn finish(mut self) -> Result<Journal, IngestError> {
        self.close_shard()?;
        self.progress.finish_and_clear();
        Ok(self.state)
    }
}
