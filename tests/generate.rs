//! `tessera export --format llava-hf` and `tessera generate` end to end, through the binary:
//! a stage-2 (LoRA) run on the tiny preset, exported merged and unmerged; captions for two
//! shard samples from the run and from both exports are the same, and samples.jsonl holds
//! the id, the reference caption and the generated one; an image that does not decode stops
//! `generate --image` with an error naming the file (no caption of a stand-in). Export and
//! generate run outside the repository with no `--tokenizer`: the run keeps its shards'
//! tokenizer, and refuses another one naming both fingerprints. Export takes the newest
//! complete checkpoint, passing over (and naming) damaged or unfinished ones.
#![cfg(feature = "train")]
use anyhow::{ensure, Result};
use std::path::{Path, PathBuf};

use crate::support;
use support::{
    caption_shards, fixture, run_err, run_ok, tessera, tokenizer, train_command, TrainArgs,
};

/// `tessera` run from a folder that is not the repository (no `.deps/` under it), as a user
/// runs it from anywhere.
fn tessera_elsewhere() -> std::process::Command {
    let mut cmd = tessera();
    cmd.current_dir(std::env::temp_dir());
    cmd
}

/// `generate --shards` (two samples, six new tokens, from outside the repository) into `out`;
/// returns the (id, reference, generated) lines.
fn caption(source: &str, dir: &Path, shards: &Path, out: &Path) -> Result<Vec<[String; 3]>> {
    let flags = ["--limit", "2", "--max-new-tokens", "6"];
    caption_shards(tessera_elsewhere(), source, dir, shards, &flags, out)
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
    let from_run = caption("--run", &run, &f.shards, &f.root.join("run.jsonl"))?;
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
            tessera_elsewhere()
                .args([
                    "export", "--quiet", "--format", "llava-hf", "--dtype", "f32", "--run",
                ])
                .arg(&run)
                .arg("--out")
                .arg(&export)
                .args(extra),
        )?;
        ensure!(
            std::fs::read(export.join("tokenizer.json"))? == std::fs::read(tokenizer())?,
            "{name} export ships a tokenizer.json other than the one the shards were made with"
        );
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
            "--model",
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
    let (_, trained) = tessera_train::newest_complete_trained(&run)?;
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
        tessera_elsewhere()
            .args([
                "export", "--quiet", "--format", "llava-hf", "--dtype", "f32", "--run",
            ])
            .arg(&run)
            .arg("--out")
            .arg(&export),
    )?;
    let from_run = caption("--run", &run, &f.shards, &f.root.join("run.jsonl"))?;
    let from_export = caption("--model", &export, &f.shards, &f.root.join("export.jsonl"))?;
    assert_eq!(
        from_export, from_run,
        "the full fine-tune's export captions like the run"
    );

    let plain = f.root.join("plain");
    run_ok(export_f32(&run, &plain).arg("--quiet"))?;
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

/// The projector tensors of a safetensors file, by LLaVA key.
fn projector_of(path: &Path) -> Result<tessera_fsdp::ParamMap> {
    let tensors = tessera_model::load_safetensors(path)?;
    ensure!(
        tensors.len() == 4 && tensors.keys().all(|k| k.starts_with("mm_projector.")),
        "{}: not the four projector tensors: {:?}",
        path.display(),
        tensors.keys().collect::<Vec<_>>()
    );
    Ok(tensors)
}

