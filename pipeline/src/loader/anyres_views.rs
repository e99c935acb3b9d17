//! One image's views under LLaVA-OneVision's `anyres_max_N`, as its image processor cuts them:
//! 1. the base view: the whole image resized to one tile (squashed), or for an image of a
//!    several-image sample (which OneVision gives its base view alone) padded to a square of
//!    the mean colour first (`pad_to_square`, LLaVA's `expand2square`);
//! 2. the image resized to fit the chosen pinpoint (the planner's grid times the tile),
//!    keeping its aspect ratio (the scaled side rounded up), centred on a black canvas of
//!    the pinpoint's size (the odd pixel of padding on the right or bottom);
//! 3. that canvas cut into tiles, row by row.
//!
//! The image is decoded once and resized twice (base view, canvas); the views are written as
//! `[views, 3, tile, tile]` u8.
use super::decode::RgbImage;
use super::resize::{ChwResizer, ResizeError};
use super::ResizePolicy;
use tessera_shards::image_layout::ImageTokens;

/// Writes the views of `img` under `geometry` into `out` (`geometry.tiles` views of
/// `3 x tile x tile` bytes); `canvas` is scratch, kept between calls. `source_dims` is the
/// image's size before any DCT-scaled decode: what the processor's arithmetic sees. `pad_rgb`
/// fills the square of a several-image sample's base view (the processor's mean x 255).
pub fn anyres_views(
    resizer: &mut ChwResizer,
    img: &RgbImage,
    source_dims: (u32, u32),
    geometry: &ImageTokens,
    (tile, pad_rgb): (u32, [u8; 3]),
    canvas: &mut Vec<u8>,
    out: &mut [u8],
) -> Result<(), ResizeError> {
    let view = 3 * tile as usize * tile as usize;
    if out.len() != geometry.tiles as usize * view {
        return Err(ResizeError::OutputLength {
            len: out.len(),
            size: tile,
        });
    }
    let (base, tiles) = out.split_at_mut(view);
    let policy = match geometry.base_newline {
        true => ResizePolicy::Pad,
        false => ResizePolicy::Squash,
    };
    resizer.resize_into(img, source_dims, tile, policy, pad_rgb, base)?;
    if geometry.tiles == 1 {
        return Ok(());
    }
    let (rows, cols) = (geometry.grid.0, geometry.grid.1);
    let (pin_w, pin_h) = (cols * tile, rows * tile);
    let [x0, y0, w, h] = fitted_box(source_dims, (pin_w, pin_h));
    canvas.clear();
    canvas.resize(3 * pin_w as usize * pin_h as usize, 0);
    resizer.resize_into_box(img, (pin_w, pin_h), [x0, y0, w, h], canvas)?;
    cut_tiles(
        canvas,
        (pin_w as usize, pin_h as usize),
        tile as usize,
        tiles,
    );
    Ok(())
}

/// transformers' `get_patch_output_size` and `_get_padding_size`: where an image `source`
/// (width, height) lands on a `pinpoint` (width, height) canvas, `[x, y, width, height]`.
pub fn fitted_box(source: (u32, u32), pinpoint: (u32, u32)) -> [u32; 4] {
    let (ow, oh) = (f64::from(source.0.max(1)), f64::from(source.1.max(1)));
    let (tw, th) = pinpoint;
    let (scale_w, scale_h) = (f64::from(tw) / ow, f64::from(th) / oh);
    let (w, h) = if scale_w < scale_h {
        (tw, ((oh * scale_w).ceil() as u32).min(th))
    } else {
        (((ow * scale_h).ceil() as u32).min(tw), th)
    };
    [(tw - w) / 2, (th - h) / 2, w, h]
}

/// Copies the `tile x tile` squares of a `[3, height, width]` canvas, row by row, into `out`
/// as `[n, 3, tile, tile]`.
fn cut_tiles(canvas: &[u8], (width, height): (usize, usize), tile: usize, out: &mut [u8]) {
    let plane = width * height;
    let views = out.chunks_exact_mut(3 * tile * tile);
    let origins = (0..height / tile).flat_map(|r| (0..width / tile).map(move |c| (r, c)));
    for ((r, c), view) in origins.zip(views) {
        for (channel, dst) in view.chunks_exact_mut(tile * tile).enumerate() {
            for (y, dst_row) in dst.chunks_exact_mut(tile).enumerate() {
                let start = channel * plane + (r * tile + y) * width + c * tile;
                dst_row.copy_from_slice(&canvas[start..start + tile]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fitted_box_rounds_the_scaled_side_up_and_centres_it() {
        // 1000 x 300 on 1152 x 384: scale 1.152 by width (1.28 by height), 345.6 -> 346 rows.
        assert_eq!(fitted_box((1000, 300), (1152, 384)), [0, 19, 1152, 346]);
        // A tall one: 301 x 1.152 = 346.75 -> 347 columns, 37 of padding (18 left, 19 right).
        assert_eq!(fitted_box((301, 1000), (384, 1152)), [18, 0, 347, 1152]);
        assert_eq!(fitted_box((384, 384), (384, 384)), [0, 0, 384, 384]);
    }

    #[test]
    fn tiles_are_cut_row_by_row_from_each_channel() {
        // A 3 x 4 x 6 canvas whose bytes are their own index: tiles of 2, a 2 x 3 grid.
        let (w, h, tile) = (6usize, 4usize, 2usize);
        let canvas: Vec<u8> = (0..3 * w * h).map(|i| i as u8).collect();
        let mut out = vec![0u8; 6 * 3 * tile * tile];
        cut_tiles(&canvas, (w, h), tile, &mut out);
        // Tile (1, 2): rows 2-3, columns 4-5; channel 1 starts at 24.
        let t = 3 * 3 * tile * tile + 2 * 3 * tile * tile;
        let green = &out[t + tile * tile..t + 2 * tile * tile];
        assert_eq!(green, &[24 + 16, 24 + 17, 24 + 22, 24 + 23]);
    }
}
