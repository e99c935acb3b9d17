//! A disk that fills up, on a small tmpfs each test mounts (root with CAP_SYS_ADMIN only: a
//! test fails elsewhere, unless the machine opts out with `TESSERA_TESTS_SKIP=mount`, which
//! marks them ignored) and unmounts even when it fails:
//! - a checkpoint that does not fit stops the run with a plain message naming the file, the
//!   bytes it needed and the bytes free, after a warning before the write; its partial folder
//!   is gone, the last committed checkpoint is intact, and once the disk is bigger `--resume`
//!   ends with the losses of an uninterrupted run;
//! - a disk too small for any checkpoint is said at the start of the run;
//! - `metrics.jsonl` (and `plan.jsonl`) on a full disk stop the run the same way, no torn line
//!   left;
//! - an ingest whose shards do not fit stops naming the shard, leaves no partial shard, and
//!   `--resume` on a bigger disk writes the shards a clean ingest writes, byte for byte.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::process::Stdio;

use crate::support;
use support::metrics::{losses, read_metrics};
use support::tmpfs;
use support::{fixture, full_finetune, ingest, run_err, run_ok, tessera, wait_until, Fixture};
use tmpfs::{pages_bytes, Tmpfs};

/// The message of a full disk, for `file`: plain words, no Rust debug form.
fn says_disk_full(stderr: &str, file: &str) -> Result<()> {
    ensure!(
        stderr.contains(&format!("{file}: the disk is full: writing it needs "))
            && stderr.contains(" free; free some space")
            && !stderr.contains("Os {")
            && !stderr.contains("StorageFull"),
        "no plain full-disk message naming {file}: {stderr}"
    );
    Ok(())
}

/// The bytes the message says the write needed.
fn needed_bytes(stderr: &str) -> Result<u64> {
    let after = stderr
        .split("writing it needs ")
        .nth(1)
        .context("no `needs`")?;
    let digits: String = after
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    Ok(digits.parse()?)
}

fn leftovers(dir: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in walk(dir)? {
        let name = entry.to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            found.push(name);
        }
    }
    Ok(found)
}

fn walk(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    if dir.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            out.extend(walk(&path)?);
            out.push(path);
        }
    }
    Ok(out)
}

const STEPS: [&str; 6] = [
    "--steps",
    "4",
    "--checkpoint-every",
    "2",
    "--keep-checkpoints",
    "1",
];

#[test]
#[cfg_attr(
    tessera_skip_mount,
    ignore = "TESSERA_TESTS_SKIP=mount: mounting a tmpfs needs root with CAP_SYS_ADMIN"
)]
fn a_checkpoint_that_does_not_fit_stops_the_run_plainly_and_resume_continues_once_space_is_freed(
) -> Result<()> {
    let f = fixture(60, 0.0)?;
    let straight = f.root.join("straight");
    run_ok(&mut full_finetune(&f, &straight, &STEPS))?;
    let checkpoint = pages_bytes(&straight.join("checkpoints/step-00000004"))?;
    let rest = pages_bytes(&straight)? - pages_bytes(&straight.join("checkpoints"))?;
    // Everything else and one and a half checkpoints: step 2's fits; step 4's does not (the
    // older one is pruned only once the newer one is committed).
    let disk = Tmpfs::mount(rest + checkpoint * 3 / 2)?;
    let run = disk.path.join("run");
    let stderr = run_err(&mut full_finetune(&f, &run, &STEPS))?;
    says_disk_full(
        &stderr,
        "checkpoints/step-00000004.tmp/rank-00000/shards.safetensors",
    )?;
    let file = std::fs::metadata(
        straight.join("checkpoints/step-00000004/rank-00000/shards.safetensors"),
    )?
    .len();
    let needed = needed_bytes(&stderr)?;
    ensure!(
        (file..file + 64 * 1024).contains(&needed),
        "the message says {needed} bytes for a file of {file}: {stderr}"
    );
    ensure!(
        stderr.contains("the checkpoint of step 4 needs about") && stderr.contains("will not fit"),
        "no warning before the write: {stderr}"
    );
    let left = leftovers(&run)?;
    ensure!(
        left.is_empty(),
        "partial files left on the full disk: {left:?}"
    );
    ensure!(
        run.join("checkpoints/step-00000002/meta.json").is_file(),
        "the committed checkpoint of step 2 is gone"
    );

    disk.resize(rest + checkpoint * 3)?;
    let out = run_ok(
        full_finetune(&f, &run, &STEPS)
            .arg("--resume")
            .env("RUST_LOG", "info"),
    )?;
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(log.contains("step-00000002 (step 2"), "{log}");
    assert_eq!(losses(&run)?, losses(&straight)?);
    Ok(())
}

