//! A flaky object store, through the binary: a fault-injecting proxy (`support/fault_proxy.rs`)
//! in front of moto's S3 server fails a share of the requests with HTTP 503, answers cut
//! mid-way, or stalls past the client's timeout (`TESSERA_REMOTE_TIMEOUT_S`, shortened here).
//! - With every 10th GET failing, `train --shards s3://...` ends with the losses of the same
//!   run on a healthy store, and `metrics.jsonl` and `summary.json` count the retries (as many
//!   as the proxy injected faults).
//! - A shard object deleted mid-run fails the run at once (a 404 is not retried), naming the
//!   object and the shard; once the object is back, `--resume` finishes with the losses of an
//!   uninterrupted run.
//! - `ingest --out s3://...` with PUTs, multipart parts and their completions failing too
//!   writes the same objects, byte for byte, as a healthy upload, and no other object.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use fault_proxy::{Fault, FaultProxy, Rule};
use moto::MotoServer;
use support::fault_proxy;
use support::metrics::{losses, read_metrics};
use support::moto;
use support::{fixture, ingest, run_ok, tessera, tokenizer, train_command, Fixture, TrainArgs};

/// Stalls outlast the 1 s timeout the runs below set.
const STALL: Duration = Duration::from_secs(3);

/// The environment of a client of `proxy`, with a short timeout and backoff so that faults
/// cost the test little time (the policy is the one a user sets through these switches).
fn through(mut cmd: Command, proxy: &FaultProxy) -> Command {
    for (key, value) in proxy.env() {
        cmd.env(key, value);
    }
    cmd.env("TESSERA_REMOTE_TIMEOUT_S", "1")
        .env("TESSERA_REMOTE_BACKOFF_MS", "10")
        .env("TESSERA_REMOTE_RETRY_S", "30");
    cmd
}

fn train(f: &Fixture, shards: &str, out: &Path, extra: &[&str]) -> Command {
    let args = TrainArgs {
        shards: shards.as_ref(),
        lm: &f.lm,
        stage: 1,
        token_budget: 512,
    };
    let mut cmd = train_command(tessera(), f, args, out, extra);
    // No cache: every step reads from the store.
    cmd.args(["--cache-limit", "0"]);
    cmd
}

fn every_tenth_get() -> Vec<Rule> {
    vec![Rule {
        method: "GET",
        every: 10,
        faults: vec![Fault::Unavailable, Fault::CutBody, Fault::Stall],
    }]
}

#[test]
fn with_every_tenth_get_failing_training_keeps_its_losses_and_counts_the_retries() -> Result<()> {
    let f = fixture(48, 0.0)?;
    let server = MotoServer::start()?;
    server.create_bucket("datasets")?;
    let url = server.upload_dir(&f.shards, "datasets", "flaky")?;
    let steps = ["--steps", "12"];
    let healthy = f.root.join("healthy");
    run_ok(&mut train(
        &f,
        &f.shards.to_string_lossy(),
        &healthy,
        &steps,
    ))?;

    let proxy = FaultProxy::start(server.port, every_tenth_get(), STALL)?;
    let flaky = f.root.join("flaky");
    let started = Instant::now();
    run_ok(&mut through(train(&f, &url, &flaky, &steps), &proxy))?;
    let took = started.elapsed();
    let log = proxy.log();
    let injected = log.injected_into("GET");
    ensure!(
        injected >= 3,
        "the proxy failed only {injected} of {:?} requests: the test needs each fault kind",
        log.requests
    );
    assert_eq!(
        losses(&flaky)?,
        losses(&healthy)?,
        "losses through a flaky store"
    );
    let retried: u64 = read_metrics(&flaky.join("metrics.jsonl"))?
        .iter()
        .map(|m| m.store_retries)
        .sum();
    assert_eq!(
        retried, injected as u64,
        "metrics.jsonl counts {retried} retries; the proxy failed {injected} requests ({:?})",
        log.injected
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(flaky.join("summary.json"))?)?;
    assert_eq!(summary["store_retries"], injected as u64);
    eprintln!(
        "{injected} of {} GETs failed ({:?}); the run took {:.1} s",
        log.requests.get("GET").copied().unwrap_or(0),
        log.injected,
        took.as_secs_f64()
    );
    Ok(())
}

