//! `PlannerBuilder` -> `Planner`: the planner's inputs, validated once in `build()`.
use super::error::PlanError;
use super::order::SampleOrder;
use tessera_shards::{Kind, SampleImages, SampleMeta};

/// How samples become micro-batches.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Mode {
    /// Several samples per row (first-fit decreasing), rows levelled, ranks balanced by cost.
    #[default]
    Pack,
    /// One sample per row; rows of similar length grouped (length buckets), no packing.
    Bucket,
    /// The naive baseline: a fixed number of samples per micro-batch in shuffled order, one
    /// per row, padded to the longest; kinds mix freely.
    Fixed,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Pack, Mode::Bucket, Mode::Fixed];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Pack => "pack",
            Mode::Bucket => "bucket",
            Mode::Fixed => "fixed",
        }
    }
}

/// Relative compute cost of a sample, in units of one LM token: `len` (the linear layers) +
/// `attention * len^2` (attention is block-diagonal, so quadratic per sample, not per row) +
/// `vision` per image (the vision tower's forward, once for each of a sample's images).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    pub attention: f64,
    pub vision: f64,
}

impl Default for CostModel {
    /// For a Qwen2.5-0.5B-sized LM (hidden 896) behind SigLIP-so400m: attention adds about
    /// `len / (12 * hidden)` per token; the frozen vision tower's forward is about half the
    /// LM cost of its 729 tokens.
    fn default() -> Self {
        CostModel {
            attention: 1.0 / 10752.0,
            vision: 364.0,
        }
    }
}

impl CostModel {
    pub(crate) fn cost(&self, images: u32, len: u32) -> f64 {
        let l = f64::from(len);
        l + self.attention * l * l + self.vision * f64::from(images)
    }
}

/// What the planner does with a sample longer than a row can be (`min(seq_len, token_budget)`).
/// Either way nothing is truncated: a cut caption or image would train on a wrong target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
pub enum OverLong {
    /// `build()` refuses the dataset, naming the first such sample.
    #[default]
    Fail,
    /// The sample is left out of every epoch's plan and listed in [`Planner::skipped`]; every
    /// rank leaves out the same samples, so resume stays exact at any world size.
    Skip,
}

/// A sample the plan leaves out for its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SkippedSample {
    /// Its index in the dataset (shard order, then row order).
    pub index: u64,
    /// Its tokens with every image expanded.
    pub tokens: u64,
    /// The longest a row can be.
    pub limit: u64,
}

/// Builder for a [`Planner`]; `build()` validates every setting and every sample.
#[derive(Clone, Debug)]
pub struct PlannerBuilder {
    samples: Vec<SampleMeta>,
    image_tokens: u32,
    world_size: usize,
    token_budget: u64,
    seq_len: u64,
    micro_steps: usize,
    seed: u64,
    epoch: u64,
    mode: Mode,
    fingerprint: String,
    cost: CostModel,
    fixed_samples: Option<usize>,
    only: Option<Kind>,
    draws: Option<(Vec<u64>, String)>,
    over_long: OverLong,
    images: Option<Vec<SampleImages>>,
}

impl Default for PlannerBuilder {
    fn default() -> Self {
        PlannerBuilder {
            samples: Vec::new(),
            image_tokens: 729,
            world_size: 1,
            token_budget: 8192,
            seq_len: 2048,
            micro_steps: 1,
            seed: 0,
            epoch: 0,
            mode: Mode::Pack,
            fingerprint: String::new(),
            cost: CostModel::default(),
            fixed_samples: None,
            only: None,
            draws: None,
            over_long: OverLong::Fail,
            images: None,
        }
    }
}

impl PlannerBuilder {
    /// Per-sample metadata; a sample's index is its position (shard order, then row order).
    pub fn samples(mut self, samples: &[SampleMeta]) -> Self {
        self.samples = samples.to_vec();
        self
    }
    /// Vision tokens per image (729 for SigLIP-so400m at 384 px); default 729. A sample of
    /// several images counts this many for each.
    pub fn image_tokens(mut self, n: u32) -> Self {
        self.image_tokens = n;
        self
    }
    /// Each sample's images as a layout makes them (`tessera_shards::sample_images`, in the order of
    /// `samples`): an image sample then counts those tokens, and its tiles in the rank
    /// balance's cost, instead of `image_tokens` per image.
    pub fn sample_images(mut self, images: Vec<SampleImages>) -> Self {
        self.images = Some(images);
        self
    }
    /// Ranks (W); default 1.
    pub fn world_size(mut self, w: usize) -> Self {
        self.world_size = w;
        self
    }
    /// Tokens per micro-batch, padding included (`rows * row_len`); default 8192.
    pub fn token_budget(mut self, b: u64) -> Self {
        self.token_budget = b;
        self
    }
    /// Longest row (packed sequence); default 2048.
    pub fn seq_len(mut self, l: u64) -> Self {
        self.seq_len = l;
        self
    }
    /// Micro-steps per optimizer step (G, gradient accumulation); default 1.
    pub fn micro_steps(mut self, g: usize) -> Self {
        self.micro_steps = g;
        self
    }
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    pub fn epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
    /// The dataset's fingerprint (`tessera_shards::Dataset::fingerprint`): part of the shuffle seed.
    pub fn fingerprint(mut self, fingerprint: &str) -> Self {
        self.fingerprint = fingerprint.to_string();
        self
    }
    pub fn cost_model(mut self, cost: CostModel) -> Self {
        self.cost = cost;
        self
    }
    /// `fixed` mode's samples per micro-batch; default `max(1, token_budget / seq_len)` (the
    /// count whose worst case still fits the budget).
    pub fn fixed_samples(mut self, n: usize) -> Self {
        self.fixed_samples = Some(n);
        self
    }

