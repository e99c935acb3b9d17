//! `--standardize-features N` through the binary (tiny model, synth photos):
//! - stage 1 measures the tower's per-channel feature mean and standard deviation over N
//!   images and records them in `vlm.json`; training with them differs from training without;
//! - a run resumed from its step-2 checkpoint keeps them and ends with the same loss;
//! - a stage 2 started from the stage-1 run's projector takes that run's statistics;
//! - a projector file (already in raw-feature coordinates) with the flag is refused;
//! - the exports fold them into the projector's first layer: `generate --run` and `generate
//!   --model` on the llava-hf export caption held-out samples alike, and the tessera export's
//!   projector file is LLaVA's plain four tensors.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;

use crate::support;
use support::metrics::losses;
use support::{
    caption_shards, fixture, read_json, run_err, run_ok, tessera, train_command, Fixture, TrainArgs,
};

const IMAGES: usize = 6;

fn stage1(f: &Fixture, out: &Path, extra: &[&str]) -> std::process::Command {
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm: &f.lm,
        stage: 1,
        token_budget: 512,
    };
    let mut cmd = train_command(tessera(), f, args, out, extra);
    cmd.args(["--lr", "1e-2", "--checkpoint-every", "2"]);
    cmd
}

/// The statistics a run's `vlm.json` records: (mean, std, images).
fn recorded(run: &Path) -> Result<(Vec<f64>, Vec<f64>, u64)> {
    let vlm = read_json(&run.join("vlm.json"))?;
    let stats = &vlm["feature_stats"];
    let floats = |k: &str| -> Result<Vec<f64>> {
        stats[k]
            .as_array()
            .with_context(|| format!("vlm.json has no feature_stats.{k}"))?
            .iter()
            .map(|v| v.as_f64().context("a number"))
            .collect()
    };
    let images = stats["images"].as_u64().context("feature_stats.images")?;
    Ok((floats("mean")?, floats("std")?, images))
}

fn close(a: &[(u64, f64)], b: &[(u64, f64)], rel: f64) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((s, x), (t, y))| s == t && (x - y).abs() <= rel * x.abs().max(1e-6))
}

#[test]
fn standardised_features_are_measured_recorded_resumed_inherited_and_folded_on_export() -> Result<()>
{
    let f = fixture(40, 0.0)?;
    let n = IMAGES.to_string();
    let hidden = read_json(&f.vision.join("config.json"))?["hidden_size"]
        .as_u64()
        .context("the tower's hidden_size")? as usize;

    let a = f.root.join("a");
    run_ok(&mut stage1(
        &f,
        &a,
        &["--steps", "4", "--standardize-features", &n],
    ))?;
    let (mean, std, images) = recorded(&a)?;
    ensure!(
        mean.len() == hidden && std.len() == hidden,
        "{} means and {} deviations for a tower of {hidden} channels",
        mean.len(),
        std.len()
    );
    ensure!(images == IMAGES as u64, "measured over {images} images");
    ensure!(
        std.iter().all(|s| s.is_finite() && *s > 0.0) && mean.iter().any(|m| m.abs() > 1e-6),
        "statistics of real features: mean {mean:?} std {std:?}"
    );

    let plain = f.root.join("plain");
    run_ok(&mut stage1(&f, &plain, &["--steps", "4"]))?;
    ensure!(
        read_json(&plain.join("vlm.json"))?
            .get("feature_stats")
            .is_none(),
        "a run without the flag records no statistics"
    );
    let (with, without) = (losses(&a)?, losses(&plain)?);
    ensure!(
        !close(&with, &without, 1e-6),
        "standardising changes training: {with:?} against {without:?}"
    );

    // Its last checkpoint lost, the run resumes from step 2: the same statistics and losses.
    let b = f.root.join("b");
    run_ok(std::process::Command::new("cp").arg("-r").arg(&a).arg(&b))?;
    std::fs::remove_dir_all(b.join("checkpoints/step-00000004"))?;
    run_ok(&mut stage1(
        &f,
        &b,
        &["--steps", "4", "--standardize-features", &n, "--resume"],
    ))?;
    ensure!(
        recorded(&b)? == recorded(&a)?,
        "the resumed run keeps its statistics"
    );
    let resumed = losses(&b)?;
    let (last, want) = (resumed.last(), with.last());
    ensure!(
        matches!((last, want), (Some((s, x)), Some((t, y))) if s == t && (x - y).abs() <= 1e-5 * y.abs()),
        "resumed losses {resumed:?} against uninterrupted {with:?}"
    );

    // Stage 2 from the stage-1 run takes its statistics (the flag may be left out).
    let s2 = f.root.join("s2");
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm: &f.lm,
        stage: 2,
        token_budget: 512,
    };
    run_ok(
        train_command(tessera(), &f, args, &s2, &["--steps", "2"])
            .args(["--train", "projector,lm", "--init-projector"])
            .arg(&a),
    )?;
    ensure!(
        recorded(&s2)? == recorded(&a)?,
        "stage 2 standardises with the statistics its projector was trained on"
    );

    // A projector file holds no statistics: asking to standardise for it is refused.
    let export = f.root.join("export");
    run_ok(
        tessera()
            .args(["export", "--quiet", "--run"])
            .arg(&a)
            .arg("--out")
            .arg(&export),
    )?;
    let projector_file = export.join("mm_projector.safetensors");
    let tensors = tessera_model::load_safetensors(&projector_file)?;
    let mut names: Vec<&str> = tensors.keys().map(String::as_str).collect();
    names.sort();
    ensure!(
        names
            == [
                "mm_projector.0.bias",
                "mm_projector.0.weight",
                "mm_projector.2.bias",
                "mm_projector.2.weight"
            ],
        "the exported projector is LLaVA's plain mlp2x_gelu: {names:?}"
    );
    let file = projector_file.to_str().context("a UTF-8 temporary path")?;
    let err = run_err(&mut stage1(
        &f,
        &f.root.join("refused"),
        &[
            "--steps",
            "1",
            "--standardize-features",
            &n,
            "--init-projector",
            file,
        ],
    ))?;
    ensure!(
        err.contains("mm_projector.safetensors") && err.contains("--standardize-features"),
        "the refusal names the file and the flag: {err}"
    );

    // The llava-hf export (statistics folded) captions as the run does.
    let hf = f.root.join("hf");
    run_ok(
        tessera()
            .args([
                "export", "--quiet", "--format", "llava-hf", "--dtype", "f32", "--run",
            ])
            .arg(&a)
            .arg("--out")
            .arg(&hf),
    )?;
    let flags = ["--limit", "3", "--max-new-tokens", "6", "--dtype", "f32"];
    let caption = |source: &str, dir: &Path, out: &Path| {
        caption_shards(tessera(), source, dir, &f.shards, &flags, out)
    };
    let from_run = caption("--run", &a, &f.root.join("run.jsonl"))?;
    let from_export = caption("--model", &hf, &f.root.join("hf.jsonl"))?;
    ensure!(
        from_run == from_export,
        "the export captions as the run:\n{from_run:?}\nagainst\n{from_export:?}"
    );
    Ok(())
}
