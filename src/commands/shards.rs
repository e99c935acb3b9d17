//! `tessera shards verify DIR | stats DIR`.
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
    /// Samples by kind, token-length and image-size percentiles, rejected records by reason.
    Stats {
        /// Shard directory (holding index.json): a path or URL (s3://, gs://, az://, https://).
        dir: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        ShardsCommand::Verify { dir } => verify(&dir),
        ShardsCommand::Stats { dir, json } => stats(&dir, json),
    }
}

fn verify(dir: &str) -> anyhow::Result<()> {
    let location = remote::open_location(dir, None)?;
    let report = shards::verify_at(&location).with_context(|| format!("verify {dir}"))?;
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

fn stats(dir: &str, json: bool) -> anyhow::Result<()> {
    let location = remote::open_location(dir, None)?;
    let dataset = shards::Dataset::open_at(&location).with_context(|| format!("open {dir}"))?;
    let s = shards::stats(&dataset).with_context(|| format!("stats of {dir}"))?;
    if json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    println!("samples: {}", s.samples);
    for (kind, n) in &s.by_kind {
        println!("  kind {kind:<8} {n}");
    }
    for (format, n) in &s.image_formats {
        println!("  format {format:<6} {n}");
    }
    let p = |name: &str, q: &shards::Percentiles| {
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
        shards::TINY_SIDE,
        s.tiny_images
    );
    println!(
        "extreme aspect (>= {}:1): {}",
        shards::EXTREME_ASPECT,
        s.extreme_aspect_images
    );
    println!("rejected at ingest: {}", s.rejected.values().sum::<u64>());
    for (reason, n) in &s.rejected {
        println!("  {reason:<28} {n}");
    }
    Ok(())
}
