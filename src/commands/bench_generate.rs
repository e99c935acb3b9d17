//! `tessera bench generate`: greedy generation tokens/s of a random-weight preset with the KV
//! cache next to the baseline that recomputes the whole prefix (image tokens included) at
//! every step, same model, same prompt, same run. Both must pick the same tokens. The last
//! line is JSON.
use anyhow::{ensure, Context};
use std::time::Instant;
use tessera_model::{write_preset, GenerateOptions, Generator, LmFamily, Preset, Vlm, VlmOptions};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum PresetArg {
    /// 64 px images (64 tokens), LM hidden 128, 2 layers.
    Tiny,
    /// 128 px images (64 tokens), LM hidden 256, 6 layers.
    Small,
}

/// Arguments of `tessera bench generate`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Model size (random weights, written to a temporary directory).
    #[arg(long, value_enum, default_value = "tiny")]
    preset: PresetArg,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Timed runs of each mode (after one warm-up run each).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

fn tokens_per_second(
    generator: &Generator,
    prompt: &[i64],
    pixels: &[u8],
    options: &GenerateOptions,
    repeats: usize,
) -> anyhow::Result<(f64, Vec<i64>)> {
    let warm = generator.generate(prompt, pixels, options)?;
    let started = Instant::now();
    let mut tokens = 0;
    for _ in 0..repeats {
        tokens += generator.generate(prompt, pixels, options)?.tokens.len();
    }
    Ok((tokens as f64 / started.elapsed().as_secs_f64(), warm.tokens))
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let (preset, name) = match args.preset {
        PresetArg::Tiny => (Preset::Tiny, "tiny"),
        PresetArg::Small => (Preset::Small, "small"),
    };
    let dir = std::env::temp_dir().join(format!("tessera-bench-generate-{}", std::process::id()));
    write_preset(&dir, preset, LmFamily::Qwen2, 0)
        .with_context(|| format!("writing {}", dir.display()))?;
    let (vision_dir, lm_dir) = (dir.join("vision"), dir.join("lm"));
    // The preset's LM is a Qwen2: its image token is Qwen's `<|image_pad|>`.
    let image_token = i64::from(tessera_text::SpecialTokens::qwen().image.id);
    let options = VlmOptions {
        image_token_id: Some(image_token),
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&vision_dir, &lm_dir, options)?;
    let params = vlm.load_params(&vision_dir, &lm_dir, None, 0)?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    let generator = Generator::new(&vlm, params)?;
    let side = vlm.vision.image_size as usize;
    let image_tokens = vlm.vision.num_patches() as usize;
    let pixels: Vec<u8> = (0..3 * side * side).map(|i| (i * 37 % 251) as u8).collect();
    let prompt = vec![image_token; image_tokens];
    let cached = GenerateOptions {
        max_new_tokens: args.new_tokens,
        ..Default::default()
    };
    let recompute = GenerateOptions {
        kv_cache: false,
        ..cached.clone()
    };
    let (with_cache, a) = tokens_per_second(&generator, &prompt, &pixels, &cached, args.repeats)?;
    let (without, b) = tokens_per_second(&generator, &prompt, &pixels, &recompute, args.repeats)?;
    ensure!(
        a == b,
        "the KV cache changed the greedy tokens: {a:?} vs {b:?}"
    );
    let ratio = with_cache / without;
    println!(
        "preset {name}: prompt {} tokens ({image_tokens} image), {} new tokens, {} runs",
        prompt.len(),
        args.new_tokens,
        args.repeats
    );
    println!("  KV cache:          {with_cache:8.1} tokens/s");
    println!("  recompute prefix:  {without:8.1} tokens/s");
    println!("  speed-up:          {ratio:8.2}x");
    println!(
        "{}",
        serde_json::json!({
            "bench": "generate", "preset": name, "prompt_tokens": prompt.len(),
            "new_tokens": args.new_tokens, "repeats": args.repeats,
            "kv_cache_tokens_per_s": with_cache, "recompute_tokens_per_s": without,
            "ratio": ratio,
        })
    );
    Ok(())
}
