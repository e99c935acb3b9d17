//! `loss.png`: the loss curve drawn straight onto an RGB image (axes, ticks with numeric labels
//! from a built-in 3x5 digit font, the raw curve in light blue and a moving average in dark
//! blue). No plotting crate: the `image` crate encodes the PNG.
use image::{Rgb, RgbImage};
use std::path::Path;

const WIDTH: u32 = 900;
const HEIGHT: u32 = 540;
const LEFT: i64 = 80;
const RIGHT: i64 = 20;
const TOP: i64 = 20;
const BOTTOM: i64 = 40;
const SCALE: i64 = 2;

/// Why the picture could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("{path}: no finite loss to plot")]
    Empty { path: String },
    #[error("{path}")]
    Write {
        path: String,
        source: image::ImageError,
    },
}

/// Draws `losses` (one per step, x = step) and writes a PNG to `path`.
pub(super) fn plot_loss(losses: &[(u64, f64)], path: &Path) -> Result<(), PlotError> {
    let img = draw(losses).ok_or_else(|| PlotError::Empty {
        path: path.display().to_string(),
    })?;
    img.save(path).map_err(|source| PlotError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// The picture as pixels; `None` when no loss is finite.
pub(super) fn draw(losses: &[(u64, f64)]) -> Option<RgbImage> {
    let points: Vec<(u64, f64)> = losses.iter().copied().filter(|p| p.1.is_finite()).collect();
    let (x_min, x_max) = (
        points.first()?.0,
        points.last()?.0.max(points.first()?.0 + 1),
    );
    let y_lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_hi = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let pad = ((y_hi - y_lo) * 0.05).max(1e-3);
    let (y_min, y_max) = ((y_lo - pad).max(0.0).min(y_lo), y_hi + pad);

    let mut img = RgbImage::from_pixel(WIDTH, HEIGHT, Rgb([255, 255, 255]));
    let (w, h) = (i64::from(WIDTH), i64::from(HEIGHT));
    let to_px = |x: f64, y: f64| -> (i64, i64) {
        let fx = (x - x_min as f64) / (x_max - x_min) as f64;
        let fy = (y - y_min) / (y_max - y_min);
        (
            LEFT + (fx * (w - LEFT - RIGHT) as f64).round() as i64,
            h - BOTTOM - (fy * (h - TOP - BOTTOM) as f64).round() as i64,
        )
    };
    let black = Rgb([0, 0, 0]);
    let grid = Rgb([225, 225, 225]);
    for i in 0..=4 {
        let y = y_min + (y_max - y_min) * f64::from(i) / 4.0;
        let (_, py) = to_px(x_min as f64, y);
        line(&mut img, (LEFT, py), (w - RIGHT, py), grid);
        line(&mut img, (LEFT - 5, py), (LEFT, py), black);
        let label = format!("{y:.3}");
        text(
            &mut img,
            &label,
            LEFT - 8 - text_width(&label),
            py - 2 * SCALE,
            black,
        );
        let x = x_min as f64 + (x_max - x_min) as f64 * f64::from(i) / 4.0;
        let (px, _) = to_px(x, y_min);
        line(&mut img, (px, h - BOTTOM), (px, h - BOTTOM + 5), black);
        let label = format!("{}", x.round() as u64);
        text(
            &mut img,
            &label,
            px - text_width(&label) / 2,
            h - BOTTOM + 10,
            black,
        );
    }
    line(&mut img, (LEFT, TOP), (LEFT, h - BOTTOM), black);
    line(&mut img, (LEFT, h - BOTTOM), (w - RIGHT, h - BOTTOM), black);

    let raw: Vec<(i64, i64)> = points.iter().map(|&(x, y)| to_px(x as f64, y)).collect();
    polyline(&mut img, &raw, Rgb([160, 190, 235]));
    let window = (points.len() / 25).max(1);
    let smooth: Vec<(i64, i64)> = (0..points.len())
        .map(|i| {
            let lo = i.saturating_sub(window - 1);
            let mean = points[lo..=i].iter().map(|p| p.1).sum::<f64>() / (i - lo + 1) as f64;
            to_px(points[i].0 as f64, mean)
        })
        .collect();
    polyline(&mut img, &smooth, Rgb([20, 60, 170]));
    Some(img)
}

fn polyline(img: &mut RgbImage, pts: &[(i64, i64)], color: Rgb<u8>) {
    if let [only] = pts {
        put(img, only.0, only.1, color);
    }
    for seg in pts.windows(2) {
        line(img, seg[0], seg[1], color);
    }
}

fn put(img: &mut RgbImage, x: i64, y: i64, color: Rgb<u8>) {
    if (0..i64::from(img.width())).contains(&x) && (0..i64::from(img.height())).contains(&y) {
        img.put_pixel(x as u32, y as u32, color);
    }
}

/// Bresenham's line.
fn line(img: &mut RgbImage, (mut x0, mut y0): (i64, i64), (x1, y1): (i64, i64), color: Rgb<u8>) {
    let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
    let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
    let mut err = dx + dy;
    loop {
        put(img, x0, y0, color);
        if x0 == x1 && y0 == y1 {
            break;
        }
        let e2 = 2 * err;
        if e2 >= dy {
            err += dy;
            x0 += sx;
        }
        if e2 <= dx {
            err += dx;
            y0 += sy;
        }
    }
}

/// 3x5 glyphs, one row per u8 (bits 2..0 = columns left to right).
fn glyph(c: char) -> [u8; 5] {
    match c {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        '.' => [0, 0, 0, 0, 2],
        '-' => [0, 0, 7, 0, 0],
        'e' => [0, 7, 7, 4, 7],
        _ => [0; 5],
    }
}

fn text_width(s: &str) -> i64 {
    s.chars().count() as i64 * 4 * SCALE
}

fn text(img: &mut RgbImage, s: &str, x: i64, y: i64, color: Rgb<u8>) {
    for (i, c) in s.chars().enumerate() {
        let rows = glyph(c);
        for (r, bits) in rows.iter().enumerate() {
            for col in 0..3 {
                if bits & (4 >> col) != 0 {
                    for (ox, oy) in (0..SCALE).flat_map(|a| (0..SCALE).map(move |b| (a, b))) {
                        let px = x + (i as i64 * 4 + col) * SCALE + ox;
                        put(img, px, y + r as i64 * SCALE + oy, color);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_falling_loss_is_drawn_high_on_the_left_and_low_on_the_right() {
        let losses: Vec<(u64, f64)> = (0..100).map(|i| (i, 5.0 - 0.04 * i as f64)).collect();
        let img = draw(&losses).expect("finite losses");
        let curve_rows = |x: u32| -> Vec<u32> {
            (0..HEIGHT)
                .filter(|&y| img.get_pixel(x, y) == &Rgb([20, 60, 170]))
                .collect()
        };
        let left = curve_rows(LEFT as u32 + 1);
        let right = curve_rows(WIDTH - RIGHT as u32 - 1);
        assert!(
            !left.is_empty() && !right.is_empty(),
            "curve missing at the edges"
        );
        assert!(
            left[0] < right[0],
            "left end must be higher (smaller y) than the right end"
        );
    }

    #[test]
    fn writes_a_png_that_decodes_and_refuses_an_all_nan_curve() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("loss.png");
        plot_loss(&[(0, 3.0), (1, 2.5), (2, 2.4)], &path)?;
        let back = image::open(&path)?;
        assert_eq!((back.width(), back.height()), (WIDTH, HEIGHT));
        let err = plot_loss(&[(0, f64::NAN)], &path).expect_err("nan only");
        assert!(err.to_string().contains("no finite loss"), "{err}");
        Ok(())
    }
}
