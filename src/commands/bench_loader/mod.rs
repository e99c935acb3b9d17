//! `tessera bench loader`: the loader's images/s on a shard directory, next to the decode-only
//! bound (the `image` crate decoding the same bytes on the same thread count) and the PIL
//! reference loader (the repo's scripts/baselines/pil_loader.py) on the same images and worker
//! count. With `--image-layout anyres_max_N` the loader cuts each image's base view and tiles,
//! and the reference is transformers' own `LlavaOnevisionImageProcessor`
//! (scripts/baselines/llava_onevision_views.py): views (tiles) per second on both sides.
//! Human-readable lines first, then one JSON line.
mod measure;
mod remote;

use anyhow::Context;
use measure::{export_llava, read_images, run_decode_only, run_loader, workload};
use pipeline::loader::{LoaderConfig, ResizePolicy, SampleSource};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tessera_switches::Switches;

/// Arguments of `tessera bench loader`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Shard directory (with index.json): a path, or a URL (s3://, gs://, az://, https://);
    /// a URL is benchmarked against the same shards downloaded to local disk, cold and warm
    /// cache ($TESSERA_REMOTE_LATENCY_MS adds a delay per request in a build with the
    /// `test-hooks` feature).
    #[arg(long)]
    shards: String,
    /// Worker threads, for tessera, decode-only and the PIL reference alike.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Output side length S (pixels are S x S).
    #[arg(long, default_value_t = 384)]
    image_size: usize,
    /// Use the dataset prefix holding this many image samples.
    #[arg(long, default_value_t = 2000)]
    limit: usize,
    /// squash (SigLIP: resize to S x S) or pad (LLaVA expand2square, as the PIL reference does).
    #[arg(long, value_enum, default_value_t = ResizePolicy::Pad)]
    policy: ResizePolicy,
    /// Samples per packed row and rows per micro-batch of the synthetic plan.
    #[arg(long, num_args = 2, default_values_t = [2, 4])]
    packing: Vec<usize>,
    /// How images become tower views: single (default: one S x S view each) or anyres_max_N
    /// (LLaVA-OneVision's base view and tiles, measured in views/s against transformers'
    /// LlavaOnevisionImageProcessor from .deps/hfvenv, which cuts 384 px tiles).
    #[arg(long)]
    image_layout: Option<shards::image_layout::ImageLayout>,
    /// The tower's patch side under --image-layout anyres_max_N (so400m: 14).
    #[arg(long, default_value_t = 14)]
    patch_size: u32,
    /// Skip the PIL reference even when python3 with pillow and numpy is present.
    #[arg(long)]
    no_reference: bool,
    /// Alternating rounds of tessera and decode-only; medians are reported (a shared VM moves
    /// a single run's rate by a third or more).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Measure the per-sample crc32c check: each round also runs the loader with the check
    /// off, and the median ratio is reported (`checksum_cost`).
    #[arg(long, hide = true)]
    checksum_cost: bool,
}

/// One round: the loader, then decode-only, back to back.
struct Round {
    images_per_s: f64,
    /// Tower views: images/s under `single`, base views and tiles under `anyres_max_N`.
    views_per_s: f64,
    samples_per_s: f64,
    decode_only: f64,
    loader_cpu_ms: Option<f64>,
    decode_cpu_ms: Option<f64>,
    /// Images/s with the checksum check off (`--checksum-cost`).
    unchecked: Option<f64>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    if ::remote::is_remote(&args.shards) {
        return remote::run(&args);
    }
    let dataset = shards::Dataset::open(Path::new(&args.shards))
        .with_context(|| format!("opening shards in {}", args.shards))?;
    let kinds: Vec<_> = dataset.metadata()?.iter().map(|m| m.kind).collect();
    let tokens = dataset.manifest().special_tokens();
    let source: Arc<dyn SampleSource> = Arc::new(dataset);
    let work = workload(&kinds, args.limit, args.packing[0], args.packing[1]);
    anyhow::ensure!(
        !work.image_indices.is_empty(),
        "no image samples in {}",
        args.shards
    );
    let images = read_images(source.as_ref(), &work.image_indices)?; // also warms the page cache
    let policy = args.policy;
    let layout = args.image_layout.clone().unwrap_or_default();
    let side = args.image_size / args.patch_size.max(1) as usize;
    let config = LoaderConfig::builder()
        .threads(args.threads)
        .image_size(args.image_size)
        .image_tokens(side * side)
        .image_layout(layout.clone(), args.patch_size)
        .resize(policy)
        .tokens(&tokens)
        .build()?;
    let anyres = layout != shards::image_layout::ImageLayout::Single;
    let threads = config.threads;

