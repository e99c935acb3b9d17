//! `tessera`: LLaVA-style VLM data pipeline and FSDP trainer. This file only parses the command
//! line and dispatches; each command lives in `commands/<name>.rs`.
mod commands;

use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::process::ExitCode;
use tessera_switches::Switches;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "LLaVA-style VLM data pipeline and FSDP trainer"
)]
struct Cli {
    /// Only warnings and errors on stderr; no progress bars (NO_PROGRESS=1 hides those alone).
    #[arg(long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the largest variant (train's flags) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Write a dataset in LLaVA-Pretrain's exact layout (json + images/ [+ images.zip]).
    Synth(commands::synth::Args),
    /// Convert LLaVA or LLaVA-OneVision json + images (folder or zip), or Hugging Face parquet
    /// (the_cauldron, TRL `messages`), into verified parquet shards.
    Ingest(commands::ingest::Args),
    /// Inspect shards: `verify DIR` or `stats DIR`.
    Shards(commands::shards::Args),
    /// Benchmarks: `loader` (images/s vs the PIL reference; AnyRes views/s vs transformers'
    /// processor), `plan` (pack vs bucket vs fixed) and `generate` (the KV cache vs recomputing
    /// the prefix).
    Bench(commands::bench::Args),
    /// Write small random-weight Hugging Face checkpoints (DIR/vision, DIR/lm; the LM Qwen2,
    /// Qwen3, Qwen3-MoE or Llama).
    #[cfg(feature = "train")]
    InitModel(commands::init_model::Args),
    /// Train stage 1 (projector) or stage 2 (projector + LoRA, or the LM and tower in full) off
    /// pre-built shards.
    #[cfg(feature = "train")]
    Train(Box<commands::train::Args>),
    /// Export a run: projector safetensors, PEFT adapter, VLM config.json, or a transformers
    /// folder: `--format llava-hf` (LlavaForConditionalGeneration) or `--format
    /// llava-onevision` (LlavaOnevisionForConditionalGeneration, an `--image-layout anyres_max_N`
    /// run).
    #[cfg(feature = "train")]
    Export(commands::export::Args),
    /// Caption an image or held-out shard samples with a run or a llava-hf export.
    #[cfg(feature = "train")]
    Generate(commands::generate::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    commands::init_logging(cli.quiet);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Each cause once, even where a library's message repeats its own source.
            eprintln!("error: {}", tessera_errors::with_causes(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Reads the environment switches (a bad value stops here, before any work), then runs the
/// command.
fn run(cli: Cli) -> anyhow::Result<()> {
    let switches = Switches::load()?;
    // Progress bars and the per-step line: on a terminal, unless --quiet or NO_PROGRESS.
    let progress = !cli.quiet && !switches.no_progress && std::io::stderr().is_terminal();
    match cli.command {
        Command::Synth(args) => commands::synth::run(args, progress),
        Command::Ingest(args) => commands::ingest::run(args, cli.quiet, progress),
        Command::Shards(args) => commands::shards::run(args),
        Command::Bench(args) => commands::bench::run(args),
        #[cfg(feature = "train")]
        Command::InitModel(args) => commands::init_model::run(args),
        #[cfg(feature = "train")]
        Command::Train(args) => commands::train::run(*args, progress),
        #[cfg(feature = "train")]
        Command::Export(args) => commands::export::run(args),
        #[cfg(feature = "train")]
        Command::Generate(args) => commands::generate::run(args),
    }
}
