//! `tessera export --run DIR --out DIR`: projector safetensors (LLaVA keys), PEFT adapter
//! (stage 2) and a config.json describing the VLM, from the run's latest complete checkpoint.
use anyhow::Context;
use std::path::PathBuf;

/// Arguments of `tessera export`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Run directory written by `tessera train` (its latest complete checkpoint is exported).
    #[arg(long)]
    pub run: PathBuf,
    /// Output directory (created if missing).
    #[arg(long)]
    pub out: PathBuf,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let report = trainer::train::export(&args.run, &args.out)
        .with_context(|| format!("exporting run {}", args.run.display()))?;
    println!("exported step {} of {}", report.step, args.run.display());
    println!("  projector: {}", report.projector.display());
    if let Some(adapter) = &report.adapter {
        println!("  adapter:   {}", adapter.display());
    }
    println!("  config:    {}", report.config.display());
    Ok(())
}
