//! Checkpoint container: atomic commit, newest-complete selection, refusal messages, pruning.
use crate::checkpoint::format::*;
use crate::run_dir::RunDir;
use std::collections::BTreeMap;
use std::path::Path;

fn model() -> ModelFingerprint {
    ModelFingerprint {
        vision_config: "v1".into(),
        lm_config: "l1".into(),
        params: "p1".into(),
        vision_weights: "vw1".into(),
        lm_weights: "lw1".into(),
    }
}

fn record(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run_record() -> BTreeMap<String, String> {
    record(&[
        ("lm_weights", "lw1"),
        ("lr", "0.001"),
        ("seed", "5"),
        ("shards", "d1"),
        ("stage", "1"),
    ])
}

fn meta(step: u64, world_size: usize) -> CheckpointMeta {
    CheckpointMeta {
        format_version: FORMAT_VERSION,
        step,
        world_size,
        strategy: tessera_fsdp::Strategy::FullShard,
        stage: 1,
        model: model(),
        data_fingerprint: "d1".into(),
        config: serde_json::json!({}),
        run: run_record(),
        plan_world_size: world_size,
    }
}

fn write(run: &Path, step: u64, world_size: usize) -> anyhow::Result<()> {
    let run = RunDir::new(run);
    let writers: Vec<_> = (0..world_size)
        .map(|r| CheckpointWriter::begin(&run, step, r))
        .collect::<Result<_, _>>()?;
    for (rank, w) in writers.iter().enumerate() {
        std::fs::write(w.dir().join("params.bin"), vec![rank as u8; 64])?;
        w.finish_rank(&RankState {
            rank,
            next_step: step,
            planner: serde_json::json!({ "step": step }),
            seed: 7,
        })?;
    }
    let mut writers = writers;
    writers.remove(0).commit(&meta(step, world_size))?;
    Ok(())
}

fn expected<'a>(m: &'a ModelFingerprint, run: &'a BTreeMap<String, String>) -> Expected<'a> {
    Expected {
        model: m,
        run,
        allow_changing: &[],
        resume_knobs: &["lr", "seed", "stage", "lora_r"],
    }
}

/// The committed checkpoint of `step`, opened without verifying its files.
fn open(run: &Path, step: u64) -> anyhow::Result<Checkpoint> {
    Ok(Checkpoint::open(&RunDir::new(run).checkpoint(step))?)
}

#[test]
fn newest_complete_checkpoint_wins_and_tmp_folders_are_passed_over() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    let dir = RunDir::new(run.path());
    assert!(dir.newest_complete_checkpoint()?.checkpoint.is_none());
    write(run.path(), 10, 2)?;
    write(run.path(), 20, 2)?;
    // A write that never committed (a killed run): only its rank folders exist.
    let w = CheckpointWriter::begin(&dir, 30, 0)?;
    std::fs::write(w.dir().join("params.bin"), b"partial")?;
    let steps: Vec<(u64, bool)> = dir
        .checkpoint_folders()?
        .iter()
        .map(|f| (f.step, f.committed))
        .collect();
    assert_eq!(steps, [(30, false), (20, true), (10, true)]);
    let ckpt = dir
        .newest_complete_checkpoint()?
        .checkpoint
        .expect("a complete checkpoint");
    assert_eq!(ckpt.meta.step, 20);
    ckpt.check_matches(&expected(&model(), &run_record()))?;
    let state = ckpt.rank_state(1)?;
    assert_eq!((state.rank, state.next_step), (1, 20));
    assert_eq!(
        std::fs::read(ckpt.rank_dir(1)?.join("params.bin"))?,
        vec![1u8; 64]
    );
    Ok(())
}

#[test]
fn commit_refuses_when_a_rank_did_not_finish() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    let w0 = CheckpointWriter::begin(&RunDir::new(run.path()), 5, 0)?;
    w0.finish_rank(&RankState {
        rank: 0,
        next_step: 5,
        planner: serde_json::Value::Null,
        seed: 1,
    })?;
    let msg = w0
        .commit(&meta(5, 2))
        .expect_err("rank 1 missing")
        .to_string();
    assert!(msg.contains("rank 1 did not finish"), "{msg}");
    let folders = RunDir::new(run.path()).checkpoint_folders()?;
    assert!(
        folders.iter().all(|f| !f.committed),
        "nothing committed after a failed commit: {folders:?}"
    );
    Ok(())
}

