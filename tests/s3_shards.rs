//! `--shards s3://...` end to end, through the binary, against moto's S3 server on 127.0.0.1:
//! `ingest --out s3://...`, then `shards verify` and `shards stats` on the URL; 20 training steps from the URL give the
//! losses the same shards give from local disk (and the run keeps the shards' tokenizer, uploaded
//! beside index.json); a server killed mid-run fails the run naming
//! the URL once the retries are spent.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use moto::MotoServer;
use support::metrics::losses;
use support::moto;
use support::{fixture, ingest, run_ok, tessera, tokenizer, train_command, Fixture, TrainArgs};

fn with_server(mut cmd: Command, server: &MotoServer) -> Command {
    for (key, value) in server.env() {
        cmd.env(key, value);
    }
    cmd
}

fn train(f: &Fixture, shards: &str, out: &Path, extra: &[&str]) -> Command {
    let args = TrainArgs {
        shards: shards.as_ref(),
        lm: &f.lm,
        stage: 1,
        token_budget: 512,
    };
    train_command(tessera(), f, args, out, extra)
}

#[test]
fn s3_shards_verify_stat_and_train_like_local_ones() -> Result<()> {
    let f = fixture(48, 0.0)?;
    let server = MotoServer::start()?;
    server.create_bucket("datasets")?;
    // The fixture's ingest again, straight to the server (shards staged, then uploaded).
    let url = "s3://datasets/llava/shards".to_string();
    let llava = f.root.join("llava");
    let mut upload = ingest(with_server(tessera(), &server), &llava, &url);
    upload.arg("--staging").arg(f.root.join("staging"));
    run_ok(&mut upload)?;

    let mut verify = with_server(tessera(), &server);
    let out = run_ok(verify.args(["shards", "verify", &url]))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(stdout.contains("ok: "), "{stdout}");

    let local_dir = f.shards.to_string_lossy().into_owned();
    let stats = |dir: &str| -> Result<serde_json::Value> {
        let mut cmd = with_server(tessera(), &server);
        let out = run_ok(cmd.args(["shards", "stats", "--json", dir]))?;
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    assert_eq!(stats(&url)?, stats(&local_dir)?);

    let local_run = f.root.join("run-local");
    run_ok(&mut train(&f, &local_dir, &local_run, &["--steps", "20"]))?;
    let s3_run = f.root.join("run-s3");
    let cache = f.root.join("cache");
    let mut cmd = with_server(train(&f, &url, &s3_run, &["--steps", "20"]), &server);
    run_ok(cmd.arg("--cache-dir").arg(&cache))?;
    let (local, s3) = (losses(&local_run)?, losses(&s3_run)?);
    assert_eq!(local.len(), 20);
    // Same bytes, same plan, same arithmetic: the same values, printed the same way.
    assert_eq!(s3, local, "losses from s3:// differ from local disk");
    ensure!(
        cache.join("ranges").read_dir()?.count() > 0,
        "nothing cached"
    );
    ensure!(
        std::fs::read(s3_run.join("tokenizer.json"))? == std::fs::read(tokenizer())?,
        "the run from s3:// keeps no copy of the tokenizer.json uploaded beside index.json"
    );
    Ok(())
}

#[test]
fn a_server_killed_mid_run_fails_it_naming_the_url() -> Result<()> {
    let f = fixture(48, 0.0)?;
    let mut server = MotoServer::start()?;
    server.create_bucket("datasets")?;
    let url = server.upload_dir(&f.shards, "datasets", "killed")?;
    let run = f.root.join("run");
    // No cache (a limit of 0 keeps nothing), so every step reads from the server.
    let mut cmd = with_server(
        train(&f, &url, &run, &["--epochs", "40", "--cache-limit", "0"]),
        &server,
    );
    let child = cmd
        .env("TESSERA_REMOTE_RETRY_S", "3")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let metrics = run.join("metrics.jsonl");
    while !std::fs::read_to_string(&metrics).is_ok_and(|m| m.lines().count() >= 2) {
        ensure!(Instant::now() < deadline, "no training steps within 300 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill();
    let out = child.wait_with_output().context("waiting for the run")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the run survived a dead server");
    ensure!(
        stderr.contains(&format!("{url}/shard-00000.parquet")),
        "the failure does not name the shard's URL: {stderr}"
    );
    Ok(())
}

#[test]
fn a_parquet_input_in_s3_ingests_to_the_shards_of_the_local_file() -> Result<()> {
    let l = support::layouts::layouts(&[])?;
    let server = MotoServer::start()?;
    server.create_bucket("inputs")?;
    let file = l.cauldron().join("train.parquet");
    server.put("inputs", "cauldron/train.parquet", &std::fs::read(&file)?)?;
    let ingest = |input: &str, out: &Path| {
        let mut cmd = with_server(tessera(), &server);
        cmd.args(["ingest", "--quiet", "--input", input, "--tokenizer"])
            .arg(tokenizer())
            .args([
                "--template",
                "chatml",
                "--max-rejected-fraction",
                "0.5",
                "--out",
            ])
            .arg(out);
        cmd
    };
    let local = l.root.join("local");
    run_ok(&mut ingest(&file.to_string_lossy(), &local))?;
    // The folder URL (its *.parquet objects) and the object's own URL.
    for (name, url) in [
        ("folder", "s3://inputs/cauldron/"),
        ("object", "s3://inputs/cauldron/train.parquet"),
    ] {
        let out = l.root.join(name);
        run_ok(&mut ingest(url, &out))?;
        let shard = tessera_shards::shard_file_name(0);
        ensure!(
            std::fs::read(out.join(&shard))? == std::fs::read(local.join(&shard))?,
            "{name}: shards from {url} differ from the local file's"
        );
        ensure!(
            std::fs::read(out.join("rejected.jsonl"))?
                == std::fs::read(local.join("rejected.jsonl"))?,
            "{name}: rejections differ"
        );
    }
    Ok(())
}
