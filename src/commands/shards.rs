//! `tessera shards verify DIR | stats DIR|MIX.toml`.
use anyhow::Context;

/// Arguments of `tessera shards`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: ShardsCommand,
}

#[derive(clap::Subcommand)]
enum ShardsCommand {
    /// Check every shard's sha256, size, schema and row counts against index.json, every row's
    /// token counts and image and token crc32c, and that no unlisted shard-*.parquet lies in
    /// DIR. Exits non-zero on any problem.
    Verify {
        /// Shard directory (holding index.json): a path or URL (s3://, gs://, az://, https://).
        dir: String,
    },
    /// Samples by kind, images per sample, token-length and image-size percentiles, rejected
    /// records by reason; for a mixture file, each source's stats and its share of an epoch.
    Stats {
        /// Shard directory (holding index.json): a path or URL (s3://, gs://, az://, https://);
        /// or a mixture file (mix.toml).
        dir: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also count each sample's tokens under this image layout, from the image sizes the
        /// shards hold (no decode): `single` (one tile per image) or `anyres_max_N`
        /// (LLaVA-OneVision's tiles, as its processor counts them).
        #[arg(long)]
        image_layout: Option<tessera_shards::image_layout::ImageLayout>,
        /// The tower's tile side in pixels, for --image-layout (so400m-384: 384).
        #[arg(long, default_value_t = 384)]
        tile_size: u32,
        /// The tower's patch side in pixels, for --image-layout (so400m: 14).
        #[arg(long, default_value_t = 14)]
        patch_size: u32,
    },
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        ShardsCommand::Verify { dir } => verify(&dir),
        ShardsCommand::Stats {
            dir,
            json,
            image_layout,
            tile_size,
            patch_size,
        } => {
            let tower = tessera_shards::image_layout::Tower {
                tile: tile_size,
                patch: patch_size,
            };
            stats(&dir, json, image_layout.as_ref().map(|l| (l, tower)))
        }
    }
}

fn verify(dir: &str) -> anyhow::Result<()> {
    let location = tessera_remote::open_location(dir, None)?;
    let report = tessera_shards::verify_at(&location).with_context(|| format!("verify {dir}"))?;
    for problem in &report.problems {
        println!("FAIL {problem}");
    }
    if !report.is_ok() {
        anyhow::bail!(
            "{}: {} problem(s) in {} shard(s)",
            dir,
            report.problems.len(),
            report.shards_checked
        );
    }
    println!(
        "ok: {} shards, {} samples verified",
        report.shards_checked, report.samples_checked
    );
    Ok(())
}

/// One source of a mixture as `shards stats --json` prints it.
#[derive(serde::Serialize)]
struct SourceStats {
    name: String,
    shards: String,
    /// Samples drawn from it per epoch, and their share of the epoch.
    per_epoch: u64,
    share: f64,
    stats: tessera_shards::DatasetStats,
}

/// An image layout and the tower it cuts tiles for.
type Layout<'a> = Option<(
    &'a tessera_shards::image_layout::ImageLayout,
    tessera_shards::image_layout::Tower,
)>;

fn stats(dir: &str, json: bool, layout: Layout) -> anyhow::Result<()> {
    if tessera_pipeline::mix::is_mixture(dir) {
        return mixture_stats(dir, json, layout);
    }
    let location = tessera_remote::open_location(dir, None)?;
    let dataset =
        tessera_shards::Dataset::open_at(&location).with_context(|| format!("open {dir}"))?;
    let s =
        tessera_shards::stats_under(&dataset, layout).with_context(|| format!("stats of {dir}"))?;
    if json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    print_stats(&s);
    Ok(())
}

/// Each source's stats and its share of an epoch (per_epoch / the epoch's samples).
fn mixture_stats(file: &str, json: bool, layout: Layout) -> anyhow::Result<()> {
    let spec = tessera_pipeline::mix::MixSpec::load(std::path::Path::new(file))?;
    let mut datasets = Vec::new();
    for source in &spec.sources {
        let location = tessera_remote::open_location(&source.shards, None)?;
        datasets.push(
            tessera_shards::Dataset::open_at(&location)
                .with_context(|| format!("source {}: open {}", source.name, source.shards))?,
        );
    }
    let mixture = tessera_pipeline::mix::Mixture::new(spec, datasets)?;
    let epoch = mixture.epoch_samples();
    let mut out = Vec::new();
    for source in mixture.sources() {
        out.push(SourceStats {
            name: source.name.clone(),
            shards: source.dataset.source().describe(),
            per_epoch: source.per_epoch,
            share: source.share(epoch),
            stats: tessera_shards::stats_under(&source.dataset, layout)
                .with_context(|| format!("stats of source {}", source.name))?,
        });
    }
    if json {
        let value = serde_json::json!({"epoch_samples": epoch, "sources": out});
        println!("{value}");
        return Ok(());
    }
    println!("mixture {file}: {epoch} samples per epoch");
    for source in &out {
        println!(
            "\nsource {} ({}): {} of {} samples per epoch, share {:.1}%",
            source.name,
            source.shards,
            source.per_epoch,
            source.stats.samples,
            100.0 * source.share
        );
        print_stats(&source.stats);
    }
    Ok(())
}

fn print_stats(s: &tessera_shards::DatasetStats) {
    println!("samples: {}", s.samples);
    for (kind, n) in &s.by_kind {
        println!("  kind {kind:<8} {n}");
    }
    println!("images: {}", s.images);
    for (count, n) in &s.images_per_sample {
        println!("  {count} per sample  {n}");
    }
    for (format, n) in &s.image_formats {
        println!("  format {format:<6} {n}");
    }
    let p = |name: &str, q: &tessera_shards::Percentiles| {
        println!(
            "{name:<14} p50 {:>6}  p90 {:>6}  p99 {:>6}  max {:>6}",
            q.p50, q.p90, q.p99, q.max
        )
    };
    p("text tokens", &s.text_tokens);
    p("image width", &s.image_width);
    p("image height", &s.image_height);
    println!(
        "tiny images (short side < {} px): {}",
        tessera_shards::TINY_SIDE,
        s.tiny_images
    );
    println!(
        "extreme aspect (>= {}:1): {}",
        tessera_shards::EXTREME_ASPECT,
        s.extreme_aspect_images
    );
    if let Some(l) = &s.under_layout {
        println!(
            "under --image-layout {} (tile {} px, patch {} px): {} tokens in all, {} of them \
             image tokens",
            l.layout, l.tile, l.patch, l.total_tokens, l.total_image_tokens
        );
        p("  sample tokens", &l.sample_tokens);
        p("  image tokens", &l.image_tokens);
        p("  tiles/image", &l.tiles_per_image);
    }
    println!("rejected at ingest: {}", s.rejected.values().sum::<u64>());
    for (reason, n) in &s.rejected {
        println!("  {reason:<28} {n}");
    }
}
