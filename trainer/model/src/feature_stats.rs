//! Per-channel standardisation of the vision features before the projector
//! (`--standardize-features N`): each feature channel minus its mean over the first N training
//! images, over its standard deviation. Measured once before stage 1 on the frozen tower, then
//! fixed: two frozen projector tensors (`mm_projector.feature_mean`, `mm_projector.feature_std`)
//! that travel with the run (`vlm.json`) and into a stage 2 that starts from its projector.
//!
//! Why: a tower's intermediate hidden states (DINOv2's, which the demo reads) carry a few
//! channels hundreds of times larger than the rest. AdamW moves every weight by about the same
//! step, so the projector's first layer swings with those channels and stage 1 stalls or not
//! depending on the seed (docs/performance-notes.md, "Demo"). In standardised coordinates every
//! channel weighs the same. It is an affine map of the input, so an export folds it into the
//! first linear layer ([`fold_into_projector`]) and writes LLaVA's plain `mlp2x_gelu`.
use crate::vision::{normalize_pixels, VisionTower};
use crate::weights::HfCheckpoint;
use crate::{ModelError, VisionConfig};
use serde::{Deserialize, Serialize};
use std::path::Path;
use tch::{Kind, Tensor};
use tessera_fsdp::{ParamMap, ParamSpec};

/// The projector's frozen per-channel feature mean, `[feature channels]` (the tower's width
/// times its feature layers).
pub(crate) const FEATURE_MEAN: &str = "mm_projector.feature_mean";
/// The projector's frozen per-channel feature standard deviation, `[feature channels]`.
pub(crate) const FEATURE_STD: &str = "mm_projector.feature_std";

/// A standard deviation below this (a channel constant over the measured images) counts as
/// this, so that the channel passes through centred rather than divided by zero.
const MIN_STD: f64 = 1e-6;

/// Per-channel mean and standard deviation of a tower's features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureStats {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// Images (views under AnyRes) the statistics were measured over.
    pub images: u64,
}

/// Accumulates the statistics of a tower's features (as the model reads them: its feature
/// layer, the patch tokens) over batches of pixels, in f64.
pub struct FeatureMeter {
    vision: VisionConfig,
    tower: VisionTower,
    params: ParamMap,
    sum: Tensor,
    squares: Tensor,
    tokens: i64,
    images: u64,
}

impl FeatureMeter {
    /// A meter for `vision`'s features, its weights read from `vision_dir` (f32).
    pub fn new(vision: &VisionConfig, vision_dir: &Path) -> Result<Self, ModelError> {
        let tower = VisionTower::new(vision);
        let params = HfCheckpoint::open(vision_dir)?
            .load_specs_as_stored(&tower.param_specs(), Some("vision_model."))?
            .into_iter()
            .map(|(k, t)| (k, t.to_kind(Kind::Float)))
            .collect();
        let zeros = || Tensor::zeros([vision.feature_size()], (Kind::Double, tch::Device::Cpu));
        Ok(FeatureMeter {
            vision: vision.clone(),
            tower,
            params,
            sum: zeros(),
            squares: zeros(),
            tokens: 0,
            images: 0,
        })
    }

    /// Adds the features of `views` images, u8 pixels `[views, 3, side, side]`.
    pub fn add(&mut self, pixels: &[u8], views: usize) -> Result<(), ModelError> {
        let side = self.vision.image_size;
        let expected = views as i64 * 3 * side * side;
        if pixels.len() as i64 != expected {
            return Err(ModelError::FeatureStats(format!(
                "{} pixel bytes for {views} views of {side} px (expected {expected})",
                pixels.len()
            )));
        }
        let _no_grad = tch::no_grad_guard();
        let raw = Tensor::from_slice(pixels).view([views as i64, 3, side, side]);
        let features = self
            .tower
            .features(&self.params, &normalize_pixels(&self.vision, &raw))
            .map_err(|source| ModelError::Compute {
                unit: "vision tower".into(),
                source,
            })?
            .reshape([-1, self.vision.feature_size()])
            .to_kind(Kind::Double);
        let dim = [0i64];
        self.sum += features.sum_dim_intlist(dim.as_slice(), false, Kind::Double);
        self.squares += features
            .square()
            .sum_dim_intlist(dim.as_slice(), false, Kind::Double);
        self.tokens += features.size()[0];
        self.images += views as u64;
        Ok(())
    }

    /// Each channel's mean and (unbiased, as `torch.std`) standard deviation.
    pub fn finish(self) -> Result<FeatureStats, ModelError> {
        if self.tokens < 2 {
            return Err(ModelError::FeatureStats(
                "no image to measure them over".into(),
            ));
        }
        let n = self.tokens as f64;
        let mean = &self.sum / n;
        let variance = (&self.squares - mean.square() * n) / (n - 1.0);
        let std = variance.clamp_min(0.0).sqrt().clamp_min(MIN_STD);
        Ok(FeatureStats {
            mean: to_f32(&mean)?,
            std: to_f32(&std)?,
            images: self.images,
        })
    }
}

