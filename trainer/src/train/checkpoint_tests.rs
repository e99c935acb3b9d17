//! Checkpoint container: atomic commit, latest-complete selection, and refusal messages.
use super::checkpoint::*;
use std::path::Path;

fn model() -> ModelFingerprint {
    ModelFingerprint {
        vision_config: "v1".into(),
        lm_config: "l1".into(),
        params: "p1".into(),
    }
}

fn meta(step: u64, world_size: usize) -> CheckpointMeta {
    CheckpointMeta {
        format_version: FORMAT_VERSION,
        step,
        world_size,
        strategy: "full_shard".into(),
        stage: 1,
        model: model(),
        data_fingerprint: "d1".into(),
        config: serde_json::json!({}),
    }
}

fn write(run: &Path, step: u64, world_size: usize) -> anyhow::Result<()> {
    let writers: Vec<_> = (0..world_size)
        .map(|r| CheckpointWriter::begin(run, step, r))
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

fn expected(m: &ModelFingerprint) -> Expected<'_> {
    Expected {
        world_size: 2,
        stage: 1,
        model: m,
        data_fingerprint: "d1",
    }
}

#[test]
fn latest_complete_checkpoint_wins_and_tmp_folders_are_ignored() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    assert!(Checkpoint::latest(run.path())?.is_none());
    write(run.path(), 10, 2)?;
    write(run.path(), 20, 2)?;
    // A write that never committed (a killed run): only its rank folders exist.
    let w = CheckpointWriter::begin(run.path(), 30, 0)?;
    std::fs::write(w.dir().join("params.bin"), b"partial")?;
    let ckpt = Checkpoint::latest(run.path())?.expect("a complete checkpoint");
    assert_eq!(ckpt.meta.step, 20);
    ckpt.check_matches(&expected(&model()))?;
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
    let w0 = CheckpointWriter::begin(run.path(), 5, 0)?;
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
    assert!(
        Checkpoint::latest(run.path())?.is_none(),
        "nothing visible after a failed commit"
    );
    Ok(())
}

#[test]
fn mismatched_checkpoints_are_refused_saying_which_part_differs() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 2)?;
    let ckpt = Checkpoint::latest(run.path())?.expect("checkpoint");
    let m = model();
    let msg = ckpt
        .check_matches(&Expected {
            world_size: 4,
            ..expected(&m)
        })
        .expect_err("other W")
        .to_string();
    assert!(
        msg.contains("written by 2 ranks but this run has 4") && msg.contains("--nproc 2"),
        "{msg}"
    );
    let other_lm = ModelFingerprint {
        lm_config: "l2".into(),
        ..model()
    };
    let msg = ckpt
        .check_matches(&expected(&other_lm))
        .expect_err("other LM")
        .to_string();
    assert!(
        msg.contains("another model") && msg.contains("LM config"),
        "{msg}"
    );
    let other_params = ModelFingerprint {
        params: "p2".into(),
        ..model()
    };
    let msg = ckpt
        .check_matches(&expected(&other_params))
        .expect_err("other shapes")
        .to_string();
    assert!(msg.contains("parameter set"), "{msg}");
    let msg = ckpt
        .check_matches(&Expected {
            data_fingerprint: "d2",
            ..expected(&m)
        })
        .expect_err("other data")
        .to_string();
    assert!(
        msg.contains("other data") && msg.contains("d1") && msg.contains("d2"),
        "{msg}"
    );
    let msg = ckpt
        .check_matches(&Expected {
            stage: 2,
            ..expected(&m)
        })
        .expect_err("other stage")
        .to_string();
    assert!(msg.contains("stage 1 run; this run is stage 2"), "{msg}");
    Ok(())
}

#[test]
fn corrupt_files_and_metadata_are_refused_naming_the_file() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 2)?;
    let dir = run.path().join("checkpoints").join(step_dir_name(10));
    std::fs::write(dir.join("rank-00001").join("params.bin"), vec![9u8; 64])?;
    let ckpt = Checkpoint::latest(run.path())?.expect("checkpoint");
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
    let msg = Checkpoint::latest(run.path())
        .expect_err("truncated meta")
        .to_string();
    assert!(
        msg.contains("corrupt") && msg.contains("meta.json is not valid"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn rewriting_a_step_replaces_the_old_folder() -> anyhow::Result<()> {
    let run = tempfile::tempdir()?;
    write(run.path(), 10, 1)?;
    write(run.path(), 10, 1)?;
    let ckpt = Checkpoint::latest(run.path())?.expect("checkpoint");
    assert_eq!(ckpt.meta.step, 10);
    ckpt.rank_dir(0)?;
    Ok(())
}
