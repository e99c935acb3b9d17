//! LLaVA `mlp2x_gelu` projector: Linear(vision_hidden, lm_hidden), exact (erf) GELU,
//! Linear(lm_hidden, lm_hidden); keys `mm_projector.0` and `mm_projector.2` (LLaVA writes them
//! under `model.`; tessera's own files drop that prefix). Default init is PyTorch's `nn.Linear`
//! init, as LLaVA's stage 1 starts from: weight and bias uniform in ±1/sqrt(fan_in).
use super::{gemm, param};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use tch::Tensor;
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

pub(super) const FC1: &str = "mm_projector.0";
pub(super) const FC2: &str = "mm_projector.2";
/// LLaVA-NeXT/OneVision's learned vector after each row of an `anyres_max_N` image's grid
/// (`model.image_newline` in their checkpoints), `[lm_hidden]`; trains with the projector.
pub const IMAGE_NEWLINE: &str = "image_newline";

/// The `image_newline` spec, for a model whose images are `anyres_max_N` grids.
pub(super) fn newline_spec(lm_hidden: i64, trainable: bool) -> ParamSpec {
    ParamSpec {
        name: IMAGE_NEWLINE.into(),
        shape: vec![lm_hidden],
        trainable,
        expert: None,
    }
}

/// transformers' `LlavaOnevisionModel` init of `image_newline`: normal with standard deviation
/// 1/sqrt(lm_hidden), here drawn from a seeded stream (Box-Muller) so every rank and CPU
/// draws the same vector.
pub(super) fn init_newline(lm_hidden: i64, seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x006e_6577_6c69_6e65);
    let std = 1.0 / (lm_hidden as f64).sqrt();
    let values: Vec<f32> = (0..lm_hidden)
        .map(|_| {
            let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
            let u2: f64 = rng.gen_range(0.0..1.0);
            let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (normal * std) as f32
        })
        .collect();
    Tensor::from_slice(&values)
}

pub(super) fn param_specs(vision_hidden: i64, lm_hidden: i64, trainable: bool) -> Vec<ParamSpec> {
    let s = |name: String, shape: Vec<i64>| ParamSpec {
        name,
        shape,
        trainable,
        expert: None,
    };
    vec![
        s(format!("{FC1}.weight"), vec![lm_hidden, vision_hidden]),
        s(format!("{FC1}.bias"), vec![lm_hidden]),
        s(format!("{FC2}.weight"), vec![lm_hidden, lm_hidden]),
        s(format!("{FC2}.bias"), vec![lm_hidden]),
    ]
}

/// `[.., vision_hidden]` -> `[.., lm_hidden]`.
/// With `--standardize-features` the features are standardised first (see `feature_stats.rs`).
pub(super) fn forward(params: &ParamMap, features: &Tensor) -> Result<Tensor, ComputeError> {
    let features = crate::feature_stats::standardize(params, features);
    let h = gemm::linear(
        &features,
        param(params, &format!("{FC1}.weight"))?,
        Some(param(params, &format!("{FC1}.bias"))?),
    )?;
    let h = h.gelu("none");
    Ok(gemm::linear(
        &h,
        param(params, &format!("{FC2}.weight"))?,
        Some(param(params, &format!("{FC2}.bias"))?),
    )?)
}

/// Tensor of `shape` with values uniform in [-bound, bound), from a seeded stream.
pub(super) fn uniform(shape: &[i64], bound: f64, rng: &mut ChaCha8Rng) -> Tensor {
    let n: i64 = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|_| rng.gen_range(-bound..bound) as f32)
        .collect();
    Tensor::from_slice(&values).view(shape)
}

/// PyTorch `nn.Linear` default init for the two layers (kaiming-uniform a=√5 = U(±1/√fan_in)).
pub(super) fn init(vision_hidden: i64, lm_hidden: i64, seed: u64) -> ParamMap {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = BTreeMap::new();
    for (key, fan_in, fan_out) in [(FC1, vision_hidden, lm_hidden), (FC2, lm_hidden, lm_hidden)] {
        let bound = 1.0 / (fan_in as f64).sqrt();
        out.insert(
            format!("{key}.weight"),
            uniform(&[fan_out, fan_in], bound, &mut rng),
        );
        out.insert(format!("{key}.bias"), uniform(&[fan_out], bound, &mut rng));
    }
    out
}
