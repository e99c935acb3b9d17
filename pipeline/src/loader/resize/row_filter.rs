//! One output row of a separable resize pass: a weighted sum of input rows, byte by byte.
//!
//! Both passes of the planar resize are this operation (the horizontal one runs on a
//! transposed image), so it is the only arithmetic kernel: with AVX2, sixteen bytes at a time
//! and two taps per `vpmaddwd`; otherwise, and for the last few bytes, a scalar loop. The
//! two give identical bytes (tested below).
use super::bicubic_taps::{Taps, WEIGHT_BITS};

/// Every output row of one pass: row `k` of `dst` (`n` bytes) is the weighted sum, by
/// `taps.of(k)`, of the `n`-byte rows of `src` that start at `base + index * stride`.
///
/// # Panics
/// If a tapped row runs past `src`, or `dst` holds fewer than `taps.output()` rows.
pub(super) fn filter_rows(
    src: &[u8],
    (base, stride): (usize, usize),
    n: usize,
    taps: &Taps,
    dst: &mut [u8],
) {
    if n == 0 {
        return;
    }
    assert!(
        base + taps.max_index() * stride + n <= src.len(),
        "a row runs past the source ({} bytes)",
        src.len()
    );
    assert!(dst.len() >= taps.output() * n, "too few output rows");
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    let mut rows = Vec::with_capacity(taps.per_output());
    for (k, out) in dst.chunks_exact_mut(n).take(taps.output()).enumerate() {
        let (index, weights) = taps.of(k);
        rows.clear();
        rows.extend(index.iter().map(|&j| base + j as usize * stride));
        #[allow(unused_mut)]
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2 is present, and every row holds n bytes (asserted above).
            done = unsafe { avx2::filter_row(src, &rows, weights, out) };
        }
        filter_row_scalar(src, &rows, weights, out, done);
    }
}

