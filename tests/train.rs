//! `tessera train` / `tessera export` end to end, through the binary: synth -> ingest ->
//! init-model -> train on 2 ranks -> interrupt after a checkpoint -> resume -> the same losses
//! as an uninterrupted run -> export -> the exported projector and adapter give the same
//! outputs as the trained tensors; every run's TensorBoard events (read by TensorBoard's own
//! reader) hold its metrics.jsonl, resumed runs and losses by sample type included; and the
//! refusals (config, mismatched or corrupt checkpoint).
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_model::{load_adapter, load_safetensors, Vlm, VlmOptions};
use tessera_pipeline::loader::{Loader, LoaderConfig, SampleSource};
use tessera_pipeline::MicroBatchPlan;

use crate::support;
use support::metrics::{check_tensorboard_events, losses};
use support::{fixture, run_err, run_ok, tessera, train_command, Fixture, TrainArgs};

/// `tessera train` on the fixture with small, fast settings.
fn train(f: &Fixture, stage: u8, out: &Path, extra: &[&str]) -> Command {
    train_with_lm(f, &f.lm, stage, out, extra)
}

fn train_with_lm(f: &Fixture, lm: &Path, stage: u8, out: &Path, extra: &[&str]) -> Command {
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm,
        stage,
        token_budget: 512,
    };
    train_command(tessera(), f, args, out, extra)
}

