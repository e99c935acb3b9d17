//! Byte-matrix transpose: lets the planar resize run its horizontal pass as a row pass.
//!
//! 16 x 16 blocks go through SIMD registers in four rounds of `punpck{l,h}bw`, each pairing
//! register `i` with `i + 8` (every round moves one bit of the row index into the byte index).
//! With AVX2 the two 128-bit lanes of a register transpose two blocks side by side; SSE2 takes
//! a last single block; the ragged edges go byte by byte.

/// `dst[c * dst_stride + r] = src[r * src_stride + c]` for `r < rows`, `c < cols`.
///
/// # Panics
/// If `src` or `dst` is too short for the strides and sizes given.
pub(super) fn transpose(
    src: &[u8],
    src_stride: usize,
    (rows, cols): (usize, usize),
    dst: &mut [u8],
    dst_stride: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(cols <= src_stride && (rows - 1) * src_stride + cols <= src.len());
    assert!(rows <= dst_stride && (cols - 1) * dst_stride + rows <= dst.len());
    let (full_rows, full_cols) = (rows / 16 * 16, cols / 16 * 16);
    #[cfg(target_arch = "x86_64")]
    {
        let wide = if std::arch::is_x86_feature_detected!("avx2") {
            cols / 32 * 32
        } else {
            0
        };
        for r in (0..full_rows).step_by(16) {
            let mut c = 0;
            while c < full_cols {
                let pair = c + 32 <= wide;
                // SAFETY: the block reads src rows r..r+16, bytes c..c+16 (c+32 for the AVX2
                // pair) and writes the matching dst rows and bytes r..r+16, all inside the
                // lengths asserted above; AVX2 was detected where used, SSE2 is part of x86_64.
                unsafe {
                    let from = src.as_ptr().add(r * src_stride + c);
                    let to = dst.as_mut_ptr().add(c * dst_stride + r);
                    if pair {
                        simd::pair_avx2(from, src_stride, to, dst_stride);
                    } else {
                        simd::block_sse2(from, src_stride, to, dst_stride);
                    }
                }
                c += if pair { 32 } else { 16 };
            }
        }
    }
    let simd_done = if cfg!(target_arch = "x86_64") {
        (full_rows, full_cols)
    } else {
        (0, 0)
    };
    transpose_scalar(src, src_stride, (rows, cols), dst, dst_stride, simd_done);
}

/// Every element outside the `done` corner (`rows x cols` already written).
fn transpose_scalar(
    src: &[u8],
    src_stride: usize,
    (rows, cols): (usize, usize),
    dst: &mut [u8],
    dst_stride: usize,
    done: (usize, usize),
) {
    for r in 0..rows {
        let skip = if r < done.0 { done.1 } else { 0 };
        for c in skip..cols {
            dst[c * dst_stride + r] = src[r * src_stride + c];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// Four rounds of byte unpacks: register `i` of the result holds column `i` (per lane).
    macro_rules! transpose_rounds {
        ($r:ident, $lo:ident, $hi:ident) => {
            for _ in 0..4 {
                let mut next = $r;
                for i in 0..8 {
                    next[2 * i] = $lo($r[i], $r[i + 8]);
                    next[2 * i + 1] = $hi($r[i], $r[i + 8]);
                }
                $r = next;
            }
        };
    }

    /// Transposes one 16 x 16 block.
    ///
    /// # Safety
    /// 16 rows of 16 bytes readable at `src` (stride `src_stride`) and writable at `dst`
    /// (stride `dst_stride`).
    #[inline(always)]
    pub(super) unsafe fn block_sse2(
        src: *const u8,
        src_stride: usize,
        dst: *mut u8,
        dst_stride: usize,
    ) {
        // SAFETY: the caller's guarantee covers every load and store.
        unsafe {
            let mut r: [__m128i; 16] =
                std::array::from_fn(|i| _mm_loadu_si128(src.add(i * src_stride).cast()));
            transpose_rounds!(r, _mm_unpacklo_epi8, _mm_unpackhi_epi8);
            for (i, row) in r.iter().enumerate() {
                _mm_storeu_si128(dst.add(i * dst_stride).cast(), *row);
            }
        }
    }

    /// Transposes 16 rows x 32 bytes: two 16 x 16 blocks, one per 128-bit lane.
    ///
    /// # Safety
    /// AVX2; 16 rows of 32 bytes readable at `src`, 32 rows of 16 bytes writable at `dst`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pair_avx2(
        src: *const u8,
        src_stride: usize,
        dst: *mut u8,
        dst_stride: usize,
    ) {
        // SAFETY: the caller's guarantee covers every load and store.
        unsafe {
            let mut r: [__m256i; 16] =
                std::array::from_fn(|i| _mm256_loadu_si256(src.add(i * src_stride).cast()));
            transpose_rounds!(r, _mm256_unpacklo_epi8, _mm256_unpackhi_epi8);
            for (i, row) in r.iter().enumerate() {
                _mm_storeu_si128(dst.add(i * dst_stride).cast(), _mm256_castsi256_si128(*row));
                let high = _mm256_extracti128_si256::<1>(*row);
                _mm_storeu_si128(dst.add((16 + i) * dst_stride).cast(), high);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_and_stride_matches_the_definition() {
        for (rows, cols) in [
            (1, 1),
            (16, 16),
            (17, 33),
            (48, 20),
            (5, 64),
            (100, 3),
            (33, 80),
            (16, 48),
        ] {
            let (ss, ds) = (cols + 3, rows + 5);
            let src: Vec<u8> = (0..rows * ss).map(|i| (i * 31 % 253) as u8).collect();
            let mut dst = vec![0u8; cols * ds];
            transpose(&src, ss, (rows, cols), &mut dst, ds);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(dst[c * ds + r], src[r * ss + c], "{rows}x{cols} at {r},{c}");
                }
            }
        }
    }
}
