//! How many language-model tokens an image of a given size becomes, from its size alone (the
//! shards hold every image's width and height, so this needs no decode):
//!
//! - `single`: one tile of the tower's size (LLaVA-1.5): `(tile / patch)²` tokens whatever the
//!   image.
//! - `anyres_max_N`: LLaVA-OneVision's AnyRes as transformers' `LlavaOnevisionProcessor` counts
//!   it. The image goes to the pinpoint (a grid of tiles) that keeps the most of its pixels,
//!   then wastes the least (LLaVA-NeXT's `select_best_resolution`); the grid's features lose
//!   the rows or columns that were padding (`unpad_image`, by the original size); when the
//!   grid still holds more than 1.1 times N tiles' worth it is pooled down by
//!   `ratio = sqrt(h·w / (N·side²))`; each row ends with the `image_newline` vector; the base view
//!   (the whole image as one tile) comes first.
//!
//! The arithmetic follows Python's: `int(round(x, 7))` and float floor division, so the counts
//! equal transformers' to the token (`shards/tests/image_layout.rs` checks them against the
//! processor on sizes of every shape).
use std::fmt;
use std::str::FromStr;

/// How images are cut into tower tiles. Written as its name (`single`, `anyres_max_9`) in
/// JSON and TOML.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ImageLayout {
    /// One tile of the tower's size per image.
    #[default]
    Single,
    /// LLaVA-OneVision's `anyres_max_N`: a base view plus the best pinpoint's grid of tiles,
    /// pooled to about N tiles' worth.
    /// Its `image_grid_pinpoints` are LLaVA-OneVision's 36: the tower's tile size times
    /// {1..6} in both directions.
    AnyRes {
        /// N of `anyres_max_N`.
        max_tiles: u32,
    },
}

impl FromStr for ImageLayout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "single" {
            return Ok(ImageLayout::Single);
        }
        match s.strip_prefix("anyres_max_").map(str::parse::<u32>) {
            Some(Ok(n)) if n >= 1 => Ok(ImageLayout::AnyRes { max_tiles: n }),
            _ => Err(format!(
                "`{s}` is not an image layout: single (one tile per image) or anyres_max_N (N >= \
                 1: LLaVA-OneVision's tiles, pooled to about N tiles' worth; anyres_max_9 is its \
                 default)"
            )),
        }
    }
}

impl TryFrom<String> for ImageLayout {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<ImageLayout> for String {
    fn from(layout: ImageLayout) -> String {
        layout.to_string()
    }
}

impl fmt::Display for ImageLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageLayout::Single => f.write_str("single"),
            ImageLayout::AnyRes { max_tiles } => write!(f, "anyres_max_{max_tiles}"),
        }
    }
}

/// The tower's geometry: the tile it sees and its patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tower {
    /// Tile side in pixels (so400m-384: 384).
    pub tile: u32,
    /// Patch side in pixels (14): a tile gives `(tile / patch)²` features.
    pub patch: u32,
}

impl Default for Tower {
    /// siglip-so400m-patch14-384, LLaVA-OneVision's tower.
    fn default() -> Self {
        Tower {
            tile: 384,
            patch: 14,
        }
    }
}

impl Tower {
    /// Features per side of one tile (27 for so400m-384).
    pub fn side(self) -> u32 {
        self.tile / self.patch.max(1)
    }
}

/// What one image becomes under a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageTokens {
    /// Tiles the tower runs over (the base view included).
    pub tiles: u32,
    /// The chosen pinpoint's grid, tiles down and across (1 x 1 for `single`).
    pub grid: (u32, u32),
    /// Tokens of the base view (all of them for `single`).
    pub base: u64,
    /// The grid's features left once the padding is removed: (top, left, rows, columns) of
    /// the `grid x side` feature map (all 0 for `single`).
    pub unpadded: (u64, u64, u64, u64),
    /// Rows and columns of the grid's features after unpadding and pooling (0 for `single`).
    pub rows: u64,
    pub cols: u64,
    /// One `image_newline` after the base view: OneVision's images of a multi-image sample,
    /// which get the base view only.
    pub base_newline: bool,
}

