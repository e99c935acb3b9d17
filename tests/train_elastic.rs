//! Resuming at another world size, crash-safe checkpoints and the validation loss, end to end
//! through the binary (tiny model, synth shards):
//! - a full fine-tune (projector + LM + vision tower) checkpointed at W=2 in sharded form
//!   (format 4: each rank its own shards, no gather) and resumed at W=1 and at W=3 trains every
//!   step on the same samples as an uninterrupted W=2 run (from each run's `plan.jsonl`) and
//!   ends at the same loss (1e-3 relative: the reductions run in another order); a damaged
//!   shard file is named;
//! - a run killed with SIGKILL inside a checkpoint write resumes from the previous complete
//!   checkpoint and says which one it skipped and why;
//! - `--val-shards` writes `val_loss` every N steps, equal on every rank, into metrics.jsonl,
//!   summary.json and loss.png.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support;
use support::metrics::read_metrics;
use support::{
    ensure_nothing_left, fixture, full_finetune, ingest, run_ok, tessera, train_command,
    wait_until, Fixture, TrainArgs,
};

/// Stage 1 on the fixture, small micro-batches (a few samples per rank and step).
fn train(f: &Fixture, out: &Path, extra: &[&str]) -> Command {
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm: &f.lm,
        stage: 1,
        token_budget: 256,
    };
    train_command(tessera(), f, args, out, extra)
}

/// `plan.jsonl`: the samples of every step, by step.
fn planned(run: &Path) -> Result<Vec<(u64, Vec<u64>)>> {
    let text = std::fs::read_to_string(run.join("plan.jsonl"))?;
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            let step = v["step"].as_u64().context("step")?;
            let samples = v["samples"]
                .as_array()
                .context("samples")?
                .iter()
                .map(|s| s.as_u64().context("sample index"))
                .collect::<Result<_>>()?;
            Ok((step, samples))
        })
        .collect()
}

fn wait_for(path: &Path, child: &mut std::process::Child) -> Result<()> {
    wait_until(child, &path.display().to_string(), || path.exists())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    run_ok(Command::new("cp").arg("-r").arg(from).arg(to))?;
    Ok(())
}

fn relative_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn a_sharded_w2_full_finetune_checkpoint_resumes_at_w1_and_w3_on_the_same_samples_and_loss(
) -> Result<()> {
    let f = fixture(300, 0.0)?;
    let steps = ["--steps", "16", "--checkpoint-every", "8"];
    let straight = f.root.join("straight");
    run_ok(full_finetune(&f, &straight, &steps).args(["--nproc", "2"]))?;
    let want = planned(&straight)?;
    assert_eq!(want.len(), 16);
    let all: Vec<u64> = want.iter().flat_map(|(_, s)| s.clone()).collect();
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    ensure!(
        distinct.len() == all.len(),
        "16 steps fit one epoch here: no sample may repeat ({} of {})",
        distinct.len(),
        all.len()
    );
    let want_loss = read_metrics(&straight.join("metrics.jsonl"))?
        .last()
        .context("metrics")?
        .loss;

    // Its step-8 checkpoint is what a run stopped after step 8 leaves: resume from it.
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(
        straight.join("checkpoints/step-00000008/meta.json"),
    )?)?;
    assert_eq!(meta["format_version"], 4);
    // Each rank wrote its own shards; rank 0 also the layout that maps them to parameters.
    let ckpt = straight.join("checkpoints/step-00000008");
    for rank in ["rank-00000", "rank-00001"] {
        ensure!(
            ckpt.join(rank).join("shards.safetensors").is_file(),
            "{rank} wrote no shards"
        );
    }
    ensure!(ckpt.join("rank-00000/layout.json").is_file());
    let layout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("rank-00000/layout.json"))?)?;
    assert_eq!(layout["writers"], 2);
    let names: Vec<&str> = layout["buffers"]
        .as_array()
        .context("buffers")?
        .iter()
        .flat_map(|b| b["params"].as_array().into_iter().flatten())
        .filter_map(|p| p["name"].as_str())
        .collect();
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.mlp.down_proj.weight",
        "mm_projector.0.weight",
        "vision_model.encoder.layers.0.self_attn.q_proj.weight",
    ] {
        ensure!(names.contains(&name), "the layout lacks {name}: {names:?}");
    }
    let half = f.root.join("half");
    copy_dir(&straight, &half)?;
    std::fs::remove_dir_all(half.join("checkpoints/step-00000016"))?;

    for nproc in ["1", "3"] {
        let run = f.root.join(format!("resumed-w{nproc}"));
        copy_dir(&half, &run)?;
        run_ok(full_finetune(&f, &run, &steps).args(["--nproc", nproc, "--resume"]))?;
        let got = planned(&run)?;
        assert_eq!(
            got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            (0..16).collect::<Vec<_>>(),
            "W={nproc}: every step once"
        );
        assert_eq!(got, want, "W={nproc}: the steps trained other samples");
        let loss = read_metrics(&run.join("metrics.jsonl"))?
            .last()
            .context("metrics")?
            .loss;
        ensure!(
            relative_diff(loss, want_loss) < 1e-3,
            "W={nproc}: loss at step 16 {loss} vs {want_loss} uninterrupted"
        );
        let record = std::fs::read_to_string(run.join("resumes.jsonl"))?;
        let record: serde_json::Value =
            serde_json::from_str(record.lines().last().context("a resume record")?)?;
        assert_eq!(record["step"], 8);
        assert_eq!(record["checkpoint_world_size"], 2);
        assert_eq!(record["world_size"], nproc.parse::<u64>()?);
        assert_eq!(record["plan_world_size"], 2);
    }

    // One flipped byte in rank 1's shards: the resume names the file instead of training on it.
    let damaged = f.root.join("damaged");
    copy_dir(&half, &damaged)?;
    let file = damaged.join("checkpoints/step-00000008/rank-00001/shards.safetensors");
    let mut bytes = std::fs::read(&file)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&file, bytes)?;
    let out = full_finetune(&f, &damaged, &steps)
        .args(["--nproc", "1", "--resume"])
        .output()?;
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "a damaged shard was resumed from: {log}"
    );
    ensure!(
        log.contains("rank 1: shards.safetensors does not match"),
        "the error does not name the damaged file: {log}"
    );
    Ok(())
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "pauses a checkpoint write through TESSERA_CHECKPOINT_PAUSE_AT: --features test-hooks"
)]
fn a_kill_during_a_checkpoint_write_resumes_from_the_previous_complete_one() -> Result<()> {
    let f = fixture(120, 0.0)?;
    let run = f.root.join("run");
    let steps = ["--steps", "12", "--checkpoint-every", "4"];
    let mut child = train(&f, &run, &steps)
        .env("TESSERA_CHECKPOINT_PAUSE_AT", "8")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    // Rank 0 has written its tensors for step 8 and waits inside the write: kill -9.
    wait_for(
        &run.join("checkpoints/step-00000008.tmp/rank-00000/shards.safetensors"),
        &mut child,
    )?;
    child.kill()?;
    child.wait()?;
    ensure_nothing_left(&run)?;
    assert!(run.join("checkpoints/step-00000004/meta.json").is_file());
    assert!(!run.join("checkpoints/step-00000008").exists());

    let out = run_ok(
        train(&f, &run, &steps)
            .arg("--resume")
            .env("RUST_LOG", "info"),
    )?;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("skipped checkpoints/step-00000008.tmp: never committed"),
        "{log}"
    );
    assert!(
        log.contains("resumed from") && log.contains("step-00000004 (step 4"),
        "{log}"
    );
    let record: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(run.join("resumes.jsonl"))?.trim())?;
    assert_eq!(record["step"], 4);
    assert_eq!(record["checkpoint"], "checkpoints/step-00000004");
    assert_eq!(
        record["skipped"][0]["checkpoint"],
        "checkpoints/step-00000008.tmp"
    );
    let steps: Vec<u64> = read_metrics(&run.join("metrics.jsonl"))?
        .iter()
        .map(|m| m.step)
        .collect();
    assert_eq!(steps, (0..12).collect::<Vec<_>>());
    assert!(run.join("checkpoints/step-00000012/meta.json").is_file());
    assert!(
        !run.join("checkpoints/step-00000008.tmp").exists(),
        "the killed write was redone and committed"
    );
    Ok(())
}