    let bytes: Vec<Vec<u8>> = images.iter().map(|(_, b)| b.clone()).collect();
    let mut rounds = Vec::new();
    let mut total = pipeline::loader::LoaderStats::default();
    for round in 1..=args.rounds.max(1) {
        // With --checksum-cost, odd rounds run the unchecked loader first (order effects:
        // a warmer cache for the second run) and even rounds after.
        let unchecked_first = args.checksum_cost && round % 2 == 1;
        let unchecked_rate = |first: bool| -> anyhow::Result<Option<f64>> {
            if !args.checksum_cost || first != unchecked_first {
                return Ok(None);
            }
            let off = pipeline::loader::LoaderConfig {
                verify_checksums: false,
                ..config.clone()
            };
            let (stats, took) = run_loader(source.clone(), work.plans.clone(), off)?;
            let rate = stats.images as f64 / took.as_secs_f64();
            println!("round {round}: tessera without the crc32c check: {rate:.1} images/s");
            Ok(Some(rate))
        };
        let unchecked_before = unchecked_rate(true)?;
        let cpu_before = process_cpu_seconds();
        let (stats, took) = run_loader(source.clone(), work.plans.clone(), config.clone())?;
        let loader_cpu = cpu_since(cpu_before);
        let secs = took.as_secs_f64();
        let images_per_s = stats.images as f64 / secs;
        println!(
            "round {round}: tessera {} images ({} views), {} samples, {} skipped in {secs:.3}s \
             with {threads} threads: {images_per_s:.1} images/s, {:.1} views/s, consumer wait \
             {:.3}s",
            stats.images,
            stats.views,
            stats.samples,
            stats.skipped,
            stats.views as f64 / secs,
            stats.wait.as_secs_f64()
        );
        let unchecked = unchecked_before.or(unchecked_rate(false)?);
        if let Some(rate) = unchecked {
            println!(
                "round {round}: with / without the check {:.4}",
                images_per_s / rate
            );
        }
        let cpu_before = process_cpu_seconds();
        let (took, failed) = run_decode_only(&bytes, threads);
        let decode_cpu = cpu_since(cpu_before);
        let decoded = bytes.len() - failed;
        let decode_only = decoded as f64 / took.as_secs_f64();
        println!(
            "round {round}: decode only (image crate, full decode, {threads} threads): {decoded} \
             images in {:.3}s: {decode_only:.1} images/s; tessera / decode-only {:.3}",
            took.as_secs_f64(),
            images_per_s / decode_only
        );
        // CPU seconds per image move less than wall time when other processes share the
        // cores (preemption drops out; cache contention stays): the same ratio, less noisy.
        let cpu_ms = |cpu: Option<f64>, n: u64| cpu.map(|c| c * 1e3 / n.max(1) as f64);
        rounds.push(Round {
            views_per_s: stats.views as f64 / secs,
            images_per_s,
            samples_per_s: stats.samples as f64 / secs,
            decode_only,
            loader_cpu_ms: cpu_ms(loader_cpu, stats.images),
            decode_cpu_ms: cpu_ms(decode_cpu, decoded as u64),
            unchecked,
        });
        total.add(&stats);
    }
    let per_image = |d: std::time::Duration| d.as_secs_f64() * 1e3 / total.images.max(1) as f64;
    println!(
        "  stage time per image (thread-ms): read {:.3} (of it crc32c {:.4}), decode {:.3}, \
         resize {:.3}, assemble {:.3}",
        per_image(total.read),
        per_image(total.checksum),
        per_image(total.decode),
        per_image(total.resize),
        per_image(total.assemble)
    );
    let of = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let images_per_s = of(|r| r.images_per_s);
    let views_per_s = of(|r| r.views_per_s);
    let samples_per_s = of(|r| r.samples_per_s);
    let decode_only = of(|r| r.decode_only);
    let ratio_vs_decode_only = of(|r| r.images_per_s / r.decode_only);
    let cpu_of = |f: fn(&Round) -> Option<f64>| {
        let values: Option<Vec<f64>> = rounds.iter().map(f).collect();
        values.map(median)
    };
    let loader_cpu_ms = cpu_of(|r| r.loader_cpu_ms);
    let decode_cpu_ms = cpu_of(|r| r.decode_cpu_ms);
    let cpu_ratio = cpu_of(|r| Some(r.decode_cpu_ms? / r.loader_cpu_ms?));
    // 1 - (with check / without), median over paired rounds: the share of throughput the
    // check costs (negative = within noise).
    let checksum_cost = cpu_of(|r| Some(1.0 - r.images_per_s / r.unchecked?));
    if let Some(cost) = checksum_cost {
        println!(
            "crc32c check cost, median of {} paired rounds: {:.2}% of loader throughput",
            rounds.len(),
            100.0 * cost
        );
    }
    // The check's own thread time over all stages' (noise-free next to paired wall times).
    let stages = total.read + total.decode + total.resize + total.assemble;
    let checksum_share = total.checksum.as_secs_f64() / stages.as_secs_f64().max(1e-12);
    println!(
        "crc32c check: {:.3}% of the loader's thread time",
        100.0 * checksum_share
    );

