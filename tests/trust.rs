//! `tessera train` trusts nothing on disk: a shard corrupted after ingest stops training naming
//! shard, row and sample; a run folder belongs to one run (a used one is refused, a resume
//! names every changed setting); checkpoints hold only trainable state and only the last few
//! stay; a broken model directory is reported once, before any rank starts.
#![cfg(feature = "train")]
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

use crate::support;
use support::{fixture, run_err, run_ok, tessera, train_command, Fixture, TrainArgs};

/// `tessera train --stage 1` on the fixture with small, fast settings.
fn train(f: &Fixture, lm: &Path, out: &Path, extra: &[&str]) -> Command {
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm,
        stage: 1,
        token_budget: 512,
    };
    train_command(tessera(), f, args, out, extra)
}

fn names_in(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| dir.display().to_string())?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    Ok(names)
}

fn bytes_under(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        total += if path.is_dir() {
            bytes_under(&path)?
        } else {
            path.metadata()?.len()
        };
    }
    Ok(total)
}

#[test]
fn a_flipped_image_bit_in_a_shard_stops_training_naming_shard_row_and_sample() -> Result<()> {
    let f = fixture(24, 0.0)?;
    let (shard, row, id, image) = {
        let dataset = tessera_shards::Dataset::open(&f.shards)?;
        let sample = dataset.read(&[13])?.remove(0);
        let (shard, row) = dataset.location(13).context("sample 13's place")?;
        (
            shard.to_string(),
            row,
            sample.id,
            sample.images.into_iter().next().context("an image")?.bytes,
        )
    };
    // One bit in the middle of the stored JPEG: it still decodes, only the checksum can tell.
    let path = f.shards.join(&shard);
    let mut bytes = std::fs::read(&path)?;
    let start = bytes
        .windows(image.len())
        .position(|w| w == image.as_slice())
        .context("the image's bytes in its shard")?;
    bytes[start + image.len() / 2] ^= 0x01;
    std::fs::write(&path, bytes)?;

    let msg = run_err(&mut train(&f, &f.lm, &f.root.join("fail"), &[]))?;
    let want = format!("{shard} row {row} (sample {id}): image fails its crc32c");
    assert!(msg.contains(&want), "wanted `{want}` in: {msg}");

    let out = run_ok(&mut train(
        &f,
        &f.lm,
        &f.root.join("skip"),
        &["--on-bad-image", "skip"],
    ))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&want) && stderr.contains("dropped from its micro-batch"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn a_used_run_folder_is_refused_and_a_resume_names_what_changed() -> Result<()> {
    let f = fixture(24, 0.0)?;
    let run = f.root.join("run");
    run_ok(&mut train(
        &f,
        &f.lm,
        &run,
        &["--steps", "2", "--checkpoint-every", "1"],
    ))?;

    let msg = run_err(&mut train(&f, &f.lm, &run, &["--steps", "2"]))?;
    assert!(
        msg.contains("is not empty") && msg.contains("--resume") && msg.contains("--overwrite"),
        "{msg}"
    );
    let resume = [
        "--steps",
        "2",
        "--resume",
        "--lr",
        "0.002",
        "--warmup-ratio",
        "0.1",
    ];
    let msg = run_err(&mut train(&f, &f.lm, &run, &resume))?;
    assert!(
        msg.contains("lr: 0.001 -> 0.002, warmup_ratio: 0.03 -> 0.1")
            && msg.contains("--resume-changing lr,warmup_ratio"),
        "{msg}"
    );
    run_ok(train(&f, &f.lm, &run, &resume).args(["--resume-changing", "lr,warmup_ratio"]))?;

    run_ok(&mut train(
        &f,
        &f.lm,
        &run,
        &["--steps", "1", "--overwrite"],
    ))?;
    assert_eq!(names_in(&run.join("checkpoints"))?, ["step-00000001"]);
    let lines = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    assert_eq!(
        lines.lines().count(),
        1,
        "the old run's history went: {lines}"
    );
    Ok(())
}

#[test]
fn checkpoints_hold_only_trainable_state_and_only_the_last_three_stay() -> Result<()> {
    let f = fixture(24, 0.0)?;
    let run = f.root.join("run");
    run_ok(&mut train(
        &f,
        &f.lm,
        &run,
        &["--steps", "8", "--checkpoint-every", "1"],
    ))?;
    let root = run.join("checkpoints");
    assert_eq!(
        names_in(&root)?,
        ["step-00000006", "step-00000007", "step-00000008"]
    );
    let frozen_lm = bytes_under(&f.lm)?;
    for name in names_in(&root)? {
        let dir = root.join(&name);
        let size = bytes_under(&dir)?;
        assert!(
            size * 20 < frozen_lm,
            "{name} holds {size} bytes; the frozen LM alone is {frozen_lm}"
        );
        // Format 4: each rank's shards of the trainable buffers and their AdamW moments
        // (one rank here), plus the layout naming the parameters in them.
        let file = "shards.safetensors";
        let state = tessera_model::load_safetensors(&dir.join("rank-00000").join(file))?;
        assert!(!state.is_empty(), "{name}/{file} is empty");
        let frozen: Vec<&String> = state
            .keys()
            .filter(|k| {
                // Stage 1 trains the projector alone: its buffer `projector.trainable`.
                !k.starts_with("projector.trainable.") && k.as_str() != "optimizer.step"
            })
            .collect();
        assert!(
            frozen.is_empty(),
            "{name}/{file} stores frozen tensors: {frozen:?}"
        );
    }
    Ok(())
}

#[test]
fn a_broken_or_unsupported_lm_config_is_reported_once_before_any_rank_starts() -> Result<()> {
    let f = fixture(4, 0.0)?;
    let lm = f.root.join("broken_lm");
    std::fs::create_dir_all(&lm)?;
    std::fs::copy(f.lm.join("model.safetensors"), lm.join("model.safetensors"))?;
    std::fs::write(lm.join("config.json"), b"{\"hidden_size\": \"wide\"")?;
    let run = f.root.join("run");
    let msg = run_err(&mut train(&f, &lm, &run, &["--nproc", "2", "--steps", "1"]))?;
    assert_eq!(msg.matches("config.json").count(), 1, "{msg}");
    assert!(!run.exists(), "nothing was started");

    // A language model of a family tessera does not train: refused once, before any rank
    // starts, naming the folder, its model_type and the families that are supported.
    let config = std::fs::read_to_string(f.lm.join("config.json"))?;
    let mistral = config.replace("\"qwen2\"", "\"mistral\"");
    assert_ne!(mistral, config, "the tiny LM's config names qwen2");
    std::fs::write(lm.join("config.json"), mistral)?;
    let msg = run_err(&mut train(&f, &lm, &run, &["--nproc", "2", "--steps", "1"]))?;
    let folder = lm.display().to_string();
    assert_eq!(msg.matches(&folder).count(), 1, "{msg}");
    for part in ["model_type \"mistral\"", "qwen2", "qwen3", "llama"] {
        assert!(msg.contains(part), "`{part}` is not in: {msg}");
    }
    assert!(!run.exists(), "nothing was started");
    Ok(())
}
