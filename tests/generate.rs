//! `tessera export --format llava-hf` and `tessera generate` end to end, through the binary:
//! a stage-2 (LoRA) run on the tiny preset, exported merged and unmerged; captions for two
//! shard samples from the run and from both exports are the same, and samples.jsonl holds
//! the id, the reference caption and the generated one; an image that does not decode stops
//! `generate --image` with an error naming the file (no caption of a stand-in).
#![cfg(feature = "train")]
use anyhow::{ensure, Result};
use std::path::Path;

mod support;
use support::{fixture, run_err, run_ok, tessera, tokenizer};

/// `generate --shards` into `out`; returns the (id, reference, generated) lines.
fn caption(
    source: &[&str],
    source_dir: &Path,
    shards: &Path,
    out: &Path,
) -> Result<Vec<[String; 3]>> {
    run_ok(
        tessera()
            .arg("generate")
            .args(source)
            .arg(source_dir)
            .arg("--shards")
            .arg(shards)
            .args(["--limit", "2", "--max-new-tokens", "6", "--tokenizer"])
            .arg(tokenizer())
            .arg("--out")
            .arg(out),
    )?;
    let text = std::fs::read_to_string(out)?;
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            let field = |k: &str| v[k].as_str().map(str::to_string);
            match (field("id"), field("reference"), field("generated")) {
                (Some(a), Some(b), Some(c)) => Ok([a, b, c]),
                _ => anyhow::bail!(
                    "{}: line without id/reference/generated: {line}",
                    out.display()
                ),
            }
        })
        .collect()
}

/// `tessera train --stage 2` on the fixture (budget 512, rows of 256) into `run`, with `extra`.
fn stage2(f: &support::Fixture, run: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = tessera();
    cmd.args(["train", "--quiet", "--shards"])
        .arg(&f.shards)
        .arg("--vision")
        .arg(&f.vision)
        .arg("--lm")
        .arg(&f.lm)
        .args(["--stage", "2", "--token-budget", "512", "--seq-len", "256"])
        .args(extra)
        .arg("--out")
        .arg(run);
    cmd
}

#[test]
fn run_and_llava_hf_exports_caption_alike_and_a_bad_image_is_named() -> Result<()> {
    let f = fixture(24, 0.0)?;
    let run = f.root.join("stage2");
    run_ok(&mut stage2(
        &f,
        &run,
        &["--steps", "2", "--lora-r", "4", "--lora-alpha", "8"],
    ))?;
    let from_run = caption(&["--run"], &run, &f.shards, &f.root.join("run.jsonl"))?;
    ensure!(from_run.len() == 2, "two samples captioned: {from_run:?}");
    ensure!(
        from_run
            .iter()
            .all(|[id, reference, _]| !id.is_empty() && !reference.is_empty()),
        "ids and reference captions are filled: {from_run:?}"
    );
    let bad = f.root.join("not_a_photo.jpg");
    std::fs::write(&bad, b"\xff\xd8\xff\xe0 truncated JPEG")?;
    let err = run_err(
        tessera()
            .args(["generate", "--run"])
            .arg(&run)
            .arg("--image")
            .arg(&bad)
            .arg("--tokenizer")
            .arg(tokenizer()),
    )?;
    ensure!(
        err.contains("not_a_photo.jpg"),
        "generate's error names the undecodable image: {err}"
    );

    for (name, extra) in [("merged", None), ("unmerged", Some("--no-merge"))] {
        let export = f.root.join(name);
        run_ok(
            tessera()
                .args([
                    "export", "--quiet", "--format", "llava-hf", "--dtype", "f32", "--run",
                ])
                .arg(&run)
                .arg("--out")
                .arg(&export)
                .arg("--tokenizer")
                .arg(tokenizer())
                .args(extra),
        )?;
        for file in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "processor_config.json",
        ] {
            ensure!(export.join(file).is_file(), "{name} export lacks {file}");
        }
        ensure!(
            export.join("adapter/adapter_model.safetensors").is_file() == extra.is_some(),
            "{name} export: adapter/ only when unmerged"
        );
        let from_export = caption(
            &["--model"],
            &export,
            &f.shards,
            &f.root.join(format!("{name}.jsonl")),
        )?;
        assert_eq!(from_export, from_run, "{name} export captions like the run");
    }
    Ok(())
}

/// A full fine-tune (stage 2 training projector, the whole LM and the last vision layer, at
/// W=2, checkpointed in shards): its llava-hf export captions like the run, and the plain
/// export writes the trained LM and tower as Hugging Face directories holding the trained
/// values. (transformers itself loads a full fine-tune's export and generates the same greedy
/// tokens in `trainer/train/tests/fsdp_vlm/llava.rs`.)
#[test]
fn a_full_finetune_exports_whole_models_that_caption_like_the_run() -> Result<()> {
    let f = fixture(24, 0.0)?;
    let run = f.root.join("full");
    let full = [
        "--train",
        "projector,lm,vision:1",
        "--nproc",
        "2",
        "--steps",
        "3",
        "--lm-lr",
        "1e-2",
        "--vision-lr",
        "1e-2",
    ];
    run_ok(&mut stage2(&f, &run, &full))?;
    let (_, trained) = tessera_train::latest_trainable(&run)?;
    let norm = trained
        .get("model.norm.weight")?
        .ok_or_else(|| anyhow::anyhow!("the checkpoint did not train model.norm.weight"))?;
    let base =
        tessera_model::HfCheckpoint::open(&f.lm)?.tensor("model.norm.weight", &norm.size())?;
    ensure!(
        (&norm - &base).abs().max().double_value(&[]) > 1e-4,
        "three steps at lr 1e-2 left the LM's final norm as it was"
    );

    let export = f.root.join("export");
    run_ok(
        tessera()
            .args([
                "export", "--quiet", "--format", "llava-hf", "--dtype", "f32", "--run",
            ])
            .arg(&run)
            .arg("--out")
            .arg(&export)
            .arg("--tokenizer")
            .arg(tokenizer()),
    )?;
    let from_run = caption(&["--run"], &run, &f.shards, &f.root.join("run.jsonl"))?;
    let from_export = caption(
        &["--model"],
        &export,
        &f.shards,
        &f.root.join("export.jsonl"),
    )?;
    assert_eq!(
        from_export, from_run,
        "the full fine-tune's export captions like the run"
    );

    let plain = f.root.join("plain");
    run_ok(
        tessera()
            .args(["export", "--quiet", "--dtype", "f32", "--run"])
            .arg(&run)
            .arg("--out")
            .arg(&plain),
    )?;
    for file in [
        "lm/config.json",
        "lm/model.safetensors",
        "vision/model.safetensors",
    ] {
        ensure!(plain.join(file).is_file(), "the plain export lacks {file}");
    }
    let exported = tessera_model::load_safetensors(&plain.join("lm/model.safetensors"))?;
    let diff = (&exported["model.norm.weight"] - &norm)
        .abs()
        .max()
        .double_value(&[]);
    ensure!(
        diff == 0.0,
        "the exported LM's final norm differs from the checkpoint's by {diff}"
    );
    Ok(())
}
