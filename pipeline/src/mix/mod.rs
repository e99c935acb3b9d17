//! Weighted mixtures of shard sets (`--shards mix.toml`).
//!
//! 1. `spec`: the mixture file ([`MixSpec`]): sources with a `weight` or a `repeat`.
//! 2. [`Mixture`]: the opened shard sets behind one global sample index (source after source),
//!    read as one [`crate::loader::SampleSource`]; it checks they share a tokenizer, template
//!    and placeholder id, and fixes each source's samples per epoch.
//! 3. `draw`: an epoch's items (global indices, repeats allowed) in a seeded order that keeps
//!    every prefix within one sample of each source's share; the planner plans them in that
//!    order ([`crate::plan::PlannerBuilder::draws`]), so realized shares follow the weights
//!    however many ranks run it, and a resume at any W continues the same items.
mod draw;
mod error;
mod spec;

pub use error::MixError;
pub use spec::{is_mixture, Amount, MixSpec, SourceSpec};

use crate::loader::{LoaderError, SampleSource};
use draw::{interleave, proportional_counts, seed_of, source_sequence};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tessera_shards::{Dataset, Sample, SampleMeta};

/// One opened source of a mixture.
pub struct MixSource {
    pub name: String,
    pub dataset: Arc<Dataset>,
    pub amount: Amount,
    /// Global index of its first sample.
    pub first: u64,
    /// Samples it holds.
    pub len: u64,
    /// Samples each epoch draws from it.
    pub per_epoch: u64,
}

impl MixSource {
    /// Its share of an epoch of `epoch` samples.
    pub fn share(&self, epoch: u64) -> f64 {
        if epoch == 0 {
            0.0
        } else {
            self.per_epoch as f64 / epoch as f64
        }
    }
}

/// An epoch of a mixture: its items (global sample indices, in the order they are planned)
/// and a key naming that order (resume positions carry it).
#[derive(Clone, Debug, PartialEq)]
pub struct Draw {
    pub items: Vec<u64>,
    pub key: String,
}

/// Opened shard sets with their per-epoch amounts.
pub struct Mixture {
    pub spec: MixSpec,
    sources: Vec<MixSource>,
    fingerprint: String,
}

impl Mixture {
    /// The mixture of `spec` over `datasets` (one per source, opened by the caller, which
    /// knows about object stores). Refuses sources made with other tokenizers, templates or
    /// placeholder ids than the first, and empty ones.
    pub fn new(spec: MixSpec, datasets: Vec<Dataset>) -> Result<Mixture, MixError> {
        let invalid = |name: &str, detail: String| MixError::Source {
            name: name.to_string(),
            detail,
        };
        let mut sources = Vec::with_capacity(datasets.len());
        let mut first = 0;
        for (source, dataset) in spec.sources.iter().zip(datasets) {
            let len = dataset.len() as u64;
            if len == 0 {
                return Err(invalid(
                    &source.name,
                    format!("{} holds no samples", source.shards),
                ));
            }
            sources.push(MixSource {
                name: source.name.clone(),
                dataset: Arc::new(dataset),
                amount: source.amount,
                first,
                len,
                per_epoch: 0,
            });
            first += len;
        }
        if let Some(head) = sources.first() {
            let m = head.dataset.manifest();
            for other in &sources[1..] {
                let o = other.dataset.manifest();
                let differs = |what: &str, a: &str, b: &str| {
                    invalid(
                        &other.name,
                        format!("its {what} {b} differs from source {}'s {a}", head.name),
                    )
                };
                if o.tokenizer_fingerprint != m.tokenizer_fingerprint {
                    return Err(differs(
                        "tokenizer",
                        &m.tokenizer_fingerprint,
                        &o.tokenizer_fingerprint,
                    ));
                }
                if o.template != m.template {
                    return Err(differs("template", &m.template, &o.template));
                }
                if o.image_placeholder_id != m.image_placeholder_id {
                    let (a, b) = (
                        m.image_placeholder_id.to_string(),
                        o.image_placeholder_id.to_string(),
                    );
                    return Err(differs("image placeholder id", &a, &b));
                }
            }
        }
        let weights: Vec<Option<f64>> = sources
            .iter()
            .map(|s| match s.amount {
                Amount::Weight(w) => Some(w),
                Amount::Repeat(_) => None,
            })
            .collect();
        if weights.iter().all(Option::is_some) {
            let total = spec.samples.unwrap_or(first);
            let w: Vec<f64> = weights.iter().map(|w| w.unwrap_or(0.0)).collect();
            for (s, count) in sources.iter_mut().zip(proportional_counts(&w, total)) {
                s.per_epoch = count;
            }
        } else {
            for s in &mut sources {
                let repeat = match s.amount {
                    Amount::Repeat(r) => r,
                    Amount::Weight(_) => 1.0,
                };
                s.per_epoch = (repeat * s.len as f64).round() as u64;
            }
        }
        let mut hasher = Sha256::new();
        hasher.update(b"tessera-mixture-v1\n");
        for s in &sources {
            hasher.update(
                format!(
                    "{}\t{}\t{:?}\t{}\n",
                    s.name,
                    s.dataset.fingerprint(),
                    s.amount,
                    s.per_epoch
                )
                .as_bytes(),
            );
        }
        Ok(Mixture {
            spec,
            sources,
            fingerprint: hex::encode(hasher.finalize()),
        })
    }

