//! `loss.png`: the loss curves drawn straight onto an RGB image (axes titled `step` and `loss`,
//! ticks with numeric labels from a built-in 3x5 font, and a legend). The training loss is one
//! series per sample type, each raw in a light shade and as a moving average in a dark one:
//! image steps in blue, text-only steps in green (a run alternating between the two types
//! draws two clean curves instead of a saw-tooth); the validation loss is orange with a dot
//! per evaluation. No plotting crate: the `image` crate encodes the PNG.
use image::{Rgb, RgbImage};
use std::path::Path;

const WIDTH: u32 = 900;
const HEIGHT: u32 = 540;
const LEFT: i64 = 80;
const RIGHT: i64 = 20;
const TOP: i64 = 30;
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

/// The curves' colours: (raw, moving average) per training series.
const IMAGE_COLOURS: (Rgb<u8>, Rgb<u8>) = (Rgb([160, 190, 235]), Rgb([20, 60, 170]));
const TEXT_COLOURS: (Rgb<u8>, Rgb<u8>) = (Rgb([165, 215, 165]), Rgb([25, 125, 45]));
const VALIDATION: Rgb<u8> = Rgb([230, 120, 20]);

/// A run's losses as `loss.png` draws them, each `(step, loss)` in step order.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Losses {
    /// Mean token loss of each step's image micro-batches (steps that had some).
    pub(crate) image: Vec<(u64, f64)>,
    /// The same over text-only micro-batches.
    pub(crate) text_only: Vec<(u64, f64)>,
    pub(crate) validation: Vec<(u64, f64)>,
}

impl Losses {
    /// From `metrics.jsonl`'s steps.
    pub(crate) fn from_steps(steps: &[crate::report::metrics::StepMetrics]) -> Losses {
        let mut out = Losses::default();
        for m in steps {
            if let Some(l) = m.loss_image {
                out.image.push((m.step, l));
            }
            if let Some(l) = m.loss_text {
                out.text_only.push((m.step, l));
            }
            if let Some(v) = m.val_loss {
                out.validation.push((m.step, v));
            }
        }
        out
    }

    /// The training series to draw, each with its finite points.
    fn series(&self) -> Vec<Series> {
        [
            ("image", &self.image, IMAGE_COLOURS),
            ("text-only", &self.text_only, TEXT_COLOURS),
        ]
        .into_iter()
        .map(|(name, points, (raw, average))| Series {
            name,
            points: points.iter().copied().filter(|p| p.1.is_finite()).collect(),
            raw,
            average,
        })
        .filter(|s| !s.points.is_empty())
        .collect()
    }
}

/// One training series as drawn: raw points in a light colour, their average in a dark one.
struct Series {
    name: &'static str,
    points: Vec<(u64, f64)>,
    raw: Rgb<u8>,
    average: Rgb<u8>,
}

