//! Which feature statistics a run's projector standardises with (`--standardize-features N`,
//! see tessera-model's `feature_stats.rs`), decided before the model is built:
//! 1. a resumed run keeps those its `vlm.json` recorded;
//! 2. a run that starts from a stage-1 run's projector (`--init-projector RUN`) takes that
//!    run's, since its projector was trained on them;
//! 3. otherwise `N > 0` measures them over the first N image samples of `--shards`, on the
//!    frozen tower, on every rank alike (the same images, so no collective is needed);
//! 4. else none: LLaVA's plain projector.
use crate::config::ConfigError;
use crate::config::TrainConfig;
use crate::data::TrainData;
use crate::error::TrainError;
use crate::run_dir::RunDir;
use crate::vlm_description::VlmDescription;
use std::sync::Arc;
use tessera_model::{FeatureMeter, FeatureStats, Vlm};
use tessera_pipeline::loader::{BadImagePolicy, Loader, LoaderConfig};
use tessera_pipeline::MicroBatchPlan;
use tessera_shards::{Kind, SampleMeta};

/// The statistics of the run `cfg` starts (`resume`: it continues the run in `--out`), for
/// `vlm` (built without any); `None` when its projector reads the features as they are.
pub(crate) fn resolve(
    cfg: &TrainConfig,
    resume: bool,
    data: &TrainData,
    samples: &[SampleMeta],
    vlm: &Vlm,
) -> Result<Option<FeatureStats>, TrainError> {
    if resume {
        let recorded = RunDir::new(&cfg.out).vlm();
        if recorded.is_file() {
            return Ok(VlmDescription::load(&recorded)?.feature_stats);
        }
    }
    if let Some(init) = &cfg.init_projector {
        if init.is_dir() {
            let stats = VlmDescription::load(&RunDir::new(init).vlm())?.feature_stats;
            if stats.is_some() && cfg.standardize_features > 0 {
                tracing::info!(
                    "--standardize-features: the projector of {} was trained on its run's \
                     feature statistics; this run keeps them",
                    init.display()
                );
            }
            if stats.is_some() || cfg.standardize_features == 0 {
                return Ok(stats);
            }
        } else if cfg.standardize_features > 0 {
            return Err(ConfigError::Invalid {
                field: "standardize_features",
                reason: format!(
                    "{} is a projector file, trained on the features as they are: start from \
                     the stage-1 run's directory (whose statistics come with it) or leave \
                     --standardize-features out",
                    init.display()
                ),
            }
            .into());
        }
    }
    if cfg.standardize_features == 0 {
        return Ok(None);
    }
    measure(cfg, data, samples, vlm).map(Some)
}

/// The statistics of `vlm`'s tower features over the first `--standardize-features` image
/// samples of the training data, each image decoded and resized as training feeds it.
fn measure(
    cfg: &TrainConfig,
    data: &TrainData,
    samples: &[SampleMeta],
    vlm: &Vlm,
) -> Result<FeatureStats, TrainError> {
    let indices: Vec<u64> = samples
        .iter()
        .enumerate()
        .filter(|(_, m)| m.kind == Kind::Image && m.num_images > 0)
        .map(|(i, _)| i as u64)
        .take(cfg.standardize_features)
        .collect();
    if indices.is_empty() {
        return Err(ConfigError::Invalid {
            field: "standardize_features",
            reason: format!("{} holds no image sample to measure", cfg.shards.display()),
        }
        .into());
    }
    let vision = &vlm.vision;
    let loader_cfg = LoaderConfig::builder()
        .image_size(vision.image_size as usize)
        .image_tokens(vision.num_patches() as usize)
        .image_layout(cfg.image_layout.clone(), vision.patch_size as u32)
        .tokens(&data.manifest().special_tokens())
        .resize(cfg.resize)
        .threads(cfg.loader_threads)
        .on_bad_image(BadImagePolicy::Fail)
        .build()?;
    let plans: Vec<MicroBatchPlan> = (0..indices.len() as u64)
        .map(|i| MicroBatchPlan {
            kind: Kind::Image,
            rows: vec![vec![i]],
            zero_loss: false,
        })
        .collect();
    let chosen = data.source().read(&indices)?;
    let mut meter = FeatureMeter::new(vision, &cfg.vision)?;
    for mb in Loader::new(Arc::new(chosen), plans, loader_cfg) {
        let mb = mb?;
        meter.add(&mb.pixels, mb.views())?;
    }
    let stats = meter.finish()?;
    tracing::info!(
        "--standardize-features: the tower's features measured over {} images ({} views)",
        indices.len(),
        stats.images
    );
    Ok(stats)
}
