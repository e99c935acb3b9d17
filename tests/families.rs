//! The whole job on the language model families beyond Qwen2 (whose runs `train.rs`,
//! `train_elastic.rs` and `generate.rs` cover), through the binary: a Qwen3-shaped folder
//! (`init-model --family qwen3`: q/k norms, no bias, head_dim twice hidden/heads), a Qwen3-MoE
//! one (`--family qwen3_moe`: sparse layers, whose router balance the metrics and TensorBoard
//! must show) and the real
//! SmolLM2-135M-Instruct (Llama; its own tokenizer, which has no image token, so ingest adds
//! `<image>` and the LM grows a row for it). For each: the shards are ingested with the LM's
//! tokenizer; stage 1 (the projector, and the added row alone) and stage 2 (`--train
//! projector,lm`) train at W=2; FULL_SHARD and
//! NO_SHARD give the same losses; the W=2 checkpoint resumes at W=1 to the same loss; the
//! llava-hf export holds a `LlavaConfig` whose `text_config` is the family's; transformers loads
//! it with no missing or unexpected weight and generates greedily the tokens tessera generates,
//! and its `LlavaProcessor` makes the prompt ids `tessera generate --image` makes (the image
//! token, `<image>` for SmolLM2, expanded). And shards made with another tokenizer are refused
//! before training, naming both.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::process::Command;

use crate::support;
use support::checkpoints::{newest_checkpoint, trained_parameters};
use support::metrics::{check_tensorboard_events, losses};
use support::{
    fixture_with, read_json, run_err, run_ok, smollm2, tessera, train_command, Fixture, Lm,
    TrainArgs,
};

/// `tessera train` on `f` at stage `stage`, then `extra`: one sample per rank and micro-step
/// (rows of 128 tokens: 64 image tokens and a caption), the activations kept (`--recompute
/// none`: no second forward), so that the real SmolLM2-135M trains in seconds a step.
fn train(f: &Fixture, stage: u8, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = tessera();
    cmd.args(["train", "--quiet", "--shards"])
        .arg(&f.shards)
        .arg("--vision")
        .arg(&f.vision)
        .arg("--lm")
        .arg(&f.lm)
        .args(["--stage", &stage.to_string(), "--token-budget", "128"])
        .args([
            "--seq-len",
            "128",
            "--recompute",
            "none",
            "--seed",
            "5",
            "--out",
        ])
        .arg(out)
        .args(extra);
    cmd
}

fn relative_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

/// Stage 2, the LM trained in full from stage 1's projector, on `nproc` ranks under
/// `strategy`: two steps, a checkpoint every `every` (0: at the end only; a full fine-tune of
/// SmolLM2 checkpoints 1.6 GB of masters and moments).
fn stage2(
    f: &Fixture,
    stage1: &Path,
    out: &Path,
    strategy: &str,
    nproc: &str,
    every: &str,
) -> Command {
    let mut cmd = train(
        f,
        2,
        out,
        &[
            "--train",
            "projector,lm",
            "--lm-lr",
            "1e-3",
            "--nproc",
            nproc,
            "--steps",
            "2",
            "--checkpoint-every",
            every,
            "--strategy",
            strategy,
        ],
    );
    cmd.arg("--init-projector").arg(stage1);
    cmd
}

/// What tessera and transformers make of the llava-hf export `export`, for the first image of
/// `f`'s shards and the prompt `tessera generate --image` writes: tessera's greedy tokens (the
/// export read back, as `generate --model` reads it) and its expanded prompt ids; transformers'
/// greedy tokens (`tests/oracles/transformers_oracle.py greedy`, which fails on any missing or unexpected
/// weight) and the prompt ids the export's own `LlavaProcessor` and chat template make.
struct Greedy {
    ours: Vec<i64>,
    theirs: Vec<i64>,
    prompt: Vec<i64>,
    processor_prompt: Vec<i64>,
}