    /// Plans only samples of `kind`; the others are left out of every epoch (stage 1, which
    /// trains only the projector, learns nothing from text-only samples). Default: all kinds.
    pub fn only(mut self, kind: Option<Kind>) -> Self {
        self.only = kind;
        self
    }

    /// Plans `items` (indices into `samples`, repeats allowed: a mixture's epoch draw) in
    /// this order instead of a seeded shuffle of every sample once; `key` names the order
    /// (resume positions carry it). The plan's micro-batches name the drawn samples' indices.
    pub fn draws(mut self, items: Vec<u64>, key: &str) -> Self {
        self.draws = Some((items, key.to_string()));
        self
    }

    /// What to do with samples longer than a row can be (default: fail).
    pub fn over_long(mut self, policy: OverLong) -> Self {
        self.over_long = policy;
        self
    }

    pub fn build(self) -> Result<Planner, PlanError> {
        if self.token_budget == 0 {
            return Err(PlanError::ZeroBudget);
        }
        if self.world_size == 0 {
            return Err(PlanError::ZeroWorldSize);
        }
        if self.seq_len == 0 {
            return Err(PlanError::ZeroSeqLen);
        }
        if self.micro_steps == 0 {
            return Err(PlanError::ZeroMicroSteps);
        }
        for (name, v) in [
            ("attention", self.cost.attention),
            ("vision", self.cost.vision),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(PlanError::InvalidCost(format!(
                    "{name} cost {v} must be finite and >= 0"
                )));
            }
        }
        let fixed_samples = match self.fixed_samples {
            Some(n) => n,
            None => usize::try_from(self.token_budget / self.seq_len)
                .unwrap_or(usize::MAX)
                .max(1),
        };
        if self.mode == Mode::Fixed {
            if fixed_samples == 0 {
                return Err(PlanError::ZeroFixedSamples);
            }
            if fixed_samples > 1 && fixed_samples as u64 * self.seq_len > self.token_budget {
                return Err(PlanError::FixedOverBudget {
                    samples: fixed_samples,
                    seq_len: self.seq_len,
                    budget: self.token_budget,
                });
            }
        }
        let items = self
            .draws
            .as_ref()
            .map_or(self.samples.len(), |(d, _)| d.len());
        if self.samples.len() > u32::MAX as usize || items > u32::MAX as usize {
            return Err(PlanError::TooManySamples {
                count: self.samples.len().max(items),
            });
        }
        if let Some(&bad) = self
            .draws
            .as_ref()
            .and_then(|(d, _)| d.iter().find(|&&i| i >= self.samples.len() as u64))
        {
            return Err(PlanError::DrawOutOfRange {
                index: bad,
                samples: self.samples.len(),
            });
        }
        let (row_cap, cap_name) = if self.seq_len <= self.token_budget {
            (self.seq_len, "sequence length")
        } else {
            (self.token_budget, "token budget")
        };
        let mut lens = Vec::with_capacity(self.samples.len());
        let mut skipped = Vec::new();
        if let Some(images) = self
            .images
            .as_ref()
            .filter(|i| i.len() != self.samples.len())
        {
            return Err(PlanError::ImagesPerSample {
                images: images.len(),
                samples: self.samples.len(),
            });
        }
        let images_of = |i: usize, s: &SampleMeta| match &self.images {
            Some(images) => images[i],
            None => SampleImages {
                tokens: u64::from(s.num_images) * u64::from(self.image_tokens),
                tiles: s.num_images,
            },
        };
        let mut tiles = Vec::with_capacity(self.samples.len());
        for (i, s) in self.samples.iter().enumerate() {
            let images = images_of(i, s);
            tiles.push(images.tiles);
            let len = sample_len(i as u64, s, images.tokens)?;
            if len > row_cap {
                if self.over_long == OverLong::Fail {
                    return Err(PlanError::SampleTooLong {
                        index: i as u64,
                        len,
                        limit: row_cap,
                        limit_name: cap_name,
                    });
                }
                skipped.push(SkippedSample {
                    index: i as u64,
                    tokens: len,
                    limit: row_cap,
                });
            }
            lens.push(len.min(u64::from(u32::MAX)) as u32);
        }
        // Per item: every sample once (a seeded shuffle), or a mixture's draw (its order).
        let (metas, lens, tiles, order_of, drawn): (Vec<SampleMeta>, Vec<u32>, Vec<u32>, _, _) =
            match self.draws {
                None => (self.samples, lens, tiles, None, None),
                Some((items, key)) => {
                    let metas = items.iter().map(|&i| self.samples[i as usize]).collect();
                    let item_lens = items.iter().map(|&i| lens[i as usize]).collect();
                    let item_tiles = items.iter().map(|&i| tiles[i as usize]).collect();
                    (metas, item_lens, item_tiles, Some(key), Some(items))
                }
            };
        let kinds: Vec<Kind> = metas.iter().map(|s| s.kind).collect();
        let mut order = match &order_of {
            None => SampleOrder::new(&kinds, &self.fingerprint, self.seed, self.epoch),
            Some(key) => SampleOrder::given(&kinds, key),
        };
        if let Some(keep) = self.only {
            order.keep_only(keep, &kinds);
        }
        if !skipped.is_empty() {
            order.drop_longer_than(row_cap as u32, &lens);
        }
        Ok(Planner {
            supervised: metas.iter().map(|s| s.num_supervised_tokens).collect(),
            costs: tiles
                .iter()
                .zip(&lens)
                .map(|(&t, &l)| self.cost.cost(t, l))
                .collect(),
            kinds,
            lens,
            drawn,
            order,
            world_size: self.world_size,
            token_budget: self.token_budget,
            row_cap: row_cap as u32,
            micro_steps: self.micro_steps,
            epoch: self.epoch,
            mode: self.mode,
            fixed_samples,
            skipped,
        })
    }
}