    pub fn sources(&self) -> &[MixSource] {
        &self.sources
    }

    /// Distinct samples of all sources.
    pub fn len(&self) -> u64 {
        self.sources.iter().map(|s| s.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Samples each epoch draws.
    pub fn epoch_samples(&self) -> u64 {
        self.sources.iter().map(|s| s.per_epoch).sum()
    }

    /// sha256 over each source's name, shards fingerprint and amount: equal for the same
    /// shard sets mixed the same way.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The first source's index.json (every source shares its tokenizer and template).
    pub fn manifest(&self) -> &tessera_shards::Manifest {
        self.sources[0].dataset.manifest()
    }

    /// Every sample's metadata, source after source (global index order).
    pub fn metadata(&self) -> Result<Vec<SampleMeta>, MixError> {
        let mut out = Vec::with_capacity(self.len() as usize);
        for s in &self.sources {
            out.extend(s.dataset.metadata().map_err(|source| MixError::Shards {
                name: s.name.clone(),
                source,
            })?);
        }
        Ok(out)
    }

    /// Which source holds global sample `index`.
    pub fn source_of(&self, index: u64) -> usize {
        self.sources
            .partition_point(|s| s.first <= index)
            .saturating_sub(1)
    }

    /// Epoch `epoch`'s items in planning order (see `draw`).
    pub fn draw(&self, seed: u64, epoch: u64) -> Draw {
        let key_seed = seed_of(&[
            b"tessera-mix-draw-v1",
            self.fingerprint.as_bytes(),
            &seed.to_le_bytes(),
            &epoch.to_le_bytes(),
        ]);
        let sequences: Vec<Vec<u64>> = self
            .sources
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let stream = seed_of(&[&key_seed, &(i as u64).to_le_bytes()]);
                source_sequence(s.len, s.per_epoch, stream)
            })
            .collect();
        let counts: Vec<u64> = self.sources.iter().map(|s| s.per_epoch).collect();
        let items = interleave(&counts)
            .into_iter()
            .map(|(s, k)| self.sources[s].first + sequences[s][k as usize])
            .collect();
        Draw {
            items,
            key: format!("mix-{}", hex::encode(&key_seed[..8])),
        }
    }
}

impl SampleSource for Mixture {
    fn read(&self, indices: &[u64]) -> Result<Vec<Sample>, LoaderError> {
        let mut slots: Vec<Option<Sample>> = vec![None; indices.len()];
        for (s, source) in self.sources.iter().enumerate() {
            let (positions, local): (Vec<usize>, Vec<u64>) = indices
                .iter()
                .enumerate()
                .filter(|(_, &i)| self.source_of(i) == s)
                .map(|(p, &i)| (p, i - source.first))
                .unzip();
            if local.is_empty() {
                continue;
            }
            let read = source.dataset.read(&local).map_err(|e| LoaderError::Read {
                indices: local.iter().map(|l| l + source.first).collect(),
                source: e,
            })?;
            for (p, sample) in positions.into_iter().zip(read) {
                slots[p] = Some(sample);
            }
        }
        slots
            .into_iter()
            .zip(indices)
            .map(|(s, &i)| {
                s.ok_or_else(|| LoaderError::Read {
                    indices: vec![i],
                    source: tessera_shards::ShardError::OutOfRange {
                        index: i,
                        len: self.len() as usize,
                    },
                })
            })
            .collect()
    }

    fn mixture_source(&self, index: u64) -> Option<usize> {
        Some(self.source_of(index))
    }

    fn locate(&self, index: u64) -> String {
        let source = &self.sources[self.source_of(index)];
        format!(
            "{}: {}",
            source.name,
            SampleSource::locate(source.dataset.as_ref(), index - source.first)
        )
    }

    fn reads_ahead(&self) -> bool {
        self.sources.iter().any(|s| s.dataset.reads_ahead())
    }

    fn read_ahead(&self, indices: &[u64]) -> Result<(), LoaderError> {
        for (s, source) in self.sources.iter().enumerate() {
            let local: Vec<u64> = indices
                .iter()
                .filter(|&&i| self.source_of(i) == s)
                .map(|&i| i - source.first)
                .collect();
            if !local.is_empty() {
                SampleSource::read_ahead(source.dataset.as_ref(), &local)?;
            }
        }
        Ok(())
    }
}