fn greedy_both(f: &Fixture, export: &Path, tokens: usize) -> Result<Greedy> {
    let model = tessera_train::load_export_model(export, Some(tessera_model::Dtype::F32))?;
    let captioner = model.into_captioner(&export.join("tokenizer.json"))?;
    let dataset = tessera_shards::Dataset::open(&f.shards)?;
    let first = dataset
        .metadata()?
        .iter()
        .position(|m| m.kind == tessera_shards::Kind::Image)
        .context("an image sample")?;
    let sample = dataset.read(&[first as u64])?.remove(0);
    let image = sample
        .images
        .into_iter()
        .next()
        .context("the image sample's bytes")?;
    let prompt = captioner.prompt_ids(Some(tessera_train::DEFAULT_INSTRUCTION), 1)?;
    let sample = tessera_train::image_sample("first".into(), vec![image.bytes], prompt);
    let mb = captioner.batches(vec![sample])?.remove(0);
    let options = tessera_model::GenerateOptions {
        max_new_tokens: tokens,
        ..Default::default()
    };
    let ours = captioner
        .generator
        .generate(&mb.input_ids, &mb.pixels, &options)?
        .tokens;

    let side = mb.image_size as i64;
    let pixels = tch::Tensor::from_slice(&mb.pixels).view([1, 3, side, side]);
    let pixel_values = (pixels.to_kind(tch::Kind::Float) / 255.0 - 0.5) / 0.5;
    let mut inputs = tessera_fsdp::ParamMap::new();
    inputs.insert("prompt_ids".into(), tch::Tensor::from_slice(&mb.input_ids));
    inputs.insert("pixel_values".into(), pixel_values);
    let file = f.root.join("greedy_inputs.safetensors");
    tessera_model::save_safetensors(&file, &inputs)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run_ok(
        Command::new(root.join(".deps/hfvenv/bin/python"))
            .arg(root.join("tests/oracles/transformers_oracle.py"))
            .arg("greedy")
            .arg(export)
            .arg(&file)
            .arg(tokens.to_string()),
    )?;
    let line: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let theirs: Vec<Vec<i64>> = serde_json::from_value(line["tokens"].clone())?;
    Ok(Greedy {
        ours,
        theirs: theirs.into_iter().next().context("one image")?,
        prompt: mb.input_ids.clone(),
        processor_prompt: serde_json::from_value(line["processor_prompt_ids"].clone())?,
    })
}

/// The whole job on `f` (see the module docs); `model_type` and `vocab_rows` are what the
/// export's `text_config` must say.
fn whole_job(f: &Fixture, model_type: &str, vocab_rows: i64) -> Result<()> {
    let stage1 = f.root.join("stage1");
    run_ok(&mut train(f, 1, &stage1, &["--nproc", "2", "--steps", "1"]))?;
    // Stage 1 trains the projector, and the embedding row of an `<image>` that ingest added to
    // the tokenizer (SmolLM2's has none): nothing else.
    let index = read_json(&f.shards.join("index.json"))?;
    let added = index["special_tokens"]["added"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    let mut trained = trained_parameters(&newest_checkpoint(&stage1)?)?;
    trained.sort();
    let mut want = vec!["mm_projector.0.weight", "mm_projector.0.bias"];
    want.extend(["mm_projector.2.weight", "mm_projector.2.bias"]);
    if added {
        want.push("added_tokens.embed_tokens");
    }
    want.sort_unstable();
    ensure!(trained == want, "stage 1 trained {trained:?}, not {want:?}");

    let full = f.root.join("full_shard");
    run_ok(&mut stage2(f, &stage1, &full, "full_shard", "2", "1"))?;
    let ddp = f.root.join("no_shard");
    run_ok(&mut stage2(f, &stage1, &ddp, "no_shard", "2", "0"))?;
    let (a, b) = (losses(&full)?, losses(&ddp)?);
    ensure!(a.len() == 2 && b.len() == 2, "two steps each: {a:?} {b:?}");
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        ensure!(
            relative_diff(*x, *y) <= 1e-4,
            "step {step}: FULL_SHARD loss {x} vs NO_SHARD {y}"
        );
    }

    // The W=2 checkpoint of step 1, resumed at W=1: the same second step. The run's files are
    // copied, the checkpoint linked (a resume only reads it).
    let resumed = f.root.join("resumed");
    std::fs::create_dir_all(resumed.join("checkpoints"))?;
    for entry in std::fs::read_dir(&full)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::copy(
                &path,
                resumed.join(path.file_name().context("a file name")?),
            )?;
        }
    }
    run_ok(
        Command::new("cp")
            .arg("-al")
            .arg(full.join("checkpoints/step-00000001"))
            .arg(resumed.join("checkpoints")),
    )?;
    let mut resume = stage2(f, &stage1, &resumed, "full_shard", "1", "1");
    run_ok(resume.arg("--resume"))?;
    let resumed_losses = losses(&resumed)?;
    let (want, got) = (a[1].1, resumed_losses.get(1).context("a second step")?.1);
    ensure!(
        relative_diff(want, got) < 1e-3,
        "step 2 resumed at W=1: loss {got} vs {want} at W=2"
    );

    let export = f.root.join("llava");
    run_ok(
        tessera()
            .args([
                "export", "--quiet", "--format", "llava-hf", "--dtype", "f32",
            ])
            .arg("--run")
            .arg(&full)
            .arg("--out")
            .arg(&export),
    )?;
    let config = read_json(&export.join("config.json"))?;
    let text = &config["text_config"];
    ensure!(
        config["model_type"] == "llava" && text["model_type"] == model_type,
        "the export's config: {config}"
    );
    ensure!(
        text["vocab_size"].as_i64() == Some(vocab_rows),
        "text_config.vocab_size {} (want {vocab_rows})",
        text["vocab_size"]
    );
    ensure!(
        config["image_token_index"] == index["special_tokens"]["image"]["id"],
        "image_token_index {} is not the shards' image token {}",
        config["image_token_index"],
        index["special_tokens"]["image"]
    );
    let greedy = greedy_both(f, &export, 6)?;
    assert_eq!(
        greedy.ours, greedy.theirs,
        "{model_type}: greedy tokens, tessera vs transformers, on the export"
    );
    assert_eq!(
        greedy.prompt, greedy.processor_prompt,
        "{model_type}: the prompt of `generate --image` vs the export's LlavaProcessor"
    );
    Ok(())
}

