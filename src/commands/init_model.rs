//! `tessera init-model`: writes small random-weight Hugging Face checkpoints (DIR/vision, a
//! SigLIP vision tower, and DIR/lm, a causal LM of the family asked for: Qwen2, Qwen3,
//! Qwen3-MoE or Llama) for tests and the demo; with `--tokenizer`, the LM folder gets that tokenizer.json,
//! as a Hub folder holds its own (so `train` checks the shards were made with it).
use anyhow::Context;
use std::path::PathBuf;
use tessera_model::{write_preset, LmFamily, Preset};

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

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum FamilyArg {
    /// Qwen2 / Qwen2.5: q/k/v bias, tied embeddings, RoPE base 1e6.
    Qwen2,
    /// Qwen3: q/k norms, no bias, head_dim twice hidden/heads (as Qwen3-0.6B), tied.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, every layer sparse (8 experts, top-2 renormalised, each
    /// a quarter of the dense width), untied head.
    #[value(name = "qwen3_moe")]
    Qwen3Moe,
    /// Llama (SmolLM2's switches: no bias, RoPE base 1e5, RMSNorm eps 1e-5), untied head.
    Llama,
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
    /// Language model family (config.json's model_type) of DIR/lm.
    #[arg(long, value_enum, default_value = "qwen2")]
    family: FamilyArg,
    /// tokenizer.json to put in DIR/lm (the shards must then be ingested with it).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
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
    let family = match args.family {
        FamilyArg::Qwen2 => LmFamily::Qwen2,
        FamilyArg::Qwen3 => LmFamily::Qwen3,
        FamilyArg::Qwen3Moe => LmFamily::Qwen3Moe,
        FamilyArg::Llama => LmFamily::Llama,
    };
    let params = write_preset(&args.out, preset, family, args.seed).with_context(|| {
        format!(
            "writing {preset:?} {family:?} checkpoints under {}",
            args.out.display()
        )
    })?;
    if let Some(tokenizer) = &args.tokenizer {
        let target = args.out.join("lm").join("tokenizer.json");
        std::fs::copy(tokenizer, &target)
            .with_context(|| format!("copying {} to {}", tokenizer.display(), target.display()))?;
    }
    tracing::info!(
        "wrote {} and {} ({params} parameters)",
        args.out.join("vision").display(),
        args.out.join("lm").display()
    );
    Ok(())
}