/// Starts a run, waits for its checkpoint of `step`, then interrupts it (Ctrl-C to the launcher).
fn interrupt_after_checkpoint(mut cmd: Command, run: &Path, step: u64) -> Result<()> {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let marker = run
        .join("checkpoints")
        .join(format!("step-{step:08}"))
        .join("meta.json");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !marker.is_file() {
        ensure!(
            Instant::now() < deadline,
            "no checkpoint {} within 300 s",
            marker.display()
        );
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("run exited ({status}) before checkpoint {step}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    run_ok(Command::new("kill").args(["-INT", &child.id().to_string()]))?;
    child.wait()?;
    Ok(())
}

/// A micro-batch of the first `n` image samples, as the loader builds it for the tiny model.
fn image_batch(f: &Fixture, vlm: &Vlm, n: usize) -> Result<tessera_pipeline::MicroBatch> {
    let dataset = tessera_shards::Dataset::open(&f.shards)?;
    let rows: Vec<Vec<u64>> = dataset
        .metadata()?
        .iter()
        .enumerate()
        .filter(|(_, m)| m.kind == tessera_shards::Kind::Image)
        .take(n)
        .map(|(i, _)| vec![i as u64])
        .collect();
    let plan = MicroBatchPlan {
        kind: tessera_shards::Kind::Image,
        rows,
        zero_loss: false,
    };
    let config = LoaderConfig::builder()
        .image_size(vlm.vision.image_size as usize)
        .image_tokens(vlm.vision.num_patches() as usize)
        .threads(1)
        .tokens(&dataset.manifest().special_tokens())
        .build()?;
    let source: Arc<dyn SampleSource> = Arc::new(dataset);
    Loader::new(source, vec![plan], config)
        .next()
        .context("one micro-batch")?
        .map_err(Into::into)
}

/// Every trained tensor of the run's newest complete checkpoint.
fn newest_trained(run: &Path) -> Result<tessera_fsdp::ParamMap> {
    let (_, trained) = tessera_train::newest_complete_trained(run)?;
    Ok(trained.collect(|_| true)?)
}

#[test]
fn two_ranks_interrupted_and_resumed_match_an_uninterrupted_run_and_export_round_trips(
) -> Result<()> {
    let f = fixture(160, 0.2)?;
    let steps = ["--nproc", "2", "--steps", "8", "--checkpoint-every", "3"];
    let straight = f.root.join("straight");
    run_ok(&mut train(&f, 1, &straight, &steps))?;
    let resumed = f.root.join("resumed");
    interrupt_after_checkpoint(train(&f, 1, &resumed, &steps), &resumed, 3)?;
    let before = losses(&resumed)?;
    ensure!(
        before.len() < 8,
        "the interrupted run finished all 8 steps; nothing was resumed"
    );
    run_ok(train(&f, 1, &resumed, &steps).arg("--resume"))?;
    let (a, b) = (losses(&straight)?, losses(&resumed)?);
    assert_eq!(a.len(), 8);
    assert_eq!(a, b, "resumed losses differ from the uninterrupted run's");
    assert!(straight.join("loss.png").is_file() && straight.join("summary.json").is_file());
    // TensorBoard's reader sees each step once (the resumed file supersedes the interrupted
    // one's steps from 3 on), equal to metrics.jsonl, with a tag per rank.
    for run in [&straight, &resumed] {
        let events = check_tensorboard_events(run)?;
        assert_eq!(events.steps, 8, "{}", run.display());
        assert_eq!(
            events.per_tag["loss/image"], 8,
            "stage 1 steps are image steps"
        );
        assert!(!events.per_tag.contains_key("loss/text_only"));
        for tag in [
            "loader_wait_frac/rank1",
            "peak_rss_mib/rank0",
            "compute_s/rank1",
        ] {
            assert_eq!(events.per_tag.get(tag), Some(&8), "{tag}");
        }
    }

    // Stage 2 from the stage-1 projector, then export and load the files back.
    let stage2 = f.root.join("stage2");
    run_ok(
        train(
            &f,
            2,
            &stage2,
            &["--steps", "4", "--lora-r", "4", "--lora-alpha", "8"],
        )
        .arg("--init-projector")
        .arg(&straight)
        .arg("--val-shards")
        .arg(&f.shards)
        .args(["--val-samples", "8", "--val-every", "2"]),
    )?;
    // Stage 2 plans image and text-only steps: a loss series each, and validation points.
    let events = check_tensorboard_events(&stage2)?;
    assert_eq!(events.steps, 4);
    let typed = |tag: &str| events.per_tag.get(tag).copied().unwrap_or(0);
    assert!(
        typed("loss/image") > 0 && typed("loss/text_only") > 0,
        "{:?}",
        events.per_tag
    );
    assert_eq!(typed("loss/validation"), 2);
    assert!(events.scalars > 4 * 10);
    let export = f.root.join("export");
    run_ok(
        tessera()
            .args(["export", "--dtype", "f32", "--run"])
            .arg(&stage2)
            .arg("--out")
            .arg(&export),
    )?;
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(export.join("config.json"))?)?;
    assert_eq!(config["mm_projector_type"], "mlp2x_gelu");
    assert_eq!(config["image_token_count"], 64);
    let projector = load_safetensors(&export.join("mm_projector.safetensors"))?;
    let keys: Vec<&str> = projector.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "mm_projector.0.bias",
            "mm_projector.0.weight",
            "mm_projector.2.bias",
            "mm_projector.2.weight"
        ]
    );
    let (lora_cfg, adapter) = load_adapter(&export.join("adapter"))?;
    assert_eq!((lora_cfg.r, lora_cfg.lora_alpha), (4, 8.0));

    let tokens = tessera_shards::Dataset::open(&f.shards)?
        .manifest()
        .special_tokens();
    let options = VlmOptions {
        lora: Some(lora_cfg),
        image_token_id: Some(i64::from(tokens.image.id)),
        ..VlmOptions::default()
    };
    let vlm = Vlm::from_dirs(&f.vision, &f.lm, options)?;
    let mb = image_batch(&f, &vlm, 3)?;
    let mut from_export = vlm.load_params(
        &f.vision,
        &f.lm,
        Some(&export.join("mm_projector.safetensors")),
        0,
    )?;
    from_export.extend(adapter);
    let mut from_run = vlm.load_params(&f.vision, &f.lm, None, 0)?;
    let trained = newest_trained(&stage2)?;
    ensure!(
        trained.keys().any(|k| k.contains("lora_B")),
        "stage 2 trained no adapter"
    );
    from_run.extend(trained);
    let (loss_export, n) = vlm.loss(&from_export, &mb)?;
    let (loss_run, _) = vlm.loss(&from_run, &mb)?;
    ensure!(n > 0, "the batch has supervised tokens");
    assert_eq!(loss_export.double_value(&[]), loss_run.double_value(&[]));
    let logits_export = vlm.logits(&from_export, &mb)?;
    assert!(
        logits_export.equal(&vlm.logits(&from_run, &mb)?),
        "exported model gives other logits"
    );

    // Refusals: another LM config, other data; a damaged checkpoint is passed over.
    let other_lm = f.root.join("other_lm");
    std::fs::create_dir_all(&other_lm)?;
    std::fs::copy(
        f.lm.join("model.safetensors"),
        other_lm.join("model.safetensors"),
    )?;
    let cfg = std::fs::read_to_string(f.lm.join("config.json"))?;
    std::fs::write(
        other_lm.join("config.json"),
        cfg.replace("\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1e-5"),
    )?;
    let resume = ["--nproc", "2", "--steps", "8", "--resume"];
    let msg = run_err(&mut train_with_lm(&f, &other_lm, 1, &straight, &resume))?;
    assert!(
        msg.contains("lm_config: ") && msg.contains("--resume-changing lm_config"),
        "{msg}"
    );
    let last = straight
        .join("checkpoints")
        .join("step-00000008")
        .join("rank-00000")
        .join("shards.safetensors");
    let mut bytes = std::fs::read(&last)?;
    let end = bytes.len() - 1;
    bytes[end] ^= 0xff;
    std::fs::write(&last, bytes)?;
    let out = run_ok(&mut train(
        &f,
        1,
        &straight,
        &["--nproc", "2", "--steps", "8", "--resume"],
    ))?;
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("skipped checkpoints/step-00000008")
            && msg.contains("corrupt")
            && msg.contains("rank 0: shards.safetensors does not match"),
        "{msg}"
    );
    assert_eq!(
        losses(&straight)?,
        a,
        "resumed from step 6 after passing over the damaged step 8: the same losses"
    );
    Ok(())
}

