//! `tessera bench loader`: the loader's images/s on a shard directory, next to the decode-only
//! bound (the `image` crate decoding the same bytes on the same thread count) and the PIL
//! reference loader (the repo's scripts/baselines/pil_loader.py) on the same images and worker
//! count. With `--image-layout anyres_max_N` the loader cuts each image's base view and tiles,
//! and the reference is transformers' own `LlavaOnevisionImageProcessor`
//! (scripts/baselines/llava_onevision_views.py): views (tiles) per second on both sides.
//! Human-readable lines first, then one JSON line.
mod measure;
mod remote;
mod rounds;
mod summary;

use anyhow::Context;
use measure::export_llava;
use rounds::Bench;
use std::path::{Path, PathBuf};
use std::process::Command;
use summary::{checksum_share, json_line, print_stage_times, Medians, Setting};
use tessera_pipeline::loader::ResizePolicy;
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
    image_layout: Option<tessera_shards::image_layout::ImageLayout>,
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

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    if tessera_remote::is_remote(&args.shards) {
        return remote::run(&args);
    }
    let bench = Bench::prepare(&args)?;
    let (rounds, total) = bench.rounds(args.rounds)?;
    print_stage_times(&total);
    let medians = Medians::of(&rounds);
    medians.print_checksum_cost();
    let checksum_share = checksum_share(&total);
    let reference = compare_with_reference(&bench, &args, &medians)?;
    medians.print_vs_decode_only();
    let setting = Setting {
        layout: &bench.layout,
        threads: bench.config.threads,
        image_size: args.image_size,
        policy: args.policy,
    };
    let line = json_line(&medians, &total, &setting, reference, checksum_share);
    println!("{line}");
    Ok(())
}

/// The reference's rate on the same images and workers (PIL's images/s, or under
/// `anyres_max_N` transformers' views/s) and tessera's median over it, printed; `None`s with
/// `--no-reference` or where the reference cannot run.
fn compare_with_reference(
    bench: &Bench,
    args: &Args,
    medians: &Medians,
) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let (threads, n) = (bench.config.threads, medians.rounds);
    if bench.anyres() {
        let reference = match args.no_reference {
            true => None,
            false => run_views_reference(&bench.images, args, threads)?,
        };
        let views_per_s = medians.views_per_s;
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
        return Ok((reference, ratio));
    }
    let reference = match args.no_reference {
        true => None,
        false => run_reference(&bench.images, args.image_size, threads)?,
    };
    let images_per_s = medians.images_per_s;
    let ratio = reference.map(|r| images_per_s / r);
    match (reference, ratio) {
        (Some(r), Some(ratio)) => println!(
            "PIL reference ({threads} workers): {r:.1} images/s; tessera (median of {n}) \
             {images_per_s:.1} images/s is {ratio:.2}x"
        ),
        _ => println!("PIL reference: not run (needs python3 with pillow and numpy)"),
    }
    Ok((reference, ratio))
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