impl ImageTokens {
    /// Language-model tokens in all: base, the grid's features, one newline per row (or the
    /// base view's newline).
    pub fn total(&self) -> u64 {
        self.base + self.rows * self.cols + self.rows + u64::from(self.base_newline)
    }
}

impl ImageLayout {
    /// The pinpoints as (height, width) pairs.
    pub fn pinpoints(&self, tower: Tower) -> Vec<(u32, u32)> {
        match self {
            ImageLayout::Single => vec![(tower.tile, tower.tile)],
            ImageLayout::AnyRes { .. } => {
                let sides = (1..=6).map(|k| k * tower.tile);
                sides
                    .clone()
                    .flat_map(|h| sides.clone().map(move |w| (h, w)))
                    .collect()
            }
        }
    }

    /// What an image `width` x `height` becomes.
    pub fn tokens(&self, width: u32, height: u32, tower: Tower) -> ImageTokens {
        let side = u64::from(tower.side());
        let base = side * side;
        let ImageLayout::AnyRes { max_tiles } = self else {
            return ImageTokens {
                tiles: 1,
                grid: (1, 1),
                base,
                unpadded: (0, 0, 0, 0),
                rows: 0,
                cols: 0,
                base_newline: false,
            };
        };
        let (best_h, best_w) = best_resolution(height, width, &self.pinpoints(tower));
        let grid = (best_h / tower.tile.max(1), best_w / tower.tile.max(1));
        let unpadded = unpadded(
            height,
            width,
            side * u64::from(grid.0),
            side * u64::from(grid.1),
        );
        let (rows, cols) = pooled(unpadded.2, unpadded.3, u64::from(*max_tiles), side);
        ImageTokens {
            tiles: 1 + grid.0 * grid.1,
            grid,
            base,
            unpadded,
            rows,
            cols,
            base_newline: false,
        }
    }

    /// What one of `images` images of a sample becomes: under `anyres_max_N` a sample of
    /// several images gives each its base view and one newline (LLaVA-OneVision's rule, as
    /// transformers' processor and model apply it), one image alone gets its tiles.
    pub fn tokens_in_sample(
        &self,
        width: u32,
        height: u32,
        images: usize,
        tower: Tower,
    ) -> ImageTokens {
        match self {
            ImageLayout::AnyRes { .. } if images > 1 => ImageTokens {
                base_newline: true,
                ..ImageLayout::Single.tokens(width, height, tower)
            },
            _ => self.tokens(width, height, tower),
        }
    }
}

/// LLaVA-NeXT's `select_best_resolution`: the (height, width) pinpoint that keeps the most of
/// the image's pixels once it is scaled to fit, then wastes the least; the first such one.
pub fn best_resolution(height: u32, width: u32, pinpoints: &[(u32, u32)]) -> (u32, u32) {
    let (oh, ow) = (f64::from(height.max(1)), f64::from(width.max(1)));
    let original = i64::from(height.max(1)) * i64::from(width.max(1));
    let mut best = pinpoints.first().copied().unwrap_or((height, width));
    let (mut max_effective, mut min_wasted) = (0i64, i64::MAX);
    for &(h, w) in pinpoints {
        let scale = (f64::from(w) / ow).min(f64::from(h) / oh);
        let (dw, dh) = ((ow * scale) as i64, (oh * scale) as i64);
        let effective = (dw * dh).min(original);
        let wasted = i64::from(w) * i64::from(h) - effective;
        if effective > max_effective || (effective == max_effective && wasted < min_wasted) {
            max_effective = effective;
            min_wasted = wasted;
            best = (h, w);
        }
    }
    best
}

/// `unpad_image`'s (top, left, rows, columns) of a `current_h` x `current_w` feature grid made
/// from an image `height` x `width`: the padding on the short axis removed (as much on each
/// side, so an odd remainder stays).
fn unpadded(height: u32, width: u32, current_h: u64, current_w: u64) -> (u64, u64, u64, u64) {
    let (h, w) = (f64::from(height.max(1)), f64::from(width.max(1)));
    let (ch, cw) = (current_h as f64, current_w as f64);
    if w / h > cw / ch {
        let new_h = python_round7(h * (cw / w)) as u64;
        let padding = current_h.saturating_sub(new_h) / 2;
        (padding, 0, current_h - 2 * padding, current_w)
    } else {
        let new_w = python_round7(w * (ch / h)) as u64;
        let padding = current_w.saturating_sub(new_w) / 2;
        (0, padding, current_h, current_w - 2 * padding)
    }
}

