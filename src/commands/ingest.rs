//! `tessera ingest`: LLaVA / LLaVA-OneVision json + images (folder or zip), or `datasets`
//! parquet with embedded images (the_cauldron, FineVision, TRL `messages`), local or in object
//! storage -> verified parquet shards.
use anyhow::Context;
use std::path::PathBuf;
use tessera_ingest::{Format, IngestConfig};
use tessera_text::chat::Template;

/// Arguments of `tessera ingest`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The input: a LLaVA or LLaVA-OneVision json (an array of {"id", "image"?,
    /// "conversations": [{"from", "value"}]}, `image` a path or a list), or Hugging Face
    /// `datasets` parquet (a file, or a folder of *.parquet; a path or an s3://, gs://, az://
    /// URL) in the_cauldron's layout (`images` + `texts`) or TRL's (`messages` + `images`).
    /// `--json` is the same flag.
    #[arg(long, alias = "json")]
    input: String,
    /// The input's layout: llava, onevision, cauldron or messages (default: detected from the
    /// input; see the README).
    #[arg(long)]
    format: Option<Format>,
    /// Where a json layout's images are: a folder, or a .zip read in place (never extracted).
    /// Parquet layouts carry their images (an Image struct without bytes is looked up here).
    #[arg(long)]
    images: Option<PathBuf>,
    /// The language model's tokenizer.json (its tokenizer_config.json beside it, when there is
    /// one, names the end of sequence); the special tokens come from it, and a tokenizer
    /// without an image token gets <image> added.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Output directory (must be empty unless --resume), or a URL (s3://bucket/prefix, gs://,
    /// az://): the shards are written to --staging, then uploaded, index.json last.
    #[arg(long)]
    out: String,
    /// With a URL --out: the local folder ingest writes before the upload (default: under the
    /// system temp dir, named after the URL, so --resume finds it; removed after the upload).
    #[arg(long)]
    staging: Option<PathBuf>,
    /// Chat template: plain (LLaVA-Pretrain: <image> + caption) or chatml (multi-turn ChatML,
    /// for tokenizers with <|im_start|> and <|im_end|>). Default: the layout's own, plain for
    /// LLaVA json, chatml for the chat layouts (onevision, cauldron, messages).
    #[arg(long)]
    template: Option<Template>,
    /// Close a shard once it holds about this many bytes.
    #[arg(long, default_value_t = IngestConfig::DEFAULT_SHARD_SIZE)]
    shard_size: u64,
    /// Worker threads (default: all cores). The output is identical whatever this is.
    #[arg(long)]
    workers: Option<usize>,
    /// Skip the full decode of every image (the header is still checked).
    #[arg(long)]
    no_verify: bool,
    /// Continue an interrupted run in --out (same inputs and settings; a finished --out is
    /// checked against them and left as it is).
    #[arg(long)]
    resume: bool,
    /// Fail (and write no index.json) when more than this fraction of records is rejected.
    #[arg(long, default_value_t = 0.01)]
    max_rejected_fraction: f64,
    /// Reject images whose header announces more pixels than this (decompression bombs).
    #[arg(long, default_value_t = IngestConfig::DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
    /// Reject records longer than this many tokens (reason `too_long` in rejected.jsonl, with
    /// the count), each image counted as --image-tokens. Default: no limit (train leaves
    /// longer-than-a-row samples out, or stops with --over-long fail).
    #[arg(long)]
    max_tokens: Option<u64>,
    /// What one image counts toward --max-tokens: the vision tower's tokens per image (729:
    /// SigLIP-so400m at 384 px).
    #[arg(long, default_value_t = 729)]
    image_tokens: u64,
}

/// `quiet`: the global `--quiet` (no summary on stderr; failures still say everything).
/// `progress`: show a progress bar (a terminal, and no `--quiet` or NO_PROGRESS).
pub(crate) fn run(args: Args, quiet: bool, progress: bool) -> anyhow::Result<()> {
    let upload_to = tessera_remote::is_remote(&args.out).then(|| args.out.clone());
    let default_staging = upload_to.is_some() && args.staging.is_none();
    let local_out = match (&upload_to, &args.staging) {
        (Some(_), Some(dir)) => dir.clone(),
        (Some(url), None) => std::env::temp_dir().join(format!(
            "tessera-ingest-{}",
            url.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        )),
        (None, _) => PathBuf::from(&args.out),
    };
    let mut config = IngestConfig::for_input(args.input, args.tokenizer, local_out);
    config.images = args.images;
    config.format = args.format;
    config.template = args.template;
    config.shard_size = args.shard_size.max(1);
    if let Some(workers) = args.workers {
        config.workers = workers.max(1);
    }
    config.verify = !args.no_verify;
    config.resume = args.resume;
    config.max_rejected_fraction = args.max_rejected_fraction;
    config.max_pixels = args.max_pixels;
    config.max_tokens = args.max_tokens;
    config.image_tokens = args.image_tokens;
    config.progress = progress;
    let summary = tessera_ingest::run(&config)
        .with_context(|| format!("ingest into {}", config.out.display()))?;
    if !quiet {
        eprint!("{}", summary.text());
    }
    if !summary.complete {
        // The plain template takes one human and one gpt turn: multi-turn records need chatml.
        let hint = if args.template == Some(Template::Plain)
            && summary.report.rejected.contains_key("bad_conversation")
        {
            " (bad_conversation under --template plain: multi-turn records need --template \
             chatml)"
        } else {
            ""
        };
        anyhow::bail!(
            "{} of {} records rejected ({:.3}%: {}{hint}), above --max-rejected-fraction {}: \
             index.json not written; see {}/rejected.jsonl. To accept them, rerun the same \
             command with --resume --max-rejected-fraction {} (nothing is re-processed)",
            summary.report.rejected_total(),
            summary.report.records_read,
            100.0 * summary.rejected_fraction,
            summary.rejected_by_reason(),
            summary.max_rejected_fraction,
            config.out.display(),
            summary.accepting_fraction()
        );
    }
    if let Some(url) = upload_to {
        let files = tessera_remote::open_remote(&url, None, &[])?;
        let sent = files
            .upload_dataset(&config.out)
            .with_context(|| format!("uploading {} to {url}", config.out.display()))?;
        let attempts = files.attempts();
        if !quiet {
            eprintln!(
                "uploaded {} files ({:.1} MB; {} already there) to {url}, index.json last; {}",
                sent.files_sent,
                sent.bytes_sent as f64 / 1e6,
                sent.files_already_there,
                attempts.describe()
            );
        } else if attempts.failed() > 0 {
            tracing::warn!("{url}: {}", attempts.describe());
        }
        if default_staging {
            std::fs::remove_dir_all(&config.out)
                .with_context(|| format!("removing the staging folder {}", config.out.display()))?;
        }
    }
    Ok(())
}
