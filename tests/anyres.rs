//! `--image-layout anyres_max_N` end to end through the binary (tiny model, synth photos of
//! many sizes, tile 64 px, patch 8 px):
//! - every step trains exactly the tokens the planner counted from the stored image sizes
//!   (each sample's text plus its image's base view, unpadded grid and row newlines), so the
//!   loader's views and the model's packing agree with the plan;
//! - stage 1 trains `image_newline` beside the projector (it is in the checkpoint and moves);
//! - a W=2 run checkpointed at step 3 resumes at W=1 on the same samples and ends at the same
//!   loss (1e-3 relative: the reductions run in another order);
//! - resuming without the layout is refused;
//! - `export --format llava-onevision` writes what transformers'
//!   `LlavaOnevisionForConditionalGeneration` loads with no missing or unexpected keys, and
//!   through its own `AutoProcessor` (a `LlavaOnevisionProcessor`) a wide, a tall and a square
//!   photo and a two-image prompt become the prompt ids `tessera generate` makes, the logits
//!   after it equal tessera's (1e-4 of their scale, f32) and the greedy tokens are tessera's
//!   (`tests/oracles/onevision_greedy.py`).
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::process::Command;
use tessera_shards::image_layout::{ImageLayout, Tower};

use crate::support;
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
    let dataset = tessera_shards::Dataset::open(&f.shards)?;
    let metas = dataset.metadata()?;
    let layout: ImageLayout = LAYOUT.parse().map_err(anyhow::Error::msg)?;
    let images = tessera_shards::sample_images(&dataset, &layout, TOWER)?;
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

/// The crops (x, y, width, height) of a real photo the round trip prompts with, and the cases:
/// each alone, then two in one prompt.
const CROPS: [(u32, u32, u32, u32); 3] =
    [(0, 0, 300, 120), (500, 100, 100, 260), (800, 800, 200, 180)];
const PHOTO: &str = "/usr/share/backgrounds/mate/nature/Garden.jpg";

#[test]
fn the_llava_onevision_export_prompts_and_generates_as_tessera_does() -> Result<()> {
    let f = fixture(24, 0.0)?;
    let run = f.root.join("run");
    run_ok(&mut stage1(
        &f,
        &run,
        &["--image-layout", LAYOUT, "--lr", "1e-2"],
    ))?;
    let export = f.root.join("onevision");
    let llava_hf = run_err(
        tessera()
            .args(["export", "--format", "llava-hf", "--run"])
            .arg(&run)
            .arg("--out")
            .arg(f.root.join("refused")),
    )?;
    ensure!(llava_hf.contains("--format llava-onevision"), "{llava_hf}");
    run_ok(
        tessera()
            .args([
                "export",
                "--format",
                "llava-onevision",
                "--dtype",
                "f32",
                "--run",
            ])
            .arg(&run)
            .arg("--out")
            .arg(&export),
    )?;

    let photo = image::open(PHOTO)
        .with_context(|| format!("{PHOTO} (scripts/setup/setup.sh installs mate-backgrounds)"))?;
    let mut paths = Vec::new();
    for (i, &(x, y, w, h)) in CROPS.iter().enumerate() {
        let path = f.root.join(format!("crop{i}.png"));
        photo.crop_imm(x, y, w, h).to_rgb8().save(&path)?;
        paths.push(path);
    }
    let cases: Vec<Vec<usize>> = vec![vec![0], vec![1], vec![2], vec![0, 1]];

    // tessera's side: the run as `tessera generate --run` loads it, in f32.
    let model = tessera_train::load_run_model(&run, Some(tessera_model::Dtype::F32))?;
    let captioner = model.into_captioner(&run.join("tokenizer.json"))?;
    let options = tessera_model::GenerateOptions {
        max_new_tokens: 6,
        ..Default::default()
    };
    let (mut views, mut ours) = (std::collections::BTreeMap::new(), Vec::new());
    for (k, case) in cases.iter().enumerate() {
        let images = case
            .iter()
            .map(|&i| std::fs::read(&paths[i]))
            .collect::<std::io::Result<Vec<_>>>()?;
        let prompt = captioner.prompt_ids(None, images.len())?;
        let sample = tessera_train::image_sample(format!("case{k}"), images, prompt);
        let mb = captioner.batches(vec![sample])?.remove(0);
        let generator = &captioner.generator;
        let (ids, geometry) = (&mb.input_ids, &mb.image_geometry);
        let tokens = generator
            .generate_images(ids, &mb.pixels, geometry, &options)?
            .tokens;
        let logits = generator.prompt_logits_images(ids, &mb.pixels, geometry)?;
        let last = logits.get(logits.size()[0] - 1);
        let side = mb.image_size as i64;
        let pixels = tch::Tensor::from_slice(&mb.pixels).view([-1, 3, side, side]);
        views.insert(format!("views.{k}"), pixels);
        ours.push((ids.clone(), tokens, last));
    }
    let views_file = f.root.join("views.safetensors");
    tessera_model::save_safetensors(&views_file, &views)?;
    let cases_file = f.root.join("cases.json");
    let case_paths: Vec<Vec<&Path>> = cases
        .iter()
        .map(|c| c.iter().map(|&i| paths[i].as_path()).collect())
        .collect();
    std::fs::write(&cases_file, serde_json::to_vec(&case_paths)?)?;

    // transformers' side.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let logits_file = f.root.join("logits.safetensors");
    let out = run_ok(
        Command::new(root.join(".deps/hfvenv/bin/python"))
            .arg(root.join("tests/oracles/onevision_greedy.py"))
            .arg(&export)
            .arg(&cases_file)
            .arg(&views_file)
            .arg(options.max_new_tokens.to_string())
            .arg(&logits_file),
    )?;
    let theirs_logits = tessera_model::load_safetensors(&logits_file)?;
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(lines.len() == cases.len(), "one line per case: {lines:?}");
    for (k, (line, (ids, tokens, logits))) in lines.iter().zip(&ours).enumerate() {
        let prompt: Vec<i64> = serde_json::from_value(line["prompt_ids"].clone())?;
        ensure!(
            &prompt == ids,
            "case {k}: the processor's prompt has {} ids, tessera's {}",
            prompt.len(),
            ids.len()
        );
        let theirs = theirs_logits
            .get(&format!("logits.{k}"))
            .context("the oracle's logits")?;
        let scale = logits.abs().max().double_value(&[]);
        let diff = (logits - theirs).abs().max().double_value(&[]);
        ensure!(
            diff <= 1e-4 * scale,
            "case {k}: logits differ by {diff} (scale {scale})"
        );
        let with_ours: Vec<i64> = serde_json::from_value(line["tokens_ours"].clone())?;
        let with_theirs: Vec<i64> = serde_json::from_value(line["tokens"].clone())?;
        assert_eq!(
            &with_ours, tokens,
            "case {k}: greedy tokens from tessera's views"
        );
        assert_eq!(
            &with_theirs, tokens,
            "case {k}: greedy tokens from the processor's views"
        );
        let level = line["level_diff"].as_f64().context("level_diff")?;
        ensure!(
            level < 1.0,
            "case {k}: the processor's views differ by {level} levels"
        );
        eprintln!(
            "case {k}: {} prompt ids, logits within {diff:.2e} (scale {scale:.2}), views {level:.3} \
             levels apart, tokens {tokens:?}",
            ids.len()
        );
    }
    Ok(())
}
