//! Config: stage defaults, file + flag layering, and the error messages a user sees.
use super::config::*;
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
            "stage 2 needs r >= 1",
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
    std::fs::write(&path, "stage = 1\nlearning_rate = 0.1\n")?;
    let msg = ConfigLayer::from_file(&path)
        .expect_err("unknown key")
        .to_string();
    assert!(
        msg.contains("bad.toml") && msg.contains("learning_rate"),
        "{msg}"
    );
    assert!(msg.contains("line 2"), "{msg}");
    std::fs::write(&path, "stage = 3\n")?;
    let msg = ConfigLayer::from_file(&path)
        .expect_err("bad stage")
        .to_string();
    assert!(msg.contains("stage 3 does not exist"), "{msg}");
    std::fs::write(&path, "strategy = \"zero3\"\n")?;
    let msg = ConfigLayer::from_file(&path)
        .expect_err("bad strategy")
        .to_string();
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
