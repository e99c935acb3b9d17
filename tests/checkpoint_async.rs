//! `--checkpoint-write async`, end to end through the binary (tiny model, synth shards, a full
//! fine-tune of projector, LM and tower at W=2, FULL_SHARD):
//! - its checkpoints hold the same bytes as `sync` ones (every rank's shards and moments, its
//!   position, the layout), and the run's losses are the same;
//! - training goes on while a checkpoint is being written, and a kill in the middle of that
//!   write resumes from the last committed checkpoint with the uninterrupted run's losses;
//!   the launcher's SIGKILL takes its ranks with it.
#![cfg(feature = "train")]
use anyhow::{ensure, Result};
use std::path::Path;
use std::process::Stdio;

use crate::support;
use support::metrics::{losses, read_metrics};
use support::{ensure_nothing_left, fixture, full_finetune, run_ok, wait_until};

const STEPS: [&str; 8] = [
    "--steps",
    "6",
    "--checkpoint-every",
    "2",
    "--nproc",
    "2",
    "--keep-checkpoints",
    "3",
];

/// The files of checkpoint `step` that hold training state, by name relative to the folder
/// (`meta.json` records the config, which differs in `checkpoint_write` itself).
fn state_files(run: &Path, step: u64) -> Result<Vec<(String, Vec<u8>)>> {
    let dir = run.join(format!("checkpoints/step-{step:08}"));
    let mut files = Vec::new();
    for rank in ["rank-00000", "rank-00001"] {
        for name in ["shards.safetensors", "state.json", "layout.json"] {
            let path = dir.join(rank).join(name);
            if path.is_file() {
                files.push((format!("{rank}/{name}"), std::fs::read(&path)?));
            }
        }
    }
    ensure!(
        files
            .iter()
            .filter(|(n, _)| n.ends_with("shards.safetensors"))
            .count()
            == 2,
        "{}: each of the 2 ranks writes its shards",
        dir.display()
    );
    Ok(files)
}

#[test]
fn async_checkpoints_hold_the_same_state_as_sync_ones_and_the_losses_do_not_change() -> Result<()> {
    let f = fixture(120, 0.2)?;
    let sync = f.root.join("sync");
    let background = f.root.join("async");
    run_ok(&mut full_finetune(&f, &sync, &STEPS))?;
    run_ok(full_finetune(&f, &background, &STEPS).args(["--checkpoint-write", "async"]))?;
    assert_eq!(losses(&background)?, losses(&sync)?);
    for step in [2, 4, 6] {
        let (want, got) = (state_files(&sync, step)?, state_files(&background, step)?);
        let names = |files: &[(String, Vec<u8>)]| -> Vec<String> {
            files.iter().map(|(n, _)| n.clone()).collect()
        };
        assert_eq!(names(&got), names(&want), "step {step}");
        for ((name, a), (_, b)) in want.iter().zip(&got) {
            assert!(a == b, "step {step}: {name} differs between sync and async");
        }
        assert!(background
            .join(format!("checkpoints/step-{step:08}/meta.json"))
            .is_file());
    }
    Ok(())
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "pauses a checkpoint write through TESSERA_CHECKPOINT_PAUSE_AT: --features test-hooks"
)]
fn training_goes_on_during_an_async_write_and_a_kill_in_it_resumes_from_the_last_commit(
) -> Result<()> {
    let f = fixture(120, 0.2)?;
    let whole = f.root.join("whole");
    run_ok(full_finetune(&f, &whole, &STEPS).args(["--checkpoint-write", "async"]))?;

    // The write of step 4's checkpoint stops after the tensors and never finishes.
    let run = f.root.join("killed");
    let mut child = full_finetune(&f, &run, &STEPS)
        .args(["--checkpoint-write", "async"])
        .env("TESSERA_CHECKPOINT_PAUSE_AT", "4")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    // Steps 4 and 5 train while it hangs (the run then waits for it before step 6's
    // checkpoint, one write being in flight at a time).
    let metrics = run.join("metrics.jsonl");
    let trained_to_5 =
        || read_metrics(&metrics).is_ok_and(|m| m.last().is_some_and(|s| s.step == 5));
    wait_until(&mut child, "step 5 in metrics.jsonl", trained_to_5)?;
    // SIGKILL to the launcher: its ranks go too, none is left waiting on its peers.
    child.kill()?;
    child.wait()?;
    ensure_nothing_left(&run)?;
    let checkpoints = run.join("checkpoints");
    assert!(checkpoints.join("step-00000002/meta.json").is_file());
    assert!(checkpoints.join("step-00000004.tmp").is_dir());
    assert!(!checkpoints.join("step-00000004").exists());

    let out = run_ok(
        full_finetune(&f, &run, &STEPS)
            .args(["--checkpoint-write", "async", "--resume"])
            .env("RUST_LOG", "info"),
    )?;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("resumed from") && log.contains("step-00000002 (step 2"),
        "{log}"
    );
    assert_eq!(losses(&run)?, losses(&whole)?);
    Ok(())
}
