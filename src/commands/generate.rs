//! `tessera generate`: captions images (`--image`, once per image) or held-out shard samples
//! (`--shards`)
//! with a run's newest complete checkpoint and its tokenizer (`--run`) or a llava-hf export
//! (`--model`), through `tessera_train::Captioner` (the training loader for the image, the
//! run's template for the prompt, generation with a KV cache, greedily unless `--temperature`
//! is set, until the template's end token or `--max-new-tokens`). With `--lm DIR` it chats
//! with a language model folder alone: `--prompt` as one user turn through the model's own
//! chat template, until one of its end ids (tokenizer_config.json, generation_config.json).
use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use tessera_shards::Kind;
use tessera_train::{held_out_prompt, image_sample, Captioner};
use tessera_train::{load_export_model, load_run_model, RunDir};

/// Arguments of `tessera generate`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Run directory written by `tessera train` (its newest complete checkpoint generates).
    #[arg(
        long,
        required_unless_present_any = ["model", "lm"],
        conflicts_with_all = ["model", "lm"]
    )]
    run: Option<PathBuf>,
    /// Directory written by `tessera export --format llava-hf`.
    #[arg(long, conflicts_with = "lm")]
    model: Option<PathBuf>,
    /// A language model folder alone (Hugging Face layout: config.json, weights, tokenizer.json
    /// and its chat template): answers --prompt as one chat turn, text only.
    #[arg(long, requires = "prompt", conflicts_with_all = ["image", "shards"])]
    lm: Option<PathBuf>,
    /// Image (JPEG, PNG or WebP) to caption. Give it more than once for several images: they
    /// take the prompt's placeholders in the order given (`plain`: the placeholders alone;
    /// `chatml`: one `<image>` each before the instruction).
    #[arg(
        long,
        required_unless_present_any = ["shards", "lm"],
        conflicts_with = "shards"
    )]
    image: Vec<PathBuf>,
    /// Instruction for chatml models (default "Describe the image."); the plain template
    /// (stage 1) takes none: the caption follows the image. With --lm: the user's turn.
    #[arg(long)]
    prompt: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 (the default) is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Nucleus sampling: draw among the most likely tokens whose probabilities sum to this.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Caption the first --limit image samples of these shards and write samples.jsonl
    /// (id, reference caption, generated caption).
    #[arg(long)]
    shards: Option<PathBuf>,
    /// With --shards: how many samples.
    #[arg(long, default_value_t = 8)]
    limit: usize,
    /// With --shards: output file (default RUN/samples.jsonl, or ./samples.jsonl).
    #[arg(long)]
    out: Option<PathBuf>,
    /// tokenizer.json (default: the export's own, or the run's, RUN/tokenizer.json; for a run,
    /// one that is not the tokenizer its shards were made with is refused).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Recompute the whole prefix at every step instead of caching keys and values.
    #[arg(long)]
    no_kv_cache: bool,
    /// Dtype the weights are held and run in (default: the widest the model's checkpoints
    /// store, so bf16 for Hub checkpoints and default exports: the model is in memory once).
    #[arg(long, value_enum)]
    dtype: Option<tessera_model::Dtype>,
}

/// The model of `--run` (its tokenizer checked against its shards') or of `--model`.
fn load_captioner(
    run: Option<&Path>,
    export: Option<&Path>,
    tokenizer: Option<&Path>,
    dtype: Option<tessera_model::Dtype>,
) -> anyhow::Result<Captioner> {
    let (model, path) = match (run, export) {
        (Some(run), _) => {
            let context = || format!("loading run {}", run.display());
            let path = RunDir::new(run)
                .tokenizer_for(tokenizer)
                .with_context(context)?;
            (load_run_model(run, dtype).with_context(context)?, path)
        }
        (None, Some(dir)) => (
            load_export_model(dir, dtype)
                .with_context(|| format!("loading llava-hf export {}", dir.display()))?,
            tokenizer.map_or_else(|| dir.join("tokenizer.json"), Path::to_path_buf),
        ),
        (None, None) => bail!("give --run or --model"),
    };
    Ok(model.into_captioner(&path)?)
}

