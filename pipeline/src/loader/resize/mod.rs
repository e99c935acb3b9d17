//! RGB image -> `[3, S, S]` u8 CHW, bicubic (Catmull-Rom, a = -0.5, PIL's BICUBIC kernel),
//! under the `squash` or `pad` policy: by `planar` (AVX2 row passes that write the planes
//! directly) or by `fast_image_resize` plus a CHW transpose.
//!
//! The kernels: `bicubic_taps` (PIL's weights, fixed point), `row_filter` (the one arithmetic
//! kernel, AVX2 or scalar), `transpose` (byte matrices, SSE2/AVX2), `planar` (the two passes
//! built from those), `chw` (interleaved rows to planes, for the `fast_image_resize` path).
//!
//! `pad` is LLaVA's `expand2square` without building the padded square: the image is resized
//! straight into its centred box of the output and the border is filled with the pad colour,
//! which gives the same picture as padding first and resizing after, at a fraction of the work.
mod bicubic_taps;
mod chw;
mod planar;
mod row_filter;
mod transpose;

use super::decode::RgbImage;
use super::ResizePolicy;
use chw::deinterleave_row;
use fast_image_resize as fir;
use planar::{PlanarResizer, PlanarTarget};

/// Why an image could not be resized into its output. An error of `fast_image_resize` is the
/// `source()`.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error("output holds {len} bytes, not 3x{size}x{size}")]
    OutputLength { len: usize, size: u32 },
    #[error("source {width}x{height} holds {len} bytes")]
    ShortSource { width: u32, height: u32, len: usize },
    #[error("box {width}x{height} does not fit the {len} output bytes")]
    BoxOutside {
        width: usize,
        height: usize,
        len: usize,
    },
    #[error("fast_image_resize: source {width}x{height}")]
    FirSource {
        width: u32,
        height: u32,
        source: fir::ImageBufferError,
    },
    #[error("fast_image_resize: target {width}x{height}")]
    FirTarget {
        width: u32,
        height: u32,
        source: fir::ImageBufferError,
    },
    #[error("fast_image_resize: {from:?} -> {to:?}")]
    Fir {
        from: (u32, u32),
        to: (u32, u32),
        source: fir::ResizeError,
    },
}

impl ResizeError {
    fn short_source(img: &RgbImage) -> Self {
        ResizeError::ShortSource {
            width: img.width,
            height: img.height,
            len: img.data.len(),
        }
    }
}

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

/// Which code resizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeBackend {
    /// `planar`: two row passes and two transposes, AVX2 (scalar elsewhere).
    Planar,
    /// `fast_image_resize` on interleaved pixels, then the CHW transpose.
    FastImageResize,
}

impl ResizeBackend {
    /// `Planar` where the CPU has AVX2 (measured 1.75-1.88x faster there, BENCHMARKS.md);
    /// elsewhere `fast_image_resize`, whose SSE4.1 and NEON paths beat a scalar loop.
    pub fn detect() -> ResizeBackend {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                return ResizeBackend::Planar;
            }
        }
        ResizeBackend::FastImageResize
    }
}

/// Reusable resize state for one worker thread.
pub struct ChwResizer {
    backend: ResizeBackend,
    planar: PlanarResizer,
    fir: fir::Resizer,
    options: fir::ResizeOptions,
    /// `fast_image_resize`'s output box, interleaved RGB, before the CHW transpose.
    scratch: Vec<u8>,
}

impl Default for ChwResizer {
    fn default() -> Self {
        ChwResizer::with_backend(ResizeBackend::detect())
    }
}

impl ChwResizer {
    pub fn with_backend(backend: ResizeBackend) -> Self {
        let alg = fir::ResizeAlg::Convolution(fir::FilterType::CatmullRom);
        ChwResizer {
            backend,
            planar: PlanarResizer::default(),
            fir: fir::Resizer::new(),
            options: fir::ResizeOptions::new().resize_alg(alg),
            scratch: Vec::new(),
        }
    }

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
    ) -> Result<(), ResizeError> {
        let plane = size as usize * size as usize;
        if out.len() != 3 * plane {
            return Err(ResizeError::OutputLength {
                len: out.len(),
                size,
            });
        }
        let content = content_box(source_dims.0, source_dims.1, size, policy);
        {
            let [x0, y0, bw, bh] = content.map(|v| v as usize);
            for (c, &value) in pad_rgb.iter().enumerate() {
                fill_border(
                    &mut out[c * plane..(c + 1) * plane],
                    size as usize,
                    [x0, y0, bw, bh],
                    value,
                );
            }
        }
        self.resize_into_box(img, (size, size), content, out)
    }

    /// Resizes `img` to the box `[x, y, width, height]` of `out`, a `[3, canvas_h, canvas_w]`
    /// canvas (`canvas` is (width, height)); the canvas outside the box is left as it is.
    pub fn resize_into_box(
        &mut self,
        img: &RgbImage,
        canvas: (u32, u32),
        [x0, y0, bw, bh]: [u32; 4],
        out: &mut [u8],
    ) -> Result<(), ResizeError> {
        let (size, x0, y0) = (canvas.0 as usize, x0 as usize, y0 as usize);
        let plane = size * canvas.1 as usize;
        let (bw, bh) = (bw as usize, bh as usize);
        let box_bytes = bw * bh * 3;
        if x0 + bw > size || y0 + bh > canvas.1 as usize || out.len() != 3 * plane {
            return Err(ResizeError::BoxOutside {
                width: bw,
                height: bh,
                len: out.len(),
            });
        }
        let same_size = (img.width as usize, img.height as usize) == (bw, bh);
        let boxed: &[u8] = if same_size {
            img.data
                .get(..box_bytes)
                .ok_or_else(|| ResizeError::short_source(img))?
        } else if self.backend == ResizeBackend::Planar {
            let target = PlanarTarget {
                plane,
                origin: y0 * size + x0,
                stride: size,
            };
            return self.planar.resize(img, (bw, bh), out, target);
        } else {
            self.resize_with_fir(img, (bw as u32, bh as u32))?
        };
        // HWC -> CHW, row by row into the box.
        let (r, gb) = out.split_at_mut(plane);
        let (g, b) = gb.split_at_mut(plane);
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

    /// `fast_image_resize` into `scratch`, interleaved. Typed to RGB: the untyped `resize`
    /// dispatches over every pixel type at run time, which compiled all 13 into this crate (two
    /// thirds of its machine code, and more than half of its build time).
    fn resize_with_fir(
        &mut self,
        img: &RgbImage,
        (bw, bh): (u32, u32),
    ) -> Result<&[u8], ResizeError> {
        let (width, height) = (img.width, img.height);
        let src =
            fir::images::TypedImageRef::<fir::pixels::U8x3>::from_buffer(width, height, &img.data)
                .map_err(|source| ResizeError::FirSource {
                    width,
                    height,
                    source,
                })?;
        self.scratch.resize(bw as usize * bh as usize * 3, 0);
        let mut dst =
            fir::images::TypedImage::<fir::pixels::U8x3>::from_buffer(bw, bh, &mut self.scratch)
                .map_err(|source| ResizeError::FirTarget {
                    width: bw,
                    height: bh,
                    source,
                })?;
        self.fir
            .resize_typed(&src, &mut dst, &self.options)
            .map_err(|source| ResizeError::Fir {
                from: (width, height),
                to: (bw, bh),
                source,
            })?;
        Ok(&self.scratch)
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