#[test]
fn mismatched_checkpoints_are_refused_saying_which_part_differs() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 2)?;
    let ckpt = open(run.path(), 10)?;
    let (m, same) = (model(), run_record());
    let other_params = ModelFingerprint {
        params: "p2".into(),
        ..model()
    };
    let msg = ckpt
        .check_matches(&expected(&other_params, &same))
        .expect_err("other shapes")
        .to_string();
    assert!(msg.contains("parameter set"), "{msg}");

    // Another lr and other LM weights: both named, old -> new, with the escape hatch.
    let changed = record(&[
        ("lm_weights", "lw2"),
        ("lr", "0.002"),
        ("seed", "5"),
        ("shards", "d1"),
        ("stage", "1"),
    ]);
    let msg = ckpt
        .check_matches(&expected(&m, &changed))
        .expect_err("other lr")
        .to_string();
    assert!(
        msg.contains("lm_weights: lw1 -> lw2, lr: 0.001 -> 0.002")
            && msg.contains("--resume-changing lm_weights,lr"),
        "{msg}"
    );
    let allowed = ["lm_weights".to_string(), "lr".to_string()];
    ckpt.check_matches(&Expected {
        allow_changing: &allowed,
        ..expected(&m, &changed)
    })?;
    let only_lr = ["lr".to_string()];
    let msg = ckpt
        .check_matches(&Expected {
            allow_changing: &only_lr,
            ..expected(&m, &changed)
        })
        .expect_err("lm_weights not allowed")
        .to_string();
    assert!(
        msg.contains("lm_weights: lw1 -> lw2") && !msg.contains("lr:"),
        "{msg}"
    );
    let typo = ["learning_rate".to_string()];
    let msg = ckpt
        .check_matches(&Expected {
            allow_changing: &typo,
            ..expected(&m, &same)
        })
        .expect_err("unknown key")
        .to_string();
    assert!(
        msg.contains("no such run-record key") && msg.contains("lr"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn a_checkpoint_of_an_older_format_is_refused_naming_it_and_the_remedy() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 2)?;
    // What a format-3 checkpoint's meta.json held: no run record, no plan world size.
    let meta = RunDir::new(run.path()).checkpoint(10).join("meta.json");
    let mut value: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta)?)?;
    value["format_version"] = 3.into();
    if let Some(fields) = value.as_object_mut() {
        fields.remove("run");
        fields.remove("plan_world_size");
    }
    std::fs::write(&meta, serde_json::to_vec(&value)?)?;
    let msg = open(run.path(), 10).expect_err("format 3").to_string();
    assert!(
        msg.contains("step-00000010")
            && msg.contains("checkpoint format 3")
            && msg.contains("reads format 4 only")
            && msg.contains("train the run again"),
        "{msg}"
    );
    // A resume, an export or --init-projector stops at it instead of passing it over.
    let err = RunDir::new(run.path())
        .newest_complete_checkpoint()
        .err()
        .map(|e| e.to_string());
    assert_eq!(err.as_deref(), Some(msg.as_str()));
    Ok(())
}

#[test]
fn meta_json_names_the_strategy_as_the_config_does() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 2)?;
    let meta = RunDir::new(run.path()).checkpoint(10).join("meta.json");
    let mut value: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta)?)?;
    assert_eq!(value["strategy"], "full_shard");
    value["strategy"] = "zero_three".into();
    std::fs::write(&meta, serde_json::to_vec(&value)?)?;
    let err = open(run.path(), 10).expect_err("no such strategy");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("meta.json") && msg.contains("zero_three"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn resume_changing_accepts_a_knob_only_one_record_holds() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 2)?;
    let ckpt = open(run.path(), 10)?;
    let mut lora = run_record();
    lora.insert("lora_r".into(), "128".into());
    let msg = ckpt
        .check_matches(&expected(&model(), &lora))
        .expect_err("LoRA added")
        .to_string();
    assert!(
        msg.contains("lora_r: (none) -> 128") && msg.contains("--resume-changing lora_r"),
        "{msg}"
    );
    let allowed = ["lora_r".to_string()];
    ckpt.check_matches(&Expected {
        allow_changing: &allowed,
        ..expected(&model(), &lora)
    })?;
    // A knob of the list that neither record holds is still a key, and changes nothing.
    ckpt.check_matches(&Expected {
        allow_changing: &allowed,
        ..expected(&model(), &run_record())
    })?;
    Ok(())
}

