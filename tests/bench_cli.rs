//! `tessera bench loader` and `tessera bench plan` from the command line: they run on real
//! shards / a synthetic LLaVA distribution and end with the JSON line the README promises; a
//! bad `TESSERA_*` value stops them before any work.
use crate::support;

use anyhow::{ensure, Context, Result};
use support::{fixture, run_err, run_ok, tessera};

fn last_json(stdout: &[u8]) -> Result<serde_json::Value> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().last().context("no output")?;
    serde_json::from_str(line).with_context(|| format!("last line is not JSON: {line}"))
}

#[test]
fn bench_loader_measures_every_image_against_decode_only() -> Result<()> {
    let fx = fixture(40, 0.25)?;
    // --threads 2 wins over the TESSERA_LOADER_THREADS=1 that pins the tests to one thread.
    let out = run_ok(
        tessera()
            .args(["bench", "loader", "--shards"])
            .arg(&fx.shards)
            .args(["--limit", "12", "--image-size", "64", "--threads", "2"])
            .args(["--rounds", "2", "--no-reference"]),
    )?;
    let json = last_json(&out.stdout)?;
    ensure!(json["images"] == 12, "{json}");
    ensure!(json["rounds"] == 2 && json["threads"] == 2, "{json}");
    for field in [
        "images_per_s",
        "decode_only_images_per_s",
        "ratio_vs_decode_only",
    ] {
        let value = json[field]
            .as_f64()
            .with_context(|| format!("{field} in {json}"))?;
        ensure!(value.is_finite() && value > 0.0, "{field} = {value}");
    }
    ensure!(
        json["reference_images_per_s"].is_null(),
        "reference ran despite --no-reference"
    );
    let stages = &json["stage_seconds"];
    for stage in ["read", "decode", "resize", "assemble"] {
        ensure!(
            stages[stage].as_f64().is_some_and(|s| s > 0.0),
            "{stage}: {stages}"
        );
    }
    Ok(())
}

#[test]
fn bench_plan_puts_pack_bucket_and_fixed_side_by_side() -> Result<()> {
    let out = run_ok(tessera().args([
        "bench",
        "plan",
        "--synthetic-llava",
        "3000",
        "--world-size",
        "4",
        "--token-budget",
        "4096",
    ]))?;
    let json = last_json(&out.stdout)?;
    for mode in ["pack", "bucket"] {
        ensure!(
            json[mode]["type_aligned"] == 1.0,
            "{mode} not type-aligned: {json}"
        );
    }
    let pad = |mode: &str| json[mode]["pad_fraction"].as_f64().unwrap_or(f64::NAN);
    ensure!(
        pad("pack") < pad("fixed"),
        "pack pads no less than fixed: {json}"
    );
    ensure!(json["fixed"]["type_aligned"].as_f64().is_some(), "{json}");
    Ok(())
}

#[test]
fn a_bad_switch_value_stops_the_command_naming_the_variable_and_the_value() -> Result<()> {
    let msg = run_err(tessera().env("TESSERA_LOADER_THREADS", "two").args([
        "bench",
        "plan",
        "--synthetic-llava",
        "100",
        "--world-size",
        "2",
        "--token-budget",
        "4096",
    ]))?;
    ensure!(
        msg.contains(r#"TESSERA_LOADER_THREADS="two": expected a thread count of at least 1"#),
        "{msg}"
    );
    Ok(())
}
