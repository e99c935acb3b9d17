//! `tessera init-model`: writes small random-weight Hugging Face checkpoints (DIR/vision, a
//! SigLIP vision tower, and DIR/lm, a Qwen2 causal LM) for tests and the demo.
use anyhow::Context;
use std::path::PathBuf;
use tessera_model::{write_preset, Preset};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum PresetArg {
    /// 64 px images (64 tokens), LM hidden 128 at a trained scale, 2 layers, 151,936-row vocab.
    Tiny,
    /// 128 px images (64 tokens), LM hidden 256, 6 layers.
    Small,
    /// Qwen2.5-0.5B's shape + siglip-so400m-patch14-384's shape (about 3.6 GB in f32).
    #[value(name = "qwen2.5-0.5b-shape")]
    Qwen05bShape,
}

/// Arguments of `tessera init-model`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Model size to write.
    #[arg(long, value_enum)]
    preset: PresetArg,
    /// Output directory; DIR/vision and DIR/lm are created.
    #[arg(long)]
    out: PathBuf,
    /// Seed of the random weights (same seed, same files).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let preset = match args.preset {
        PresetArg::Tiny => Preset::Tiny,
        PresetArg::Small => Preset::Small,
        PresetArg::Qwen05bShape => Preset::Qwen05bShape,
    };
    let params = write_preset(&args.out, preset, args.seed).with_context(|| {
        format!(
            "writing {preset:?} checkpoints under {}",
            args.out.display()
        )
    })?;
    tracing::info!(
        "wrote {} and {} ({params} parameters)",
        args.out.join("vision").display(),
        args.out.join("lm").display()
    );
    Ok(())
}
