//! Bicubic resize of interleaved RGB straight into three planes, as two row passes.
//!
//! 1. vertical: each output row is a weighted sum of input rows (`row_filter`), on the
//!    interleaved bytes as they come from the decoder;
//! 2. transpose (`3W` columns become rows: row `3x + c` is channel `c` of column `x`);
//! 3. horizontal, now also a row pass: each output column of each channel is a weighted sum
//!    of rows `3x + c` of the transposed image; the channels come apart here for free;
//! 4. transpose each channel back into its plane of the output.
//!
//! Every pass reads and writes whole contiguous rows, so the one SIMD kernel serves both axes.
//! `fast_image_resize` instead filters interleaved 3-byte pixels horizontally, which on these
//! small upscales (336 -> 384, four taps) costs most of its time in per-pixel shuffling; the
//! weights here are computed once per (input, output) length and kept.
use super::bicubic_taps::Taps;
use super::row_filter::filter_rows;
use super::transpose::transpose;
use super::ResizeError;
use crate::loader::decode::RgbImage;
use std::collections::HashMap;

/// Kept taps are dropped when this many (input, output) lengths have been seen. Building one
/// set costs ~30 µs (a tenth of a resize) and LLaVA-style data has hundreds of distinct
/// widths; 1024 sets of 384 outputs at six taps hold about 14 MB per worker.
const MAX_CACHED_TAPS: usize = 1024;

/// Where one channel's box lies in the output: plane `c` starts at `c * plane`, the box's top
/// left byte is `origin` into the plane, and its rows are `stride` bytes apart.
#[derive(Clone, Copy, Debug)]
pub(super) struct PlanarTarget {
    pub plane: usize,
    pub origin: usize,
    pub stride: usize,
}

/// Reusable state of one worker thread: cached taps and the intermediate images.
#[derive(Default)]
pub(super) struct PlanarResizer {
    taps: HashMap<(usize, usize), Taps>,
    vertical: Vec<u8>,
    transposed: Vec<u8>,
    columns: Vec<u8>,
}

/// Sets `buf` to `len` bytes, filling only what it grows by (every byte is overwritten).
fn sized(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() > len {
        buf.truncate(len);
    } else {
        buf.resize(len, 0);
    }
    buf
}

impl PlanarResizer {
    /// Resizes `img` to `width x height` into the three channel boxes of `out`.
    pub(super) fn resize(
        &mut self,
        img: &RgbImage,
        (width, height): (usize, usize),
        out: &mut [u8],
        target: PlanarTarget,
    ) -> Result<(), ResizeError> {
        let (w, h) = (img.width as usize, img.height as usize);
        let row_bytes = 3 * w;
        if img.data.len() < h * row_bytes {
            return Err(ResizeError::short_source(img));
        }
        let last = 2 * target.plane + target.origin + (height.max(1) - 1) * target.stride + width;
        if width == 0 || height == 0 || width > target.stride || out.len() < last {
            return Err(ResizeError::BoxOutside {
                width,
                height,
                len: out.len(),
            });
        }
        // Both axes' taps must be in the map at once: clear it before, never between.
        if self.taps.len() + 2 > MAX_CACHED_TAPS {
            self.taps.clear();
        }
        for (input, output) in [(h, height), (w, width)] {
            self.taps
                .entry((input, output))
                .or_insert_with(|| Taps::new(input, output));
        }
        let Self {
            taps,
            vertical,
            transposed,
            columns,
        } = self;

        // 1. Vertical, on interleaved rows.
        let vertical: &[u8] = if h == height {
            &img.data[..h * row_bytes]
        } else {
            let vertical = sized(vertical, height * row_bytes);
            let taps = &taps[&(h, height)];
            filter_rows(&img.data, (0, row_bytes), row_bytes, taps, vertical);
            vertical
        };

        // 2. Transpose: row 3x + c holds channel c of column x, `height` bytes long.
        let transposed = sized(transposed, row_bytes * height);
        transpose(vertical, row_bytes, (height, row_bytes), transposed, height);

        // 3. Horizontal, as a row pass per channel: `columns` holds each channel's output
        //    columns as rows of `height` bytes. The last step reads channel c's column x at
        //    `first(c) + x * step`.
        let (source, first, step): (&[u8], usize, usize) = if w == width {
            (transposed, height, 3 * height)
        } else {
            let taps = &taps[&(w, width)];
            let columns = sized(columns, 3 * width * height);
            for (c, plane) in columns.chunks_exact_mut(width * height).enumerate() {
                filter_rows(transposed, (c * height, 3 * height), height, taps, plane);
            }
            (columns, width * height, height)
        };

        // 4. Each channel back to row-major, into its box.
        for c in 0..3 {
            let dst = &mut out[c * target.plane + target.origin..];
            transpose(
                &source[c * first..],
                step,
                (width, height),
                dst,
                target.stride,
            );
        }
        Ok(())
    }
}