/// Draws `losses` and writes a PNG to `path`.
pub(crate) fn plot_loss(losses: &Losses, path: &Path) -> Result<(), PlotError> {
    let img = draw(losses).ok_or_else(|| PlotError::Empty {
        path: path.display().to_string(),
    })?;
    img.save(path).map_err(|source| PlotError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// The picture as pixels; `None` when no training loss is finite.
pub(crate) fn draw(losses: &Losses) -> Option<RgbImage> {
    let series = losses.series();
    let val: Vec<(u64, f64)> = losses
        .validation
        .iter()
        .copied()
        .filter(|p| p.1.is_finite())
        .collect();
    let every = || series.iter().flat_map(|s| s.points.iter()).chain(&val);
    if series.is_empty() {
        return None;
    }
    let x_first = every().map(|p| p.0).min()?;
    let x_last = every().map(|p| p.0).max()?;
    let (x_min, x_max) = (x_first, x_last.max(x_first + 1));
    let y_lo = every().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_hi = every().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
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
    let y_ticks = Ticks::nice(y_min, y_max, false);
    for (y, label) in y_ticks.values.iter().zip(y_ticks.labels()) {
        let (_, py) = to_px(x_min as f64, *y);
        line(&mut img, (LEFT, py), (w - RIGHT, py), grid);
        line(&mut img, (LEFT - 5, py), (LEFT, py), black);
        text(
            &mut img,
            &label,
            LEFT - 8 - text_width(&label),
            py - 2 * SCALE,
            black,
        );
    }
    // Steps are whole numbers: no tick between two of them.
    let x_ticks = Ticks::nice(x_min as f64, x_max as f64, true);
    for (x, label) in x_ticks.values.iter().zip(x_ticks.labels()) {
        let (px, _) = to_px(*x, y_min);
        line(&mut img, (px, h - BOTTOM), (px, h - BOTTOM + 5), black);
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

    // Every series' raw points first, then the averages over them, so no light line hides a
    // dark one.
    for s in &series {
        let px: Vec<(i64, i64)> = s.points.iter().map(|&(x, y)| to_px(x as f64, y)).collect();
        polyline(&mut img, &px, s.raw);
    }
    for s in &series {
        let smooth: Vec<(i64, i64)> = moving_average(&s.points)
            .into_iter()
            .map(|(x, y)| to_px(x as f64, y))
            .collect();
        polyline(&mut img, &smooth, s.average);
    }
    let val_px: Vec<(i64, i64)> = val.iter().map(|&(x, y)| to_px(x as f64, y)).collect();
    polyline(&mut img, &val_px, VALIDATION);
    for &(x, y) in &val_px {
        for (dx, dy) in (-2..=2).flat_map(|a| (-2..=2).map(move |b| (a, b))) {
            put(&mut img, x + dx, y + dy, VALIDATION);
        }
    }

    // Axis titles: `step` under the x ticks, `loss` above the y axis.
    let title = "step";
    let mid = LEFT + (w - LEFT - RIGHT) / 2;
    text(
        &mut img,
        title,
        mid - text_width(title) / 2,
        h - BOTTOM + 24,
        black,
    );
    text(&mut img, "loss", 8, 4, black);
    // Legend, top right: a colour swatch and the curve's name per line.
    let mut entries: Vec<(&str, Rgb<u8>)> = series.iter().map(|s| (s.name, s.average)).collect();
    if !val.is_empty() {
        entries.push(("validation", VALIDATION));
    }
    let legend_x = w - RIGHT - 30 - text_width("validation");
    for (i, (name, color)) in entries.into_iter().enumerate() {
        let y = TOP + 10 + 16 * i as i64;
        for t in -1..=1 {
            line(
                &mut img,
                (legend_x, y + 4 + t),
                (legend_x + 18, y + 4 + t),
                color,
            );
        }
        text(&mut img, name, legend_x + 24, y, black);
    }
    Some(img)
}

/// The trailing mean over a window of about a 25th of the series (at least 1 point).
fn moving_average(points: &[(u64, f64)]) -> Vec<(u64, f64)> {
    let window = (points.len() / 25).max(1);
    (0..points.len())
        .map(|i| {
            let lo = i.saturating_sub(window - 1);
            let mean = points[lo..=i].iter().map(|p| p.1).sum::<f64>() / (i - lo + 1) as f64;
            (points[i].0, mean)
        })
        .collect()
}

/// Tick values of an axis: round numbers (the classic "nice numbers" rule) and how many
/// decimals their labels need.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Ticks {
    /// Increasing multiples of the step inside the range.
    pub(crate) values: Vec<f64>,
    /// Decimals every label is printed with: none for a step of 1, 2, 5, 10, ...; one for 0.1,
    /// 0.2, 0.5; and so on.
    pub(crate) decimals: usize,
}

/// The range a tick count should fall in: a step of 1, 2 or 5 × 10^k is picked to land there.
const TICKS_WANTED: (usize, usize) = (5, 8);

impl Ticks {
    /// Ticks for the range `lo..=hi`: the step is 1, 2 or 5 × 10^k, the one whose tick count
    /// is in [`TICKS_WANTED`] (or else nearest to it by ratio, fewer ticks on a tie; 4 to 10
    /// ticks then); the first tick is
    /// ceil(lo / step) × step, the last the greatest multiple not above `hi`. `integers` keeps
    /// the step at 1 or more (an axis of whole numbers). A range too narrow for `f64` to step
    /// through (`lo == hi`, or a width below 1e-9 of its size) is widened around its middle to
    /// ±5% of its size (±0.05 near zero); a range with an end that is not finite, or wider than
    /// 1e300, has no ticks.
    pub(crate) fn nice(lo: f64, hi: f64, integers: bool) -> Ticks {
        let none = Ticks {
            values: Vec::new(),
            decimals: 0,
        };
        if !lo.is_finite() || !hi.is_finite() {
            return none;
        }
        let (mut lo, mut hi) = (lo.min(hi), lo.max(hi));
        let size = lo.abs().max(hi.abs());
        if hi - lo <= size * 1e-9 || hi - lo < 1e-200 {
            let (mid, half) = (lo / 2.0 + hi / 2.0, size.max(1.0) * 0.05);
            (lo, hi) = (mid - half, mid + half);
        }
        if !(lo.is_finite() && hi.is_finite()) || hi - lo >= 1e300 {
            return none;
        }
        // Tick numbers `first..=last` of a step (tolerating rounding at the ends).
        let span_of = |step: f64| {
            let first = (lo / step - 1e-9).ceil();
            let last = (hi / step + 1e-9).floor();
            (first, last)
        };
        let count = |step: f64| {
            let (first, last) = span_of(step);
            (last - first + 1.0).max(0.0)
        };
        // How far a count falls outside the wanted band, as a ratio: 4 ticks (5/4) miss by
        // more than 9 (9/8), 3 (5/3) by more than 10 (10/8).
        let miss = |n: f64| {
            let (few, many) = (TICKS_WANTED.0 as f64, TICKS_WANTED.1 as f64);
            if n < 1.0 {
                f64::INFINITY
            } else {
                (few / n).max(n / many).max(1.0).ln()
            }
        };
        // Candidates from a step that gives ~100 ticks up to one that gives ~1 (none below 1
        // for `integers`); the largest step wins a tie.
        let top = (hi - lo).log10().floor() as i32 + 1;
        let (k_lo, k_hi) = if integers {
            ((top - 3).max(0), top.max(0))
        } else {
            (top - 3, top)
        };
        let mut best: Option<(f64, i32, f64)> = None;
        for k in (k_lo..=k_hi).rev() {
            for m in [5.0, 2.0, 1.0] {
                let step = m * 10f64.powi(k);
                if best.is_none_or(|(_, _, b)| miss(count(step)) < miss(count(b))) {
                    best = Some((m, k, step));
                }
            }
        }
        let Some((m, k, step)) = best else {
            return none;
        };
        let (first, last) = span_of(step);
        // `count` is at most about 100 here; the cap only guards against a surprise.
        if !(0.0..=1000.0).contains(&(last - first)) {
            return none;
        }
        // i × m / 10^-k rather than i × (m × 10^k): 0.3, not 0.30000000000000004.
        let value = |i: f64| {
            if k < 0 {
                i * m / 10f64.powi(-k)
            } else {
                i * m * 10f64.powi(k)
            }
        };
        Ticks {
            values: (0..=(last - first) as i64)
                .map(|i| value(first + i as f64))
                .collect(),
            decimals: usize::try_from(-k).unwrap_or(0),
        }
    }

    /// The labels: `8`, `10`, `12`; `0.5`, `1.0`; `150`, `200`.
    pub(crate) fn labels(&self) -> Vec<String> {
        self.values
            .iter()
            .map(|v| {
                let label = format!("{v:.*}", self.decimals);
                // A value that rounds to zero prints without its sign.
                match label.strip_prefix('-') {
                    Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
                    _ => label,
                }
            })
            .collect()
    }
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
        'g' => [0, 3, 5, 3, 6],
        'm' => [0, 6, 7, 5, 5],
        'x' => [0, 5, 2, 2, 5],
        'y' => [0, 5, 5, 3, 6],
        'a' => [0, 3, 5, 5, 3],
        'd' => [1, 3, 5, 5, 3],
        'i' => [2, 0, 2, 2, 2],
        'l' => [4, 4, 4, 4, 6],
        'n' => [0, 6, 5, 5, 5],
        'o' => [0, 2, 5, 5, 2],
        'p' => [0, 6, 5, 6, 4],
        'r' => [0, 5, 6, 4, 4],
        's' => [0, 3, 4, 1, 6],
        't' => [2, 7, 2, 2, 3],
        'v' => [0, 5, 5, 5, 2],
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

    /// Losses of the image series and the validation points.
    fn image_losses(train: &[(u64, f64)], validation: &[(u64, f64)]) -> Losses {
        Losses {
            image: train.to_vec(),
            validation: validation.to_vec(),
            ..Losses::default()
        }
    }

    fn labels(lo: f64, hi: f64, integers: bool) -> Vec<String> {
        Ticks::nice(lo, hi, integers).labels()
    }

    #[test]
    fn ticks_are_round_numbers_with_plain_labels() {
        // 5.8 wide: a step of 2 would give only 3 ticks (8, 10, 12), a step of 1 gives 5.
        assert_eq!(labels(7.1, 12.9, false), ["8", "9", "10", "11", "12"]);
        assert_eq!(
            labels(7.1, 20.9, false),
            ["8", "10", "12", "14", "16", "18", "20"]
        );
        assert_eq!(labels(0.0, 237.0, false), ["0", "50", "100", "150", "200"]);
        assert_eq!(labels(0.0, 237.0, true), ["0", "50", "100", "150", "200"]);
        assert_eq!(
            labels(0.2, 3.1, false),
            ["0.5", "1.0", "1.5", "2.0", "2.5", "3.0"]
        );
        assert_eq!(
            labels(0.31, 1.74, false),
            ["0.4", "0.6", "0.8", "1.0", "1.2", "1.4", "1.6"]
        );
        assert_eq!(
            labels(0.012, 0.047, false),
            ["0.015", "0.020", "0.025", "0.030", "0.035", "0.040", "0.045"]
        );
        assert_eq!(
            labels(149.0, 412.0, true),
            ["150", "200", "250", "300", "350", "400"]
        );
        assert_eq!(labels(-3.2, 2.1, false), ["-3", "-2", "-1", "0", "1", "2"]);
        // Reversed ends give the same ticks.
        assert_eq!(labels(12.9, 7.1, false), labels(7.1, 12.9, false));
        // Whole-number axes never step below 1.
        assert_eq!(labels(0.0, 3.0, true), ["0", "1", "2", "3"]);
        assert_eq!(
            labels(0.0, 3.0, false),
            ["0.0", "0.5", "1.0", "1.5", "2.0", "2.5", "3.0"]
        );
        assert_eq!(labels(4.0, 5.0, true), ["4", "5"]);
    }

    #[test]
    fn ticks_stay_in_range_and_near_five_to_eight_for_any_range() {
        let mut counts = std::collections::BTreeMap::new();
        for lo_i in -40..40 {
            for span_i in 1..400 {
                let lo = f64::from(lo_i) * 0.37;
                let span = 1e-3 * 1.037f64.powi(span_i);
                let hi = lo + span;
                for integers in [false, true] {
                    let ticks = Ticks::nice(lo, hi, integers);
                    let n = ticks.values.len();
                    if !integers || span >= 6.0 {
                        *counts.entry(n).or_insert(0) += 1;
                        assert!((4..=10).contains(&n), "{lo}..{hi}: {n} ticks");
                    }
                    let slack = span * 1e-6;
                    assert!(
                        ticks
                            .values
                            .iter()
                            .all(|v| (lo - slack..=hi + slack).contains(v)),
                        "{lo}..{hi}: {:?}",
                        ticks.values
                    );
                    assert!(ticks.values.windows(2).all(|w| w[0] < w[1]));
                    let labels = ticks.labels();
                    let distinct: std::collections::HashSet<_> = labels.iter().collect();
                    assert_eq!(distinct.len(), labels.len(), "{lo}..{hi}: {labels:?}");
                    for (v, label) in ticks.values.iter().zip(&labels) {
                        let back: f64 = label.parse().expect("a label is a number");
                        assert!((back - v).abs() <= span * 1e-6, "{v} printed as {label}");
                    }
                }
            }
        }
        // Most ranges land in the wanted band (84% of these; the rest have 4, 9 or 10 ticks).
        let total: usize = counts.values().sum();
        let inside: usize = (5..=8).filter_map(|n| counts.get(&n)).sum();
        assert!(inside * 10 >= total * 8, "tick counts {counts:?}");
    }

    #[test]
    fn tiny_degenerate_and_unbounded_ranges_do_not_panic() {
        for (lo, hi) in [
            (5.0, 5.0),
            (0.0, 0.0),
            (-2.0, -2.0),
            (1.0, 1.0 + 1e-12),
            (3.0, 3.0000001),
            (1e-300, 2e-300),
            (0.0, f64::MIN_POSITIVE),
            (1e15, 1e15 + 1.0),
            (-1e308, 1e308),
            (f64::MAX, f64::MAX),
            (f64::NAN, 1.0),
            (f64::NEG_INFINITY, 0.0),
            (0.0, f64::INFINITY),
        ] {
            for integers in [false, true] {
                let ticks = Ticks::nice(lo, hi, integers);
                assert!(ticks.values.len() <= 1001, "{lo}..{hi}");
                assert!(ticks.values.iter().all(|v| v.is_finite()), "{lo}..{hi}");
                let _ = ticks.labels();
            }
        }
        // A single value gets ticks around it; an unbounded range gets none.
        assert_eq!(labels(5.0, 5.0, false), ["4.8", "4.9", "5.0", "5.1", "5.2"]);
        assert_eq!(
            labels(0.0, 0.0, false),
            ["-0.04", "-0.02", "0.00", "0.02", "0.04"]
        );
        assert!((5..=6).contains(&labels(3.0, 3.0000001, false).len()));
        assert!(labels(f64::NAN, 1.0, false).is_empty());
        assert!(labels(-1e308, 1e308, false).is_empty());
    }

    #[test]
    fn a_falling_loss_is_drawn_high_on_the_left_and_low_on_the_right() {
        let losses: Vec<(u64, f64)> = (0..100).map(|i| (i, 5.0 - 0.04 * i as f64)).collect();
        let img = draw(&image_losses(&losses, &[])).expect("finite losses");
        let curve_rows = |x: u32| -> Vec<u32> {
            (0..HEIGHT)
                .filter(|&y| img.get_pixel(x, y) == &IMAGE_COLOURS.1)
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
        plot_loss(&image_losses(&[(0, 3.0), (1, 2.5), (2, 2.4)], &[]), &path)?;
        let back = image::open(&path)?;
        assert_eq!((back.width(), back.height()), (WIDTH, HEIGHT));
        let err =
            plot_loss(&image_losses(&[(0, f64::NAN)], &[(0, 1.0)]), &path).expect_err("nan only");
        assert!(err.to_string().contains("no finite loss"), "{err}");
        Ok(())
    }

    #[test]
    fn validation_losses_are_drawn_in_their_colour_with_a_legend() {
        let losses: Vec<(u64, f64)> = (0..40).map(|i| (i, 5.0 - 0.05 * i as f64)).collect();
        let val = [(9, 4.8), (19, 4.4), (29, 4.1), (39, 3.9)];
        let count = |img: &RgbImage, c: Rgb<u8>| img.pixels().filter(|p| **p == c).count();
        let with = draw(&image_losses(&losses, &val)).expect("finite losses");
        let without = draw(&image_losses(&losses, &[])).expect("finite losses");
        assert!(
            count(&with, VALIDATION) > 4 * 25,
            "a dot per evaluation and the line"
        );
        assert_eq!(count(&without, VALIDATION), 0);
        // The legend and the axis titles add black text that the tick labels alone lack.
        let black = Rgb([0, 0, 0]);
        assert!(
            count(&with, black) > count(&without, black),
            "legend entry for validation"
        );
        // The evaluations span the loss range: the curve covers many pixel rows.
        let rows: Vec<u32> = (0..HEIGHT)
            .filter(|&y| (0..WIDTH).any(|x| with.get_pixel(x, y) == &VALIDATION))
            .collect();
        assert!(rows.len() > 10, "validation curve spans several rows");
    }

    #[test]
    fn image_and_text_only_steps_are_two_series_in_their_colours() {
        // Alternating types: image steps at 4 ± 0.2, text-only steps at 1 ± 0.2 (the moving
        // average over 4 points of either is flat).
        let zigzag = |i: u64| if i % 4 < 2 { 0.2 } else { -0.2 };
        let image: Vec<(u64, f64)> = (0..200).step_by(2).map(|i| (i, 4.0 + zigzag(i))).collect();
        let text_only: Vec<(u64, f64)> = (1..200)
            .step_by(2)
            .map(|i| (i, 1.0 + zigzag(i - 1)))
            .collect();
        let losses = Losses {
            image,
            text_only,
            ..Losses::default()
        };
        let img = draw(&losses).expect("finite losses");
        let rows_of = |c: Rgb<u8>| -> Vec<u32> {
            let x = WIDTH / 2;
            (0..HEIGHT).filter(|&y| img.get_pixel(x, y) == &c).collect()
        };
        let (image_rows, text_rows) = (rows_of(IMAGE_COLOURS.1), rows_of(TEXT_COLOURS.1));
        assert!(
            !image_rows.is_empty() && !text_rows.is_empty(),
            "both drawn"
        );
        // Each average is flat: a few rows thick at mid-plot, the image one above.
        assert!(
            image_rows.len() <= 3 && text_rows.len() <= 3,
            "{image_rows:?} {text_rows:?}"
        );
        assert!(
            image_rows[0] + 100 < text_rows[0],
            "image loss drawn higher"
        );
        // No saw-tooth: the raw image series never dips to the text-only level.
        let raw_rows: Vec<u32> = img
            .enumerate_pixels()
            .filter(|(_, _, p)| **p == IMAGE_COLOURS.0)
            .map(|(_, y, _)| y)
            .collect();
        assert!(
            !raw_rows.is_empty() && raw_rows.iter().all(|&y| y < text_rows[0]),
            "raw image points stay high"
        );
    }

    #[test]
    fn losses_by_type_come_from_the_steps_metrics() {
        use crate::report::metrics::StepMetrics;
        let step = |i: u64, image: Option<f64>, text: Option<f64>, val: Option<f64>| StepMetrics {
            step: i,
            loss: 9.0,
            loss_image: image,
            loss_text: text,
            val_loss: val,
            ..StepMetrics::default()
        };
        let steps = [
            step(0, Some(3.0), None, None),
            step(1, None, Some(1.0), Some(2.5)),
            step(2, Some(2.8), Some(0.9), None),
        ];
        let l = Losses::from_steps(&steps);
        assert_eq!(l.image, [(0, 3.0), (2, 2.8)]);
        assert_eq!(l.text_only, [(1, 1.0), (2, 0.9)]);
        assert_eq!(l.validation, [(1, 2.5)]);
    }
}