    let n = rounds.len();
    let (reference, ratio_vs_reference) = if anyres {
        let reference = match args.no_reference {
            true => None,
            false => run_views_reference(&images, &args, threads)?,
        };
        let ratio = reference.map(|r| views_per_s / r);
        match (reference, ratio) {
            (Some(r), Some(ratio)) => println!(
                "LlavaOnevisionImageProcessor ({threads} workers): {r:.1} views/s; tessera \
                 (median of {n}) {views_per_s:.1} views/s is {ratio:.2}x"
            ),
            _ => println!(
                "LlavaOnevisionImageProcessor: not run (needs .deps/hfvenv, 384 px, patch 14)"
            ),
        }
        (reference, ratio)
    } else {
        let reference = match args.no_reference {
            true => None,
            false => run_reference(&images, args.image_size, threads)?,
        };
        let ratio = reference.map(|r| images_per_s / r);
        match (reference, ratio) {
            (Some(r), Some(ratio)) => println!(
                "PIL reference ({threads} workers): {r:.1} images/s; tessera (median of {n}) \
                 {images_per_s:.1} images/s is {ratio:.2}x"
            ),
            _ => println!("PIL reference: not run (needs python3 with pillow and numpy)"),
        }
        (reference, ratio)
    };
    println!("tessera / decode-only, median of {n} paired rounds: {ratio_vs_decode_only:.3}");
    if let (Some(l), Some(d), Some(r)) = (loader_cpu_ms, decode_cpu_ms, cpu_ratio) {
        println!(
            "process CPU per image (medians): tessera {l:.3} ms, decode-only {d:.3} ms; \
             decode-only / tessera {r:.3}"
        );
    }
    let line = serde_json::json!({
        "images_per_s": images_per_s,
        "views_per_s": views_per_s,
        "image_layout": layout.to_string(),
        "samples_per_s": samples_per_s,
        "decode_only_images_per_s": decode_only,
        "reference_images_per_s": reference,
        "ratio_vs_reference": ratio_vs_reference,
        "ratio_vs_decode_only": ratio_vs_decode_only,
        "threads": threads,
        "cpu_ms_per_image": loader_cpu_ms,
        "decode_only_cpu_ms_per_image": decode_cpu_ms,
        "cpu_ratio_vs_decode_only": cpu_ratio,
        "image_size": args.image_size,
        "checksum_cost": checksum_cost,
        "checksum_thread_time_fraction": checksum_share,
        "policy": policy, // serialises as "squash" / "pad"
        "images": total.images / n as u64,
        "rounds": n,
        "stage_seconds": {
            "read": total.read.as_secs_f64() / n as f64,
            "checksum": total.checksum.as_secs_f64() / n as f64,
            "decode": total.decode.as_secs_f64() / n as f64,
            "resize": total.resize.as_secs_f64() / n as f64,
            "assemble": total.assemble.as_secs_f64() / n as f64,
        },
    });
    println!("{line}");
    Ok(())
}

