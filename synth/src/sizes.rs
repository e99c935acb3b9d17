//! Image sizes drawn like LLaVA-Pretrain's (LCS-558K): the shorter side is 336 for about 85% of
//! images (BLIP's resize), a few are smaller, the rest are larger originals (500x375-like); mean
//! about 407x367, median 336x336, 95th percentile about 597x504, no side over 1000 px.
//!
//! The model: pick an orientation (square 40%, landscape 42%, portrait 18%), an aspect ratio from a
//! mixture around 4:3, 3:2 and 16:9 with a thin tail to 3:1, and a shorter side; the longer side
//! is the shorter times the ratio, capped at [`MAX_SIDE`]. The shares were fitted so that the
//! statistics above come out (see the test below and `tests/synth.rs`).
use rand::Rng;

/// The shorter side most LLaVA-Pretrain images have.
pub const SHORT_SIDE: u32 = 336;
/// No side is longer.
pub const MAX_SIDE: u32 = 1000;

/// Share of images whose shorter side is exactly [`SHORT_SIDE`].
const SHORT_SIDE_SHARE: f64 = 0.85;
/// Share of larger originals (shorter side 337..530); the remainder is smaller (160..335).
const LARGER_SHARE: f64 = 0.12;
const SQUARE_SHARE: f64 = 0.40;
const LANDSCAPE_SHARE: f64 = 0.42;

/// Draws one `(width, height)`.
pub(crate) fn sample_size(rng: &mut impl Rng) -> (u32, u32) {
    let u: f64 = rng.gen();
    let short = if u < SHORT_SIDE_SHARE {
        SHORT_SIDE
    } else if u < SHORT_SIDE_SHARE + LARGER_SHARE {
        rng.gen_range(SHORT_SIDE + 1..=530)
    } else {
        rng.gen_range(160..SHORT_SIDE)
    };
    let orientation: f64 = rng.gen();
    if orientation < SQUARE_SHARE {
        return (short, short);
    }
    let landscape = orientation < SQUARE_SHARE + LANDSCAPE_SHARE;
    let v: f64 = rng.gen();
    let excess = if v < 0.30 {
        0.30 * rng.gen::<f64>()
    } else if v < 0.85 {
        0.30 + 0.25 * rng.gen::<f64>()
    } else if v < 0.97 {
        0.55 + 0.25 * rng.gen::<f64>()
    } else {
        0.80 + rng.gen::<f64>()
    };
    // Landscapes run a little wider than portraits run tall, as in web photos.
    let ratio = 1.0 + excess * if landscape { 1.07 } else { 0.85 };
    let long = ((short as f64 * ratio).round() as u32).clamp(short, MAX_SIDE);
    if landscape {
        (long, short)
    } else {
        (short, long)
    }
}

/// Summary statistics of a list of sizes, as the tests and the CLI report them.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeStats {
    pub count: usize,
    pub mean_width: f64,
    pub mean_height: f64,
    pub p95_width: u32,
    pub p95_height: u32,
    pub short_side_share: f64,
    pub max_side: u32,
}

impl SizeStats {
    /// Statistics of `sizes`; `None` for an empty list.
    pub fn of(sizes: &[(u32, u32)]) -> Option<SizeStats> {
        if sizes.is_empty() {
            return None;
        }
        let n = sizes.len() as f64;
        let p95 = |mut v: Vec<u32>| {
            v.sort_unstable();
            v[((v.len() as f64 * 0.95) as usize).min(v.len() - 1)]
        };
        Some(SizeStats {
            count: sizes.len(),
            mean_width: sizes.iter().map(|s| s.0 as f64).sum::<f64>() / n,
            mean_height: sizes.iter().map(|s| s.1 as f64).sum::<f64>() / n,
            p95_width: p95(sizes.iter().map(|s| s.0).collect()),
            p95_height: p95(sizes.iter().map(|s| s.1).collect()),
            short_side_share: sizes.iter().filter(|s| s.0.min(s.1) == SHORT_SIDE).count() as f64
                / n,
            max_side: sizes.iter().map(|s| s.0.max(s.1)).max().unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn large_sample_matches_llava_pretrain_statistics() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let sizes: Vec<(u32, u32)> = (0..50_000).map(|_| sample_size(&mut rng)).collect();
        let s = SizeStats::of(&sizes).expect("non-empty");
        assert!((s.mean_width - 407.0).abs() < 10.0, "{s:?}");
        assert!((s.mean_height - 367.0).abs() < 10.0, "{s:?}");
        assert!(s.p95_width.abs_diff(597) < 25, "{s:?}");
        assert!(s.p95_height.abs_diff(504) < 25, "{s:?}");
        assert!((s.short_side_share - 0.85).abs() < 0.01, "{s:?}");
        assert!(s.max_side <= MAX_SIDE, "{s:?}");
        let mut widths: Vec<u32> = sizes.iter().map(|s| s.0).collect();
        widths.sort_unstable();
        assert_eq!(widths[widths.len() / 2], SHORT_SIDE, "median width");
    }
}
