//! One over-long record among good ones, as a user meets it: a caption of thousands of tokens
//! in a LLaVA json. `ingest --max-tokens` rejects it into rejected.jsonl (`too_long`, with its
//! count); ingested without a limit, `train` leaves it out of the plan on every rank (it is in
//! skipped.jsonl with its id, shard and length, and in no step of plan.jsonl), counts it in the
//! summary, and trains on the rest; `--over-long fail` stops before the first step naming the
//! record's id, not an index.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::Path;

use crate::support;
use support::{fixture, ingest, run_err, run_ok, tessera, train_command, Fixture, TrainArgs};

/// The fixture's LLaVA json with record `k`'s caption `words` words long; returns its id.
fn lengthen_caption(f: &Fixture, k: usize, words: usize) -> Result<String> {
    let path = f.root.join("llava/blip_laion_cc_sbu_558k.json");
    let mut records: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&path)?)?;
    let record = records.get_mut(k).context("record k")?;
    let caption = vec!["a striped cat on a red sofa"; words / 7].join(" ");
    record["conversations"][1]["value"] = caption.into();
    let id = record["id"].as_str().context("an id")?.to_string();
    std::fs::write(&path, serde_json::to_vec(&records)?)?;
    Ok(id)
}

fn lines(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

#[test]
fn an_over_long_record_is_rejected_at_ingest_or_left_out_by_train_named_by_its_id() -> Result<()> {
    let f = fixture(24, 0.0)?;
    let id = lengthen_caption(&f, 5, 3000)?;

    // Ingest with a limit: the record is rejected with its count, the others kept.
    let limited = f.root.join("limited");
    let mut cmd = ingest(tessera(), &f.root.join("llava"), &limited);
    run_ok(cmd.args([
        "--max-tokens",
        "600",
        "--image-tokens",
        "64",
        "--max-rejected-fraction",
        "0.1",
    ]))?;
    let rejected = lines(&limited.join("rejected.jsonl"))?;
    ensure!(
        rejected.len() == 1
            && rejected[0]["id"] == id.as_str()
            && rejected[0]["reason"] == "too_long"
            && rejected[0]["detail"]
                .as_str()
                .is_some_and(|d| d.contains("exceed --max-tokens 600")),
        "rejected.jsonl: {rejected:?}"
    );

    // Ingested without a limit, train at W=2 leaves it out and says so.
    let shards = f.root.join("unlimited");
    run_ok(&mut ingest(tessera(), &f.root.join("llava"), &shards))?;
    let args = || TrainArgs {
        shards: shards.as_os_str(),
        lm: &f.lm,
        stage: 1,
        token_budget: 256,
    };
    let run = f.root.join("skip");
    let extra = ["--nproc", "2", "--steps", "3"];
    run_ok(&mut train_command(tessera(), &f, args(), &run, &extra))?;
    let skipped = lines(&run.join("skipped.jsonl"))?;
    ensure!(
        skipped.len() == 1
            && skipped[0]["id"] == id.as_str()
            && skipped[0]["limit"] == 256
            && skipped[0]["tokens"].as_u64().is_some_and(|t| t > 3000)
            && skipped[0]["location"]
                .as_str()
                .is_some_and(|l| l.contains("shard-")),
        "skipped.jsonl: {skipped:?}"
    );
    let index = skipped[0]["index"].as_u64().context("index")?;
    let planned = lines(&run.join("plan.jsonl"))?;
    ensure!(planned.len() == 3, "three steps: {planned:?}");
    for step in &planned {
        let samples: Vec<u64> = serde_json::from_value(step["samples"].clone())?;
        ensure!(
            !samples.contains(&index),
            "step {} trains on it",
            step["step"]
        );
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json"))?)?;
    ensure!(summary["skipped_over_long"] == 1, "summary: {summary}");

    // --over-long fail: the stop names the record by its id, before any step.
    let run = f.root.join("fail");
    let err = run_err(&mut train_command(
        tessera(),
        &f,
        args(),
        &run,
        &["--steps", "1", "--over-long", "fail"],
    ))?;
    ensure!(
        err.contains(&format!("sample {id} (")) && err.contains("--over-long skip"),
        "the stop names the record: {err}"
    );
    let steps = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
    ensure!(steps.trim().is_empty(), "a step ran: {steps}");
    Ok(())
}
