//! `tessera ingest`: LLaVA json + images (folder or zip) -> verified parquet shards.
use anyhow::Context;
use ingest::{IngestConfig, Template};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `tessera ingest`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// LLaVA json: an array of {"id", "image"?, "conversations": [{"from", "value"}]}.
    #[arg(long)]
    json: PathBuf,
    /// Images root: a folder, or a .zip read in place (never extracted).
    #[arg(long)]
    images: PathBuf,
    /// Qwen tokenizer.json.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Output directory (must be empty unless --resume).
    #[arg(long)]
    out: PathBuf,
    /// Chat template: plain (LLaVA-Pretrain: <image> + caption) or chatml (Qwen2.5 multi-turn).
    #[arg(long, default_value = "plain")]
    template: Template,
    /// Close a shard once it holds about this many bytes.
    #[arg(long, default_value_t = IngestConfig::DEFAULT_SHARD_SIZE)]
    shard_size: u64,
    /// Worker threads (default: all cores). The output is identical whatever this is.
    #[arg(long)]
    workers: Option<usize>,
    /// Skip the full decode of every image (the header is still checked).
    #[arg(long)]
    no_verify: bool,
    /// Continue an interrupted run in --out (same inputs and settings).
    #[arg(long)]
    resume: bool,
    /// Fail (and write no index.json) when more than this fraction of records is rejected.
    #[arg(long, default_value_t = 0.01)]
    max_rejected_fraction: f64,
    /// Reject images whose header announces more pixels than this (decompression bombs).
    #[arg(long, default_value_t = IngestConfig::DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let mut config = IngestConfig::new(args.json, args.images, args.tokenizer, args.out);
    config.template = args.template;
    config.shard_size = args.shard_size.max(1);
    if let Some(workers) = args.workers {
        config.workers = workers.max(1);
    }
    config.verify = !args.no_verify;
    config.resume = args.resume;
    config.max_rejected_fraction = args.max_rejected_fraction;
    config.max_pixels = args.max_pixels;
    config.progress = std::io::stderr().is_terminal() && std::env::var_os("NO_PROGRESS").is_none();
    let summary =
        ingest::run(&config).with_context(|| format!("ingest into {}", config.out.display()))?;
    eprint!("{}", summary.text());
    if !summary.complete {
        anyhow::bail!(
            "{} of {} records rejected ({:.3}%), above --max-rejected-fraction {}: index.json not written; \
             see {}/rejected.jsonl, or rerun with --resume and a higher --max-rejected-fraction to accept",
            summary.report.rejected_total(),
            summary.report.records_read,
            100.0 * summary.rejected_fraction,
            summary.max_rejected_fraction,
            config.out.display()
        );
    }
    Ok(())
}