/// A run that trains the LM alone (`--train lm`) keeps no projector in its checkpoints: the
/// plain export writes the one it started from (`--init-projector`'s file, or else the one its
/// seed drew, as every rank drew it) and says so; `generate --run` and the llava-hf export run
/// with that same projector (they caption alike). Once the `--init-projector` file is gone, the
/// export says why it cannot write a projector instead of writing an empty one.
#[test]
fn an_lm_only_run_exports_the_projector_it_started_from() -> Result<()> {
    let f = fixture(16, 0.0)?;
    let vlm = tessera_model::Vlm::from_dirs(&f.vision, &f.lm, Default::default())?;
    let start = f.root.join("start_projector.safetensors");
    tessera_model::save_safetensors(&start, &vlm.initial_projector(None, 7)?)?;
    let lm_only = ["--train", "lm", "--steps", "1", "--lm-lr", "1e-2"];

    let run = f.root.join("from_file");
    let mut train = stage2(&f, &run, &lm_only);
    run_ok(train.arg("--init-projector").arg(&start))?;
    let plain = f.root.join("plain");
    let out = run_ok(&mut export_f32(&run, &plain))?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        said.contains("not trained by this run") && said.contains("--init-projector"),
        "export says where the projector came from: {said}"
    );
    let exported = projector_of(&plain.join("mm_projector.safetensors"))?;
    for ((name, t), want) in exported.iter().zip(projector_of(&start)?.values()) {
        ensure!(t.equal(want), "{name}: not the --init-projector tensor");
    }
    let llava = f.root.join("llava");
    run_ok(
        tessera_elsewhere()
            .args([
                "export", "--quiet", "--format", "llava-hf", "--dtype", "f32",
            ])
            .arg("--run")
            .arg(&run)
            .arg("--out")
            .arg(&llava),
    )?;
    let from_run = caption("--run", &run, &f.shards, &f.root.join("run.jsonl"))?;
    let from_export = caption("--model", &llava, &f.shards, &f.root.join("llava.jsonl"))?;
    assert_eq!(from_export, from_run, "the export captions like the run");

    std::fs::remove_file(&start)?;
    let err = run_err(
        tessera()
            .args(["export", "--run"])
            .arg(&run)
            .arg("--out")
            .arg(f.root.join("gone")),
    )?;
    ensure!(
        err.contains("did not train the projector") && err.contains(&start.display().to_string()),
        "the export says why it has no projector to write: {err}"
    );

    let run = f.root.join("from_seed");
    run_ok(stage2(&f, &run, &lm_only).args(["--seed", "5"]))?;
    let plain = f.root.join("plain_seed");
    run_ok(export_f32(&run, &plain).arg("--quiet"))?;
    let drawn = vlm.initial_projector(None, 5)?;
    for (name, t) in projector_of(&plain.join("mm_projector.safetensors"))? {
        ensure!(
            t.equal(&drawn[&name]),
            "{name}: not the projector seed 5 draws"
        );
    }

    // A run that did not train the projector has none to hand on: --init-projector refuses it.
    let err = run_err(
        stage2(&f, &f.root.join("next"), &lm_only)
            .arg("--init-projector")
            .arg(&run),
    )?;
    ensure!(
        err.contains("did not train the projector") && err.contains("mm_projector.safetensors"),
        "--init-projector of an lm-only run says what to pass instead: {err}"
    );
    Ok(())
}

/// `tessera export --dtype f32 --run RUN --out OUT` (the plain format).
fn export_f32(run: &Path, out: &Path) -> std::process::Command {
    let mut cmd = tessera();
    cmd.args(["export", "--dtype", "f32", "--run"])
        .arg(run)
        .arg("--out")
        .arg(out);
    cmd
}

/// A tokenizer.json that is not the shards' (one more trailing newline: still valid JSON).
fn other_tokenizer(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("tokenizer.json");
    let mut bytes = std::fs::read(tokenizer())?;
    bytes.push(b'\n');
    std::fs::write(&path, bytes)?;
    Ok(path)
}

/// Overwrites every byte of `path` (its manifest's sha256 no longer matches).
fn damage(path: &Path) -> Result<()> {
    let len = std::fs::metadata(path)?.len() as usize;
    std::fs::write(path, vec![0x5a; len])?;
    Ok(())
}

