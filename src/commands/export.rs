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
    /// Dtype of the exported projector and adapter weights (default bf16, as the Hub ships
    /// them; f32 writes the trained f32 masters unrounded).
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: trainer::train::Dtype,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let report = trainer::train::export_as(&args.run, &args.out, args.dtype)
        .with_context(|| format!("exporting run {}", args.run.display()))?;
    println!("exported step {} of {}", report.step, args.run.display());
    println!("  projector: {}", report.projector.display());
    if let Some(adapter) = &report.adapter {
        println!("  adapter:   {}", adapter.display());
    }
    println!("  config:    {}", report.config.display());
    Ok(())
}