/// Tensor name -> dtype ("F32", "BF16") from a safetensors file's header.
fn header_dtypes(path: &Path) -> Result<std::collections::BTreeMap<String, String>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(bytes.len() >= 8, "{} is too short", path.display());
    let len = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len])?;
    let fields = header.as_object().context("the header is a JSON object")?;
    Ok(fields
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(k, v)| (k.clone(), v["dtype"].as_str().unwrap_or("?").to_string()))
        .collect())
}

/// The bf16 matrix-product kernels a run's checkpoint at `step` recorded (`native` or `f32`).
fn recorded_gemm(run: &Path, step: u64) -> Result<String> {
    let meta = run
        .join("checkpoints")
        .join(format!("step-{step:08}"))
        .join("meta.json");
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta)?)?;
    meta["run"]["cpu_bf16_gemm"]
        .as_str()
        .map(String::from)
        .with_context(|| format!("{}: no cpu_bf16_gemm in its run record", run.display()))
}

/// The straight run measures the CPU's bf16 kernels (rank 0 times both, both ranks take its
/// choice) and records the choice; the interrupted run is forced to the same one, and its
/// resume, forced to nothing, must take it from the checkpoint: the same losses follow.
#[test]
fn bf16_run_saves_f32_masters_resumes_with_the_same_losses_and_exports_bf16() -> Result<()> {
    let f = fixture(80, 0.0)?;
    let steps = [
        "--nproc",
        "2",
        "--steps",
        "6",
        "--checkpoint-every",
        "3",
        "--precision",
        "bf16",
    ];
    let straight = f.root.join("straight");
    run_ok(
        train(&f, 2, &straight, &steps)
            .args(["--lora-r", "4"])
            .env_remove("TESSERA_CPU_BF16_GEMM"),
    )?;
    let measured = recorded_gemm(&straight, 6)?;
    ensure!(
        measured == "native" || measured == "f32",
        "recorded {measured:?}"
    );
    let resumed = f.root.join("resumed");
    let mut first = train(&f, 2, &resumed, &steps);
    first
        .args(["--lora-r", "4"])
        .env("TESSERA_CPU_BF16_GEMM", &measured);
    interrupt_after_checkpoint(first, &resumed, 3)?;
    assert_eq!(recorded_gemm(&resumed, 3)?, measured);
    ensure!(
        losses(&resumed)?.len() < 6,
        "the interrupted run finished all 6 steps; nothing was resumed"
    );
    run_ok(
        train(&f, 2, &resumed, &steps)
            .args(["--lora-r", "4", "--resume"])
            .env_remove("TESSERA_CPU_BF16_GEMM"),
    )?;
    let (a, b) = (losses(&straight)?, losses(&resumed)?);
    assert_eq!(a.len(), 6);
    assert_eq!(
        a, b,
        "resumed bf16 losses differ from the uninterrupted run's"
    );
    assert_eq!(recorded_gemm(&resumed, 6)?, measured);
    // Resuming with the other kernels forced is a changed setting, refused by name.
    let other = if measured == "f32" { "native" } else { "f32" };
    let msg = run_err(
        train(&f, 2, &resumed, &steps)
            .args(["--lora-r", "4", "--resume"])
            .env("TESSERA_CPU_BF16_GEMM", other),
    )?;
    assert!(
        msg.contains(&format!("cpu_bf16_gemm: {measured} -> {other}"))
            && msg.contains("--resume-changing cpu_bf16_gemm"),
        "{msg}"
    );

    // The checkpoint holds f32 masters and moments; its stored config says bf16.
    let ckpt = straight.join("checkpoints").join("step-00000006");
    for file in [ckpt.join("rank-00000").join("shards.safetensors")] {
        let dtypes = header_dtypes(&file)?;
        ensure!(!dtypes.is_empty(), "{} holds no tensors", file.display());
        for (name, dtype) in &dtypes {
            ensure!(
                dtype == "F32" || name == "optimizer.step",
                "{}: {name} is {dtype}",
                file.display()
            );
        }
    }
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(ckpt.join("meta.json"))?)?;
    assert_eq!(meta["config"]["precision"], "bf16");

    // Export: bf16 by default, f32 on request; both hold the same values up to bf16 rounding.
    let (bf16_dir, f32_dir) = (f.root.join("export-bf16"), f.root.join("export-f32"));
    run_ok(
        tessera()
            .args(["export", "--run"])
            .arg(&straight)
            .arg("--out")
            .arg(&bf16_dir),
    )?;
    run_ok(
        tessera()
            .args(["export", "--dtype", "f32", "--run"])
            .arg(&straight)
            .arg("--out")
            .arg(&f32_dir),
    )?;
    for (dir, want) in [(&bf16_dir, "BF16"), (&f32_dir, "F32")] {
        for file in [
            dir.join("mm_projector.safetensors"),
            dir.join("adapter").join("adapter_model.safetensors"),
        ] {
            let dtypes = header_dtypes(&file)?;
            ensure!(!dtypes.is_empty(), "{} holds no tensors", file.display());
            for (name, dtype) in dtypes {
                ensure!(
                    dtype == want,
                    "{}: {name} is {dtype}, not {want}",
                    file.display()
                );
            }
        }
    }
    let (b, w) = (
        load_safetensors(&bf16_dir.join("mm_projector.safetensors"))?,
        load_safetensors(&f32_dir.join("mm_projector.safetensors"))?,
    );
    for (name, t) in &w {
        let diff = (&b[name] - t).abs().max().double_value(&[]);
        let scale = t.abs().max().double_value(&[]);
        ensure!(
            diff <= scale / 128.0,
            "{name}: bf16 export off by {diff} (scale {scale})"
        );
    }
    Ok(())
}

