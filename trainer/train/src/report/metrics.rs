//! What a run reports: one JSON object per optimizer step appended to `metrics.jsonl`
//! ([`StepMetrics`]) and to `plan.jsonl` (the step's samples), both through a [`StepLog`]; a
//! progress line on stderr; `summary.json` at the end of the run.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// What one optimizer step measured (rank 0 writes it; cross-rank values are reduced first).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    /// Mean token cross-entropy over the step's supervised tokens, all ranks; for an MoE LM
    /// plus `moe.aux_weight × moe.aux_loss`, the loss the gradients are of.
    pub loss: f64,
    /// The same over the step's image micro-batches alone (absent when it ran none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_image: Option<f64>,
    /// The same over the step's text-only micro-batches alone (absent when it ran none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_text: Option<f64>,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// All tokens (padding included) per second of step time, all ranks.
    pub tokens_per_s: f64,
    /// Non-padding tokens per second, all ranks.
    pub real_tokens_per_s: f64,
    pub images_per_s: f64,
    /// Fraction of the step this rank spent waiting for the loader.
    pub loader_wait_frac: f64,
    /// Slowest rank's compute time over the mean rank's (1.0 = balanced).
    pub imbalance: f64,
    pub step_time_s: f64,
    pub tokens: u64,
    pub real_tokens: u64,
    pub supervised_tokens: u64,
    pub images: u64,
    /// Seconds of the step per part, this rank, all micro-steps: each unit component's
    /// forward, backward and recompute (`vision`, `projector`, `embed`, `lm_layers`, `head`),
    /// then `gather_wait`, `reduce_wait` and `optimizer`; for an MoE LM on the CPU also the
    /// part of `lm_layers`' forwards and recomputes its sparse blocks spent in the router and
    /// dispatch (`moe_router_dispatch`) and in the experts and combine (`moe_experts`).
    pub unit_time_s: BTreeMap<String, f64>,
    /// Resident memory of this process, MiB.
    pub rss_mib: f64,
    /// Bytes this rank sent through collectives in the step (ring cost model), all groups.
    #[serde(default)]
    pub bytes_sent: u64,
    /// The part of `bytes_sent` sent to other machines' ranks under a hybrid strategy (the
    /// cross-node all-reduce); 0 otherwise, where every collective spans the whole job.
    #[serde(default)]
    pub bytes_sent_across_nodes: u64,
    /// Object-store requests of this rank that failed and were retried during the step (at a
    /// run's first step, since it opened `--shards`); 0 for shards on local disk.
    #[serde(default)]
    pub store_retries: u64,
    /// Mean token loss over the fixed validation set after this step's update (only on the
    /// steps `--val-every` picks, and the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// With a mixture (`--shards mix.toml`): the mean token loss of each source's supervised
    /// tokens in the step, all ranks (sources with none in the step are left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub loss_by_source: BTreeMap<String, f64>,
    /// What differs between ranks, one value per rank in rank order.
    #[serde(default)]
    pub per_rank: PerRank,
    /// An MoE LM's router balance in the step, all ranks (absent for dense LMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeMetrics>,
}

/// The experts' load in one step, over every rank and micro-batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MoeMetrics {
    /// transformers' `aux_loss` (load_balancing_loss_func over every sparse layer), the mean
    /// of the step's micro-batches: 1.0 is perfectly balanced routing.
    pub aux_loss: f64,
    /// `router_aux_loss_coef`: what `aux_loss` weighs in `loss`.
    pub aux_weight: f64,
    /// Per sparse layer (by index): the most loaded expert's top-k slots over the mean
    /// expert's (1.0 = even).
    pub load_max_over_mean: BTreeMap<String, f64>,
    /// Per sparse layer (by index): the top-k slots each expert received.
    pub tokens_per_expert: BTreeMap<String, Vec<f64>>,
}