#[test]
fn a_shard_gone_for_good_fails_the_run_naming_it_and_resume_works_once_it_is_back() -> Result<()> {
    let f = fixture(48, 0.0)?;
    // Shards of about 8 samples, so that every step reads several of them.
    let sharded = f.root.join("sharded");
    run_ok(ingest(tessera(), &f.root.join("llava"), &sharded).args(["--shard-size", "250000"]))?;
    let shard = "shard-00001.parquet";
    ensure!(sharded.join(shard).is_file(), "the ingest made one shard");
    let server = MotoServer::start()?;
    server.create_bucket("datasets")?;
    let url = server.upload_dir(&sharded, "datasets", "gone")?;
    let steps = ["--steps", "30", "--checkpoint-every", "2"];
    let straight = f.root.join("straight");
    run_ok(&mut train(
        &f,
        &sharded.to_string_lossy(),
        &straight,
        &steps,
    ))?;

    let proxy = FaultProxy::start(server.port, every_tenth_get(), STALL)?;
    let run = f.root.join("run");
    let mut child = through(train(&f, &url, &run, &steps), &proxy)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let committed = run.join("checkpoints/step-00000002/meta.json");
    let deadline = Instant::now() + Duration::from_secs(240);
    while !committed.is_file() {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("the run ended ({status}) before its first checkpoint");
        }
        ensure!(Instant::now() < deadline, "no checkpoint within 240 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.delete("datasets", &format!("gone/{shard}"))?;
    let deleted = Instant::now();
    let out = child.wait_with_output()?;
    let took = deleted.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the run survived a deleted shard");
    ensure!(
        stderr.contains(&format!("{url}/{shard}: not found"))
            && stderr.contains(&format!("shard {shard}"))
            && stderr.contains("gone from the store"),
        "the failure does not name the object and the shard: {stderr}"
    );
    // A 404 is not retried: well within the 30 s retry budget the run was given.
    ensure!(
        took < Duration::from_secs(30),
        "the run took {took:?} to give up"
    );

    server.put(
        "datasets",
        &format!("gone/{shard}"),
        &std::fs::read(sharded.join(shard))?,
    )?;
    proxy.set_rules(Vec::new());
    let out = run_ok(
        through(train(&f, &url, &run, &steps), &proxy)
            .arg("--resume")
            .env("RUST_LOG", "info"),
    )?;
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(log.contains("resumed from"), "{log}");
    assert_eq!(losses(&run)?, losses(&straight)?);
    eprintln!(
        "the run stopped {:.1} s after the shard was deleted",
        took.as_secs_f64()
    );
    Ok(())
}

#[test]
fn ingest_to_a_flaky_store_uploads_the_same_objects_and_nothing_else() -> Result<()> {
    let f = fixture(48, 0.0)?;
    let server = MotoServer::start()?;
    server.create_bucket("datasets")?;
    let llava = f.root.join("llava");
    let proxy = FaultProxy::start(
        server.port,
        vec![
            // Whole objects and multipart parts.
            Rule {
                method: "PUT",
                every: 3,
                faults: vec![Fault::Unavailable, Fault::CutBody, Fault::Stall],
            },
            // Creating and completing multipart uploads (not idempotent: refused before
            // they reach the server, as a throttling store does).
            Rule {
                method: "POST",
                every: 2,
                faults: vec![Fault::Unavailable],
            },
            Rule {
                method: "HEAD",
                every: 3,
                faults: vec![Fault::Unavailable, Fault::Stall],
            },
        ],
        STALL,
    )?;
    let url = "s3://datasets/flaky-ingest";
    // The fixture's ingest again (not --quiet: the upload's summary line counts the retries).
    let mut cmd = through(tessera(), &proxy);
    cmd.args(["ingest", "--json"])
        .arg(llava.join("blip_laion_cc_sbu_558k.json"))
        .arg("--images")
        .arg(llava.join("images"))
        .arg("--tokenizer")
        .arg(tokenizer())
        .args(["--out", url, "--staging"])
        .arg(f.root.join("staging"));
    let out = run_ok(&mut cmd)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = proxy.log();
    for method in ["PUT", "POST", "HEAD"] {
        ensure!(
            log.injected_into(method) > 0,
            "no {method} failed: {:?} of {:?}",
            log.injected,
            log.requests
        );
    }
    ensure!(
        stderr.contains("requests failed and were retried"),
        "the upload does not count its retries: {stderr}"
    );

    // Byte for byte what the fixture's healthy ingest wrote locally, and nothing else: no
    // partial object under a final name.
    let mut want: Vec<String> = std::fs::read_dir(&f.shards)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    want.retain(|n| n != "ingest_report.json");
    want.sort();
    let mut got: Vec<String> = server
        .list("datasets", "flaky-ingest")?
        .into_iter()
        .map(|k| k.trim_start_matches("flaky-ingest/").to_string())
        .collect();
    got.sort();
    assert_eq!(got, want, "objects uploaded");
    for name in &want {
        let stored = server.get("datasets", &format!("flaky-ingest/{name}"))?;
        let local = std::fs::read(f.shards.join(name)).with_context(|| name.clone())?;
        ensure!(
            stored == local,
            "{name}: the stored object differs from the ingest's file"
        );
    }
    // The same shards: verify reads them back through the healthy store.
    proxy.set_rules(Vec::new());
    let mut verify = through(tessera(), &proxy);
    run_ok(verify.args(["shards", "verify", url]))?;
    Ok(())
}
