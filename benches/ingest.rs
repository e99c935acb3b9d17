//! Ingest throughput on a synth dataset of real-photo crops (LLaVA-Pretrain's layout), next to
//! the copy bound measured in the same run (reading every image file once, one thread per
//! worker). Runs `tessera synth` then `tessera ingest` with and without `--no-verify`.
//!
//! `cargo bench --no-default-features --bench ingest` (env: INGEST_BENCH_SAMPLES, default
//! 20000; INGEST_BENCH_WORKERS, default 2; INGEST_BENCH_PHOTOS, default
//! /usr/share/backgrounds/mate; INGEST_BENCH_REPEATS, default 1: each ingest mode runs that
//! many times and the fastest run counts; INGEST_BENCH_DATA: a folder to keep the synth data
//! in between runs: reused when it holds a dataset made with the same samples and photos,
//! made there otherwise; without it the data lives in a temporary folder). Last line: one
//! JSON object.
//!
//! Next to each wall-clock rate it reports the CPU time per record (children's user + system
//! time) and the load average: on a shared machine the wall rate mostly measures the other
//! jobs, the CPU time much less. The fixed startup (an ingest of an empty json, mostly loading
//! tokenizer.json) is measured too; the 558,128-sample projections add it once, and the
//! `_cpu_bound` ones assume `workers` otherwise idle cores.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const LLAVA_PRETRAIN_SAMPLES: f64 = 558_128.0;

/// `name`'s value, or `default` when it is unset; a value that does not parse stops the bench
/// naming the variable (a typo must not measure the default under the wrong label).
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("ingest bench: {name}={v:?} is not a valid value");
            std::process::exit(2)
        }),
    }
}

/// CPU seconds (user + system) used so far by this process (`children == false`) or by its
/// waited-for children, from /proc/self/stat (Linux; clock ticks of 1/100 s). Unlike wall time
/// this barely moves when other work shares the cores, so the bench reports it too.
fn cpu_s(children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command name the state is field 3: utime, stime (14, 15) sit at 11, 12 and
    // cutime, cstime (16, 17) at 13, 14.
    let at = if children { 13 } else { 11 };
    let ticks: f64 =
        fields.get(at)?.parse::<f64>().ok()? + fields.get(at + 1)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn cpu_since(children: bool, before: Option<f64>) -> f64 {
    cpu_s(children)
        .zip(before)
        .map_or(f64::NAN, |(after, before)| after - before)
}

fn tessera(args: &[&str]) -> anyhow::Result<f64> {
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("NO_PROGRESS", "1")
        .status()?;
    anyhow::ensure!(status.success(), "tessera {args:?} failed");
    Ok(started.elapsed().as_secs_f64())
}

fn image_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            image_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// The 1-minute load average (Linux), to print next to each figure.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Reads every file once on `workers` threads; returns (seconds, bytes).
fn copy_bound(files: &[PathBuf], workers: usize) -> anyhow::Result<(f64, u64)> {
    let started = Instant::now();
    let chunk = files.len().div_ceil(workers.max(1)).max(1);
    let bytes = std::thread::scope(|scope| -> anyhow::Result<u64> {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|p| std::fs::read(p).map(|b| b.len() as u64))
                        .sum::<std::io::Result<u64>>()
                })
            })
            .collect();
        let mut total = 0;
        for h in handles {
            total += h
                .join()
                .map_err(|_| anyhow::anyhow!("copy thread panicked"))??;
        }
        Ok(total)
    })?;
    Ok((started.elapsed().as_secs_f64(), bytes))
}

/// The synth dataset: reused from `INGEST_BENCH_DATA` when a stamp file there says it was made
/// with the same samples and photos, otherwise written (there, or in `scratch`).
fn synth_data(scratch: &Path, samples: usize, photos: &str) -> anyhow::Result<PathBuf> {
    let kept = std::env::var_os("INGEST_BENCH_DATA").map(PathBuf::from);
    let data = kept.clone().unwrap_or_else(|| scratch.join("data"));
    let stamp_path = data.join("bench-stamp.json");
    let stamp = serde_json::json!({ "samples": samples, "photos": photos }).to_string();
    if kept.is_some() && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(&stamp) {
        eprintln!("synth: reusing {}", data.display());
        return Ok(data);
    }
    if data.exists() {
        std::fs::remove_dir_all(&data)?;
    }
    let d = data.to_string_lossy().into_owned();
    let n = samples.to_string();
    let synth_s = tessera(&["synth", "--out", &d, "--samples", &n, "--photos", photos])?;
    eprintln!("synth: {samples} samples in {synth_s:.1}s");
    std::fs::write(&stamp_path, stamp)?;
    Ok(data)
}

