//! `LoaderConfig`: image size, token ids, resize and bad-image policies, thread count.
//! Built through `LoaderConfig::builder()`, whose `build()` rejects unusable values.
use super::LoaderError;
use tessera_shards::image_layout::{ImageLayout, ImageTokens, Tower};
use tessera_switches::Switches;
use tessera_text::SpecialTokens;

/// How an image becomes `size x size`. Named `squash` / `pad` in TOML, JSON and (with the
/// `clap` feature) on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
pub enum ResizePolicy {
    /// Resize straight to `size x size`, bicubic (SigLIP's image processor).
    #[default]
    Squash,
    /// LLaVA's `expand2square`: centre on a square of the mean colour, then resize.
    Pad,
}

/// What happens to a sample whose image does not decode, or whose stored checksum does not
/// match its bytes. (`tessera train --on-bad-image` defaults to `fail`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
pub enum BadImagePolicy {
    /// Warn with the sample id and drop the sample from its micro-batch.
    #[default]
    Skip,
    /// Stop with an error naming the sample.
    Fail,
}

/// Everything the loader needs besides the plans and the samples.
#[derive(Clone, Debug, PartialEq)]
pub struct LoaderConfig {
    /// Output side length S: pixels are `[n, 3, S, S]`.
    pub image_size: usize,
    /// Vision tokens per image under `single` (each placeholder expands to this many ids).
    pub image_tokens: usize,
    /// How an image becomes tower views: `single` (one `image_size` view, resized by
    /// `resize`) or `anyres_max_N` (a base view plus its pinpoint's tiles, LLaVA-OneVision's).
    pub image_layout: ImageLayout,
    /// The tower's patch side: under `anyres_max_N` a view gives `(image_size / patch)²`
    /// features, which the geometry of each image's tokens is counted in.
    pub patch_size: u32,
    /// The id each image expands from: the dataset's image token (see
    /// [`LoaderConfigBuilder::tokens`]).
    pub placeholder_id: u32,
    /// The id padding fills rows with: the dataset's pad token.
    pub pad_id: u32,
    pub resize: ResizePolicy,
    /// Fill colour of `ResizePolicy::Pad` (LLaVA: the processor's mean x 255).
    pub pad_rgb: [u8; 3],
    pub on_bad_image: BadImagePolicy,
    /// Worker threads; 1 runs everything on the caller's thread.
    pub threads: usize,
    /// Micro-batches in flight or waiting at most (bounds memory).
    pub prefetch: usize,
    /// Check each sample's stored crc32c (image bytes, token ids) as it is read (default on;
    /// off only to measure what the check costs).
    pub verify_checksums: bool,
}

impl LoaderConfig {
    pub fn builder() -> LoaderConfigBuilder {
        LoaderConfigBuilder::default()
    }

    /// The tower's geometry the views are cut for.
    pub fn tower(&self) -> Tower {
        Tower {
            tile: self.image_size as u32,
            patch: self.patch_size,
        }
    }

    /// What image `image` of `images` in a sample becomes under an `anyres_max_N` layout
    /// (`None` under `single`), from its stored size: the planner's numbers.
    pub fn geometry(&self, width: u32, height: u32, images: usize) -> Option<ImageTokens> {
        match self.image_layout {
            ImageLayout::Single => None,
            ImageLayout::AnyRes { .. } => {
                Some(
                    self.image_layout
                        .tokens_in_sample(width, height, images, self.tower()),
                )
            }
        }
    }
}

/// Builder for `LoaderConfig`; defaults: 384 px, 729 tokens (SigLIP so400m/14 at 384), Qwen ids,
/// squash, skip, threads from [`LoaderConfigBuilder::threads`], else `TESSERA_LOADER_THREADS`,
/// else the core count; prefetch 2 per thread.
#[derive(Clone, Debug, Default)]
pub struct LoaderConfigBuilder {
    image_size: Option<usize>,
    image_tokens: Option<usize>,
    image_layout: ImageLayout,
    patch_size: Option<u32>,
    placeholder_id: Option<u32>,
    pad_id: Option<u32>,
    resize: ResizePolicy,
    pad_rgb: Option<[u8; 3]>,
    on_bad_image: BadImagePolicy,
    threads: Option<usize>,
    prefetch: Option<usize>,
    skip_checksums: bool,
}