/// The scalar loop, from byte `from` of `dst` on.
fn filter_row_scalar(src: &[u8], rows: &[usize], weights: &[i16], dst: &mut [u8], from: usize) {
    let round = 1i32 << (WEIGHT_BITS - 1);
    for (i, out) in dst.iter_mut().enumerate().skip(from) {
        let sum: i32 = rows
            .iter()
            .zip(weights)
            .map(|(&r, &w)| w as i32 * src[r + i] as i32)
            .sum();
        *out = ((sum + round) >> WEIGHT_BITS).clamp(0, 255) as u8;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::WEIGHT_BITS;
    use std::arch::x86_64::*;

    /// Most tap pairs held at once (33 taps: shrinking by up to 8x); wider filters go scalar.
    const MAX_PAIRS: usize = 17;

    /// Two `i16` weights side by side in one `i32` lane, as `vpmaddwd` pairs them.
    fn pair(first: i16, second: i16) -> i32 {
        (first as u16 as u32 | (second as u16 as u32) << 16) as i32
    }

    /// Adds weight pair `w` times the sixteen bytes at `a` and `b` into `lo` (bytes 0-3,
    /// 8-11) and `hi` (bytes 4-7, 12-15), the order `vpunpck*wd` leaves them in.
    ///
    /// # Safety
    /// AVX2; `a` and `b` readable for 16 bytes.
    #[inline(always)]
    unsafe fn accumulate(acc: &mut [__m256i; 2], a: *const u8, b: *const u8, w: __m256i) {
        // SAFETY: the caller's guarantee.
        unsafe {
            let a = _mm256_cvtepu8_epi16(_mm_loadu_si128(a.cast()));
            let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(b.cast()));
            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w));
            acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w));
        }
    }

    /// Rounds sixteen sums back to bytes 0..=255, in order: packs puts bytes 0-7 in lane 0
    /// and 8-15 in lane 1, packus saturates, the permute joins the lanes.
    #[inline(always)]
    fn finish(acc: [__m256i; 2], other: [__m256i; 2]) -> __m256i {
        // SAFETY: register-only AVX2 operations; every caller is an AVX2 function.
        unsafe {
            let shift = |v| _mm256_srai_epi32::<{ WEIGHT_BITS as i32 }>(v);
            let first = _mm256_packs_epi32(shift(acc[0]), shift(acc[1]));
            let second = _mm256_packs_epi32(shift(other[0]), shift(other[1]));
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(first, second))
        }
    }

    /// Filters whole blocks of 16 bytes (two at a time); returns how many bytes of `dst` it
    /// wrote (0 for a filter wider than `MAX_PAIRS` pairs).
    ///
    /// # Safety
    /// AVX2, and `rows[t] + dst.len() <= src.len()` for every `t`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn filter_row(
        src: &[u8],
        rows: &[usize],
        weights: &[i16],
        dst: &mut [u8],
    ) -> usize {
        let pairs = rows.len().div_ceil(2);
        if rows.is_empty() || pairs > MAX_PAIRS {
            return 0;
        }
        let base = src.as_ptr();
        // Row pointers and broadcast weight pairs; an odd last tap pairs with itself at 0.
        let mut taps = [(base, base, _mm256_setzero_si256()); MAX_PAIRS];
        for (p, tap) in taps.iter_mut().take(pairs).enumerate() {
            let (a, b) = (2 * p, (2 * p + 1).min(rows.len() - 1));
            let wb = if b == a { 0 } else { weights[b] };
            // SAFETY: rows[t] <= src.len() (the caller's guarantee).
            let (ra, rb) = unsafe { (base.add(rows[a]), base.add(rows[b])) };
            *tap = (ra, rb, _mm256_set1_epi32(pair(weights[a], wb)));
        }
        let taps = &taps[..pairs];
        let round = _mm256_set1_epi32(1 << (WEIGHT_BITS - 1));
        let n = dst.len();
        let mut i = 0;
        // SAFETY (both loops): every load reads bytes r + i..r + i + 32 (or + 16) of a row with
        // i + 32 (+ 16) <= dst.len(), inside the caller's guarantee; stores stay in dst.
        while i + 32 <= n {
            let (mut first, mut second) = ([round; 2], [round; 2]);
            for &(a, b, w) in taps {
                unsafe {
                    accumulate(&mut first, a.add(i), b.add(i), w);
                    accumulate(&mut second, a.add(i + 16), b.add(i + 16), w);
                }
            }
            let out = finish(first, second);
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), out) };
            i += 32;
        }
        if i + 16 <= n {
            let mut acc = [round; 2];
            for &(a, b, w) in taps {
                unsafe { accumulate(&mut acc, a.add(i), b.add(i), w) };
            }
            let out = _mm256_castsi256_si128(finish(acc, acc));
            unsafe { _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), out) };
            i += 16;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(len: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2654435761).max(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn simd_and_scalar_agree_for_every_tap_count_and_tail() {
        // Shrinks, growths and odd widths: every tap count from 1 to ~9 and every tail.
        let src = noise(3 * 64 * 120, 7);
        for (input, output) in [(64, 64), (64, 40), (40, 64), (64, 17), (64, 9), (3, 5)] {
            let taps = Taps::new(input, output);
            for n in [1usize, 15, 16, 17, 33, 97, 120] {
                let stride = 3 * n;
                let mut fast = vec![0u8; output * n];
                filter_rows(&src, (n / 2, stride), n, &taps, &mut fast);
                let mut slow = vec![0u8; output * n];
                for (k, out) in slow.chunks_exact_mut(n).enumerate() {
                    let (index, weights) = taps.of(k);
                    let rows: Vec<usize> =
                        index.iter().map(|&j| n / 2 + j as usize * stride).collect();
                    filter_row_scalar(&src, &rows, weights, out, 0);
                }
                assert_eq!(fast, slow, "{input} -> {output}, rows of {n} bytes");
            }
        }
    }

    #[test]
    fn clamps_overshoot_at_both_ends() {
        // Bicubic rings past a hard edge: the sums leave 0..=255 and must be clamped.
        let mut src = vec![0u8; 8 * 32];
        src[4 * 32..].fill(255);
        let taps = Taps::new(8, 20);
        let mut out = vec![7u8; 20 * 32];
        filter_rows(&src, (0, 32), 32, &taps, &mut out);
        let column: Vec<u8> = out.chunks_exact(32).map(|row| row[5]).collect();
        assert_eq!(column.first(), Some(&0));
        assert_eq!(column.last(), Some(&255));
        assert!(column.windows(2).all(|w| w[0] <= w[1]), "{column:?}");
    }
}
