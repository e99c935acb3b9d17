//! Config: stage defaults, file + flag layering, and the error messages a user sees.
use crate::config::*;
use std::path::PathBuf;

fn base() -> ConfigLayer {
    ConfigLayer {
        shards: Some("s".into()),
        vision: Some("v".into()),
        lm: Some("l".into()),
        out: Some("o".into()),
        stage: Some(Stage::Align),
        ..Default::default()
    }
}

fn err_of(layer: ConfigLayer) -> String {
    match layer.resolve() {
        Ok(cfg) => panic!("expected an error, got {cfg:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn stage_defaults_follow_llava_1_5() -> anyhow::Result<()> {
    let s1 = base().resolve()?;
    assert_eq!((s1.lr, s1.weight_decay, s1.warmup_ratio), (1e-3, 0.0, 0.03));
    let s2 = ConfigLayer {
        stage: Some(Stage::Finetune),
        ..base()
    }
    .resolve()?;
    assert_eq!((s2.lr, s2.projector_lr), (2e-4, 2e-5));
    assert_eq!((s2.lora_r, s2.lora_alpha), (128, 256.0));
    Ok(())
}

#[test]
fn flags_override_the_file_and_the_file_overrides_defaults() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("train.toml");
    std::fs::write(
        &path,
        "shards = \"data/shards\"\nvision = \"m/vision\"\nlm = \"m/lm\"\nout = \"runs/a\"\n\
         stage = 2\nlr = 1e-4\nstrategy = \"shard_grad_op\"\nmicro_steps = 4\n",
    )?;
    let file = ConfigLayer::from_file(&path)?;
    let flags = ConfigLayer {
        micro_steps: Some(2),
        ..Default::default()
    };
    let cfg = file.overlay(flags).resolve()?;
    assert_eq!(cfg.shards, PathBuf::from("data/shards"));
    assert_eq!(cfg.stage, Stage::Finetune);
    assert_eq!(cfg.lr, 1e-4, "file value kept");
    assert_eq!(cfg.micro_steps, 2, "flag wins over file");
    assert_eq!(cfg.strategy, Strategy::ShardGradOp);
    assert_eq!(
        cfg.projector_lr, 2e-5,
        "stage default where neither sets it"
    );
    Ok(())
}

#[test]
fn missing_required_field_is_named() {
    let msg = err_of(ConfigLayer {
        shards: None,
        ..base()
    });
    assert!(msg.contains("`shards` is required"), "{msg}");
    let msg = err_of(ConfigLayer {
        stage: None,
        ..base()
    });
    assert!(msg.contains("`stage` is required"), "{msg}");
}

#[test]
fn bad_values_name_the_field_and_the_reason() {
    let cases: Vec<(ConfigLayer, &str, &str)> = vec![
        (
            ConfigLayer {
                token_budget: Some(0),
                ..base()
            },
            "`token_budget`",
            "not a budget",
        ),
        (
            ConfigLayer {
                token_budget: Some(512),
                seq_len: Some(1024),
                ..base()
            },
            "`token_budget`",
            "below seq_len 1024",
        ),
        (
            ConfigLayer {
                lr: Some(-1.0),
                ..base()
            },
            "`lr`",
            "not a learning rate",
        ),
        (
            ConfigLayer {
                micro_steps: Some(0),
                ..base()
            },
            "`micro_steps`",
            "at least 1",
        ),
        (
            ConfigLayer {
                nproc: Some(0),
                ..base()
            },
            "`nproc`",
            "0 ranks",
        ),
        (
            ConfigLayer {
                warmup_ratio: Some(1.5),
                ..base()
            },
            "`warmup_ratio`",
            "[0, 1)",
        ),
        (
            ConfigLayer {
                steps: Some(10),
                epochs: Some(1),
                ..base()
            },
            "`steps`",
            "not both",
        ),
        (
            ConfigLayer {
                stage: Some(Stage::Finetune),
                lora_r: Some(0),
                ..base()
            },
            "`lora_r`",
            "LoRA needs r >= 1",
        ),
        (
            ConfigLayer {
                grad_clip: Some(f64::NAN),
                ..base()
            },
            "`grad_clip`",
            ">= 0",
        ),
    ];
    for (layer, field, reason) in cases {
        let msg = err_of(layer);
        assert!(
            msg.contains(field) && msg.contains(reason),
            "{msg:?} lacks {field} / {reason}"
        );
    }
}

#[test]
fn file_errors_name_the_file_and_the_key() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.toml");
    // As the CLI prints it: the message names the file, toml's error (the source) the line
    // and the key.
    let printed = |e: ConfigError| tessera_errors::with_causes(&e);
    std::fs::write(&path, "stage = 1\nlearning_rate = 0.1\n")?;
    let err = ConfigLayer::from_file(&path).expect_err("unknown key");
    assert!(std::error::Error::source(&err).is_some());
    let msg = printed(err);
    assert!(
        msg.contains("bad.toml") && msg.contains("learning_rate"),
        "{msg}"
    );
    assert!(msg.contains("line 2"), "{msg}");
    assert_eq!(msg.matches("bad.toml").count(), 1, "{msg}");
    std::fs::write(&path, "stage = 3\n")?;
    let msg = printed(ConfigLayer::from_file(&path).expect_err("bad stage"));
    assert!(msg.contains("stage 3 does not exist"), "{msg}");
    std::fs::write(&path, "strategy = \"zero3\"\n")?;
    let msg = printed(ConfigLayer::from_file(&path).expect_err("bad strategy"));
    assert!(msg.contains("zero3") && msg.contains("full_shard"), "{msg}");
    let msg = ConfigLayer::from_file(&dir.path().join("absent.toml"))
        .expect_err("no file")
        .to_string();
    assert!(msg.contains("absent.toml"), "{msg}");
    Ok(())
}

