//! Captioning with a [`Generator`] (what `tessera generate` runs): the image goes through the
//! training loader (decode, resize policy, placeholder expansion), the prompt through the
//! model's chat template ([`tessera_text::chat`]: `plain`, the image alone as LLaVA's stage 1;
//! `chatml`, a user turn holding the framed image and the instruction, then the assistant
//! header) with the dataset's special tokens, and the model generates until the tokenizer's
//! end of sequence (or, for `chatml`, `<|im_end|>`) or `max_new_tokens`.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tessera_model::{GenerateOptions, Generator, ModelError};
use tessera_pipeline::loader::{BadImagePolicy, Loader, LoaderConfig, LoaderError, ResizePolicy};
use tessera_pipeline::{MicroBatch, MicroBatchPlan};
use tessera_shards::image_layout::ImageLayout;
use tessera_shards::{Image, Kind, Sample};
use tessera_text::chat::{Role, Template, IMAGE_TAG, IM_END};
use tessera_text::SpecialTokens;

/// The instruction of a `chatml` prompt when none is given.
pub const DEFAULT_INSTRUCTION: &str = "Describe the image.";

/// Why captioning failed; each message names the tokenizer, sample or tokens involved.
#[derive(Debug, thiserror::Error)]
pub enum CaptionError {
    #[error("loading tokenizer {path}")]
    Tokenizer {
        path: PathBuf,
        source: tessera_text::TextError,
    },
    #[error("{path}: the image token {token} is id {tokenizer}, the model's is {model}")]
    ImageToken {
        path: PathBuf,
        token: String,
        tokenizer: u32,
        model: i64,
    },
    #[error("a language model alone cannot caption images")]
    NoVisionTower,
    #[error(transparent)]
    LoaderConfig(LoaderError),
    #[error("tokenizing the prompt")]
    Prompt {
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Boxed, as `Generate`'s source: a loader error beside the sample id is large.
    #[error("preparing {sample}")]
    Prepare {
        sample: String,
        source: Box<LoaderError>,
    },
    /// Boxed: a `ModelError` beside the sample ids would make every `Result` here large.
    #[error("generating for {samples}")]
    Generate {
        samples: String,
        source: Box<ModelError>,
    },
    #[error("decoding {ids:?}")]
    Decode {
        ids: Vec<u32>,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("sample {0} has no image")]
    NoImage(String),
    /// The model names a template this build does not know.
    #[error("{0}")]
    Template(String),
}

/// The model plus what turns text and images into its inputs.
pub struct Captioner {
    pub generator: Generator,
    pub encoder: tessera_text::Encoder,
    /// Stop ids are the template's ends (see [`Template::stop_ids`]); the rest is the caller's.
    pub options: GenerateOptions,
    template: Template,
    loader: LoaderConfig,
}

impl Captioner {
    /// `generator` with the tokenizer at `tokenizer` (whose image token must be the model's),
    /// prompting with `template` and resizing images by `resize` (as the model was trained).
    /// `tokens`: the special tokens the model was trained with (a run's); `None` resolves them
    /// from the tokenizer's own files (a llava-hf export's tokenizer_config.json).
    /// `layout`: how the model was trained to see images (`single`, or `anyres_max_N`, whose
    /// views the loader cuts as in training).
    pub fn new(
        generator: Generator,
        template: Template,
        (resize, layout): (ResizePolicy, ImageLayout),
        tokenizer: &Path,
        tokens: Option<SpecialTokens>,
    ) -> Result<Self, CaptionError> {
        let encoder = match tokens {
            Some(tokens) => tessera_text::Encoder::with_tokens(tokenizer, template, tokens),
            None => tessera_text::Encoder::load(tokenizer, template),
        }
        .map_err(|source| CaptionError::Tokenizer {
            path: tokenizer.to_path_buf(),
            source,
        })?;
        let image = &encoder.tokens.image;
        if i64::from(image.id) != generator.image_token_id() {
            return Err(CaptionError::ImageToken {
                path: tokenizer.to_path_buf(),
                token: image.text.clone(),
                tokenizer: image.id,
                model: generator.image_token_id(),
            });
        }
        let im_end = encoder.tokenizer().token_to_id(IM_END);
        let stop_ids = template
            .stop_ids(&encoder.tokens, im_end)
            .into_iter()
            .map(i64::from)
            .collect();
        let vision = generator.vision().ok_or(CaptionError::NoVisionTower)?;
        let loader = LoaderConfig::builder()
            .image_size(vision.image_size as usize)
            .image_tokens(vision.num_patches() as usize)
            .image_layout(layout, vision.patch_size as u32)
            .tokens(&encoder.tokens)
            .resize(resize)
            .threads(1)
            .verify_checksums(false)
            // A caption of a zero stand-in would look like an answer: an image that does not
            // decode stops generation, naming the file or sample.
            .on_bad_image(BadImagePolicy::Fail)
            .build()
            .map_err(CaptionError::LoaderConfig)?;
        Ok(Self {
            generator,
            encoder,
            options: GenerateOptions {
                stop_ids,
                ..Default::default()
            },
            template,
            loader,
        })
    }