fn main() -> anyhow::Result<()> {
    let samples: usize = env_or("INGEST_BENCH_SAMPLES", 20_000);
    let workers: usize = env_or("INGEST_BENCH_WORKERS", 2);
    let repeats: usize = env_or("INGEST_BENCH_REPEATS", 1usize).max(1);
    let photos: String = env_or(
        "INGEST_BENCH_PHOTOS",
        "/usr/share/backgrounds/mate".to_string(),
    );
    let root = tempfile::tempdir()?;
    let data = synth_data(root.path(), samples, &photos)?;
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/tokenizer/tokenizer.json");
    let t = tokenizer.to_string_lossy().into_owned();
    let mut files = Vec::new();
    image_files(&data.join("images"), &mut files)?;
    copy_bound(&files, workers)?; // warm the page cache: every timed pass below reads from it
    let cpu_before = cpu_s(false);
    let (copy_s, bytes) = copy_bound(&files, workers)?;
    let copy_cpu = cpu_since(false, cpu_before);
    eprintln!(
        "copy bound: {:.0} files/s, {:.1} CPU-us per file (load {})",
        files.len() as f64 / copy_s,
        copy_cpu * 1e6 / files.len() as f64,
        load_average()
    );
    let json = data
        .join("blip_laion_cc_sbu_558k.json")
        .to_string_lossy()
        .into_owned();
    let images = data.join("images").to_string_lossy().into_owned();
    let w = workers.to_string();
    let run = |name: &str, extra: &[&str]| -> anyhow::Result<(f64, f64)> {
        let (mut best, mut best_cpu) = (f64::INFINITY, f64::NAN);
        for attempt in 0..repeats {
            let out_dir = root.path().join(format!("{name}-{attempt}"));
            let out = out_dir.to_string_lossy().into_owned();
            let mut args = vec![
                "ingest",
                "--json",
                &json,
                "--images",
                &images,
                "--tokenizer",
                &t,
                "--out",
                &out,
                "--workers",
                &w,
                "--quiet",
            ];
            args.extend_from_slice(extra);
            let cpu_before = cpu_s(true);
            let seconds = tessera(&args)?;
            let cpu = cpu_since(true, cpu_before);
            eprintln!(
                "ingest {name}: {:.0} records/s, {:.1} CPU-us per record (load {})",
                samples as f64 / seconds,
                cpu * 1e6 / samples as f64,
                load_average()
            );
            if seconds < best {
                (best, best_cpu) = (seconds, cpu);
            }
            std::fs::remove_dir_all(&out_dir)?;
        }
        Ok((best, best_cpu))
    };
    // The fixed cost of a run (loading the 7 MB tokenizer.json dominates): an empty json.
    let empty = root.path().join("empty.json");
    std::fs::write(&empty, "[]")?;
    let empty_out = root.path().join("empty-out").to_string_lossy().into_owned();
    let startup_cpu_before = cpu_s(true);
    let startup_s = tessera(&[
        "ingest",
        "--json",
        &empty.to_string_lossy(),
        "--images",
        &images,
        "--tokenizer",
        &t,
        "--out",
        &empty_out,
        "--quiet",
    ])?;
    let startup_cpu = cpu_since(true, startup_cpu_before);
    eprintln!("ingest of an empty json: {startup_s:.2}s, {startup_cpu:.2} CPU-s");
    let (no_verify_s, no_verify_cpu) = run("no-verify", &["--no-verify"])?;
    let (verify_s, verify_cpu) = run("verify", &[])?;
    let rate = |s: f64| samples as f64 / s;
    // 558,128 samples: the fixed startup once, then the per-record time of this run.
    let project = |s: f64| startup_s + LLAVA_PRETRAIN_SAMPLES * (s - startup_s) / samples as f64;
    // The same on `workers` otherwise idle cores, from CPU time (what a loaded machine hides).
    let project_cpu = |cpu: f64| {
        startup_cpu + LLAVA_PRETRAIN_SAMPLES * (cpu - startup_cpu) / samples as f64 / workers as f64
    };
    println!(
        "{}",
        serde_json::json!({
            "samples": samples,
            "workers": workers,
            "repeats": repeats,
            "image_files": files.len(),
            "mean_image_bytes": bytes / files.len().max(1) as u64,
            "copy_records_per_s": rate(copy_s),
            "no_verify_records_per_s": rate(no_verify_s),
            "verify_records_per_s": rate(verify_s),
            "ratio_no_verify_vs_copy": copy_s / no_verify_s,
            "ratio_verify_vs_copy": copy_s / verify_s,
            "copy_cpu_us_per_file": copy_cpu * 1e6 / files.len() as f64,
            "no_verify_cpu_us_per_record": no_verify_cpu * 1e6 / samples as f64,
            "verify_cpu_us_per_record": verify_cpu * 1e6 / samples as f64,
            "load_average_1m": load_average(),
            "startup_s": startup_s,
            "startup_cpu_s": startup_cpu,
            "projected_558k_seconds_verify": project(verify_s),
            "projected_558k_seconds_no_verify": project(no_verify_s),
            "projected_558k_seconds_verify_cpu_bound": project_cpu(verify_cpu),
            "projected_558k_seconds_no_verify_cpu_bound": project_cpu(no_verify_cpu),
        })
    );
    Ok(())
}