#[test]
fn paths_that_are_not_shards_or_models_are_refused_before_work() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = ConfigLayer {
        shards: Some(dir.path().to_path_buf()),
        ..base()
    }
    .resolve()?;
    let msg = cfg.check_paths().expect_err("no index.json").to_string();
    assert!(
        msg.contains("`shards`") && msg.contains("no index.json"),
        "{msg}"
    );
    std::fs::write(dir.path().join("index.json"), "{}")?;
    let msg = cfg.check_paths().expect_err("no vision config").to_string();
    assert!(
        msg.contains("`vision`") && msg.contains("config.json"),
        "{msg}"
    );
    Ok(())
}

/// `tessera train`'s knobs as the binary sees them (it flattens `ConfigLayer` the same way).
#[derive(clap::Parser, Debug)]
struct Cli {
    #[command(flatten)]
    knobs: ConfigLayer,
}

fn parse_flags(flags: &[&str]) -> Result<ConfigLayer, clap::Error> {
    use clap::Parser;
    Cli::try_parse_from(std::iter::once("train").chain(flags.iter().copied())).map(|c| c.knobs)
}

#[test]
fn every_flag_and_its_toml_key_set_the_same_knob() -> anyhow::Result<()> {
    use clap::CommandFactory;
    Cli::command().debug_assert();
    // (flag, value, TOML line): the names users and scripts already rely on.
    let knobs = [
        ("--shards", "data/shards", "shards = \"data/shards\""),
        ("--vision", "m/vision", "vision = \"m/vision\""),
        ("--lm", "m/lm", "lm = \"m/lm\""),
        ("--stage", "2", "stage = 2"),
        ("--out", "runs/a", "out = \"runs/a\""),
        ("--nproc", "2", "nproc = 2"),
        ("--strategy", "no_shard", "strategy = \"no_shard\""),
        ("--expert-parallel", "4", "expert_parallel = 4"),
        ("--recompute", "every:2", "recompute = \"every:2\""),
        ("--steps", "7", "steps = 7"),
        ("--epochs", "3", "epochs = 3"),
        ("--token-budget", "8192", "token_budget = 8192"),
        ("--micro-steps", "4", "micro_steps = 4"),
        ("--lr", "0.0001", "lr = 1e-4"),
        ("--projector-lr", "0.00002", "projector_lr = 2e-5"),
        (
            "--train",
            "projector,lm,vision:4",
            "train = \"projector,lm,vision:4\"",
        ),
        ("--lm-lr", "0.00003", "lm_lr = 3e-5"),
        ("--vision-lr", "0.000002", "vision_lr = 2e-6"),
        ("--warmup-ratio", "0.1", "warmup_ratio = 0.1"),
        ("--weight-decay", "0.01", "weight_decay = 0.01"),
        ("--grad-clip", "0.5", "grad_clip = 0.5"),
        ("--lora-r", "8", "lora_r = 8"),
        ("--lora-alpha", "16", "lora_alpha = 16.0"),
        ("--seed", "5", "seed = 5"),
        ("--checkpoint-every", "3", "checkpoint_every = 3"),
        ("--keep-checkpoints", "5", "keep_checkpoints = 5"),
        ("--keep-every", "10", "keep_every = 10"),
        (
            "--checkpoint-write",
            "async",
            "checkpoint_write = \"async\"",
        ),
        ("--on-bad-image", "skip", "on_bad_image = \"skip\""),
        ("--over-long", "fail", "over_long = \"fail\""),
        ("--device", "cuda", "device = \"cuda\""),
        ("--image-size", "224", "image_size = 224"),
        (
            "--vision-feature-layer",
            "-12,6",
            "vision_feature_layer = [-12, 6]",
        ),
        ("--resize", "pad", "resize = \"pad\""),
        (
            "--image-layout",
            "anyres_max_9",
            "image_layout = \"anyres_max_9\"",
        ),
        (
            "--standardize-features",
            "256",
            "standardize_features = 256",
        ),
        ("--seq-len", "1024", "seq_len = 1024"),
        ("--loader-threads", "3", "loader_threads = 3"),
        ("--collective-timeout", "60", "collective_timeout_s = 60"),
        ("--heartbeat-timeout", "20", "heartbeat_timeout_s = 20"),
        ("--init-projector", "s1", "init_projector = \"s1\""),
        ("--profile", "3", "profile = 3"),
        ("--val-shards", "data/val", "val_shards = \"data/val\""),
        ("--val-every", "50", "val_every = 50"),
        ("--val-samples", "64", "val_samples = 64"),
        ("--cache-dir", "/tmp/c", "cache_dir = \"/tmp/c\""),
        ("--cache-limit", "2GB", "cache_limit = \"2GB\""),
        ("--precision", "bf16", "precision = \"bf16\""),
        ("--reduce-dtype", "bf16", "reduce_dtype = \"bf16\""),
    ];
    let flags: Vec<&str> = knobs.iter().flat_map(|(f, v, _)| [*f, *v]).collect();
    let from_flags = parse_flags(&flags)?;
    let toml: Vec<&str> = knobs.iter().map(|(_, _, line)| *line).collect();
    let from_file: ConfigLayer = toml::from_str(&toml.join("\n"))?;
    assert_eq!(from_flags, from_file);
    // Every knob is in the table above: none is left unset.
    let unset: Vec<String> = match serde_json::to_value(&from_flags)? {
        serde_json::Value::Object(fields) => fields
            .into_iter()
            .filter(|(_, v)| v.is_null())
            .map(|(k, _)| k)
            .collect(),
        other => anyhow::bail!("a layer serialises as an object, not {other}"),
    };
    assert!(
        unset.is_empty(),
        "knobs without a flag in this test: {unset:?}"
    );
    assert_eq!(from_flags.strategy, Some(Strategy::NoShard));
    assert_eq!(from_flags.resize, Some(ResizePolicy::Pad));
    assert_eq!(
        from_flags.image_layout,
        Some(tessera_shards::image_layout::ImageLayout::AnyRes { max_tiles: 9 })
    );
    assert_eq!(from_flags.collective_timeout_s, Some(60));
    Ok(())
}

