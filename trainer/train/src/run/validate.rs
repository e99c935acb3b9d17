//! Validation: the loss over a FIXED set of held-out samples (`--val-shards`, `--val-samples`),
//! every `--val-every` steps and at the end of the run.
//!
//! The set is `--val-samples` samples picked evenly over the validation shards (index order;
//! stage 1 picks among image samples only, as it trains on them alone), the same at every
//! evaluation, every seed and every world size. It is planned once by the training planner at
//! this run's W (one micro-step per step), so every rank runs the same kind at every
//! micro-step, and evaluated forward only (no autograd, no gradients). The result is the
//! token-weighted mean, as the training loss is: summed token cross-entropy over all ranks
//! divided by the set's supervised tokens (a sample with more supervised tokens weighs more).
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::run::setup::Setup;
use crate::run::sharded_vlm::ShardedVlm;
use std::path::Path;
use std::sync::Arc;
use tch::Tensor;
use tessera_pipeline::loader::{Loader, LoaderConfig, LoaderError, SampleSource};
use tessera_pipeline::plan::Planner;
use tessera_pipeline::MicroBatchPlan;
use tessera_shards::{Kind, Sample};

/// The chosen samples of a dataset, renumbered 0..n (the planner's indices) and read through
/// to the dataset's own indices.
struct Subset {
    dataset: Arc<tessera_shards::Dataset>,
    indices: Vec<u64>,
}

impl Subset {
    fn global(&self, i: u64) -> u64 {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.indices.get(i))
            .copied()
            .unwrap_or(u64::MAX)
    }
}

impl SampleSource for Subset {
    fn read(&self, indices: &[u64]) -> Result<Vec<Sample>, LoaderError> {
        let global: Vec<u64> = indices.iter().map(|&i| self.global(i)).collect();
        SampleSource::read(self.dataset.as_ref(), &global)
    }

    fn locate(&self, index: u64) -> String {
        self.dataset.locate(self.global(index))
    }
}

/// `n` of `0..len` spread evenly (all of them when `n >= len`).
fn evenly_spaced(len: usize, n: usize) -> Vec<usize> {
    if n >= len {
        return (0..len).collect();
    }
    (0..n).map(|i| i * len / n).collect()
}

fn invalid(dir: &Path, reason: String) -> TrainError {
    TrainError::Invalid(format!("--val-shards {}: {reason}", dir.display()))
}

/// The validation set, planned for this rank.
pub(crate) struct Validation {
    source: Arc<dyn SampleSource>,
    /// This rank's micro-batches, in the order every rank runs them.
    mine: Vec<MicroBatchPlan>,
    /// Supervised tokens of the whole set (the divisor).
    supervised_tokens: u64,
    pub(crate) samples: usize,
    loader_cfg: LoaderConfig,
}

impl Validation {
    /// `None` without `--val-shards`. `only`: the kind the run trains on (stage 1: images).
    pub(crate) fn new(
        cfg: &TrainConfig,
        s: &Setup,
        loader_cfg: &LoaderConfig,
        only: Option<Kind>,
    ) -> Result<Option<Self>, TrainError> {
        let Some(dir) = cfg.val_shards.as_deref() else {
            return Ok(None);
        };
        let dataset = tessera_shards::Dataset::open(dir)?;
        let (want, have) = (
            s.data.manifest().image_placeholder_id,
            dataset.manifest().image_placeholder_id,
        );
        if want != have {
            return Err(invalid(
                dir,
                format!(
                    "its image placeholder id is {have} but the training shards' is {want} \
                     (ingested with another tokenizer?)"
                ),
            ));
        }
        let metas = dataset.metadata()?;
        let eligible: Vec<usize> = (0..metas.len())
            .filter(|&i| only.is_none_or(|k| metas[i].kind == k))
            .collect();
        if eligible.is_empty() {
            return Err(invalid(
                dir,
                format!("holds no samples this stage trains on ({only:?})"),
            ));
        }
        let picked: Vec<u64> = evenly_spaced(eligible.len(), cfg.val_samples)
            .into_iter()
            .map(|i| eligible[i] as u64)
            .collect();
        let subset_metas: Vec<tessera_shards::SampleMeta> =
            picked.iter().map(|&i| metas[i as usize]).collect();
        let builder = match cfg.image_layout {
            tessera_shards::image_layout::ImageLayout::Single => Planner::builder(),
            ref layout => {
                let all =
                    tessera_shards::sample_images(&dataset, layout, super::setup::tower(&s.vlm))?;
                Planner::builder().sample_images(picked.iter().map(|&i| all[i as usize]).collect())
            }
        };
        let plan = builder
            .samples(&subset_metas)
            .image_tokens(s.vlm.vision.num_patches() as u32)
            .world_size(s.world_size)
            .token_budget(cfg.token_budget as u64)
            .seq_len(cfg.seq_len as u64)
            .micro_steps(1)
            .seed(0)
            .fingerprint(dataset.fingerprint())
            .build()
            .map_err(|source| TrainError::ValidationPlan {
                dir: dir.to_path_buf(),
                source,
            })?
            .plan();
        let mine = plan
            .steps
            .iter()
            .flat_map(|st| st.for_rank(s.rank).cloned())
            .collect();
        let supervised_tokens = plan.steps.iter().map(|st| st.supervised_tokens).sum();
        Ok(Some(Validation {
            source: Arc::new(Subset {
                dataset: Arc::new(dataset),
                indices: picked,
            }),
            mine,
            supervised_tokens,
            samples: subset_metas.len(),
            loader_cfg: loader_cfg.clone(),
        }))
    }

    /// The mean token loss over the set, the same on every rank (all-reduced). Every rank
    /// calls it at the same step.
    pub(crate) fn loss(&self, model: &mut ShardedVlm, s: &Setup) -> Result<f64, TrainError> {
        let mut loader = Loader::new(
            self.source.clone(),
            self.mine.clone(),
            self.loader_cfg.clone(),
        );
        let mut loss_sum = 0.0;
        for mb in &mut loader {
            loss_sum += model.eval_loss(&mb?)?;
        }
        let mut total = Tensor::from_slice(&[loss_sum]);
        if s.world_size > 1 {
            s.pg.all_reduce_sum(&mut total, "validation loss")?.wait()?;
        }
        Ok(total.double_value(&[0]) / self.supervised_tokens.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::evenly_spaced;

    #[test]
    fn the_set_is_spread_over_the_shards_and_capped_by_their_size() {
        assert_eq!(evenly_spaced(10, 4), vec![0, 2, 5, 7]);
        assert_eq!(evenly_spaced(3, 8), vec![0, 1, 2]);
    }
}
