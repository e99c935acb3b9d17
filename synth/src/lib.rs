//! `tessera synth`: datasets in LLaVA-Pretrain's exact layout, for tests, demos and benchmarks
//! on machines that cannot download the real 27 GB.
//!
//! What [`generate`] writes under `out`:
//! 1. `blip_laion_cc_sbu_558k.json`: a JSON list of LLaVA records (`id`, `image`,
//!    `conversations`), 9-digit ids spread over the folders `00000`..`00659` (the folder is
//!    the id's first five digits).
//! 2. `images/NNNNN/ID.jpg`: JPEG quality 90, sizes drawn like LLaVA-Pretrain's (`sizes`):
//!    procedurally drawn scenes whose caption describes them (`scene`), or crops of real
//!    photographs with generic captions (`photos`).
//! 3. With `zip`, `images.zip` holding the same bytes under the same names, no root folder.
//!
//! A share of records can be text-only multi-turn conversations (`text_only`). Every sample
//! draws from its own RNG seeded from `(seed, index)`, so the output is byte-identical for a
//! seed whatever the number of workers. Every file is written to a temporary name and renamed;
//! the json and the zip also go through `tessera_shards::write_atomically_with` (fsynced, folder
//! fsynced), the images are not fsynced one by one (see `layout::write_image`).
mod archive;
mod error;
mod generate;
mod layout;
mod photos;
mod scene;
mod sizes;
mod text_only;
mod texture;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;

pub use error::SynthError;
pub use generate::{generate, JPEG_QUALITY};
pub use layout::{LlavaRecord, Turn, BRIEF_PROMPTS, JSON_FILE_NAME, MAX_FOLDER};
pub use scene::SHAPES;
pub use sizes::{SizeStats, MAX_SIDE, SHORT_SIDE};

/// What to generate. Build with [`SynthConfig::new`], adjust fields, then [`generate`].
#[derive(Debug, Clone)]
pub struct SynthConfig {
    /// Output folder (created if missing).
    pub out: PathBuf,
    /// Number of records in the json.
    pub samples: usize,
    /// Share of records that are text-only conversations (0..=1); exactly
    /// `round(samples * fraction)` records are text-only.
    pub text_only_fraction: f64,
    /// Crop real photographs found (recursively) in this folder instead of drawing scenes.
    pub photos: Option<PathBuf>,
    /// Also write `images.zip` (stored, no root folder).
    pub zip: bool,
    /// Seed of every random choice.
    pub seed: u64,
    /// Worker threads; 1 turns parallelism off (the output is the same either way).
    pub workers: usize,
    /// Show a progress bar (the caller decides: a terminal, and no `--quiet` or NO_PROGRESS).
    pub progress: bool,
}

impl SynthConfig {
    /// Defaults: no text-only records, drawn scenes, no zip, seed 0, one worker per core, no
    /// progress bar.
    pub fn new(out: impl Into<PathBuf>, samples: usize) -> Self {
        SynthConfig {
            out: out.into(),
            samples,
            text_only_fraction: 0.0,
            photos: None,
            zip: false,
            seed: 0,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            progress: false,
        }
    }

    /// Checks the settings; [`generate`] calls it first.
    pub fn validate(&self) -> Result<(), SynthError> {
        if self.samples == 0 {
            return Err(SynthError::Config("--samples 0: nothing to write".into()));
        }
        if self.samples > layout::ID_SPACE as usize {
            return Err(SynthError::Config(format!(
                "--samples {} exceeds the {} ids of folders 00000..{:05}",
                self.samples,
                layout::ID_SPACE,
                MAX_FOLDER
            )));
        }
        if !(0.0..=1.0).contains(&self.text_only_fraction) {
            return Err(SynthError::Config(format!(
                "--text-only-fraction {} is not between 0 and 1",
                self.text_only_fraction
            )));
        }
        if self.workers == 0 {
            return Err(SynthError::Config("0 workers cannot write anything".into()));
        }
        Ok(())
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthReport {
    pub json_path: PathBuf,
    pub zip_path: Option<PathBuf>,
    pub records: usize,
    pub images: usize,
    pub text_only: usize,
    /// Total bytes of all JPEGs.
    pub image_bytes: u64,
}

/// The RNG of sample `index`: one ChaCha stream per sample, so workers never share state.
pub(crate) fn sample_rng(seed: u64, index: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index as u64);
    rng
}