#[test]
fn bad_flag_values_name_the_flag_and_the_choices() {
    let msg = |flags: &[&str]| match parse_flags(flags) {
        Ok(layer) => panic!("{flags:?} parsed as {layer:?}"),
        Err(e) => e.to_string(),
    };
    let m = msg(&["--strategy", "zero3"]);
    assert!(
        m.contains("--strategy") && m.contains("zero3") && m.contains("shard_grad_op"),
        "{m}"
    );
    let m = msg(&["--stage", "3"]);
    assert!(
        m.contains("--stage") && m.contains("stage 3 does not exist"),
        "{m}"
    );
    let m = msg(&["--resize", "crop"]);
    assert!(m.contains("--resize") && m.contains("squash"), "{m}");
    for bad in ["every:0", "some", "every:x"] {
        let m = msg(&["--recompute", bad]);
        assert!(
            m.contains("--recompute") && m.contains("all, none, selective") && m.contains("auto"),
            "{m}"
        );
    }
    let m = msg(&["--collective-timeout-s", "5"]);
    assert!(m.contains("--collective-timeout-s"), "{m}");
}

#[test]
fn a_resolved_config_keeps_the_names_checkpoints_store() -> anyhow::Result<()> {
    let cfg = ConfigLayer {
        stage: Some(Stage::Finetune),
        strategy: Some(Strategy::ShardGradOp),
        resize: Some(ResizePolicy::Pad),
        ..base()
    }
    .resolve()?;
    let json = serde_json::to_value(&cfg)?;
    assert_eq!(json["stage"], 2);
    assert_eq!(json["strategy"], "shard_grad_op");
    assert_eq!(json["resize"], "pad");
    assert_eq!(json["device"], "cpu");
    assert_eq!(json["collective_timeout_s"], 300);
    assert_eq!(serde_json::from_value::<TrainConfig>(json)?, cfg);
    Ok(())
}

#[test]
fn an_unreadable_config_file_prints_its_cause_once() {
    let err = ConfigLayer::from_file(std::path::Path::new("/nonexistent/train.toml"))
        .expect_err("no such file");
    let chain = format!("{:#}", anyhow::Error::from(err));
    assert!(chain.contains("/nonexistent/train.toml"), "{chain}");
    assert_eq!(chain.matches("os error").count(), 1, "{chain}");
}