#[test]
#[cfg_attr(
    tessera_skip_mount,
    ignore = "TESSERA_TESTS_SKIP=mount: mounting a tmpfs needs root with CAP_SYS_ADMIN"
)]
fn a_disk_too_small_for_any_checkpoint_is_said_at_the_start() -> Result<()> {
    let f = fixture(40, 0.0)?;
    let straight = f.root.join("straight");
    let steps = ["--steps", "2", "--checkpoint-every", "2"];
    run_ok(&mut full_finetune(&f, &straight, &steps))?;
    let checkpoint = pages_bytes(&straight.join("checkpoints/step-00000002"))?;
    let rest = pages_bytes(&straight)? - pages_bytes(&straight.join("checkpoints"))?;
    let disk = Tmpfs::mount(rest + checkpoint / 2)?;
    let run = disk.path.join("run");
    let out = full_finetune(&f, &run, &steps).output()?;
    let (status, stderr) = (out.status, String::from_utf8_lossy(&out.stderr));
    ensure!(
        !status.success(),
        "a checkpoint larger than the disk was written"
    );
    let warned = stderr
        .find("the checkpoint of step 2 needs about")
        .with_context(|| format!("no warning at the start: {stderr}"))?;
    let failed = stderr.find("the disk is full").context("no failure")?;
    ensure!(
        warned < failed,
        "the warning came after the failure: {stderr}"
    );
    says_disk_full(&stderr, "shards.safetensors")?;
    let left = leftovers(&run)?;
    ensure!(left.is_empty(), "partial files left: {left:?}");
    Ok(())
}

#[test]
#[cfg_attr(
    tessera_skip_mount,
    ignore = "TESSERA_TESTS_SKIP=mount: mounting a tmpfs needs root with CAP_SYS_ADMIN"
)]
fn a_full_disk_under_the_step_logs_stops_the_run_naming_the_file() -> Result<()> {
    let f = fixture(40, 0.0)?;
    let disk = Tmpfs::mount(64 << 20)?;
    let run = disk.path.join("run");
    let mut child = full_finetune(&f, &run, &["--steps", "400", "--checkpoint-every", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let metrics = run.join("metrics.jsonl");
    wait_until(&mut child, "two steps in metrics.jsonl", || {
        std::fs::read_to_string(&metrics).is_ok_and(|m| m.lines().count() >= 2)
    })?;
    disk.fill()?;
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the run went on with a full disk");
    let file = if stderr.contains("metrics.jsonl: the disk is full") {
        "metrics.jsonl"
    } else {
        "plan.jsonl"
    };
    says_disk_full(&stderr, file)?;
    let needed = needed_bytes(&stderr)?;
    ensure!(
        (10..8192).contains(&needed),
        "a step's line does not need {needed} bytes: {stderr}"
    );
    // Every line left is whole: the failed append was cut back.
    for name in ["metrics.jsonl", "plan.jsonl"] {
        let text = std::fs::read_to_string(run.join(name))?;
        ensure!(
            text.is_empty() || text.ends_with('\n'),
            "{name} ends in a torn line"
        );
    }
    let steps = read_metrics(&metrics)?;
    ensure!(
        steps.len() >= 2 && steps.len() < 400,
        "{} steps",
        steps.len()
    );
    Ok(())
}

/// `cmd` (an ingest of the fixture's records) with shards of about 200 KB.
fn small_shards(f: &Fixture, out: &Path) -> std::process::Command {
    let mut cmd = ingest(tessera(), &f.root.join("llava"), out);
    cmd.args(["--shard-size", "200000"]);
    cmd
}

#[test]
#[cfg_attr(
    tessera_skip_mount,
    ignore = "TESSERA_TESTS_SKIP=mount: mounting a tmpfs needs root with CAP_SYS_ADMIN"
)]
fn an_ingest_onto_a_full_disk_stops_naming_the_shard_and_resumes_to_the_same_shards() -> Result<()>
{
    let f = fixture(60, 0.0)?;
    let clean = f.root.join("clean");
    run_ok(&mut small_shards(&f, &clean))?;
    let mut shards: Vec<String> = std::fs::read_dir(&clean)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    shards.retain(|n| n.ends_with(".parquet"));
    shards.sort();
    ensure!(
        shards.len() >= 4,
        "{} shards: the test needs more",
        shards.len()
    );
    let all = pages_bytes(&clean)?;
    // Two shards, the journal, and half of the third shard fit.
    let room = pages_bytes(&clean.join(&shards[0]))?
        + pages_bytes(&clean.join(&shards[1]))?
        + 16 * 1024
        + pages_bytes(&clean.join(&shards[2]))? / 2;
    let disk = Tmpfs::mount(room)?;
    let out_dir = disk.path.join("shards");
    let stderr = run_err(&mut small_shards(&f, &out_dir))?;
    says_disk_full(&stderr, &shards[2])?;
    let needed = needed_bytes(&stderr)?;
    ensure!(
        needed >= 200_000,
        "a shard of --shard-size 200000 needs {needed}? {stderr}"
    );
    let left = leftovers(&out_dir)?;
    ensure!(left.is_empty(), "partial files left: {left:?}");

    disk.resize(all * 2)?;
    run_ok(small_shards(&f, &out_dir).arg("--resume"))?;
    for name in shards.iter().chain([&"index.json".to_string()]) {
        let (a, b) = (
            std::fs::read(clean.join(name))?,
            std::fs::read(out_dir.join(name))?,
        );
        ensure!(a == b, "{name} differs from the clean ingest's");
    }
    Ok(())
}
