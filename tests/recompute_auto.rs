//! `--recompute auto` through the binary, on the small preset (LM hidden 256, 6 layers,
//! Qwen's vocabulary) in stage 1 f32 at W=1:
//! - the peak the trainer estimates before the first step (`RUN/recompute.json`) is at most
//!   15% under the peak resident set it then reaches (what `auto` relies on), and at most 25%
//!   over it, for `none` and `all` at two token budgets. `none` at 4,096 tokens measures 12-18%
//!   under its estimate from run to run on an AMD EPYC (the same with micro-batches filling
//!   the budget, `--seq-len` = budget: +15%, +18%), so the over side, where the estimate only
//!   costs speed, has its own bound;
//! - with `TESSERA_RECOMPUTE_MEMORY` between `all`'s and `none`'s estimates, `auto` takes the
//!   fastest policy that fits and records it;
//! - a resume keeps the recorded choice when the memory at hand would choose another, refuses
//!   another one named on the command line (naming `recompute`), and takes it with
//!   `--resume-changing recompute`.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;

/// The two tests train one after the other: a second training process beside one changes the
/// peak the first reaches (its second step has reached `none`'s peak under `every:2`), which
/// is not what the estimate is checked against.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
use support::{ingest_with, read_json, run_err, run_ok, scratch_once, tessera, tokenizer};

/// 300 synthetic image samples ingested, and `init-model --preset small`; made once.
fn fixture() -> Result<PathBuf> {
    scratch_once("recompute_auto_fixture", "shards/index.json", |dir| {
        let llava = dir.join("llava");
        run_ok(
            tessera()
                .args(["synth", "--quiet", "--samples", "300"])
                .args(["--text-only-fraction", "0", "--seed", "3", "--out"])
                .arg(&llava),
        )?;
        run_ok(
            tessera()
                .args(["init-model", "--quiet", "--preset", "small", "--tokenizer"])
                .arg(tokenizer())
                .arg("--out")
                .arg(dir.join("model")),
        )?;
        run_ok(&mut ingest_with(
            tessera(),
            &llava,
            dir.join("shards"),
            &tokenizer(),
        ))?;
        Ok(())
    })
}

fn train(dir: &Path, out: &Path, budget: u32, extra: &[&str]) -> Command {
    let mut cmd = tessera();
    cmd.args(["train", "--quiet", "--stage", "1", "--shards"])
        .arg(dir.join("shards"))
        .arg("--vision")
        .arg(dir.join("model/vision"))
        .arg("--lm")
        .arg(dir.join("model/lm"))
        .args(["--token-budget", &budget.to_string(), "--seq-len", "256"])
        .args(["--seed", "5", "--out"])
        .arg(out)
        .args(extra);
    cmd
}

/// What the run held before its first step, in MiB.
fn held(run: &Path) -> Result<f64> {
    let report = read_json(&run.join("recompute.json"))?;
    let bytes = report["held_bytes"].as_f64().context("held_bytes")?;
    Ok(bytes / (1u64 << 20) as f64)
}

/// The run's estimate for `policy` and its choice, in MiB and by name.
fn estimate(run: &Path, policy: &str) -> Result<(f64, String)> {
    let report = read_json(&run.join("recompute.json"))?;
    let estimates = report["estimated_peak_bytes"]
        .as_array()
        .context("estimated_peak_bytes")?;
    let bytes = estimates
        .iter()
        .find(|e| e[0] == policy)
        .and_then(|e| e[1].as_f64())
        .with_context(|| format!("no estimate for {policy}: {report}"))?;
    let choice = report["choice"].as_str().context("choice")?.to_string();
    Ok((bytes / (1u64 << 20) as f64, choice))
}

/// The largest peak resident set any step of the run logged, in MiB.
fn measured_peak(run: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    let mut peak: f64 = 0.0;
    for line in text.lines() {
        let step: serde_json::Value = serde_json::from_str(line)?;
        peak = peak.max(
            step["per_rank"]["peak_rss_mib"][0]
                .as_f64()
                .context("peak_rss_mib")?,
        );
    }
    Ok(peak)
}

/// The largest micro-batch (tokens computed, padding included) any step of the run trained,
/// over the token budget.
fn largest_fill(run: &Path, budget: u32) -> Result<f64> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    let mut tokens: u64 = 0;
    for line in text.lines() {
        let step: serde_json::Value = serde_json::from_str(line)?;
        tokens = tokens.max(step["tokens"].as_u64().context("tokens")?);
    }
    Ok(tokens as f64 / f64::from(budget))
}