/// `--lm`: one user turn through the model's own chat template, the answer printed.
fn chat(dir: &Path, args: &Args) -> anyhow::Result<()> {
    let context = || format!("loading language model {}", dir.display());
    let text = tessera_text::ModelTokenizer::from_dir(dir).with_context(context)?;
    let prompt = args.prompt.as_deref().context("--lm needs --prompt")?;
    let ids: Vec<i64> = text
        .chat_prompt(prompt)?
        .into_iter()
        .map(i64::from)
        .collect();
    let generator = tessera_model::Generator::from_lm_dir(dir, args.dtype).with_context(context)?;
    let options = tessera_model::GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        stop_ids: text.stop_ids.iter().map(|&id| i64::from(id)).collect(),
        kv_cache: !args.no_kv_cache,
    };
    let generation = generator.generate(&ids, &[], &options)?;
    let tokens: Vec<u32> = generation.tokens.iter().map(|&t| t as u32).collect();
    let answer = text
        .tokenizer
        .decode(&tokens, true)
        .map_err(|e| anyhow::anyhow!("decoding {tokens:?}: {e}"))?;
    println!("{}", answer.trim());
    Ok(())
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    tessera_train::unmap_freed_tensors();
    if let Some(dir) = &args.lm {
        return chat(dir, &args);
    }
    let mut captioner = load_captioner(
        args.run.as_deref(),
        args.model.as_deref(),
        args.tokenizer.as_deref(),
        args.dtype,
    )?;
    captioner.options.max_new_tokens = args.max_new_tokens;
    captioner.options.temperature = args.temperature;
    captioner.options.top_p = args.top_p;
    captioner.options.seed = args.seed;
    captioner.options.kv_cache = !args.no_kv_cache;
    if !args.image.is_empty() {
        let images = args
            .image
            .iter()
            .map(|image| {
                std::fs::read(image).with_context(|| format!("reading {}", image.display()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let prompt = captioner.prompt_ids(args.prompt.as_deref(), images.len())?;
        let names: Vec<String> = args.image.iter().map(|i| i.display().to_string()).collect();
        let sample = image_sample(names.join(" + "), images, prompt);
        let mb = captioner.batches(vec![sample])?.remove(0);
        println!("{}", captioner.caption(&mb)?.0);
        return Ok(());
    }
    let dir = args.shards.as_deref().context("give --image or --shards")?;
    let out = args.out.clone().unwrap_or_else(|| match &args.run {
        Some(run) => RunDir::new(run).samples(),
        None => PathBuf::from("samples.jsonl"),
    });
    caption_shards(&captioner, dir, args.limit, &out)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Captions the first `limit` image samples of `dir` from their prompt (the tokens before the
/// first supervised one) and writes `out` as JSON lines.
fn caption_shards(
    captioner: &Captioner,
    dir: &Path,
    limit: usize,
    out: &Path,
) -> anyhow::Result<()> {
    let dataset = tessera_shards::Dataset::open(dir)
        .with_context(|| format!("opening shards {}", dir.display()))?;
    let indices: Vec<u64> = dataset
        .metadata()?
        .iter()
        .enumerate()
        .filter(|(_, m)| m.kind == Kind::Image)
        .map(|(i, _)| i as u64)
        .take(limit)
        .collect();
    let mut references = Vec::new();
    let mut samples = Vec::new();
    for sample in dataset.read(&indices)? {
        let (prompt, reference) = held_out_prompt(sample)?;
        references.push((prompt.id.clone(), reference));
        samples.push(prompt);
    }
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
    );
    for (mb, (id, reference)) in captioner.batches(samples)?.iter().zip(references) {
        let (generated, _) = captioner.caption(mb)?;
        println!("{id}: {generated}\n  reference: {reference}");
        let line = serde_json::json!({"id": id, "reference": reference, "generated": generated});
        writeln!(file, "{line}").with_context(|| format!("writing {}", out.display()))?;
    }
    file.flush()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
