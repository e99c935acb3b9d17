//! `tessera train --expert-parallel` on init-model's tiny Qwen3-MoE (two sparse layers of 8
//! experts, top-2), stage 2 training projector and LM (router and experts learn), through the
//! real CLI and its rank processes:
//! - EP=2 at W=2 gives the losses of W=2 without expert parallelism;
//! - a checkpoint written at EP=2 × W=2 resumes at EP=1 × W=1, and one written at EP=1 × W=1
//!   resumes at EP=2 × W=2, each continuing with the uninterrupted run's loss;
//! - the llava-hf export of the EP=2 run holds every expert (the checkpoint's experts come
//!   from both ranks' files) and equals the export of the run without EP;
//! - an expert count or world size that N does not divide is refused before training.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::process::Command;

use crate::support;
use support::metrics::losses;
use support::{fixture_with, run_err, run_ok, tessera, Fixture, Lm};

/// `tessera train` of `stage` on the fixture into `out`, 128 tokens a rank, seed 5.
fn train(f: &Fixture, stage: u8, out: &Path) -> Command {
    let mut cmd = tessera();
    cmd.args(["train", "--quiet", "--shards"])
        .arg(&f.shards)
        .arg("--vision")
        .arg(&f.vision)
        .arg("--lm")
        .arg(&f.lm)
        .args(["--stage", &stage.to_string()])
        .args(["--token-budget", "128", "--seq-len", "128", "--seed", "5"])
        .arg("--out")
        .arg(out);
    cmd
}

fn stage2(f: &Fixture, stage1: Option<&Path>, out: &Path, nproc: usize, ep: usize) -> Command {
    let mut cmd = train(f, 2, out);
    cmd.args(["--recompute", "none"])
        .args(["--train", "projector,lm", "--lm-lr", "1e-3"])
        .args(["--steps", "2", "--checkpoint-every", "1"])
        .args(["--nproc", &nproc.to_string()])
        .args(["--expert-parallel", &ep.to_string()]);
    if let Some(stage1) = stage1 {
        cmd.arg("--init-projector").arg(stage1);
    }
    cmd
}

fn relative_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

/// A new run folder `to` holding `from`'s files and its step-1 checkpoint, to `--resume`.
fn copy_for_resume(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to.join("checkpoints"))?;
    for entry in std::fs::read_dir(from)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().context("a file name")?))?;
        }
    }
    run_ok(
        Command::new("cp")
            .arg("-al")
            .arg(from.join("checkpoints/step-00000001"))
            .arg(to.join("checkpoints")),
    )?;
    Ok(())
}

fn export(run: &Path, out: &Path) -> Result<tessera_fsdp::ParamMap> {
    run_ok(
        tessera()
            .args([
                "export", "--quiet", "--format", "llava-hf", "--dtype", "f32",
            ])
            .arg("--run")
            .arg(run)
            .arg("--out")
            .arg(out),
    )?;
    let mut tensors = tessera_fsdp::ParamMap::new();
    for entry in std::fs::read_dir(out)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            tensors.extend(tch::Tensor::read_safetensors(&path)?);
        }
    }
    Ok(tensors)
}

#[test]
fn expert_parallel_runs_match_and_resume_across_expert_parallel_sizes() -> Result<()> {
    let f = fixture_with(24, 0.0, Lm::Tiny("qwen3_moe"))?;
    let stage1 = f.root.join("stage1");
    run_ok(train(&f, 1, &stage1).args(["--steps", "1"]))?;

    let plain = f.root.join("ep1_w2");
    run_ok(&mut stage2(&f, Some(&stage1), &plain, 2, 1))?;
    let parallel = f.root.join("ep2_w2");
    run_ok(&mut stage2(&f, Some(&stage1), &parallel, 2, 2))?;
    let single = f.root.join("ep1_w1");
    run_ok(&mut stage2(&f, Some(&stage1), &single, 1, 1))?;
    let (a, b, c) = (losses(&plain)?, losses(&parallel)?, losses(&single)?);
    ensure!(
        a.len() == 2 && b.len() == 2 && c.len() == 2,
        "{a:?} {b:?} {c:?}"
    );
    // (The W=1 run's global batch is half W=2's, a token budget being per rank: it is the
    // reference of its own resume only.)
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        ensure!(
            relative_diff(*x, *y) <= 1e-5,
            "step {step}: EP=2 loss {y} vs {x} without expert parallelism"
        );
    }
    let metrics = std::fs::read_to_string(parallel.join("metrics.jsonl"))?;
    ensure!(
        metrics.contains("moe_all_to_all"),
        "the EP run's unit times book the all-to-all"
    );

    // EP=2 × W=2 -> EP=1 × W=1, and EP=1 × W=1 -> EP=2 × W=2: the same second step.
    for (from, nproc, ep, want) in [(&parallel, 1, 1, b[1].1), (&single, 2, 2, c[1].1)] {
        let name = format!("resumed_w{nproc}_ep{ep}");
        let resumed = f.root.join(&name);
        copy_for_resume(from, &resumed)?;
        run_ok(stage2(&f, Some(&stage1), &resumed, nproc, ep).arg("--resume"))?;
        let got = losses(&resumed)?.get(1).context("a second step")?.1;
        ensure!(
            relative_diff(want, got) < 1e-4,
            "{name}: step 2 loss {got} vs {want} uninterrupted"
        );
    }

    // Every expert of every layer, from both ranks' files, equal to the run without EP.
    let want = export(&plain, &f.root.join("export_ep1"))?;
    let got = export(&parallel, &f.root.join("export_ep2"))?;
    let experts = want.keys().filter(|k| k.contains(".mlp.experts.")).count();
    ensure!(
        experts == 2 * 8 * 3,
        "{experts} expert tensors in the export"
    );
    ensure!(
        got.len() == want.len(),
        "{} vs {} tensors",
        got.len(),
        want.len()
    );
    for (name, w) in &want {
        let g = got.get(name).with_context(|| format!("{name} missing"))?;
        let diff = (g - w).abs().max().double_value(&[]);
        let scale = w.abs().max().double_value(&[]).max(1e-3);
        ensure!(
            diff <= 1e-4 * scale,
            "{name} differs by {diff} (scale {scale})"
        );
    }
    Ok(())
}

#[test]
fn an_expert_parallel_size_that_does_not_divide_is_refused() -> Result<()> {
    let f = fixture_with(8, 0.0, Lm::Tiny("qwen3_moe"))?;
    // 3 ranks cannot hold 8 experts evenly, nor can 2 experts groups fit 3 ranks.
    let err = run_err(&mut stage2(&f, None, &f.root.join("w3"), 3, 3))?;
    ensure!(err.contains("8 experts do not split evenly"), "{err}");
    let err = run_err(&mut stage2(&f, None, &f.root.join("w3ep2"), 3, 2))?;
    ensure!(err.contains("2 does not divide the 3 ranks"), "{err}");
    Ok(())
}
