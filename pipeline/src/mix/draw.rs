//! An epoch of a mixture: which samples it draws, in which order.
//!
//! 1. Each source's count: a weight's share of the epoch (largest remainder, so the counts sum
//!    to the epoch exactly), or `repeat` x its samples (rounded).
//! 2. Each source's sequence: passes over it, each a fresh seeded shuffle, cut at its count
//!    (`repeat = 2` is two shuffled passes, `0.5` the first half of one, a weight above its
//!    size upsamples the same way).
//! 3. The sources interleaved smoothly: item i goes to the source furthest behind its share
//!    of the first i + 1 items, so every prefix of the epoch holds each source within one
//!    sample of its share (a plan consumes the epoch in about this order, whatever W).
//!
//! Everything depends on the mixture's fingerprint, the seed and the epoch only.
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};

/// Counts summing to `total` in proportion to `weights` (largest remainder; ties to the
/// earlier source).
pub(crate) fn proportional_counts(weights: &[f64], total: u64) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    if sum <= 0.0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * total as f64).collect();
    let mut counts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let mut left = total.saturating_sub(counts.iter().sum());
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(weights.len() * 2) {
        if left == 0 {
            break;
        }
        if weights[i] > 0.0 {
            counts[i] += 1;
            left -= 1;
        }
    }
    counts
}

/// The 32-byte seed of a stream named by `parts`.
pub(crate) fn seed_of(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// `count` indices into a source of `len` samples: shuffled passes, cut at `count`.
pub(crate) fn source_sequence(len: u64, count: u64, seed: [u8; 32]) -> Vec<u64> {
    let mut rng = ChaCha20Rng::from_seed(seed);
    let mut out = Vec::with_capacity(count as usize);
    if len == 0 {
        return out;
    }
    let mut pass: Vec<u64> = (0..len).collect();
    while (out.len() as u64) < count {
        pass.shuffle(&mut rng);
        let take = (count - out.len() as u64).min(len) as usize;
        out.extend_from_slice(&pass[..take]);
    }
    out
}

/// Interleaves `sequences` (one per source) so each prefix holds each source within one item
/// of its share; returns (source, position in its sequence) per item.
pub(crate) fn interleave(counts: &[u64]) -> Vec<(usize, u64)> {
    let total: u64 = counts.iter().sum();
    let mut taken = vec![0u64; counts.len()];
    let mut out = Vec::with_capacity(total as usize);
    for i in 0..total {
        // Furthest behind its quota of the first i + 1 items: max of counts[s] * (i + 1) / total
        // - taken[s], compared exactly in integers (times `total`).
        let mut best: Option<(usize, i128)> = None;
        for (s, (&c, &t)) in counts.iter().zip(&taken).enumerate() {
            if t >= c {
                continue;
            }
            let deficit = i128::from(c) * i128::from(i + 1) - i128::from(t) * i128::from(total);
            if best.is_none_or(|(_, d)| deficit > d) {
                best = Some((s, deficit));
            }
        }
        let Some((s, _)) = best else { break };
        out.push((s, taken[s]));
        taken[s] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sum_to_the_epoch_in_proportion() {
        assert_eq!(proportional_counts(&[0.5, 0.3, 0.2], 10), [5, 3, 2]);
        assert_eq!(proportional_counts(&[1.0, 1.0, 1.0], 10), [4, 3, 3]);
        assert_eq!(proportional_counts(&[2.0, 0.0], 7), [7, 0]);
        assert_eq!(proportional_counts(&[1.0, 3.0], 0), [0, 0]);
    }

    #[test]
    fn sequences_are_shuffled_passes_cut_at_the_count() {
        let seq = source_sequence(4, 10, [7; 32]);
        assert_eq!(seq.len(), 10);
        for pass in seq.chunks(4).take(2) {
            let mut sorted = pass.to_vec();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                [0, 1, 2, 3],
                "each full pass holds every sample once"
            );
        }
        assert_eq!(seq, source_sequence(4, 10, [7; 32]), "seeded");
    }

    #[test]
    fn every_prefix_holds_each_source_within_one_of_its_share() {
        let counts = [500, 300, 200];
        let order = interleave(&counts);
        assert_eq!(order.len(), 1000);
        let mut seen = [0u64; 3];
        for (i, &(s, k)) in order.iter().enumerate() {
            assert_eq!(k, seen[s], "each source's items in sequence order");
            seen[s] += 1;
            for (c, t) in counts.iter().zip(&seen) {
                let share = *c as f64 * (i + 1) as f64 / 1000.0;
                assert!((*t as f64 - share).abs() <= 1.0, "item {i}: {t} vs {share}");
            }
        }
    }
}