#[test]
fn estimated_peaks_are_at_most_15_percent_under_the_measured_ones() -> Result<()> {
    let _alone = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fixture()?;
    let tmp = tempfile::tempdir()?;
    for budget in [2048, 4096] {
        for policy in ["none", "all"] {
            let out = tmp.path().join(format!("{policy}-{budget}"));
            run_ok(&mut train(
                &dir,
                &out,
                budget,
                &["--steps", "2", "--recompute", policy],
            ))?;
            let (estimated, choice) = estimate(&out, policy)?;
            ensure!(choice == policy, "asked for {policy}, ran {choice}");
            let measured = measured_peak(&out)?;
            let off = (estimated - measured) / measured;
            let fill = largest_fill(&out, budget)?;
            eprintln!(
                "{policy} at {budget} tokens: estimated {estimated:.0} MiB, measured \
                 {measured:.0} MiB ({:+.0}%), micro-batches up to {:.0}% of the budget",
                off * 100.0,
                fill * 100.0
            );
            ensure!(
                (-0.15..=0.25).contains(&off),
                "{policy} at {budget} tokens: estimated {estimated:.0} MiB, measured \
                 {measured:.0} MiB ({:+.0}%; allowed -15% to +25%), micro-batches up to {:.0}% \
                 of the budget",
                off * 100.0,
                fill * 100.0
            );
        }
    }
    Ok(())
}

#[test]
fn auto_takes_the_fastest_policy_that_fits_and_a_resume_keeps_it() -> Result<()> {
    let _alone = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fixture()?;
    let tmp = tempfile::tempdir()?;
    // What each policy needs here, from a run that only estimates and trains one step.
    let probe = tmp.path().join("probe");
    run_ok(&mut train(
        &dir,
        &probe,
        6144,
        &["--steps", "1", "--recompute", "all"],
    ))?;
    let (none, _) = estimate(&probe, "none")?;
    let (every2, _) = estimate(&probe, "every:2")?;
    let (all, _) = estimate(&probe, "all")?;
    ensure!(
        all < every2 && every2 < none,
        "all {all}, every:2 {every2}, none {none}"
    );
    // Room for every:2 but not for selective or none: a policy fits when 1.25 times what it
    // adds to what the run holds fits.
    let base = held(&probe)?;
    let needs = |peak: f64| base + 1.25 * (peak - base);
    let (selective, _) = estimate(&probe, "selective")?;
    let limit = needs(every2) + 8.0;
    ensure!(
        needs(selective) > limit,
        "selective ({selective:.0} MiB) fits under {limit:.0} MiB as every:2 ({every2:.0}) does"
    );
    let run = tmp.path().join("auto");
    let limit_env = format!("{limit:.0}MiB");
    // The run checkpoints at its end only: the estimate leaves out a checkpoint's writing.
    let steps = ["--steps", "2"];
    run_ok(train(&dir, &run, 6144, &steps).env("TESSERA_RECOMPUTE_MEMORY", &limit_env))?;
    let (_, choice) = estimate(&run, "all")?;
    ensure!(choice == "every:2", "auto chose {choice} under {limit_env}");
    // Not asserted: the limit holds the margin, not the estimate.
    eprintln!(
        "auto ran every:2 under {limit:.0} MiB and peaked at {:.0} MiB",
        measured_peak(&run)?
    );
    // Resumed (from its last checkpoint) with all the machine's memory: the recorded choice
    // stands.
    run_ok(train(&dir, &run, 6144, &steps).arg("--resume"))?;
    let (_, choice) = estimate(&run, "all")?;
    ensure!(choice == "every:2", "the resume chose {choice}");
    // Another policy by name is a change of the run record.
    let err = run_err(train(&dir, &run, 6144, &steps).args(["--recompute", "none", "--resume"]))?;
    ensure!(
        err.contains("recompute: every:2 -> none") && err.contains("--resume-changing recompute"),
        "{err}"
    );
    run_ok(train(&dir, &run, 6144, &steps).args([
        "--recompute",
        "none",
        "--resume",
        "--resume-changing",
        "recompute",
    ]))?;
    let (_, choice) = estimate(&run, "all")?;
    ensure!(choice == "none", "asked for none, ran {choice}");
    Ok(())
}
