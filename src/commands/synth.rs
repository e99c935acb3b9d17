//! `tessera synth`: write a dataset in LLaVA-Pretrain's exact layout (see `tessera-synth`).
use anyhow::Context;
use std::path::PathBuf;
use std::time::Instant;
use tessera_synth::{generate, SynthConfig};

/// Arguments of `tessera synth`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Output folder: receives blip_laion_cc_sbu_558k.json, images/ and (with --zip) images.zip.
    #[arg(long)]
    out: PathBuf,
    /// Number of records.
    #[arg(long)]
    samples: usize,
    /// Share of records that are text-only multi-turn conversations (no `image` key), 0 to 1.
    #[arg(long, default_value_t = 0.0)]
    text_only_fraction: f64,
    /// Crop real photographs found (recursively) in this folder instead of drawing scenes,
    /// e.g. /usr/share/backgrounds/mate.
    #[arg(long)]
    photos: Option<PathBuf>,
    /// Also write images.zip (no root folder, stored), as LLaVA-Pretrain ships it.
    #[arg(long)]
    zip: bool,
    /// Seed: the same seed gives byte-identical output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads (default: one per core; 1 turns parallelism off, same output).
    #[arg(long)]
    workers: Option<usize>,
}

/// `progress`: show a progress bar (a terminal, and no `--quiet` or NO_PROGRESS).
pub(crate) fn run(args: Args, progress: bool) -> anyhow::Result<()> {
    let mut cfg = SynthConfig::new(&args.out, args.samples);
    cfg.progress = progress;
    cfg.text_only_fraction = args.text_only_fraction;
    cfg.photos = args.photos;
    cfg.zip = args.zip;
    cfg.seed = args.seed;
    if let Some(workers) = args.workers {
        cfg.workers = workers;
    }
    let started = Instant::now();
    let report = generate(&cfg).with_context(|| format!("synth into {}", args.out.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        "{} records ({} images, {} text-only) in {:.1} s ({:.0} samples/s); mean JPEG {:.1} KB; {}{}",
        report.records,
        report.images,
        report.text_only,
        seconds,
        report.records as f64 / seconds.max(1e-9),
        report.image_bytes as f64 / report.images.max(1) as f64 / 1024.0,
        report.json_path.display(),
        report
            .zip_path
            .map(|p| format!(", {}", p.display()))
            .unwrap_or_default(),
    );
    Ok(())
}