impl FeatureStats {
    /// The frozen projector tensors these statistics are.
    pub(crate) fn tensors(&self) -> [(&'static str, Tensor); 2] {
        [
            (FEATURE_MEAN, Tensor::from_slice(&self.mean)),
            (FEATURE_STD, Tensor::from_slice(&self.std)),
        ]
    }

    /// Checks the statistics are of features `channels` wide (the tower's width times its
    /// feature layers).
    pub(crate) fn check(&self, channels: i64) -> Result<(), ModelError> {
        let bad = |what: &str, len: usize| {
            ModelError::FeatureStats(format!(
                "{len} {what} values; the vision tower's features have {channels} channels"
            ))
        };
        if self.mean.len() as i64 != channels {
            return Err(bad("mean", self.mean.len()));
        }
        if self.std.len() as i64 != channels {
            return Err(bad("std", self.std.len()));
        }
        if let Some(s) = self.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(ModelError::FeatureStats(format!(
                "a standard deviation of {s}"
            )));
        }
        Ok(())
    }
}

fn to_f32(t: &Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(Vec::<f32>::try_from(t.to_kind(Kind::Float).contiguous())?)
}

/// The two frozen specs of a standardising projector, `[channels]` each.
pub(crate) fn specs(channels: i64) -> Vec<ParamSpec> {
    [FEATURE_MEAN, FEATURE_STD]
        .into_iter()
        .map(|name| ParamSpec {
            name: name.into(),
            shape: vec![channels],
            trainable: false,
            expert: None,
        })
        .collect()
}

/// `(features - mean) / std` when `params` hold the statistics; the features unchanged if not.
pub(crate) fn standardize(params: &ParamMap, features: &Tensor) -> Tensor {
    match (params.get(FEATURE_MEAN), params.get(FEATURE_STD)) {
        (Some(mean), Some(std)) => {
            (features - mean.to_kind(features.kind())) / std.to_kind(features.kind())
        }
        _ => features.shallow_clone(),
    }
}

/// The projector's first linear layer (weight, bias): what folding rewrites.
pub const FOLDED_KEYS: [&str; 2] = ["mm_projector.0.weight", "mm_projector.0.bias"];

/// Folds `stats` into the projector's first linear layer in `params` (and drops the statistics'
/// own tensors if `params` hold them): `W' = W / std` (per input channel), `b' = b - W' mean`,
/// so LLaVA's plain `mlp2x_gelu` computes on raw features what the run's projector computed
/// on standardised ones. What every export writes.
pub fn fold_into_projector(params: &mut ParamMap, stats: &FeatureStats) -> Result<(), ModelError> {
    params.remove(FEATURE_MEAN);
    params.remove(FEATURE_STD);
    let [weight_key, bias_key] = FOLDED_KEYS;
    let missing =
        |k: &str| ModelError::FeatureStats(format!("folding them into the projector: no {k}"));
    let weight = params.get(weight_key).ok_or_else(|| missing(weight_key))?;
    let bias = params.get(bias_key).ok_or_else(|| missing(bias_key))?;
    if weight.size().last() != Some(&(stats.std.len() as i64)) {
        return Err(ModelError::FeatureStats(format!(
            "{} channels; the projector's first layer reads {:?}",
            stats.std.len(),
            weight.size()
        )));
    }
    let (kind, double) = (weight.kind(), |v: &[f32]| {
        Tensor::from_slice(v).to_kind(Kind::Double)
    });
    let folded = weight.to_kind(Kind::Double) / double(&stats.std).unsqueeze(0);
    let shift = folded
        .matmul(&double(&stats.mean).unsqueeze(1))
        .squeeze_dim(1);
    let folded_bias = bias.to_kind(Kind::Double) - shift;
    params.insert(weight_key.to_string(), folded.to_kind(kind));
    params.insert(bias_key.to_string(), folded_bias.to_kind(kind));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_keys_are_the_projectors_first_layer() {
        let fc1 = crate::projector::FC1;
        assert_eq!(
            FOLDED_KEYS,
            [format!("{fc1}.weight"), format!("{fc1}.bias")]
        );
    }

    /// The plain projector with folded weights computes on raw features what the
    /// standardising one computes: the export's promise.
    #[test]
    fn a_folded_projector_computes_what_the_standardising_one_does() -> Result<(), ModelError> {
        let (vision_hidden, lm_hidden) = (6, 4);
        let stats = FeatureStats {
            mean: vec![0.5, -3.0, 100.0, 0.0, 2.0, -0.25],
            std: vec![1.0, 0.01, 250.0, 3.0, 0.5, 0.05],
            images: 1,
        };
        let mut standardising = crate::projector::init(vision_hidden, lm_hidden, 7);
        for (name, tensor) in stats.tensors() {
            standardising.insert(name.to_string(), tensor);
        }
        let mut plain: ParamMap = standardising
            .iter()
            .map(|(k, t)| (k.clone(), t.copy()))
            .collect();
        fold_into_projector(&mut plain, &stats)?;
        assert!(!plain.contains_key(FEATURE_MEAN) && !plain.contains_key(FEATURE_STD));
        let features = Tensor::from_slice(&[
            0.7f32, -3.01, 180.0, 1.0, 2.5, -0.25, //
            0.1, -2.99, -40.0, -2.0, 1.0, -0.3,
        ])
        .view([2, vision_hidden]);
        let want = crate::projector::forward(&standardising, &features)?;
        let got = crate::projector::forward(&plain, &features)?;
        let scale = f64::try_from(want.abs().max())?;
        let gap = f64::try_from((&want - &got).abs().max())?;
        assert!(gap <= 1e-4 * scale.max(1.0), "gap {gap} of scale {scale}");
        Ok(())
    }
}