/// User + system CPU seconds of this whole process so far (Linux: /proc/self/stat, 10 ms ticks);
/// `None` where that file is missing or unreadable.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn cpu_since(before: Option<f64>) -> Option<f64> {
    Some(process_cpu_seconds()? - before?)
}

/// Runs the PIL reference on `images` exported as LLaVA json + folder; `None` when python3,
/// pillow, numpy or the script is missing.
fn run_reference(
    images: &[(String, Vec<u8>)],
    size: usize,
    workers: usize,
) -> anyhow::Result<Option<f64>> {
    let Some(script) = reference_script() else {
        tracing::warn!("scripts/baselines/pil_loader.py not found (set TESSERA_REFERENCE_LOADER)");
        return Ok(None);
    };
    let Some(python) = python_with_pillow() else {
        return Ok(None);
    };
    let dir = std::env::temp_dir().join(format!("tessera-bench-loader-{}", std::process::id()));
    let json =
        export_llava(&dir, images).with_context(|| format!("exporting to {}", dir.display()))?;
    let out = Command::new(&python)
        .arg(&script)
        .arg(&json)
        .arg(dir.join("images"))
        .args([
            "--size",
            &size.to_string(),
            "--workers",
            &workers.to_string(),
        ])
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()));
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(Some(baseline_rate(&out?, &script, "images_per_s=")?))
}

/// transformers' `LlavaOnevisionImageProcessor` over `images` written as files
/// (scripts/baselines/llava_onevision_views.py, on `workers` processes, `args.rounds` passes):
/// its views (base and tiles) per second. `None` without .deps/hfvenv or the script, or when
/// the run is not the processor's geometry (384 px tiles, patch 14).
fn run_views_reference(
    images: &[(String, Vec<u8>)],
    args: &Args,
    workers: usize,
) -> anyhow::Result<Option<f64>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (python, script) = (
        root.join(".deps/hfvenv/bin/python"),
        root.join("scripts/baselines/llava_onevision_views.py"),
    );
    if !python.is_file() || !script.is_file() || (args.image_size, args.patch_size) != (384, 14) {
        return Ok(None);
    }
    let dir = std::env::temp_dir().join(format!("tessera-bench-views-{}", std::process::id()));
    export_llava(&dir, images).with_context(|| format!("exporting to {}", dir.display()))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("images"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let out = Command::new(&python)
        .arg(&script)
        .arg(workers.to_string())
        .arg(args.rounds.max(1).to_string())
        .args(&files)
        .output()
        .with_context(|| format!("running {}", script.display()));
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(Some(baseline_rate(&out?, &script, "tiles_per_s=")?))
}

/// The rate a baseline script printed as `KEY<rate>`, once it succeeded (its line is echoed);
/// its failure names the script and shows what it printed.
fn baseline_rate(out: &std::process::Output, script: &Path, key: &str) -> anyhow::Result<f64> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "{} failed: {}{}",
        script.display(),
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}: {}", script.display(), stdout.trim());
    let rate = stdout
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key))
        .with_context(|| format!("no {key} in the output of {}: {stdout}", script.display()))?;
    rate.parse()
        .with_context(|| format!("{} printed {key}{rate:?}", script.display()))
}

/// $TESSERA_REFERENCE_LOADER, else the repo's scripts/baselines/pil_loader.py.
fn reference_script() -> Option<PathBuf> {
    if let Some(p) = &Switches::get().reference_loader {
        return Some(p.clone());
    }
    let rel = Path::new("scripts/baselines/pil_loader.py");
    [
        PathBuf::from("."),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    ]
    .into_iter()
    .map(|root| root.join(rel))
    .find(|p| p.is_file())
}

/// $TESSERA_PYTHON, the repo's .deps/venv, or python3 on PATH: the first that imports PIL and
/// numpy.
fn python_with_pillow() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/venv/bin/python3");
    let candidates = Switches::get()
        .python
        .clone()
        .into_iter()
        .chain([venv, PathBuf::from("python3")]);
    for python in candidates {
        let ok = Command::new(&python)
            .args(["-c", "import PIL, numpy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(python);
        }
    }
    None
}
