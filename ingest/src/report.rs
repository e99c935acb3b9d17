//! The end-of-run summary: counts by reason, notes, throughput, and the rejected-fraction
//! verdict. Also written as `DIR/ingest_report.json` whether or not the run passed.
use serde::Serialize;
use std::fmt::Write;
use tessera_shards::{IngestReport, ShardInfo};

pub(crate) const REPORT_FILE: &str = "ingest_report.json";

/// What a finished ingest run did.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub report: IngestReport,
    pub shards: usize,
    pub shard_bytes: u64,
    /// Seconds of the whole ingest (a resumed one: every run's time up to its last shard).
    pub seconds: f64,
    /// Records of the whole ingest per second of `seconds`.
    pub records_per_s: f64,
    /// Seconds of this run alone (equals `seconds` unless resumed).
    pub this_run_seconds: f64,
    /// Record this run started at (0 unless resumed).
    pub resumed_at_record: u64,
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
            this_run_seconds: seconds,
            resumed_at_record: 0,
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

    /// Rejections by reason: `missing_image 2, corrupt_image 1`.
    pub fn rejected_by_reason(&self) -> String {
        let parts: Vec<String> = self
            .report
            .rejected
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        parts.join(", ")
    }

    /// The smallest `--max-rejected-fraction` (3 significant digits, rounded up) that accepts
    /// this run's rejections: parsing it back gives a value >= the rejected fraction.
    pub fn accepting_fraction(&self) -> String {
        let f = self.rejected_fraction;
        if f <= 0.0 || !f.is_finite() {
            return "0".into();
        }
        let digits = (2 - f.log10().floor() as i32).clamp(0, 15) as usize;
        let scale = 10f64.powi(digits as i32);
        let mut units = (f * scale - 1e-6).ceil();
        for _ in 0..3 {
            let text = format!("{:.*}", digits, units / scale);
            if text.parse::<f64>().is_ok_and(|v| v >= f) {
                return text;
            }
            units += 1.0;
        }
        format!("{f}")
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
        if self.resumed_at_record > 0 {
            let _ = writeln!(
                out,
                "  (whole ingest; this run resumed at record {} and took {:.1}s)",
                self.resumed_at_record, self.this_run_seconds
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn with_rejections(read: u64, rejected: u64) -> Summary {
        let mut report = IngestReport {
            records_read: read,
            ..IngestReport::default()
        };
        report.rejected.insert("missing_image".into(), rejected);
        Summary::new(report, &[], 1.0, read, 0.01)
    }

    #[test]
    fn the_accepting_fraction_accepts_and_is_close() {
        for (read, rejected, want) in [
            (20, 1, "0.0500"),
            (1000, 12, "0.0120"),
            (3, 1, "0.334"),
            (558_128, 6_700, "0.0121"),
            (2, 2, "1.00"),
        ] {
            let s = with_rejections(read, rejected);
            let text = s.accepting_fraction();
            assert_eq!(text, want, "{rejected} of {read}");
            let value: f64 = text.parse().expect("a number");
            let accepted = Summary::new(s.report.clone(), &[], 1.0, read, value);
            assert!(
                accepted.complete,
                "{text} does not accept {rejected} of {read}"
            );
        }
    }
}
