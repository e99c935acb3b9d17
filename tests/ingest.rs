//! `tessera ingest` and `tessera shards` as a user runs them: kill -9 midway then --resume
//! gives the same shards; `shards verify` names a shard with a flipped byte and exits
//! non-zero; malformed json exits non-zero naming the byte offset; pyarrow reads the shards.
#[path = "../ingest/tests/common/mod.rs"]
mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn tessera() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.env("NO_PROGRESS", "1");
    cmd
}

fn ingest_args(f: &Fixture, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "ingest",
        "--json",
        &f.json().to_string_lossy(),
        "--images",
        &f.images().to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--tokenizer".into(),
        tokenizer_path().to_string_lossy().into_owned(),
        "--out".into(),
        out.to_string_lossy().into_owned(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run_ok(cmd: &mut Command) -> anyhow::Result<Output> {
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

/// A few thousand small photos with some bad records mixed in.
fn dataset(records: u32) -> Fixture {
    let mut f = Fixture::new();
    for i in 0..records {
        let id = format!("{:09}", 1_000_000 + i);
        if i % 97 == 5 {
            f.records
                .push(image_record(&id, "00100/absent.jpg", "missing"));
        } else {
            f.add_image(
                &id,
                &jpeg(96 + i % 5 * 16, 72 + i % 3 * 16, i),
                &format!("a photo of thing {i}"),
            );
        }
    }
    f.write_json();
    f
}

#[test]
fn kill_9_midway_then_resume_gives_the_same_shards() -> anyhow::Result<()> {
    let f = dataset(2500);
    let flags = [
        "--shard-size",
        "60000",
        "--workers",
        "2",
        "--max-rejected-fraction",
        "0.05",
    ];
    let reference = f.root.path().join("reference");
    run_ok(tessera().args(ingest_args(&f, &reference, &flags)))?;

    let out = f.root.path().join("interrupted");
    for (attempt, kill_after_shard) in [3usize, 9].into_iter().enumerate() {
        let extra: Vec<&str> = if attempt == 0 {
            flags.to_vec()
        } else {
            [&flags[..], &["--resume"]].concat()
        };
        let mut child = tessera()
            .args(ingest_args(&f, &out, &extra))
            .stderr(Stdio::null())
            .spawn()?;
        let marker = out.join(tessera_shards::shard_file_name(kill_after_shard));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !marker.exists() && Instant::now() < deadline && child.try_wait()?.is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill()?; // SIGKILL on unix: no chance to clean up.
        child.wait()?;
        assert!(
            !out.join("index.json").exists(),
            "attempt {attempt}: the run finished before it was killed"
        );
    }
    run_ok(tessera().args(ingest_args(&f, &out, &[&flags[..], &["--resume"]].concat())))?;
    let (expected, got) = (dir_bytes(&reference), dir_bytes(&out));
    assert!(
        expected.len() > 10,
        "expected many shards, got {}",
        expected.len()
    );
    assert_eq!(
        got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        expected.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    assert!(
        got == expected,
        "resumed shards differ from an uninterrupted run"
    );
    assert_eq!(
        std::fs::read(out.join("rejected.jsonl"))?,
        std::fs::read(reference.join("rejected.jsonl"))?
    );
    assert!(!out
        .read_dir()?
        .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".tmp"))));
    Ok(())
}

#[test]
fn shards_verify_names_a_flipped_shard_and_exits_non_zero() -> anyhow::Result<()> {
    let f = dataset(120);
    let out = f.root.path().join("out");
    run_ok(tessera().args(ingest_args(
        &f,
        &out,
        &["--shard-size", "200000", "--max-rejected-fraction", "0.05"],
    )))?;
    let ok = run_ok(tessera().args(["shards", "verify"]).arg(&out))?;
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("ok:"));
    let stats = run_ok(tessera().args(["shards", "stats", "--json"]).arg(&out))?;
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout)?;
    assert_eq!(stats["samples"], 118);
    assert_eq!(stats["rejected"]["missing_image"], 2);
    // Under a layout the text part stays (each placeholder replaced by its image's tokens):
    // one tile is 729 tokens an image; AnyRes costs more per image, the text the same.
    let under = |layout: &str| -> anyhow::Result<serde_json::Value> {
        let out = run_ok(
            tessera()
                .args(["shards", "stats", "--json", "--image-layout", layout])
                .arg(&out),
        )?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        Ok(v["under_layout"].clone())
    };
    let (single, anyres) = (under("single")?, under("anyres_max_9")?);
    let images = stats["images"].as_u64().expect("images");
    let tokens = |v: &serde_json::Value, key: &str| v[key].as_u64().expect(key);
    assert_eq!(tokens(&single, "total_image_tokens"), 729 * images);
    assert!(
        tokens(&anyres, "total_image_tokens") > 729 * images,
        "{anyres}"
    );
    assert_eq!(
        tokens(&single, "total_tokens") - tokens(&single, "total_image_tokens"),
        tokens(&anyres, "total_tokens") - tokens(&anyres, "total_image_tokens")
    );
    // The planner counts what `stats` counts: every sample planned once, `pack`'s real tokens
    // are the layout's total.
    for (layout, want) in [("single", &single), ("anyres_max_9", &anyres)] {
        let planned = run_ok(
            tessera()
                .args([
                    "bench",
                    "plan",
                    "--world-size",
                    "2",
                    "--token-budget",
                    "16384",
                ])
                .args(["--seq-len", "16384", "--image-layout", layout, "--shards"])
                .arg(&out),
        )?;
        let text = String::from_utf8(planned.stdout)?;
        let last = text.lines().last().unwrap_or_default();
        let plan: serde_json::Value = serde_json::from_str(last)?;
        assert_eq!(
            plan["pack"]["real_tokens"].as_u64(),
            Some(tokens(want, "total_tokens")),
            "{layout}: {text}"
        );
    }

    let victim = out.join("shard-00001.parquet");
    let mut bytes = std::fs::read(&victim)?;
    let at = bytes.len() / 3;
    bytes[at] ^= 0x80;
    std::fs::write(&victim, bytes)?;
    let failed = tessera().args(["shards", "verify"]).arg(&out).output()?;
    assert!(!failed.status.success(), "a flipped byte must fail verify");
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert!(
        stdout.contains("shard-00001.parquet: sha256 mismatch"),
        "{stdout}"
    );

    // A shard file the index does not list is reported too.
    std::fs::copy(
        out.join("shard-00000.parquet"),
        out.join("shard-00099.parquet"),
    )?;
    let failed = tessera().args(["shards", "verify"]).arg(&out).output()?;
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert!(
        stdout.contains("shard-00099.parquet: not listed in index.json"),
        "{stdout}"
    );
    Ok(())
}