impl MoeMetrics {
    /// From the summed balance losses of `micro_batches` micro-batches and the summed slot
    /// counts of each sparse layer (`layers[j]` is layer j's index, `loads` row-major
    /// `[layers, experts]`).
    pub(crate) fn new(
        aux_sum: f64,
        micro_batches: usize,
        aux_weight: f64,
        layers: &[i64],
        loads: &[f64],
    ) -> Self {
        let experts = loads.len() / layers.len().max(1);
        let mut m = MoeMetrics {
            aux_loss: aux_sum / micro_batches.max(1) as f64,
            aux_weight,
            ..Default::default()
        };
        for (layer, load) in layers.iter().zip(loads.chunks(experts.max(1))) {
            let mean = load.iter().sum::<f64>() / load.len().max(1) as f64;
            let max = load.iter().copied().fold(0.0, f64::max);
            let ratio = if mean > 0.0 { max / mean } else { 1.0 };
            m.load_max_over_mean.insert(layer.to_string(), ratio);
            m.tokens_per_expert.insert(layer.to_string(), load.to_vec());
        }
        m
    }

    /// The run log's line: the balance loss, and the most and least loaded (layer, expert)
    /// with their share of that layer's slots.
    pub(crate) fn describe(&self) -> String {
        let mut most = (String::new(), 0, f64::MIN);
        let mut least = (String::new(), 0, f64::MAX);
        for (layer, load) in &self.tokens_per_expert {
            let total = load.iter().sum::<f64>().max(1.0);
            for (e, &c) in load.iter().enumerate() {
                let share = c / total;
                if share > most.2 {
                    most = (layer.clone(), e, share);
                }
                if share < least.2 {
                    least = (layer.clone(), e, share);
                }
            }
        }
        format!(
            "router balance loss {:.4} (1 is even); most loaded: layer {} expert {} ({:.1}% of \
             its slots), least loaded: layer {} expert {} ({:.1}%)",
            self.aux_loss,
            most.0,
            most.1,
            100.0 * most.2,
            least.0,
            least.1,
            100.0 * least.2
        )
    }
}

/// Per-rank values of one step (each list has one entry per rank).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PerRank {
    /// Seconds the rank waited for its loader, over the step's wall time.
    pub loader_wait_frac: Vec<f64>,
    /// Seconds the rank computed (the step less its loader wait): `imbalance` is their max
    /// over their mean.
    pub compute_s: Vec<f64>,
    /// The rank's peak resident memory so far, MiB (Linux `VmHWM`).
    pub peak_rss_mib: Vec<f64>,
}