#[test]
fn a_stored_config_without_a_newer_knob_reads_with_its_default() -> anyhow::Result<()> {
    let cfg = base().resolve()?;
    let mut stored = serde_json::to_value(&cfg)?;
    let fields = stored
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("a config serialises as an object"))?;
    fields.remove("seed");
    fields.remove("steps");
    assert_eq!(TrainConfig::from_stored(stored)?, cfg);
    let mut stored = serde_json::to_value(&cfg)?;
    stored["zero_stage"] = 3.into();
    let err = TrainConfig::from_stored(stored).expect_err("unknown knob");
    let msg = tessera_errors::with_causes(&err);
    assert!(
        msg.contains("stored config") && msg.contains("zero_stage"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn precision_defaults_to_bf16_on_cuda_and_f32_on_cpu_and_is_stored_resolved() -> anyhow::Result<()>
{
    let cpu = base().resolve()?;
    assert_eq!((cpu.precision, cpu.reduce_dtype), (Dtype::F32, Dtype::F32));
    // `resolve` would refuse cuda in a CPU build; a stored config is filled, not validated.
    let cuda = TrainConfig::from_stored(serde_json::to_value(ConfigLayer {
        device: Some(Device::Cuda),
        ..base()
    })?)?;
    assert_eq!(cuda.precision, Dtype::Bf16);
    let json = serde_json::to_value(&cuda)?;
    assert_eq!(
        (&json["precision"], &json["reduce_dtype"]),
        (&"bf16".into(), &"f32".into())
    );
    let m = err_of(ConfigLayer {
        reduce_dtype: Some(Dtype::Bf16),
        ..base()
    });
    assert!(
        m.contains("`reduce_dtype`") && m.contains("bf16 precision"),
        "{m}"
    );
    Ok(())
}

/// The record every checkpoint holds: each `#[resume]` knob that applies, by serde's spelling
/// (a resume compares these strings).
#[test]
fn the_resume_record_holds_every_knob_that_applies_spelled_as_serde_does() -> anyhow::Result<()> {
    let pairs = |p: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let stage1 = base().resolve()?;
    let common = [
        ("warmup_ratio", "0.03"),
        ("weight_decay", "0"),
        ("grad_clip", "1"),
        ("token_budget", "4096"),
        ("seq_len", "2048"),
        ("micro_steps", "1"),
        ("seed", "42"),
        ("vision_feature_layer", "-2"),
        ("image_layout", "single"),
    ];
    let mut want = pairs(&common);
    want.extend(pairs(&[
        ("stage", "1"),
        ("lr", "0.001"),
        ("projector_lr", "0.001"),
        ("resize", "squash"),
        ("train", "projector"),
        ("precision", "f32"),
    ]));
    assert_eq!(stage1.resume_record(), want);

    // Stage 2 in bf16 with the LM and 4 vision layers training: the conditional knobs appear.
    let stage2 = ConfigLayer {
        stage: Some(Stage::Finetune),
        train: Some(
            "projector,lm,vision:4"
                .parse()
                .map_err(anyhow::Error::msg)?,
        ),
        resize: Some(ResizePolicy::Pad),
        precision: Some(Dtype::Bf16),
        ..base()
    }
    .resolve()?;
    let mut want = pairs(&common);
    want.extend(pairs(&[
        ("stage", "2"),
        ("lr", "0.0002"),
        ("projector_lr", "0.00002"),
        ("resize", "pad"),
        ("precision", "bf16"),
        ("reduce_dtype", "f32"),
        ("train", "projector,lm,vision:4"),
        ("lm_lr", "0.00002"),
        ("vision_lr", "0.000002"),
    ]));
    assert_eq!(stage2.resume_record(), want);

    // Stage 2's own parts (projector + LoRA) record LoRA's shape too.
    let lora = ConfigLayer {
        stage: Some(Stage::Finetune),
        ..base()
    }
    .resolve()?;
    let record = lora.resume_record();
    assert_eq!(
        (
            record.get("lora_r"),
            record.get("lora_alpha"),
            record.get("train")
        ),
        (
            Some(&"128".to_string()),
            Some(&"256".to_string()),
            Some(&"projector,lora".to_string())
        )
    );
    let knobs: Vec<&str> = TrainConfig::resume_knobs().collect();
    assert!(
        [
            "stage",
            "train",
            "lr",
            "lora_r",
            "precision",
            "reduce_dtype"
        ]
        .iter()
        .all(|k| knobs.contains(k))
            // `run.rs` records these in another form, under the same names.
            && ["shards", "image_size", "steps"].iter().all(|k| !knobs.contains(k))
            && !knobs.contains(&"strategy")
            && !knobs.contains(&"nproc"),
        "{knobs:?}"
    );
    Ok(())
}