#[test]
fn export_takes_the_newest_complete_checkpoint_and_the_run_keeps_its_tokenizer() -> Result<()> {
    let f = fixture(16, 0.0)?;
    let run = f.root.join("stage1");
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm: &f.lm,
        stage: 1,
        token_budget: 512,
    };
    let extra = ["--steps", "2", "--checkpoint-every", "1"];
    run_ok(&mut train_command(tessera(), &f, args, &run, &extra))?;
    ensure!(
        std::fs::read(run.join("tokenizer.json"))? == std::fs::read(tokenizer())?,
        "the run folder keeps no copy of its shards' tokenizer.json"
    );

    // Another tokenizer is refused, naming the file and both fingerprints.
    let other = other_tokenizer(&f.root.join("other"))?;
    let (want, _) = tessera_shards::sha256_file(&tokenizer())?;
    let (found, _) = tessera_shards::sha256_file(&other)?;
    let export = |out: &str| {
        let mut cmd = tessera_elsewhere();
        cmd.args(["export", "--run"])
            .arg(&run)
            .arg("--out")
            .arg(f.root.join(out));
        cmd
    };
    let err = run_err(
        export("refused")
            .args(["--format", "llava-hf", "--tokenizer"])
            .arg(&other),
    )?;
    ensure!(
        err.contains(&other.display().to_string()) && err.contains(&found) && err.contains(&want),
        "the refusal names the tokenizer file, its sha256 {found} and the run's {want}: {err}"
    );
    let generate = |out: &str| {
        let mut cmd = tessera_elsewhere();
        cmd.args(["generate", "--limit", "1", "--max-new-tokens", "2", "--run"])
            .arg(&run)
            .arg("--shards")
            .arg(&f.shards)
            .arg("--out")
            .arg(f.root.join(out));
        cmd
    };
    let err = run_err(generate("refused.jsonl").arg("--tokenizer").arg(&other))?;
    ensure!(
        err.contains(&found) && err.contains(&want),
        "generate refuses the other tokenizer naming both fingerprints: {err}"
    );
    run_ok(&mut generate("captions.jsonl"))?;

    // Step 2 damaged after its commit, step 3 killed while writing: step 1 is exported.
    let checkpoints = run.join("checkpoints");
    damage(&checkpoints.join("step-00000002/rank-00000/shards.safetensors"))?;
    std::fs::create_dir_all(checkpoints.join("step-00000003.tmp/rank-00000"))?;
    let out = run_ok(&mut export("previous"))?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(
        stdout.contains("exported step 1 "),
        "export did not take step 1, the newest complete checkpoint: {stdout}"
    );
    ensure!(
        stderr.contains("step-00000002") && stderr.contains("step-00000003.tmp"),
        "export does not say which checkpoints it passed over: {stderr}"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.root.join("previous/config.json"))?)?;
    ensure!(config["step"] == 1, "exported config.json: {config}");

    // Nothing complete left: refused, naming every folder passed over.
    damage(&checkpoints.join("step-00000001/rank-00000/shards.safetensors"))?;
    let err = run_err(&mut export("none"))?;
    ensure!(
        err.contains("no complete checkpoint")
            && ["step-00000001", "step-00000002", "step-00000003.tmp"]
                .iter()
                .all(|s| err.contains(s)),
        "the refusal names every checkpoint it passed over: {err}"
    );
    Ok(())
}

/// `generate --lm` with the real SmolLM2-135M-Instruct: a text-only chat turn through the
/// model's own chat template (its default system prompt included), greedy, prints exactly the
/// answer transformers gives (trainer/model/tests/model/families.rs compares the tokens and
/// logits with transformers').
#[test]
fn generate_lm_answers_a_chat_turn_as_transformers_does() -> Result<()> {
    let out = run_ok(
        tessera_elsewhere()
            .args(["generate", "--lm"])
            .arg(support::smollm2())
            .args(["--prompt", "What is the capital of France?"]),
    )?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "The capital of France is Paris."
    );
    Ok(())
}
