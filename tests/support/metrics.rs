//! A run's `metrics.jsonl` as the tests read it: the fields they assert on, parsed from JSON
//! alone, so a test that only reads metrics does not link the trainer (and libtorch).
use anyhow::{Context, Result};
use std::path::Path;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    pub step: u64,
    pub loss: f64,
    pub val_loss: Option<f64>,
    pub bytes_sent: u64,
    pub bytes_sent_across_nodes: u64,
}

/// Every step of `path`, in file order; a line that is not a step's record is an error naming
/// the file and line.
pub(crate) fn read_metrics(path: &Path) -> Result<Vec<Step>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut steps = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{} line {}", path.display(), i + 1);
        let v: serde_json::Value = serde_json::from_str(line).with_context(at)?;
        let unsigned = |key: &str| v.get(key).and_then(serde_json::Value::as_u64);
        steps.push(Step {
            step: unsigned("step").with_context(|| format!("{}: no step", at()))?,
            loss: v["loss"]
                .as_f64()
                .with_context(|| format!("{}: no loss", at()))?,
            val_loss: v.get("val_loss").and_then(serde_json::Value::as_f64),
            bytes_sent: unsigned("bytes_sent").unwrap_or(0),
            bytes_sent_across_nodes: unsigned("bytes_sent_across_nodes").unwrap_or(0),
        });
    }
    Ok(steps)
}

/// `(step, loss)` of every line of the run folder `run`'s `metrics.jsonl`.
pub(crate) fn losses(run: &Path) -> Result<Vec<(u64, f64)>> {
    Ok(read_metrics(&run.join("metrics.jsonl"))?
        .iter()
        .map(|m| (m.step, m.loss))
        .collect())
}