#[test]
fn invalid_configs_fail_before_any_work_naming_field_and_reason() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("run");
    let base = |extra: &[&str]| {
        let mut cmd = tessera();
        cmd.args([
            "train", "--shards", "s", "--vision", "v", "--lm", "l", "--stage", "1", "--out",
        ])
        .arg(&out)
        .args(extra);
        cmd
    };
    let msg = run_err(&mut base(&["--token-budget", "0"]))?;
    assert!(
        msg.contains("`token_budget`") && msg.contains("not a budget"),
        "{msg}"
    );
    let msg = run_err(&mut base(&["--steps", "5", "--epochs", "1"]))?;
    assert!(msg.contains("`steps`") && msg.contains("not both"), "{msg}");
    let msg = run_err(&mut base(&[]))?;
    assert!(
        msg.contains("`shards`") && msg.contains("no index.json"),
        "{msg}"
    );
    let config = tmp.path().join("train.toml");
    std::fs::write(&config, "stage = 1\nwarmup = 0.1\n")?;
    let msg = run_err(base(&[]).arg("--config").arg(&config))?;
    assert!(
        msg.contains("train.toml") && msg.contains("warmup"),
        "{msg}"
    );
    assert!(
        !out.exists(),
        "a refused config must not create the run directory"
    );
    Ok(())
}

#[test]
fn stage_1_on_text_only_shards_is_refused_naming_them() -> Result<()> {
    let f = fixture(12, 1.0)?;
    let msg = run_err(&mut train(&f, 1, &f.root.join("run"), &["--steps", "2"]))?;
    assert!(
        msg.contains("holds none") && msg.contains(&*f.shards.to_string_lossy()),
        "{msg}"
    );
    Ok(())
}
