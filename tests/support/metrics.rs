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
    /// Object store requests retried during the step (0 when the key is absent).
    pub store_retries: u64,
    /// Tokens that are not padding, over every rank (0 when the key is absent).
    pub real_tokens: u64,
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
            store_retries: unsigned("store_retries").unwrap_or(0),
            real_tokens: unsigned("real_tokens").unwrap_or(0),
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

/// What `tests/oracles/tensorboard_check.py` found in a run folder: TensorBoard's own reader
/// (`EventAccumulator`) loaded its event files, and they hold exactly `metrics.jsonl`'s scalars
/// (it fails otherwise, naming the first difference).
#[derive(Debug)]
pub(crate) struct Events {
    pub steps: u64,
    pub scalars: u64,
    /// Points per tag (`loss/all`, `loss/image`, `loader_wait_frac/rank1`, ...).
    pub per_tag: std::collections::BTreeMap<String, u64>,
}

/// Checks `run`'s TensorBoard events against its `metrics.jsonl` with the `tensorboard` that
/// `scripts/setup/setup.sh` installs into `.deps/venv`.
pub(crate) fn check_tensorboard_events(run: &Path) -> Result<Events> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".deps/venv/bin/python");
    let out = std::process::Command::new(&python)
        .arg(root.join("tests/oracles/tensorboard_check.py"))
        .arg(run)
        .output()
        .with_context(|| format!("running {} (run scripts/setup/setup.sh)", python.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "tensorboard_check.py {}: {}",
        run.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("tensorboard_check.py output for {}", run.display()))?;
    let per_tag = v["points_per_tag"]
        .as_object()
        .context("no points_per_tag")?
        .iter()
        .map(|(tag, n)| (tag.clone(), n.as_u64().unwrap_or(0)))
        .collect();
    Ok(Events {
        steps: v["steps"].as_u64().unwrap_or(0),
        scalars: v["scalars"].as_u64().unwrap_or(0),
        per_tag,
    })
}
