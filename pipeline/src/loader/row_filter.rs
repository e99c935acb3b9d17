//! One output row of a separable resize pass: a weighted sum of input rows, byte by byte.
//!
//! Both passes of the planar resize are this operation (the horizontal one runs on a
//! transposed image), so it is the only arithmetic kernel: with AVX2, sixteen bytes at a time
//! and two taps per `vpmaddwd`; otherwise, and for the last few bytes, a scalar loop. The
//! two give identical bytes (tested below).
use super::bicubic_taps::WEIGHT_BITS;

/// `dst[i] = clamp(round(sum over t of weights[t] * src[rows[t] + i]))` for every `i` of `dst`,
/// with `weights` in fixed point (`1 << WEIGHT_BITS` is one). `rows` are byte offsets into
/// `src`.
///
/// # Panics
/// If a row does not hold `dst.len()` bytes of `src`, or `rows` and `weights` differ in length.
pub fn filter_row(src: &[u8], rows: &[usize], weights: &[i16], dst: &mut [u8]) {
    assert_eq!(rows.len(), weights.len(), "one weight per row");
    assert!(
        rows.iter().all(|&r| r + dst.len() <= src.len()),
        "a row runs past the source ({} bytes)",
        src.len()
    );
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present, and every row holds dst.len() bytes (asserted above).
            done = unsafe { avx2::filter_row(src, rows, weights, dst) };
        }
    }
    filter_row_scalar(src, rows, weights, dst, done);
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

    /// Two `i16` weights side by side in one `i32` lane, as `vpmaddwd` pairs them.
    fn pair(first: i16, second: i16) -> i32 {
        (first as u16 as u32 | (second as u16 as u32) << 16) as i32
    }

    /// Adds `weight_pair` times the sixteen bytes at `a` and `b` into `lo` (bytes 0-3, 8-11)
    /// and `hi` (bytes 4-7, 12-15), the order `vpunpck*wd` leaves them in.
    ///
    /// # Safety
    /// AVX2; `a` and `b` readable for 16 bytes.
    #[inline(always)]
    unsafe fn add_pair(lo: &mut __m256i, hi: &mut __m256i, a: *const u8, b: __m256i, w: i32) {
        // SAFETY: the caller's guarantee.
        unsafe {
            let a = _mm256_cvtepu8_epi16(_mm_loadu_si128(a.cast()));
            let w = _mm256_set1_epi32(w);
            *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w));
            *hi = _mm256_add_epi32(*hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w));
        }
    }

    /// Filters whole blocks of 16 bytes; returns how many bytes of `dst` it wrote.
    ///
    /// # Safety
    /// AVX2, and `rows[t] + dst.len() <= src.len()` for every `t`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn filter_row(src: &[u8], rows: &[usize], weights: &[i16], dst: &mut [u8]) -> usize {
        let blocks = dst.len() / 16;
        let base = src.as_ptr();
        let round = _mm256_set1_epi32(1 << (WEIGHT_BITS - 1));
        let odd = rows.len() % 2 == 1;
        let last = rows.len().saturating_sub(1);
        for block in 0..blocks {
            let i = 16 * block;
            let (mut lo, mut hi) = (round, round);
            // SAFETY (loop body): every load reads src[r + i..r + i + 16] with
            // i + 16 <= dst.len(), inside the caller's guarantee; the store writes
            // dst[i..i + 16].
            unsafe {
                for (r, w) in rows.chunks_exact(2).zip(weights.chunks_exact(2)) {
                    let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(base.add(r[1] + i).cast()));
                    add_pair(&mut lo, &mut hi, base.add(r[0] + i), b, pair(w[0], w[1]));
                }
                if odd {
                    let zero = _mm256_setzero_si256();
                    let (r, w) = (rows[last], weights[last]);
                    add_pair(&mut lo, &mut hi, base.add(r + i), zero, pair(w, 0));
                }
                let lo = _mm256_srai_epi32::<{ WEIGHT_BITS as i32 }>(lo);
                let hi = _mm256_srai_epi32::<{ WEIGHT_BITS as i32 }>(hi);
                // packs puts bytes 0-7 in lane 0 and 8-15 in lane 1, in order; packus
                // saturates to 0..=255 and the permute joins the two lanes' low halves.
                let words = _mm256_packs_epi32(lo, hi);
                let bytes = _mm256_packus_epi16(words, words);
                let joined = _mm256_permute4x64_epi64::<0b00_00_10_00>(bytes);
                let out = dst.as_mut_ptr().add(i);
                _mm_storeu_si128(out.cast(), _mm256_castsi256_si128(joined));
            }
        }
        16 * blocks
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
        let src = noise(64 * 97, 7);
        for taps in 1..=9 {
            for width in [1usize, 15, 16, 17, 33, 97] {
                let rows: Vec<usize> = (0..taps).map(|t| (t * 7 % 64) * 97).collect();
                // Negative lobes and a sum over one, so both clamps are hit.
                let weights: Vec<i16> = (0..taps)
                    .map(|t| [9000, -1500, 12000, -700, 3000][t % 5])
                    .collect();
                let mut fast = vec![0u8; width];
                let mut slow = vec![0u8; width];
                filter_row(&src, &rows, &weights, &mut fast);
                filter_row_scalar(&src, &rows, &weights, &mut slow, 0);
                assert_eq!(fast, slow, "{taps} taps, {width} bytes");
            }
        }
    }

    #[test]
    fn unit_weight_copies_and_halves_average_with_rounding() {
        let src: Vec<u8> = (0..64).map(|i| (i * 4) as u8).collect();
        let mut out = vec![0u8; 32];
        filter_row(&src, &[32], &[1 << WEIGHT_BITS], &mut out);
        assert_eq!(out, &src[32..]);
        let half = 1 << (WEIGHT_BITS - 1);
        filter_row(&src, &[0, 1], &[half, half], &mut out);
        let want: Vec<u8> = (0..32).map(|i| (i * 4 + 2) as u8).collect();
        assert_eq!(out, want);
    }
}