/// Why a per-step log (`metrics.jsonl`, `plan.jsonl`) could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("per-step log {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The disk is full: the file, the bytes the line needed, the bytes free.
    #[error(transparent)]
    NoSpace(#[from] tessera_shards::NoSpace),
    #[error("per-step log {path} line {line}")]
    Json {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

/// A JSON-lines file with one line per optimizer step, each a `T` that serialises a `step`
/// field: `StepLog<StepMetrics>` writes `metrics.jsonl`, `StepLog<PlannedStep>` (`run.rs`)
/// `plan.jsonl`. Each line is flushed at once, so a killed run keeps its history.
pub(crate) struct StepLog<T> {
    path: PathBuf,
    file: std::fs::File,
    line: std::marker::PhantomData<fn(&T)>,
}

impl<T: Serialize> StepLog<T> {
    /// Opens `path` for appending. A run resumed at `resume_step` first cuts the file after
    /// the last line of a step < `resume_step` (lines of later steps were written after the
    /// checkpoint it resumes from), so every step appears once.
    ///
    /// The cut is a byte offset: kept lines stay byte for byte as they were (nothing is
    /// re-serialised), and it is made with one `set_len` (ftruncate) in place. Truncation
    /// never touches the bytes before the offset, so a kill at any moment leaves either the
    /// whole old file or exactly the kept lines: no moment without the history, and no copy
    /// of a long history (a temp file + rename would rewrite all of it on every resume).
    pub(crate) fn open(path: &Path, resume_step: Option<u64>) -> Result<Self, MetricsError> {
        let io = |source| MetricsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(io)?;
        if let Some(step) = resume_step {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io)?;
            let keep = kept_prefix_len(path, &bytes, step)?;
            if keep < bytes.len() {
                file.set_len(keep as u64).map_err(io)?;
                file.sync_all().map_err(io)?;
            }
        }
        file.flush().map_err(io)?;
        Ok(StepLog {
            path: path.to_path_buf(),
            file,
            line: std::marker::PhantomData,
        })
    }

    /// Appends one line. A write that fails (a full disk) cuts the file back to where it was,
    /// so no torn line is left; a full disk says so with the line's size and the bytes free.
    pub(crate) fn append(&mut self, value: &T) -> Result<(), MetricsError> {
        let mut line = to_line(value);
        line.push('\n');
        let before = self.file.metadata().map(|m| m.len());
        let written = self
            .file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush());
        let Err(source) = written else {
            return Ok(());
        };
        if let Ok(len) = before {
            let _ = self.file.set_len(len);
        }
        match tessera_shards::NoSpace::from_io(&self.path, &source, line.len() as u64) {
            Some(full) => Err(full.into()),
            None => Err(MetricsError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

/// Bytes of a [`StepLog`] to keep when resuming at `resume_step`: up to the first line
/// whose step is >= `resume_step` (lines are appended in step order). A torn last line (a
/// write cut by a kill) is dropped; an unreadable line before the end is an error.
fn kept_prefix_len(path: &Path, bytes: &[u8], resume_step: u64) -> Result<usize, MetricsError> {
    #[derive(Deserialize)]
    struct StepOnly {
        step: u64,
    }
    let mut offset = 0;
    for (i, line) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
        let complete = line.ends_with(b"\n");
        if line.iter().all(u8::is_ascii_whitespace) {
            offset += line.len();
            continue;
        }
        match serde_json::from_slice::<StepOnly>(line) {
            Ok(m) if complete && m.step < resume_step => offset += line.len(),
            Ok(_) => return Ok(offset),
            Err(_) if !complete => return Ok(offset),
            Err(source) => {
                return Err(MetricsError::Json {
                    path: path.to_path_buf(),
                    line: i + 1,
                    source,
                })
            }
        }
    }
    Ok(offset)
}

fn to_line<T: Serialize>(value: &T) -> String {
    // Serialising a struct of numbers, strings and maps with string keys cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

/// Reads every step of a `metrics.jsonl`.
pub(crate) fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>, MetricsError> {
    let file = std::fs::File::open(path).map_err(|source| MetricsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| MetricsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line).map_err(|source| MetricsError::Json {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })?,
        );
    }
    Ok(out)
}

/// One human line per step: `step 12/300 loss 3.412 lr 1.0e-3 |g| 0.81 tok/s 5120 (real 4410)
/// img/s 38.2 wait 3% imb 1.04 vision 0.12s projector 0.01s lm 0.30s rss 812MiB`.
pub(crate) fn progress_line(m: &StepMetrics, total_steps: u64) -> String {
    let mut s = format!(
        "step {}/{} loss {:.4} lr {:.2e} |g| {:.3} tok/s {:.0} (real {:.0}) img/s {:.1} wait {:.0}% imb {:.2}",
        m.step + 1,
        total_steps,
        m.loss,
        m.lr,
        m.grad_norm,
        m.tokens_per_s,
        m.real_tokens_per_s,
        m.images_per_s,
        100.0 * m.loader_wait_frac,
        m.imbalance
    );
    for (kind, t) in &m.unit_time_s {
        s += &format!(" {kind} {t:.2}s");
    }
    s + &format!(" rss {:.0}MiB", m.rss_mib)
}

/// Prints progress lines: with `live` every step (overwriting one line), else about 50 log
/// lines a run.
pub(crate) struct Progress {
    total_steps: u64,
    live: bool,
}

impl Progress {
    /// `live`: the caller's choice ([`crate::RunStart::progress`]: a terminal, and no
    /// `--quiet` or NO_PROGRESS).
    pub(crate) fn new(total_steps: u64, live: bool) -> Self {
        Progress { total_steps, live }
    }

    pub(crate) fn show(&self, m: &StepMetrics) {
        let line = progress_line(m, self.total_steps);
        let last = m.step + 1 == self.total_steps;
        if self.live {
            eprint!("\r{line}\x1b[K{}", if last { "\n" } else { "" });
        } else if m.step == 0 || last || m.step.is_multiple_of((self.total_steps / 50).max(1)) {
            tracing::info!("{line}");
        }
    }
}

/// Peak resident set size of this process so far in MiB (Linux `VmHWM` of
/// `/proc/self/status`; 0 elsewhere).
pub(crate) fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Resident set size of this process in MiB (Linux `/proc/self/statm`; 0 elsewhere).
pub(crate) fn rss_mib() -> f64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    pages * page / (1024.0 * 1024.0)
}

/// End-of-run summary (`summary.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub steps: u64,
    pub first_loss: f64,
    pub last_loss: f64,
    pub min_loss: f64,
    /// Mean of the last 10 % of steps' losses (at least one step): less noisy than `last_loss`.
    pub final_loss_mean: f64,
    pub mean_tokens_per_s: f64,
    pub mean_real_tokens_per_s: f64,
    pub mean_images_per_s: f64,
    pub mean_loader_wait_frac: f64,
    pub total_real_tokens: u64,
    pub total_images: u64,
    /// Rank 0's object-store requests that failed and were retried (the sum of the steps').
    #[serde(default)]
    pub store_retries: u64,
    /// The lowest validation loss and the step it was measured at (runs with --val-shards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_val_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_val_step: Option<u64>,
    /// The validation loss after the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_val_loss: Option<f64>,
    /// Samples the plan left out for their length (`--over-long skip`; listed in
    /// skipped.jsonl).
    #[serde(default)]
    pub skipped_over_long: u64,
}

