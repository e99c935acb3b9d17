//! `tessera generate`: captions an image (`--image`) or held-out shard samples (`--shards`)
//! with a run's latest checkpoint (`--run`) or a llava-hf export (`--model`). The image goes
//! through the training loader (decode, resize policy, placeholder expansion), the prompt
//! through the run's template (`plain`: the image alone, as LLaVA's stage 1; `chatml`: a user
//! turn holding the framed image and the prompt, then the assistant header), and the model
//! generates with a KV cache, greedily unless `--temperature` is set, until
//! `<|endoftext|>`/`<|im_end|>` or `--max-new-tokens`.
use anyhow::{anyhow, bail, Context};
use pipeline::loader::{BadImagePolicy, Loader, LoaderConfig, ResizePolicy};
use pipeline::{MicroBatch, MicroBatchPlan};
use shards::{Kind, Sample};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tessera_model::GenerateOptions;
use tessera_train::{load_export_model, load_run_model, GenerationModel};

/// Arguments of `tessera generate`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Run directory written by `tessera train` (its latest complete checkpoint generates).
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    run: Option<PathBuf>,
    /// Directory written by `tessera export --format llava-hf`.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Image (JPEG, PNG or WebP) to caption.
    #[arg(long, required_unless_present = "shards", conflicts_with = "shards")]
    image: Option<PathBuf>,
    /// Instruction for chatml models (default "Describe the image."); the plain template
    /// (stage 1) takes none: the caption follows the image.
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
    /// tokenizer.json (default: the export's own, or .deps/tokenizer/tokenizer.json for a run).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Recompute the whole prefix at every step instead of caching keys and values.
    #[arg(long)]
    no_kv_cache: bool,
}

/// The model plus what turns text and images into its inputs.
pub(crate) struct Captioner {
    pub model: GenerationModel,
    pub encoder: ingest::Encoder,
    pub options: GenerateOptions,
    loader: LoaderConfig,
}

impl Captioner {
    pub(crate) fn load(
        run: Option<&Path>,
        export: Option<&Path>,
        tokenizer: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let (model, default_tokenizer) = match (run, export) {
            (Some(run), _) => (
                load_run_model(run).with_context(|| format!("loading run {}", run.display()))?,
                PathBuf::from(".deps/tokenizer/tokenizer.json"),
            ),
            (None, Some(dir)) => (
                load_export_model(dir)
                    .with_context(|| format!("loading llava-hf export {}", dir.display()))?,
                dir.join("tokenizer.json"),
            ),
            (None, None) => bail!("give --run or --model"),
        };
        let path = tokenizer.map_or(default_tokenizer, Path::to_path_buf);
        let template: ingest::Template = model.template.parse().map_err(|e: String| anyhow!(e))?;
        let encoder = ingest::Encoder::load(&path, template)
            .with_context(|| format!("loading tokenizer {}", path.display()))?;
        if let Some(expected) = &model.tokenizer_fingerprint {
            if &encoder.fingerprint != expected {
                bail!(
                    "{} (sha256 {}) is not the tokenizer the run's shards were made with ({expected}); pass --tokenizer",
                    path.display(),
                    encoder.fingerprint
                );
            }
        }
        let generator = &model.generator;
        if i64::from(encoder.image_pad_id) != generator.image_token_id() {
            bail!(
                "{}: <|image_pad|> is id {}, the model's image token is {}",
                path.display(),
                encoder.image_pad_id,
                generator.image_token_id()
            );
        }
        let stop_ids = ["<|endoftext|>", "<|im_end|>"]
            .iter()
            .filter_map(|t| encoder.tokenizer().token_to_id(t))
            .map(i64::from)
            .collect();
        let vision = generator.vision();
        let loader = LoaderConfig::builder()
            .image_size(vision.image_size as usize)
            .image_tokens(vision.num_patches() as usize)
            .placeholder_id(encoder.image_pad_id)
            .resize(match model.image_aspect_ratio.as_str() {
                "pad" => ResizePolicy::Pad,
                _ => ResizePolicy::Squash,
            })
            .threads(1)
            .verify_checksums(false)
            // A caption of a zero stand-in would look like an answer: an image that does not
            // decode stops generation, naming the file or sample.
            .on_bad_image(BadImagePolicy::Fail)
            .build()?;
        Ok(Self {
            model,
            encoder,
            options: GenerateOptions {
                stop_ids,
                ..Default::default()
            },
            loader,
        })
    }