#[test]
fn malformed_json_and_too_many_rejections_exit_non_zero() -> anyhow::Result<()> {
    let f = dataset(20);
    std::fs::write(
        f.json(),
        br#"[{"id": "1", "conversations": []}, {"id": 2 "conversations": []}]"#,
    )?;
    let out = tessera()
        .args(ingest_args(&f, &f.root.path().join("bad"), &[]))
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("malformed JSON at byte 44"), "{stderr}");

    let f = dataset(20);
    let out_dir = f.root.path().join("strict");
    let out = tessera()
        .args(ingest_args(
            &f,
            &out_dir,
            &["--max-rejected-fraction", "0.01"],
        ))
        .output()?;
    assert!(!out.status.success(), "1 of 20 rejected is above 1%");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("missing_image"),
        "summary lists reasons: {stderr}"
    );
    assert!(out_dir.join("ingest_report.json").exists() && !out_dir.join("index.json").exists());

    // --quiet prints no summary; the stopping message alone says how many, why, and the flag
    // value that accepts them, which then finishes the run.
    let quiet = f.root.path().join("quiet");
    let out = tessera()
        .args(ingest_args(
            &f,
            &quiet,
            &["--max-rejected-fraction", "0.01"],
        ))
        .arg("--quiet")
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "only the error: {stderr}");
    assert!(
        stderr.contains("1 of 20 records rejected")
            && stderr.contains("missing_image 1")
            && stderr.contains("--resume --max-rejected-fraction 0.0500"),
        "{stderr}"
    );
    let out = run_ok(
        tessera()
            .args(ingest_args(
                &f,
                &quiet,
                &["--resume", "--max-rejected-fraction", "0.0500"],
            ))
            .arg("--quiet"),
    )?;
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(quiet.join("index.json").exists());
    Ok(())
}

#[test]
fn json_that_is_a_folder_is_named_as_a_folder() -> anyhow::Result<()> {
    let f = dataset(2);
    let mut args = ingest_args(&f, &f.root.path().join("out"), &[]);
    let json = args.iter().position(|a| a == "--json").expect("--json") + 1;
    args[json] = f.images().to_string_lossy().into_owned();
    let out = tessera().args(args).output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is a folder") && !stderr.contains("No such device"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn shards_open_in_pyarrow() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".deps/venv/bin/python");
    anyhow::ensure!(
        python.exists(),
        "{} (pyarrow's python) is missing: scripts/setup/setup.sh installs it",
        python.display()
    );
    let mut f = dataset(60);
    f.records
        .push(text_record("text-1", &[("human", "Hi"), ("gpt", "Hello")]));
    f.write_json();
    let out = f.root.path().join("out");
    run_ok(tessera().args(ingest_args(
        &f,
        &out,
        &["--shard-size", "100000", "--max-rejected-fraction", "0.05"],
    )))?;
    let checked = run_ok(
        Command::new(python)
            .arg(root.join("tests/oracles/check_pyarrow.py"))
            .arg(&out),
    )?;
    assert!(String::from_utf8_lossy(&checked.stdout).contains("pyarrow ok"));
    Ok(())
}