impl Summary {
    /// `None` for a run without steps.
    pub fn from_steps(steps: &[StepMetrics]) -> Option<Summary> {
        let first = steps.first()?;
        let last = steps.last()?;
        let n = steps.len() as f64;
        let mean = |f: fn(&StepMetrics) -> f64| steps.iter().map(f).sum::<f64>() / n;
        let tail = (steps.len() / 10).max(1);
        let tail_steps = &steps[steps.len() - tail..];
        let best_val = steps
            .iter()
            .filter_map(|m| m.val_loss.filter(|v| v.is_finite()).map(|v| (m.step, v)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        Some(Summary {
            steps: steps.len() as u64,
            first_loss: first.loss,
            last_loss: last.loss,
            min_loss: steps.iter().map(|m| m.loss).fold(f64::INFINITY, f64::min),
            final_loss_mean: tail_steps.iter().map(|m| m.loss).sum::<f64>() / tail as f64,
            mean_tokens_per_s: mean(|m| m.tokens_per_s),
            mean_real_tokens_per_s: mean(|m| m.real_tokens_per_s),
            mean_images_per_s: mean(|m| m.images_per_s),
            mean_loader_wait_frac: mean(|m| m.loader_wait_frac),
            total_real_tokens: steps.iter().map(|m| m.real_tokens).sum(),
            total_images: steps.iter().map(|m| m.images).sum(),
            store_retries: steps.iter().map(|m| m.store_retries).sum(),
            best_val_loss: best_val.map(|(_, v)| v),
            best_val_step: best_val.map(|(step, _)| step),
            final_val_loss: steps.iter().rev().find_map(|m| m.val_loss),
            skipped_over_long: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(i: u64, loss: f64) -> StepMetrics {
        StepMetrics {
            step: i,
            loss,
            ..Default::default()
        }
    }

    #[test]
    fn resume_drops_steps_after_the_checkpoint_and_keeps_earlier_ones() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("metrics.jsonl");
        let mut w = StepLog::open(&path, None)?;
        for i in 0..5 {
            w.append(&step(i, 5.0 - i as f64))?;
        }
        drop(w);
        let mut w = StepLog::open(&path, Some(3))?;
        w.append(&step(3, 1.5))?;
        let steps = read_metrics(&path)?;
        let ids: Vec<u64> = steps.iter().map(|m| m.step).collect();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        assert_eq!(steps[3].loss, 1.5);
        Ok(())
    }

    #[test]
    fn resume_keeps_earlier_lines_byte_for_byte() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("metrics.jsonl");
        // Lines as another writer (or an older tessera) formatted them: a float serde would
        // print differently, a key order of its own, an extra key. Then a torn line.
        let kept = concat!(
            "{\"step\":0,\"loss\":2.50,\"lr\":1e-3,\"note\":\"warm\"}\n",
            "{\"loss\":2.4000000000000004,\"step\":1,\"lr\":0.001}\n",
            "\n",
            "{\"step\":2,\"loss\":2.3,\"lr\":1.0E-3}\n",
        );
        let dropped = "{\"step\":3,\"loss\":2.2,\"lr\":0.001}\n{\"step\":4,\"lo";
        std::fs::write(&path, format!("{kept}{dropped}"))?;
        let mut w = StepLog::open(&path, Some(3))?;
        assert_eq!(std::fs::read(&path)?, kept.as_bytes(), "kept lines changed");
        w.append(&step(3, 1.5))?;
        let text = std::fs::read_to_string(&path)?;
        let appended = text.strip_prefix(kept).expect("kept prefix");
        assert_eq!(appended, format!("{}\n", to_line(&step(3, 1.5))));
        Ok(())
    }

    #[test]
    fn an_unreadable_line_before_the_end_is_an_error_naming_it() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "{\"step\":0}\nnot json\n{\"step\":1}\n")?;
        let err = StepLog::<StepMetrics>::open(&path, Some(1))
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("line 2")),
            "{err:?}"
        );
        Ok(())
    }

    #[test]
    fn every_line_has_the_documented_fields() -> anyhow::Result<()> {
        let line: serde_json::Value = serde_json::from_str(&to_line(&step(0, 2.0)))?;
        for key in [
            "step",
            "loss",
            "lr",
            "grad_norm",
            "tokens_per_s",
            "real_tokens_per_s",
            "images_per_s",
            "loader_wait_frac",
            "imbalance",
            "unit_time_s",
            "rss_mib",
            "bytes_sent",
            "bytes_sent_across_nodes",
        ] {
            assert!(line.get(key).is_some(), "metrics line lacks `{key}`");
        }
        Ok(())
    }

    #[test]
    fn summary_reports_first_last_and_tail_mean() {
        let steps: Vec<_> = (0..20).map(|i| step(i, 10.0 - i as f64 * 0.5)).collect();
        let s = Summary::from_steps(&steps).expect("steps");
        assert_eq!(s.first_loss, 10.0);
        assert_eq!(s.last_loss, 0.5);
        assert_eq!(s.min_loss, 0.5);
        assert_eq!(s.final_loss_mean, 0.75);
        assert!(Summary::from_steps(&[]).is_none());
        assert_eq!((s.best_val_loss, s.best_val_step), (None, None));
    }

    #[test]
    fn summary_records_the_best_validation_loss_and_its_step() {
        let mut steps: Vec<_> = (0..6).map(|i| step(i, 5.0)).collect();
        for (i, v) in [(1, 4.0), (3, 3.5), (5, 3.7)] {
            steps[i].val_loss = Some(v);
        }
        let s = Summary::from_steps(&steps).expect("steps");
        assert_eq!((s.best_val_loss, s.best_val_step), (Some(3.5), Some(3)));
        assert_eq!(s.final_val_loss, Some(3.7));
        let line: serde_json::Value = serde_json::from_str(&to_line(&steps[3])).expect("json");
        assert_eq!(line["val_loss"], 3.5);
        assert!(
            serde_json::from_str::<serde_json::Value>(&to_line(&steps[0]))
                .expect("json")
                .get("val_loss")
                .is_none()
        );
    }
}