    /// Prompt token ids (one `<|image_pad|>`) for an image and an optional instruction.
    pub(crate) fn prompt_ids(&self, prompt: Option<&str>) -> anyhow::Result<Vec<u32>> {
        let text = if self.model.template == "chatml" {
            let prompt = prompt.unwrap_or("Describe the image.");
            format!("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
        } else {
            if prompt.is_some() {
                tracing::warn!(
                    "the plain template (stage 1) takes no instruction; --prompt is ignored"
                );
            }
            "<|image_pad|>".to_string()
        };
        let encoding = self
            .encoder
            .tokenizer()
            .encode(text.as_str(), false)
            .map_err(|e| anyhow!("tokenizing the prompt: {e}"))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Micro-batches (one sample each) through the training loader: pixels and expanded ids.
    pub(crate) fn batches(&self, samples: Vec<Sample>) -> anyhow::Result<Vec<MicroBatch>> {
        let plans: Vec<MicroBatchPlan> = (0..samples.len() as u64)
            .map(|i| MicroBatchPlan {
                kind: Kind::Image,
                rows: vec![vec![i]],
                zero_loss: false,
            })
            .collect();
        let ids: Vec<String> = samples.iter().map(|s| s.id.clone()).collect();
        let loader = Loader::new(Arc::new(samples), plans, self.loader.clone());
        loader
            .zip(ids)
            .map(|(mb, id)| mb.with_context(|| format!("preparing {id}")))
            .collect()
    }

    /// Generated text (special tokens dropped) and token count for one micro-batch.
    pub(crate) fn caption(&self, mb: &MicroBatch) -> anyhow::Result<(String, usize)> {
        let generation = self
            .model
            .generator
            .generate(&mb.input_ids, &mb.pixels, &self.options)
            .with_context(|| format!("generating for {}", mb.sample_ids.join(",")))?;
        let ids: Vec<u32> = generation.tokens.iter().map(|&t| t as u32).collect();
        let text = self
            .encoder
            .tokenizer()
            .decode(&ids, true)
            .map_err(|e| anyhow!("decoding {ids:?}: {e}"))?;
        Ok((text.trim().to_string(), ids.len()))
    }
}

/// A prompt-only image sample (the shape the loader reads).
pub(crate) fn image_sample(id: String, bytes: Vec<u8>, prompt: Vec<u32>) -> Sample {
    let n = prompt.len();
    Sample {
        id,
        kind: Kind::Image,
        image: Some(bytes),
        image_format: None,
        width: 0,
        height: 0,
        conversation: Vec::new(),
        label_mask: vec![false; n],
        input_ids: prompt,
        num_text_tokens: n as u32,
        num_supervised_tokens: 0,
        image_crc32c: None,
        input_ids_crc32c: None,
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let mut captioner = Captioner::load(
        args.run.as_deref(),
        args.model.as_deref(),
        args.tokenizer.as_deref(),
    )?;
    captioner.options.max_new_tokens = args.max_new_tokens;
    captioner.options.temperature = args.temperature;
    captioner.options.top_p = args.top_p;
    captioner.options.seed = args.seed;
    captioner.options.kv_cache = !args.no_kv_cache;
    if let Some(image) = &args.image {
        let bytes = std::fs::read(image).with_context(|| format!("reading {}", image.display()))?;
        let prompt = captioner.prompt_ids(args.prompt.as_deref())?;
        let sample = image_sample(image.display().to_string(), bytes, prompt);
        let mb = captioner.batches(vec![sample])?.remove(0);
        println!("{}", captioner.caption(&mb)?.0);
        return Ok(());
    }
    let dir = args.shards.as_deref().context("give --image or --shards")?;
    let out = args.out.clone().unwrap_or_else(|| match &args.run {
        Some(run) => run.join("samples.jsonl"),
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
    let dataset =
        shards::Dataset::open(dir).with_context(|| format!("opening shards {}", dir.display()))?;
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
        let cut = sample
            .label_mask
            .iter()
            .position(|&s| s)
            .unwrap_or(sample.input_ids.len());
        let reference = sample
            .conversation
            .iter()
            .find(|t| t.role == "gpt" || t.role == "assistant")
            .map(|t| t.text.clone())
            .unwrap_or_default();
        references.push((sample.id.clone(), reference));
        let bytes = sample
            .image
            .clone()
            .with_context(|| format!("sample {} has no image", sample.id))?;
        samples.push(image_sample(
            sample.id,
            bytes,
            sample.input_ids[..cut].to_vec(),
        ));
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
