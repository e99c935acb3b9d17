//! `tessera bench plan`: plans one epoch with `pack`, `bucket` and `fixed` (the naive
//! baseline) on the same samples and reports padding, rank imbalance, type alignment and
//! planning speed side by side. The last line is one JSON object, one entry per mode.
use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use tessera_pipeline::plan::{synthetic_llava, Mode, PlanStats, Planner};

/// Arguments of `tessera bench plan`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["shards", "synthetic_llava"])))]
pub(crate) struct Args {
    /// Plan the samples of this shard directory (reads only the metadata columns).
    #[arg(long, value_name = "DIR")]
    shards: Option<PathBuf>,
    /// Plan N synthetic samples shaped like LLaVA-Pretrain (short captions, one image each)
    /// plus a text-only share.
    #[arg(long, value_name = "N")]
    synthetic_llava: Option<usize>,
    /// Ranks (W).
    #[arg(long)]
    world_size: usize,
    /// Tokens per micro-batch, padding included (B).
    #[arg(long)]
    token_budget: u64,
    /// Longest packed row.
    #[arg(long, default_value_t = 2048)]
    seq_len: u64,
    /// Micro-steps per optimizer step (G).
    #[arg(long, default_value_t = 1)]
    micro_steps: usize,
    /// Vision tokens per image (729: SigLIP-so400m at 384 px).
    #[arg(long, default_value_t = 729)]
    image_tokens: u32,
    /// Count each image's tokens (and tiles, for the rank balance) from its size under this
    /// layout instead of --image-tokens: `anyres_max_N` (LLaVA-OneVision's tiles) or `single`.
    /// With --shards only (the sizes come from the shards).
    #[arg(long, requires = "shards")]
    image_layout: Option<tessera_shards::image_layout::ImageLayout>,
    /// The tower's tile side in pixels, for --image-layout (so400m-384: 384).
    #[arg(long, default_value_t = 384)]
    tile_size: u32,
    /// The tower's patch side in pixels, for --image-layout (so400m: 14).
    #[arg(long, default_value_t = 14)]
    patch_size: u32,
    /// Share of text-only samples in the synthetic data.
    #[arg(long, default_value_t = 0.1)]
    text_only_fraction: f64,
    /// Seed of the plan's shuffle (and of the synthetic data).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Samples per micro-batch for `fixed` [default: token budget / seq len, at least 1].
    #[arg(long)]
    fixed_samples: Option<usize>,
}

struct ModeResult {
    mode: Mode,
    stats: PlanStats,
    seconds: f64,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let (samples, fingerprint, images) = match (&args.shards, args.synthetic_llava) {
        (Some(dir), _) => {
            let dataset = tessera_shards::Dataset::open(dir)
                .with_context(|| format!("opening shards in {}", dir.display()))?;
            let meta = dataset
                .metadata()
                .with_context(|| format!("reading sample metadata of {}", dir.display()))?;
            let tower = tessera_shards::image_layout::Tower {
                tile: args.tile_size,
                patch: args.patch_size,
            };
            let images = match &args.image_layout {
                Some(layout) => Some(
                    tessera_shards::sample_images(&dataset, layout, tower)
                        .with_context(|| format!("reading image sizes of {}", dir.display()))?,
                ),
                None => None,
            };
            (meta, dataset.fingerprint().to_string(), images)
        }
        (None, Some(n)) => (
            synthetic_llava(n, args.text_only_fraction, args.seed),
            format!(
                "synthetic-llava-{n}-{}-{}",
                args.text_only_fraction, args.seed
            ),
            None,
        ),
        (None, None) => anyhow::bail!("pass --shards DIR or --synthetic-llava N"),
    };
    let mut results = Vec::new();
    for mode in Mode::ALL {
        let started = Instant::now();
        let mut builder = Planner::builder()
            .samples(&samples)
            .image_tokens(args.image_tokens)
            .world_size(args.world_size)
            .token_budget(args.token_budget)
            .seq_len(args.seq_len)
            .micro_steps(args.micro_steps)
            .seed(args.seed)
            .mode(mode)
            .fingerprint(&fingerprint);
        if let Some(c) = args.fixed_samples {
            builder = builder.fixed_samples(c);
        }
        if let Some(images) = &images {
            builder = builder.sample_images(images.clone());
        }
        let planner = builder
            .build()
            .with_context(|| format!("building the {} planner", mode.name()))?;
        let plan = planner.plan();
        let seconds = started.elapsed().as_secs_f64();
        results.push(ModeResult {
            mode,
            stats: plan.stats,
            seconds,
        });
    }
    // Written through a locked handle so a closed pipe (`| head`) is an error, not a panic.
    let mut out = std::io::stdout().lock();
    print_table(&mut out, &results, samples.len(), &args).context("writing the table")?;
    let mut json = serde_json::Map::new();
    for r in &results {
        json.insert(r.mode.name().to_string(), mode_json(r, samples.len()));
    }
    writeln!(out, "{}", serde_json::Value::Object(json)).context("writing the JSON line")?;
    Ok(())
}

