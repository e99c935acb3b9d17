//! `tessera export --run DIR --out DIR`: projector safetensors (LLaVA keys), PEFT adapter
//! (stage 2) and a config.json describing the VLM, from the run's newest complete checkpoint;
//! with `--format llava-hf`, one directory transformers' `LlavaForConditionalGeneration` and
//! `AutoProcessor` load (see `tessera_train::write_llava_hf`); `--format llava-onevision` the
//! same for a run trained with `--image-layout anyres_max_N`
//! (`LlavaOnevisionForConditionalGeneration`, `LlavaOnevisionProcessor`).
use anyhow::Context;
use std::path::PathBuf;
use tessera_train::LlavaHfOptions;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Projector, PEFT adapter and tessera's VLM config.
    Tessera,
    /// A transformers `LlavaForConditionalGeneration` directory with tokenizer and processor.
    LlavaHf,
    /// A transformers `LlavaOnevisionForConditionalGeneration` directory with tokenizer and
    /// processor: the export of a run trained with `--image-layout anyres_max_N`.
    LlavaOnevision,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dtype {
    Bf16,
    F16,
    F32,
}

/// Arguments of `tessera export`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Run directory written by `tessera train` (its newest complete checkpoint is exported:
    /// newer damaged or unfinished ones are passed over and named).
    #[arg(long)]
    pub run: PathBuf,
    /// Output directory (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// What to write.
    #[arg(long, value_enum, default_value_t = Format::Tessera)]
    pub format: Format,
    /// llava-hf: keep the LoRA adapters as a PEFT adapter in OUT/adapter instead of merging.
    #[arg(long)]
    pub no_merge: bool,
    /// Weight dtype of what is written (default bf16, as the Hub ships them; f32 writes the
    /// trained f32 masters unrounded; f16 only for llava-hf).
    #[arg(long, value_enum, default_value_t = Dtype::Bf16)]
    pub dtype: Dtype,
    /// llava-hf: tokenizer.json to ship with the processor files (default: the run's own copy,
    /// RUN/tokenizer.json; one that is not the tokenizer the run's shards were made with is
    /// refused).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    tessera_train::unmap_freed_tensors();
    if matches!(args.format, Format::LlavaHf | Format::LlavaOnevision) {
        return run_llava_hf(args);
    }
    let dtype = match args.dtype {
        Dtype::Bf16 => tessera_model::Dtype::Bf16,
        Dtype::F32 => tessera_model::Dtype::F32,
        Dtype::F16 => anyhow::bail!("--dtype f16 is for --format llava-hf; use bf16 or f32"),
    };
    let report = tessera_train::export_as(&args.run, &args.out, dtype)
        .with_context(|| format!("exporting run {}", args.run.display()))?;
    println!("exported step {} of {}", report.step, args.run.display());
    match &report.projector_from {
        Some(from) => println!(
            "  projector: {} (not trained by this run: the one it started from, {from})",
            report.projector.display()
        ),
        None => println!("  projector: {}", report.projector.display()),
    }
    if let Some(adapter) = &report.adapter {
        println!("  adapter:   {}", adapter.display());
    }
    println!("  config:    {}", report.config.display());
    Ok(())
}

fn run_llava_hf(args: Args) -> anyhow::Result<()> {
    let options = LlavaHfOptions {
        merge: !args.no_merge,
        dtype: tessera_train::weight_kind(match args.dtype {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
        })
        .context("weight dtype")?,
        tokenizer: args.tokenizer.clone(),
        onevision: args.format == Format::LlavaOnevision,
        ..Default::default()
    };
    let format = match args.format {
        Format::LlavaOnevision => "llava-onevision",
        _ => "llava-hf",
    };
    let (step, report) = tessera_train::export_llava_hf(&args.run, &args.out, &options)
        .with_context(|| format!("exporting run {} as {format}", args.run.display()))?;
    println!(
        "exported step {step} of {} as {format}: {} tensors in {} file(s) under {}",
        args.run.display(),
        report.tensors,
        report.weight_files.len(),
        args.out.display()
    );
    if let Some(from) = &report.projector_from {
        println!("  projector: not trained by this run: the one it started from, {from}");
    }
    if let Some(adapter) = &report.adapter {
        println!("  adapter (unmerged): {}", adapter.display());
    }
    Ok(())
}
