//! Synthetic planner input shaped like LLaVA-Pretrain (LCS-558K) under the `plain` template:
//! an image placeholder, a short BLIP caption (a few to ~60 tokens, median about 12) and an
//! end token; plus a share of text-only multi-turn samples (100 to 1,500 tokens). Only the
//! metadata the planner reads is produced, so benches and tests need no shards.
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_shards::{Kind, SampleMeta};

/// `n` samples, a `text_only_fraction` of them text-only, drawn from `seed`.
pub fn synthetic_llava(n: usize, text_only_fraction: f64, seed: u64) -> Vec<SampleMeta> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            if rng.gen::<f64>() < text_only_fraction {
                let len = log_normal(&mut rng, 400.0, 0.7).clamp(100.0, 1500.0) as u32;
                let supervised = (f64::from(len) * rng.gen_range(0.3..0.7)) as u32;
                SampleMeta {
                    kind: Kind::Text,
                    num_images: 0,
                    num_text_tokens: len,
                    num_supervised_tokens: supervised.max(1),
                }
            } else {
                let caption = log_normal(&mut rng, 12.0, 0.5).clamp(3.0, 60.0) as u32;
                SampleMeta {
                    kind: Kind::Image,
                    num_images: 1,
                    // placeholder + caption + end token; the caption and end are targets.
                    num_text_tokens: caption + 2,
                    num_supervised_tokens: caption + 1,
                }
            }
        })
        .collect()
}

/// A log-normal draw with the given median and log-space spread (Box-Muller).
fn log_normal(rng: &mut impl Rng, median: f64, sigma: f64) -> f64 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    median * (sigma * z).exp()
}