    /// Prompt token ids (one image token per image) for `images` images and an
    /// instruction (`chatml` only; [`DEFAULT_INSTRUCTION`] when `None`): the text training saw
    /// before the answer. `plain` puts the images' placeholders first and nothing else;
    /// `chatml` a user turn of one `<image>` per image, a newline and the instruction.
    pub fn prompt_ids(
        &self,
        instruction: Option<&str>,
        images: usize,
    ) -> Result<Vec<u32>, CaptionError> {
        if self.template == Template::Plain && instruction.is_some() {
            tracing::warn!(
                "the plain template (stage 1) takes no instruction; --prompt is ignored"
            );
        }
        let turn = format!(
            "{}\n{}",
            IMAGE_TAG.repeat(images),
            instruction.unwrap_or(DEFAULT_INSTRUCTION)
        );
        let text = self.template.generation_prompt(
            &[(Role::User, turn.as_str())],
            images,
            &self.encoder.tokens,
        );
        self.encoder
            .encode_text(&text)
            .map_err(|source| CaptionError::Prompt { source })
    }

    /// Micro-batches (one sample each) through the training loader: pixels and expanded ids.
    pub fn batches(&self, samples: Vec<Sample>) -> Result<Vec<MicroBatch>, CaptionError> {
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
            .map(|(mb, sample)| {
                mb.map_err(|source| CaptionError::Prepare {
                    sample,
                    source: Box::new(source),
                })
            })
            .collect()
    }

    /// Generated text (special tokens dropped) and token count for one micro-batch.
    pub fn caption(&self, mb: &MicroBatch) -> Result<(String, usize), CaptionError> {
        let generation = self
            .generator
            .generate_images(&mb.input_ids, &mb.pixels, &mb.image_geometry, &self.options)
            .map_err(|source| CaptionError::Generate {
                samples: mb.sample_ids.join(","),
                source: Box::new(source),
            })?;
        let ids: Vec<u32> = generation.tokens.iter().map(|&t| t as u32).collect();
        let text = self
            .encoder
            .tokenizer()
            .decode(&ids, true)
            .map_err(|source| CaptionError::Decode {
                ids: ids.clone(),
                source,
            })?;
        Ok((text.trim().to_string(), ids.len()))
    }
}

/// A prompt-only sample of `images` (in placeholder order; the shape the loader reads).
pub fn image_sample(id: String, images: Vec<Vec<u8>>, prompt: Vec<u32>) -> Sample {
    let n = prompt.len();
    Sample {
        id,
        kind: Kind::Image,
        images: images.into_iter().map(Image::unchecked).collect(),
        conversation: Vec::new(),
        label_mask: vec![false; n],
        input_ids: prompt,
        num_text_tokens: n as u32,
        num_supervised_tokens: 0,
        input_ids_crc32c: None,
    }
}

/// A held-out shard sample as a prompt: its tokens before the first supervised one (the
/// answer), and its reference answer (the first gpt/assistant turn).
pub fn held_out_prompt(sample: Sample) -> Result<(Sample, String), CaptionError> {
    let cut = sample
        .label_mask
        .iter()
        .position(|&s| s)
        .unwrap_or(sample.input_ids.len());
    let reference = sample
        .conversation
        .iter()
        .find(|t| Role::from_llava(&t.role) == Some(Role::Assistant))
        .map(|t| t.text.clone())
        .unwrap_or_default();
    if sample.images.is_empty() {
        return Err(CaptionError::NoImage(sample.id));
    }
    let prompt = sample.input_ids[..cut].to_vec();
    let images = sample.images.into_iter().map(|i| i.bytes).collect();
    Ok((image_sample(sample.id, images, prompt), reference))
}