fn samples_per_s(r: &ModeResult, n: usize) -> f64 {
    n as f64 / r.seconds.max(1e-9)
}

fn print_table(
    out: &mut impl Write,
    results: &[ModeResult],
    n: usize,
    args: &Args,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{n} samples, W={} B={} seq_len={} G={}, images {}",
        args.world_size,
        args.token_budget,
        args.seq_len,
        args.micro_steps,
        match &args.image_layout {
            Some(layout) => layout.to_string(),
            None => format!("{} tokens each", args.image_tokens),
        }
    )?;
    writeln!(
        out,
        "{:<7} {:>8} {:>8} {:>10} {:>10} {:>8} {:>11} {:>14} {:>12}",
        "mode",
        "pad",
        "fill",
        "imb_mean",
        "imb_worst",
        "aligned",
        "micro_steps",
        "tokens_run",
        "samples/s"
    )?;
    for r in results {
        let s = &r.stats;
        writeln!(
            out,
            "{:<7} {:>7.2}% {:>7.2}% {:>10.4} {:>10.4} {:>7.2}% {:>11} {:>14} {:>12.0}",
            r.mode.name(),
            100.0 * s.pad_fraction,
            100.0 * s.budget_fill,
            s.imbalance_mean,
            s.imbalance_worst,
            100.0 * s.type_aligned,
            s.micro_steps,
            s.computed_tokens,
            samples_per_s(r, n)
        )?;
    }
    if let (Some(pack), Some(fixed)) = (
        results.iter().find(|r| r.mode == Mode::Pack),
        results.iter().find(|r| r.mode == Mode::Fixed),
    ) {
        writeln!(
            out,
            "fixed/pack: {:.2}x the micro-steps, {:.2}x the tokens computed",
            fixed.stats.micro_steps as f64 / pack.stats.micro_steps.max(1) as f64,
            fixed.stats.computed_tokens as f64 / pack.stats.computed_tokens.max(1) as f64
        )?;
        for r in results {
            writeln!(
                out,
                "{}: critical-path cost (sum of the slowest rank per micro-step) {:.3}x pack's",
                r.mode.name(),
                r.stats.critical_cost / pack.stats.critical_cost.max(1e-9)
            )?;
        }
    }
    Ok(())
}

fn mode_json(r: &ModeResult, n: usize) -> serde_json::Value {
    let s = &r.stats;
    serde_json::json!({
        "pad_fraction": s.pad_fraction,
        "imbalance_mean": s.imbalance_mean,
        "imbalance_worst": s.imbalance_worst,
        "type_aligned": s.type_aligned,
        "samples_per_s": samples_per_s(r, n),
        "budget_fill": s.budget_fill,
        "micro_steps": s.micro_steps,
        "computed_tokens": s.computed_tokens,
        "real_tokens": s.real_tokens,
        "filler_micro_batches": s.filler_micro_batches,
        "critical_cost": s.critical_cost,
        "plan_seconds": r.seconds,
    })
}
