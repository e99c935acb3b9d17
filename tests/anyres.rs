//! `--image-layout anyres_max_N` end to end through the binary (tiny model, synth photos of
//! many sizes, tile 64 px, patch 8 px):
//! - every step trains exactly the tokens the planner counted from the stored image sizes
//!   (each sample's text plus its image's base view, unpadded grid and row newlines), so the
//!   loader's views and the model's packing agree with the plan;
//! - stage 1 trains `image_newline` beside the projector (it is in the checkpoint and moves);
//! - a W=2 run checkpointed at step 3 resumes at W=1 on the same samples and ends at the same
//!   loss (1e-3 relative: the reductions run in another order);
//! - resuming without the layout is refused.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use shards::image_layout::{ImageLayout, Tower};
use std::path::Path;
use std::process::Command;

mod support;
use support::metrics::read_metrics;
use support::{fixture, run_err, run_ok, tessera, Fixture};

const LAYOUT: &str = "anyres_max_4";
/// init-model's tiny tower.
const TOWER: Tower = Tower { tile: 64, patch: 8 };

fn stage1(f: &Fixture, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = tessera();
    cmd.args(["train", "--quiet", "--shards"])
        .arg(&f.shards)
        .arg("--vision")
        .arg(&f.vision)
        .arg("--lm")
        .arg(&f.lm)
        .args([
            "--stage",
            "1",
            "--token-budget",
            "2048",
            "--seq-len",
            "1024",
        ])
        .args(["--seed", "5", "--steps", "6", "--checkpoint-every", "3"])
        .arg("--out")
        .arg(out)
        .args(extra);
    cmd
}

/// `plan.jsonl`: the samples of every step (all ranks), by step.
fn planned(run: &Path) -> Result<Vec<Vec<u64>>> {
    let text = std::fs::read_to_string(run.join("plan.jsonl"))?;
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            v["samples"]
                .as_array()
                .context("samples")?
                .iter()
                .map(|s| s.as_u64().context("sample index"))
                .collect()
        })
        .collect()
}

/// The trained `image_newline` of the run's newest complete checkpoint.
fn newline(run: &Path) -> Result<Vec<f32>> {
    let (_, trained) = tessera_train::newest_complete_trained(run)?;
    let mut tensors = trained.collect(|k| k == tessera_model::IMAGE_NEWLINE)?;
    let t = tensors
        .remove(tessera_model::IMAGE_NEWLINE)
        .context("the checkpoint holds no image_newline")?;
    Ok(Vec::<f32>::try_from(
        t.to_kind(tch::Kind::Float).flatten(0, -1),
    )?)
}

#[test]
fn anyres_runs_train_the_planned_tokens_and_image_newline_and_resume_at_another_world_size(
) -> Result<()> {
    let f = fixture(48, 0.0)?;
    let layout_flag = ["--image-layout", LAYOUT];
    let straight = f.root.join("straight");
    run_ok(stage1(&f, &straight, &layout_flag).args(["--nproc", "2"]))?;

    // Each step's real tokens are the sum of its samples' lengths under the layout.
    let dataset = shards::Dataset::open(&f.shards)?;
    let metas = dataset.metadata()?;
    let layout: ImageLayout = LAYOUT.parse().map_err(anyhow::Error::msg)?;
    let images = shards::sample_images(&dataset, &layout, TOWER)?;
    let length = |i: u64| {
        let (m, im) = (&metas[i as usize], &images[i as usize]);
        u64::from(m.num_text_tokens) - u64::from(m.num_images) + im.tokens
    };
    ensure!(
        images.iter().all(|im| im.tiles > 1 && im.tokens > 64),
        "every synth image is a grid of tiles under {LAYOUT}: {images:?}"
    );
    let plan = planned(&straight)?;
    let metrics = read_metrics(&straight.join("metrics.jsonl"))?;
    ensure!(plan.len() == 6 && metrics.len() == 6, "6 steps");
    for (step, (samples, m)) in plan.iter().zip(&metrics).enumerate() {
        let want: u64 = samples.iter().map(|&i| length(i)).sum();
        ensure!(
            m.real_tokens == want,
            "step {step}: trained {} real tokens, the plan counts {want} for samples {samples:?}",
            m.real_tokens
        );
    }

    // image_newline is a trained parameter of stage 1: checkpointed, and moving.
    let half = f.root.join("half");
    run_ok(Command::new("cp").arg("-r").arg(&straight).arg(&half))?;
    let at_6 = newline(&straight)?;
    std::fs::remove_dir_all(half.join("checkpoints/step-00000006"))?;
    let at_3 = newline(&half)?;
    ensure!(
        at_3.len() == 128,
        "image_newline is [lm hidden]: {}",
        at_3.len()
    );
    let moved = at_3
        .iter()
        .zip(&at_6)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    ensure!(
        moved > 1e-5,
        "image_newline did not train between steps 3 and 6"
    );

    // Without the layout, the checkpoint is refused; at W=1 it resumes exactly.
    let refused = f.root.join("refused");
    run_ok(Command::new("cp").arg("-r").arg(&half).arg(&refused))?;
    let log = run_err(&mut stage1(&f, &refused, &["--resume"]))?;
    ensure!(log.contains("belongs to another model"), "{log}");
    run_ok(stage1(&f, &half, &layout_flag).args(["--nproc", "1", "--resume"]))?;
    assert_eq!(
        planned(&half)?,
        plan,
        "the resumed run trained other samples"
    );
    let (want, got) = (
        metrics.last().context("metrics")?.loss,
        read_metrics(&half.join("metrics.jsonl"))?
            .last()
            .context("metrics")?
            .loss,
    );
    ensure!(
        (want - got).abs() / want.abs() < 1e-3,
        "resumed at W=1: loss {got} at step 6 vs {want} uninterrupted"
    );
    Ok(())
}
