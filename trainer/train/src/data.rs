//! What `--shards` names: one shard set (a folder or a URL) or a mixture file (`mix.toml`,
//! `tessera_pipeline::mix`) of several, each read through the same cache settings. The loop sees one
//! sample source and one fingerprint either way; a mixture also draws each epoch's items.
use crate::error::TrainError;
use std::sync::Arc;
use tessera_pipeline::loader::SampleSource;
use tessera_pipeline::mix::{Draw, MixSpec, Mixture};
use tessera_shards::{Dataset, DatasetLocation, Manifest, SampleMeta};

/// The training data.
#[derive(Clone)]
pub(crate) enum TrainData {
    Shards(Arc<Dataset>),
    Mixture(Arc<Mixture>),
}

impl TrainData {
    /// Opens `spec`; `open` turns a shard folder or URL into a location (with the run's cache).
    pub(crate) fn open(
        spec: &str,
        open: &dyn Fn(&str) -> Result<DatasetLocation, TrainError>,
    ) -> Result<TrainData, TrainError> {
        if !tessera_pipeline::mix::is_mixture(spec) {
            return Ok(TrainData::Shards(Arc::new(Dataset::open_at(&open(spec)?)?)));
        }
        let mix = MixSpec::load(std::path::Path::new(spec))?;
        let mut datasets = Vec::with_capacity(mix.sources.len());
        for source in &mix.sources {
            let dataset = Dataset::open_at(&open(&source.shards)?).map_err(|e| {
                TrainError::Mix(tessera_pipeline::mix::MixError::Shards {
                    name: source.name.clone(),
                    source: e,
                })
            })?;
            datasets.push(dataset);
        }
        Ok(TrainData::Mixture(Arc::new(Mixture::new(mix, datasets)?)))
    }

    /// The shard set whose index.json speaks for the data (a mixture's first source: every
    /// source shares its tokenizer, template and placeholder id).
    pub(crate) fn first(&self) -> &Dataset {
        match self {
            TrainData::Shards(d) => d,
            TrainData::Mixture(m) => &m.sources()[0].dataset,
        }
    }

    pub(crate) fn manifest(&self) -> &Manifest {
        self.first().manifest()
    }

    /// The shards' fingerprint, or the mixture's (its sources' fingerprints and amounts).
    pub(crate) fn fingerprint(&self) -> &str {
        match self {
            TrainData::Shards(d) => d.fingerprint(),
            TrainData::Mixture(m) => m.fingerprint(),
        }
    }

    pub(crate) fn metadata(&self) -> Result<Vec<SampleMeta>, TrainError> {
        Ok(match self {
            TrainData::Shards(d) => d.metadata()?,
            TrainData::Mixture(m) => m.metadata()?,
        })
    }

    /// Each sample's image tokens and tiles under `layout` (see `tessera_shards::sample_images`), in
    /// the order of [`Self::metadata`].
    pub(crate) fn sample_images(
        &self,
        layout: &tessera_shards::image_layout::ImageLayout,
        tower: tessera_shards::image_layout::Tower,
    ) -> Result<Vec<tessera_shards::SampleImages>, TrainError> {
        Ok(match self {
            TrainData::Shards(d) => tessera_shards::sample_images(d, layout, tower)?,
            TrainData::Mixture(m) => {
                let mut out = Vec::new();
                for source in m.sources() {
                    out.extend(tessera_shards::sample_images(
                        &source.dataset,
                        layout,
                        tower,
                    )?);
                }
                out
            }
        })
    }

    pub(crate) fn source(&self) -> Arc<dyn SampleSource> {
        match self {
            TrainData::Shards(d) => d.clone(),
            TrainData::Mixture(m) => m.clone(),
        }
    }

    /// A mixture's items of `epoch`; `None` for one shard set (the planner shuffles it).
    pub(crate) fn draw(&self, seed: u64, epoch: u64) -> Option<Draw> {
        match self {
            TrainData::Shards(_) => None,
            TrainData::Mixture(m) => Some(m.draw(seed, epoch)),
        }
    }

    /// The sources' names, in source order (one nameless source for a shard set).
    pub(crate) fn source_names(&self) -> Vec<String> {
        match self {
            TrainData::Shards(_) => Vec::new(),
            TrainData::Mixture(m) => m.sources().iter().map(|s| s.name.clone()).collect(),
        }
    }

    /// One log line per mixture source: samples, drawn per epoch, share.
    pub(crate) fn log_mixture(&self) {
        let TrainData::Mixture(m) = self else {
            return;
        };
        let epoch = m.epoch_samples();
        tracing::info!(
            "mixture {}: {} sources, {epoch} samples per epoch",
            m.spec.path.display(),
            m.sources().len()
        );
        for s in m.sources() {
            tracing::info!(
                "  source {}: {} samples, {} per epoch ({:.1}%, {:?})",
                s.name,
                s.len,
                s.per_epoch,
                100.0 * s.share(epoch),
                s.amount
            );
        }
    }
}