#[test]
fn the_whole_job_on_a_qwen3_shaped_model() -> Result<()> {
    let f = fixture_with(24, 0.0, Lm::Tiny("qwen3"))?;
    whole_job(&f, "qwen3", 151_936)
}

#[test]
fn the_whole_job_on_a_qwen3_moe_model() -> Result<()> {
    // init-model's tiny Qwen3-MoE: two sparse layers of 8 experts, top-2 renormalised.
    let f = fixture_with(24, 0.0, Lm::Tiny("qwen3_moe"))?;
    whole_job(&f, "qwen3_moe", 151_936)?;
    // The router's balance in plain sight: every step of the stage-2 run reports the balance
    // loss, its weight, and each sparse layer's expert loads (every token reached 2 experts),
    // and its loss is the token loss plus the weighted balance loss.
    let run = f.root.join("full_shard");
    let text = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    for line in text.lines() {
        let m: serde_json::Value = serde_json::from_str(line)?;
        let moe = &m["moe"];
        let aux = moe["aux_loss"].as_f64().context("moe.aux_loss")?;
        ensure!(
            (1.0..=8.0).contains(&aux) && moe["aux_weight"] == 0.001,
            "balance loss {aux} (1 is even, 8 all on one expert pair): {moe}"
        );
        let loads = moe["tokens_per_expert"].as_object().context("loads")?;
        ensure!(loads.len() == 2, "two sparse layers: {moe}");
        for (layer, load) in loads {
            let load: Vec<f64> = serde_json::from_value(load.clone())?;
            let slots: f64 = load.iter().sum();
            ensure!(
                load.len() == 8
                    && slots > 0.0
                    && slots == 2.0 * m["real_tokens"].as_f64().unwrap_or(0.0),
                "layer {layer}: {load:?} for {} tokens",
                m["real_tokens"]
            );
            let ratio = moe["load_max_over_mean"][layer].as_f64().context("ratio")?;
            let max = load.iter().copied().fold(0.0, f64::max);
            ensure!(
                (ratio - max / (slots / 8.0)).abs() < 1e-9,
                "layer {layer}: ratio {ratio}"
            );
        }
    }
    let events = check_tensorboard_events(&run)?;
    ensure!(
        events.per_tag.get("moe/aux_loss") == Some(&2)
            && events
                .per_tag
                .contains_key("moe/load_max_over_mean/layer_1"),
        "TensorBoard tags: {:?}",
        events.per_tag.keys()
    );
    Ok(())
}

#[test]
fn the_whole_job_on_smollm2_135m_with_image_added_to_its_tokenizer() -> Result<()> {
    let f = fixture_with(24, 0.0, Lm::Folder(&smollm2()))?;
    let index = read_json(&f.shards.join("index.json"))?;
    let tokens = &index["special_tokens"];
    ensure!(
        tokens["image"]["text"] == "<image>"
            && tokens["image"]["id"] == 49_152
            && tokens["added"] == serde_json::json!(["<image>"])
            && tokens["eos"]["text"] == "<|im_end|>",
        "SmolLM2's special tokens as ingest resolved them: {tokens}"
    );
    // 49,152 rows of its own and one for <image>.
    whole_job(&f, "llama", 49_153)
}

#[test]
fn shards_of_another_tokenizer_are_refused_naming_both() -> Result<()> {
    // Shards ingested with the Qwen tokenizer, trained with SmolLM2 (49,152 ids).
    let f = fixture_with(8, 0.0, Lm::Tiny("llama"))?;
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm: &smollm2(),
        stage: 1,
        token_budget: 256,
    };
    let out = f.root.join("refused");
    let err = run_err(&mut train_command(
        tessera(),
        &f,
        args,
        &out,
        &["--steps", "1"],
    ))?;
    let smol_tokenizer = smollm2().join("tokenizer.json");
    ensure!(
        err.contains(&f.shards.display().to_string())
            && err.contains(&smol_tokenizer.display().to_string())
            && err.contains("sha256"),
        "the refusal names the shards and the LM's tokenizer: {err}"
    );
    ensure!(
        !out.join("metrics.jsonl").exists(),
        "a step ran before the refusal"
    );
    Ok(())
}