#[test]
fn prune_keeps_the_last_n_and_every_mth() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    for step in 1..=9 {
        write(run.path(), step, 1)?;
    }
    let dir = RunDir::new(run.path());
    let w = CheckpointWriter::begin(&dir, 5, 0)?;
    std::fs::write(w.dir().join("params.bin"), b"a killed write")?;
    let removed = prune(&dir, 3, 4)?;
    assert_eq!(removed, vec![1, 2, 3, 5, 6]);
    let mut left: Vec<String> = std::fs::read_dir(dir.checkpoints())?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    left.sort();
    assert_eq!(
        left,
        [
            "step-00000004",
            "step-00000007",
            "step-00000008",
            "step-00000009"
        ]
    );
    Ok(())
}

#[test]
fn corrupt_files_and_metadata_are_refused_naming_the_file() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 2)?;
    let dir = RunDir::new(run.path()).checkpoint(10);
    std::fs::write(dir.join("rank-00001").join("params.bin"), vec![9u8; 64])?;
    let ckpt = open(run.path(), 10)?;
    ckpt.rank_dir(0)?;
    let msg = ckpt.rank_dir(1).expect_err("flipped bytes").to_string();
    assert!(
        msg.contains("corrupt") && msg.contains("rank 1: params.bin"),
        "{msg}"
    );
    std::fs::remove_file(dir.join("rank-00000").join("params.bin"))?;
    let msg = ckpt.rank_dir(0).expect_err("deleted file").to_string();
    assert!(msg.contains("params.bin is missing"), "{msg}");
    std::fs::write(dir.join("meta.json"), b"{\"format_version\": 1, \"step\"")?;
    let err = open(run.path(), 10).expect_err("truncated meta");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("corrupt: cannot read") && msg.contains("meta.json: EOF while parsing"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn rewriting_a_step_replaces_the_old_folder() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 1)?;
    write(run.path(), 10, 1)?;
    let ckpt = open(run.path(), 10)?;
    assert_eq!(ckpt.meta.step, 10);
    ckpt.rank_dir(0)?;
    Ok(())
}

#[test]
fn resume_picks_the_newest_complete_checkpoint_and_lists_what_it_skipped() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    let dir = RunDir::new(run.path());
    assert!(dir.newest_complete_checkpoint()?.checkpoint.is_none());
    write(run.path(), 10, 2)?;
    write(run.path(), 20, 2)?;
    write(run.path(), 30, 2)?;
    // Step 40: killed while writing (never renamed); step 30: a file damaged after commit.
    let w = CheckpointWriter::begin(&dir, 40, 0)?;
    std::fs::write(w.dir().join("params.bin"), b"partial")?;
    std::fs::write(
        dir.checkpoint(30).join("rank-00001").join("params.bin"),
        vec![9u8; 64],
    )?;
    let pick = dir.newest_complete_checkpoint()?;
    assert_eq!(pick.checkpoint.as_ref().map(|c| c.meta.step), Some(20));
    let skipped: Vec<(&str, &str)> = pick
        .skipped
        .iter()
        .map(|s| (s.checkpoint.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert_eq!(skipped[0].0, "checkpoints/step-00000040.tmp");
    assert!(skipped[0].1.contains("never committed"), "{skipped:?}");
    assert_eq!(skipped[1].0, "checkpoints/step-00000030");
    assert!(
        skipped[1].1.contains("rank 1: params.bin does not match"),
        "{skipped:?}"
    );
    // Nothing usable at all: every folder is listed.
    std::fs::write(dir.checkpoint(20).join("meta.json"), b"{")?;
    std::fs::remove_dir_all(dir.checkpoint(10))?;
    let pick = dir.newest_complete_checkpoint()?;
    assert!(pick.checkpoint.is_none());
    assert_eq!(pick.skipped.len(), 3);
    assert!(
        pick.skipped[2]
            .reason
            .contains("meta.json: EOF while parsing"),
        "{:?}",
        pick.skipped
    );
    Ok(())
}