/// Tokens a sample occupies in a row: its text tokens, with an image sample's placeholders
/// (one per image) expanded to its images' `image_tokens` in all. A sample is never split: all
/// of its images and text go into one row.
fn sample_len(index: u64, s: &SampleMeta, image_tokens: u64) -> Result<u64, PlanError> {
    let text = u64::from(s.num_text_tokens);
    let images = u64::from(s.num_images);
    let bad = || PlanError::EmptySample {
        index,
        kind: s.kind,
        num_images: s.num_images,
        num_text_tokens: s.num_text_tokens,
    };
    match s.kind {
        Kind::Text if text == 0 || images > 0 => Err(bad()),
        Kind::Text => Ok(text),
        Kind::Image if images == 0 || text < images => Err(bad()),
        Kind::Image => Ok(text - images + image_tokens),
    }
}

/// A validated planner: every rank builds the same one and computes the same plan alone. Its
/// per-item vectors are per sample, or per drawn item of a mixture (`drawn` maps an item to
/// its sample index).
#[derive(Clone, Debug)]
pub struct Planner {
    pub(crate) drawn: Option<Vec<u64>>,
    pub(crate) kinds: Vec<Kind>,
    pub(crate) lens: Vec<u32>,
    pub(crate) costs: Vec<f64>,
    pub(crate) supervised: Vec<u32>,
    pub(crate) order: SampleOrder,
    pub(crate) world_size: usize,
    pub(crate) token_budget: u64,
    /// `min(seq_len, token_budget)`: the longest a row can be.
    pub(crate) row_cap: u32,
    pub(crate) micro_steps: usize,
    pub(crate) epoch: u64,
    pub(crate) mode: Mode,
    pub(crate) fixed_samples: usize,
    /// Samples left out for their length (with [`OverLong::Skip`]), in index order.
    pub(crate) skipped: Vec<SkippedSample>,
}

impl Planner {
    pub fn builder() -> PlannerBuilder {
        PlannerBuilder::default()
    }

    /// Token length of each sample as planned (image placeholders expanded); of each drawn
    /// item for a mixture's draw.
    pub fn sample_lens(&self) -> &[u32] {
        &self.lens
    }

    /// The sample index of planning item `item` (the item itself unless a draw is planned).
    pub(crate) fn sample_of(&self, item: u32) -> u64 {
        match &self.drawn {
            Some(drawn) => drawn[item as usize],
            None => u64::from(item),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The samples every epoch leaves out for their length (empty unless built with
    /// [`OverLong::Skip`]).
    pub fn skipped(&self) -> &[SkippedSample] {
        &self.skipped
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }
}