/// `anyres_max_N`'s pooling: a grid of more than 1.1 times N tiles' worth of features is
/// scaled to `int(rows // ratio)` x `int(cols // ratio)`.
fn pooled(rows: u64, cols: u64, max_tiles: u64, side: u64) -> (u64, u64) {
    let ratio = ((rows * cols) as f64 / (max_tiles * side * side) as f64).sqrt();
    if ratio > 1.1 {
        (
            python_floor_div(rows as f64, ratio) as u64,
            python_floor_div(cols as f64, ratio) as u64,
        )
    } else {
        (rows, cols)
    }
}

/// Python's `int(round(x, 7))` for x >= 0: rounded to 7 decimals, then truncated.
fn python_round7(x: f64) -> f64 {
    ((x * 1e7).round() / 1e7).trunc()
}

/// Python's float `a // b` (CPython's `float_floor_div`: from `fmod`, not `floor(a / b)`).
fn python_floor_div(a: f64, b: f64) -> f64 {
    let modulo = a % b;
    let mut div = (a - modulo) / b;
    if modulo != 0.0 && ((b < 0.0) != (modulo < 0.0)) {
        div -= 1.0;
    }
    if div == 0.0 {
        return 0.0f64.copysign(a / b);
    }
    let floor = div.floor();
    if div - floor > 0.5 {
        floor + 1.0
    } else {
        floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SO400M: Tower = Tower {
        tile: 384,
        patch: 14,
    };

    #[test]
    fn layouts_parse_and_print() {
        assert_eq!("single".parse::<ImageLayout>(), Ok(ImageLayout::Single));
        let any: ImageLayout = "anyres_max_9".parse().expect("anyres_max_9");
        assert_eq!(any.to_string(), "anyres_max_9");
        assert_eq!(any.pinpoints(SO400M).len(), 36);
        assert!("anyres_max_0".parse::<ImageLayout>().is_err());
        assert!("anyres".parse::<ImageLayout>().is_err());
    }

    /// A square image at the tile's size is one tile of grid plus the base view, no pooling:
    /// 729 + 27 x 27 + 27 newlines.
    #[test]
    fn images_of_a_multi_image_sample_get_their_base_view_and_a_newline() {
        let tower = Tower::default();
        let anyres = ImageLayout::AnyRes { max_tiles: 9 };
        let alone = anyres.tokens_in_sample(1000, 700, 1, tower);
        assert_eq!(alone, anyres.tokens(1000, 700, tower));
        assert!(alone.tiles > 1);
        let one_of_two = anyres.tokens_in_sample(1000, 700, 2, tower);
        assert_eq!((one_of_two.tiles, one_of_two.total()), (1, 730));
        let single = ImageLayout::Single.tokens_in_sample(1000, 700, 2, tower);
        assert_eq!((single.tiles, single.total()), (1, 729));
    }

    #[test]
    fn a_tile_sized_square_is_the_base_view_and_one_grid_tile() {
        let any: ImageLayout = "anyres_max_9".parse().expect("layout");
        let t = any.tokens(384, 384, SO400M);
        assert_eq!((t.grid, t.rows, t.cols, t.tiles), ((1, 1), 27, 27, 2));
        assert_eq!(t.total(), 729 + 729 + 27);
        assert_eq!(ImageLayout::Single.tokens(4000, 30, SO400M).total(), 729);
    }

    #[test]
    fn python_arithmetic_matches_cpython() {
        // CPython: 27 // 0.9 is 29.0 although 27 / 0.9 rounds to 30.0; 1 // 0.1 is 9.0.
        assert_eq!(python_floor_div(27.0, 0.9), 29.0);
        assert_eq!(python_floor_div(1.0, 0.1), 9.0);
        assert_eq!(python_floor_div(54.0, 1.5), 36.0);
        assert_eq!(python_round7(26.999_999_99), 27.0);
        assert_eq!(python_round7(26.6), 26.0);
    }
}
