//! The end-of-run summary: counts by reason, notes, throughput, and the rejected-fraction
//! verdict. Also written as `DIR/ingest_report.json` whether or not the run passed.
use serde::Serialize;
use shards::{IngestReport, ShardInfo};
use std::fmt::Write;

pub(crate) const REPORT_FILE: &str = "ingest_report.json";

/// What a finished ingest run did.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub report: IngestReport,
    pub shards: usize,
    pub shard_bytes: u64,
    pub seconds: f64,
    pub records_per_s: f64,
    pub rejected_fraction: f64,
    pub max_rejected_fraction: f64,
    /// Whether index.json was written (false when too many records were rejected).
    pub complete: bool,
}

impl Summary {
    pub fn new(
        report: IngestReport,
        shards: &[ShardInfo],
        seconds: f64,
        processed: u64,
        max_rejected_fraction: f64,
    ) -> Self {
        let rejected_fraction = if report.records_read == 0 {
            0.0
        } else {
            report.rejected_total() as f64 / report.records_read as f64
        };
        Summary {
            shards: shards.len(),
            shard_bytes: shards.iter().map(|s| s.bytes).sum(),
            seconds,
            records_per_s: if seconds > 0.0 {
                processed as f64 / seconds
            } else {
                0.0
            },
            rejected_fraction,
            max_rejected_fraction,
            complete: rejected_fraction <= max_rejected_fraction,
            report,
        }
    }

    /// Human-readable lines for stderr.
    pub fn text(&self) -> String {
        let r = &self.report;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "ingest: {} records read, {} samples written in {} shards ({:.1} MB), {} rejected ({:.3}%), {:.1}s, {:.0} records/s",
            r.records_read,
            r.samples_written,
            self.shards,
            self.shard_bytes as f64 / 1e6,
            r.rejected_total(),
            100.0 * self.rejected_fraction,
            self.seconds,
            self.records_per_s
        );
        for (reason, n) in &r.rejected {
            let _ = writeln!(out, "  rejected {reason:<28} {n}");
        }
        for (note, n) in &r.notes {
            let _ = writeln!(out, "  kept     {note:<28} {n}");
        }
        for (format, n) in &r.image_formats {
            let _ = writeln!(out, "  format   {format:<28} {n}");
        }
        out
    }
}
