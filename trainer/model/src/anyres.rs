//! One image's language-model features under LLaVA-OneVision's layouts, as transformers'
//! `LlavaOnevisionModel.pack_image_features` lays them out:
//! - a grid image (`anyres_max_N`): the base view's features, then the grid's feature map,
//!   its padding removed, pooled bilinearly when it holds more than 1.1 times N tiles' worth,
//!   row by row with the learned `image_newline` after each row;
//! - a one-view image: its features, then `image_newline` when the geometry says so (what
//!   OneVision does with the images of a multi-image sample), else nothing more (LLaVA-1.5).
//!
//! The geometry (grid, unpadding, pooled size) comes from `tessera_shards::image_layout`, the same
//! numbers the planner counts tokens with, so the features always fill the image's tokens.
use crate::ModelError;
use tch::Tensor;
use tessera_shards::image_layout::ImageTokens;

/// Packs `features` `[tiles, side * side, D]` (the base view first, then the grid's tiles
/// row by row, after the projector) into `[geometry.total(), D]`. `newline` is `[D]`; a grid
/// image and a base view with its newline need it.
pub fn pack_image_features(
    features: &Tensor,
    geometry: &ImageTokens,
    side: i64,
    newline: Option<&Tensor>,
) -> Result<Tensor, ModelError> {
    let shape = features.size();
    let bad = |reason: String| Err(ModelError::ImageFeatures(reason));
    if shape.len() != 3 || shape[0] != i64::from(geometry.tiles) || shape[1] != side * side {
        return bad(format!(
            "features {shape:?} do not hold {} views of {side}x{side} patches",
            geometry.tiles
        ));
    }
    let dim = shape[2];
    if let Some(newline) = newline {
        if newline.size() != [dim] {
            return bad(format!("image_newline {:?} is not [{dim}]", newline.size()));
        }
    }
    let base = features.get(0);
    if geometry.tiles == 1 && !geometry.base_newline {
        return Ok(base);
    }
    let Some(newline) = newline else {
        return bad("this image's layout needs image_newline".into());
    };
    if geometry.tiles == 1 {
        let newline = newline.to_kind(features.kind()).view([1, dim]);
        return Ok(Tensor::cat(&[base, newline], 0));
    }
    let (grid_h, grid_w) = (i64::from(geometry.grid.0), i64::from(geometry.grid.1));
    // [gh, gw, s, s, D] -> [D, gh, s, gw, s] -> [D, gh * s, gw * s]: the tiles side by side.
    let map = features
        .narrow(0, 1, grid_h * grid_w)
        .view([grid_h, grid_w, side, side, dim])
        .permute([4, 0, 2, 1, 3])
        .contiguous()
        .view([dim, grid_h * side, grid_w * side]);
    let (top, left, rows, cols) = geometry.unpadded;
    let (top, left, rows, cols) = (top as i64, left as i64, rows as i64, cols as i64);
    let mut map = map.narrow(1, top, rows).narrow(2, left, cols);
    let (pooled_rows, pooled_cols) = (geometry.rows as i64, geometry.cols as i64);
    if (pooled_rows, pooled_cols) != (rows, cols) {
        map = map
            .unsqueeze(0)
            .upsample_bilinear2d([pooled_rows, pooled_cols], false, None, None)
            .squeeze_dim(0);
    }
    let newlines = newline
        .to_kind(map.kind())
        .view([dim, 1, 1])
        .expand([dim, pooled_rows, 1], false);
    let rows_with_newlines = Tensor::cat(&[map, newlines], 2);
    let grid = rows_with_newlines.flatten(1, 2).transpose(0, 1);
    Ok(Tensor::cat(&[base, grid], 0))
}