impl LoaderConfigBuilder {
    pub fn image_size(mut self, v: usize) -> Self {
        self.image_size = Some(v);
        self
    }
    pub fn image_tokens(mut self, v: usize) -> Self {
        self.image_tokens = Some(v);
        self
    }
    /// `anyres_max_N` cuts each image into views of `image_size` for a tower of patch
    /// `patch_size` (default `single`).
    pub fn image_layout(mut self, layout: ImageLayout, patch_size: u32) -> Self {
        self.image_layout = layout;
        self.patch_size = Some(patch_size);
        self
    }
    pub fn placeholder_id(mut self, v: u32) -> Self {
        self.placeholder_id = Some(v);
        self
    }
    /// The placeholder and padding ids of a dataset (its index.json's special tokens).
    pub fn tokens(self, tokens: &SpecialTokens) -> Self {
        self.placeholder_id(tokens.image.id).pad_id(tokens.pad_id)
    }
    pub fn pad_id(mut self, v: u32) -> Self {
        self.pad_id = Some(v);
        self
    }
    pub fn resize(mut self, v: ResizePolicy) -> Self {
        self.resize = v;
        self
    }
    pub fn pad_rgb(mut self, v: [u8; 3]) -> Self {
        self.pad_rgb = Some(v);
        self
    }
    pub fn on_bad_image(mut self, v: BadImagePolicy) -> Self {
        self.on_bad_image = v;
        self
    }
    /// Worker threads; this wins over `TESSERA_LOADER_THREADS`, which only replaces the
    /// default (the core count).
    pub fn threads(mut self, v: usize) -> Self {
        self.threads = Some(v);
        self
    }
    pub fn prefetch(mut self, v: usize) -> Self {
        self.prefetch = Some(v);
        self
    }
    /// Whether to check stored checksums (default true).
    pub fn verify_checksums(mut self, v: bool) -> Self {
        self.skip_checksums = !v;
        self
    }

    pub fn build(self) -> Result<LoaderConfig, LoaderError> {
        let image_size = self.image_size.unwrap_or(384);
        if image_size == 0 || image_size > u16::MAX as usize {
            return Err(LoaderError::Config(format!(
                "image size {image_size} is not a size (1..=65535)"
            )));
        }
        let image_tokens = self.image_tokens.unwrap_or(729);
        if image_tokens == 0 {
            return Err(LoaderError::Config("0 image tokens per image".into()));
        }
        let patch_size = self.patch_size.unwrap_or(14);
        if self.image_layout != ImageLayout::Single {
            let side = image_size as u32 / patch_size.max(1);
            if patch_size == 0 || (side * side) as usize != image_tokens {
                return Err(LoaderError::Config(format!(
                    "{}: a {image_size} px view of {patch_size} px patches gives {} features, \
                     not the {image_tokens} image tokens set",
                    self.image_layout,
                    side * side
                )));
            }
        }
        // An explicit count wins; TESSERA_LOADER_THREADS only replaces the default.
        let threads = self
            .threads
            .or(Switches::get().loader_threads)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        if threads == 0 {
            return Err(LoaderError::Config("0 worker threads".into()));
        }
        // The dataset's ids, never a guess: a wrong placeholder id trains on no image.
        let placeholder_id = self.placeholder_id.ok_or_else(|| {
            LoaderError::Config(
                "no image placeholder id: set the dataset's special tokens (its index.json's \
                 special_tokens, through `tokens`)"
                    .into(),
            )
        })?;
        let pad_id = self.pad_id.ok_or_else(|| {
            LoaderError::Config(
                "no padding id: set the dataset's special tokens (its index.json's \
                 special_tokens, through `tokens`)"
                    .into(),
            )
        })?;
        let prefetch = self.prefetch.unwrap_or(2 * threads);
        if prefetch == 0 {
            return Err(LoaderError::Config("prefetch 0 would never load".into()));
        }
        Ok(LoaderConfig {
            image_size,
            image_tokens,
            image_layout: self.image_layout,
            patch_size,
            placeholder_id,
            pad_id,
            resize: self.resize,
            pad_rgb: self.pad_rgb.unwrap_or([127, 127, 127]),
            on_bad_image: self.on_bad_image,
            threads,
            prefetch,
            verify_checksums: !self.skip_checksums,
        })
    }
}