/// Held-out shards: other synth records (another seed), ingested like the fixture's.
fn held_out(f: &Fixture, samples: usize) -> Result<PathBuf> {
    let llava = f.root.join("val-llava");
    run_ok(
        tessera()
            .args(["synth", "--quiet", "--samples", &samples.to_string()])
            .args(["--seed", "11", "--out"])
            .arg(&llava),
    )?;
    let shards = f.root.join("val-shards");
    run_ok(&mut ingest(tessera(), &llava, &shards))?;
    Ok(shards)
}

#[test]
fn validation_loss_every_n_steps_equal_on_all_ranks_in_metrics_summary_and_plot() -> Result<()> {
    let f = fixture(80, 0.2)?;
    let val = held_out(&f, 24)?;
    let run = f.root.join("run");
    let out = run_ok(
        train(&f, &run, &["--nproc", "2", "--steps", "7"])
            .arg("--val-shards")
            .arg(&val)
            .args(["--val-every", "3", "--val-samples", "10"])
            .env("RUST_LOG", "info"),
    )?;
    let metrics = read_metrics(&run.join("metrics.jsonl"))?;
    let with_val: Vec<(u64, f64)> = metrics
        .iter()
        .filter_map(|m| m.val_loss.map(|v| (m.step, v)))
        .collect();
    assert_eq!(
        with_val.iter().map(|p| p.0).collect::<Vec<_>>(),
        [2, 5, 6],
        "every 3 steps and after the last"
    );
    ensure!(
        with_val.iter().all(|p| p.1.is_finite() && p.1 > 0.0),
        "{with_val:?}"
    );
    // Each rank logs the value it computed: both ranks agree at every evaluation.
    let log = String::from_utf8_lossy(&out.stderr);
    for (step, v) in &with_val {
        for rank in 0..2 {
            let line = log
                .lines()
                .find(|l| {
                    l.starts_with(&format!("[rank {rank}]"))
                        && l.contains(&format!("step {step}: val_loss "))
                })
                .with_context(|| format!("rank {rank} logged no val_loss at step {step}"))?;
            let logged: f64 = line
                .split("val_loss ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .context("a number")?
                .parse()?;
            ensure!(
                (logged - v).abs() < 1e-5,
                "rank {rank} step {step}: {logged} vs {v}"
            );
        }
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json"))?)?;
    let best = with_val
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .context("a validation loss")?;
    assert_eq!(summary["best_val_step"], best.0);
    ensure!(
        (summary["best_val_loss"].as_f64().context("best_val_loss")? - best.1).abs() < 1e-9,
        "{summary}"
    );
    let png = image::open(run.join("loss.png"))?.to_rgb8();
    let orange = png.pixels().filter(|p| p.0 == [230, 120, 20]).count();
    ensure!(
        orange > 3 * 25,
        "loss.png draws the validation curve ({orange} pixels)"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("validation loss "), "{stdout}");
    Ok(())
}
