//! RGB image -> `[3, S, S]` u8 CHW with `fast_image_resize` (SIMD), bicubic (Catmull-Rom,
//! a = -0.5, PIL's BICUBIC kernel), under the `squash` or `pad` policy.
//!
//! `pad` is LLaVA's `expand2square` without building the padded square: the image is resized
//! straight into its centred box of the output and the border is filled with the pad colour,
//! which gives the same picture as padding first and resizing after, at a fraction of the work.
use super::chw::deinterleave_row;
use super::decode::RgbImage;
use super::ResizePolicy;
use fast_image_resize as fir;

/// Where the image lands inside the `size x size` output: `(x, y, width, height)`.
pub fn content_box(width: u32, height: u32, size: u32, policy: ResizePolicy) -> [u32; 4] {
    match policy {
        ResizePolicy::Squash => [0, 0, size, size],
        ResizePolicy::Pad => {
            let side = width.max(height) as u64;
            let scale = |len: u32| (((len as u64 * size as u64) + side / 2) / side).max(1) as u32;
            let (w, h) = (scale(width).min(size), scale(height).min(size));
            [(size - w) / 2, (size - h) / 2, w, h]
        }
    }
}

/// Reusable resize state for one worker thread.
pub struct ChwResizer {
    resizer: fir::Resizer,
    options: fir::ResizeOptions,
    /// The resized box, interleaved RGB, before the CHW transpose.
    scratch: Vec<u8>,
}

impl Default for ChwResizer {
    fn default() -> Self {
        let alg = fir::ResizeAlg::Convolution(fir::FilterType::CatmullRom);
        ChwResizer {
            resizer: fir::Resizer::new(),
            options: fir::ResizeOptions::new().resize_alg(alg),
            scratch: Vec::new(),
        }
    }
}

impl ChwResizer {
    /// Writes `img` as `[3, size, size]` into `out` (exactly `3 * size * size` bytes).
    /// `source_dims` is the size before any DCT scaling; `pad` uses its aspect ratio.
    pub fn resize_into(
        &mut self,
        img: &RgbImage,
        source_dims: (u32, u32),
        size: u32,
        policy: ResizePolicy,
        pad_rgb: [u8; 3],
        out: &mut [u8],
    ) -> Result<(), String> {
        let plane = size as usize * size as usize;
        if out.len() != 3 * plane {
            return Err(format!(
                "output holds {} bytes, not 3x{size}x{size}",
                out.len()
            ));
        }
        let [x0, y0, bw, bh] = content_box(source_dims.0, source_dims.1, size, policy);
        let src =
            fir::images::ImageRef::new(img.width, img.height, &img.data, fir::PixelType::U8x3)
                .map_err(|e| format!("source {}x{}: {e}", img.width, img.height))?;
        let box_bytes = bw as usize * bh as usize * 3;
        let boxed: &[u8] = if (img.width, img.height) == (bw, bh) {
            img.data
                .get(..box_bytes)
                .ok_or_else(|| format!("source {bw}x{bh} holds {} bytes", img.data.len()))?
        } else {
            self.scratch.resize(box_bytes, 0);
            let mut dst =
                fir::images::Image::from_slice_u8(bw, bh, &mut self.scratch, fir::PixelType::U8x3)
                    .map_err(|e| format!("resize target {bw}x{bh}: {e}"))?;
            self.resizer
                .resize(&src, &mut dst, &self.options)
                .map_err(|e| format!("resize {}x{} -> {bw}x{bh}: {e}", img.width, img.height))?;
            &self.scratch
        };
        let (r, gb) = out.split_at_mut(plane);
        let (g, b) = gb.split_at_mut(plane);
        // HWC -> CHW, row by row into the box; only the border around it gets the pad colour.
        let (size, x0, y0) = (size as usize, x0 as usize, y0 as usize);
        let (bw, bh) = (bw as usize, bh as usize);
        for (plane, &c) in [&mut *r, &mut *g, &mut *b].into_iter().zip(&pad_rgb) {
            fill_border(plane, size, [x0, y0, bw, bh], c);
        }
        for (y, src_row) in boxed.chunks_exact(bw * 3).enumerate() {
            let row = (y0 + y) * size + x0..(y0 + y) * size + x0 + bw;
            deinterleave_row(
                src_row,
                &mut r[row.clone()],
                &mut g[row.clone()],
                &mut b[row],
            );
        }
        Ok(())
    }
}

/// Sets every pixel of a `size x size` plane outside the box `[x, y, w, h]` to `value`.
fn fill_border(plane: &mut [u8], size: usize, [x, y, w, h]: [usize; 4], value: u8) {
    let (top, rest) = plane.split_at_mut(y * size);
    top.fill(value);
    let (middle, bottom) = rest.split_at_mut(h * size);
    bottom.fill(value);
    if w < size {
        for row in middle.chunks_exact_mut(size) {
            row[..x].fill(value);
            row[x + w..].fill(value);
        }
    }
}
