//! The `images` column of a `datasets` parquet row: a list of Image structs `{bytes, path}`
//! (bytes embedded in the file; `path` names it, or says where it lies under `--images` when
//! the bytes are null), or a list of path strings. Null or absent: no images.
use super::columns::{bytes_at, field, is_string, list_at, str_at};
use crate::record::ImageRef;
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};

/// The images of `row`, in list order; `Err` names an entry with neither bytes nor path.
pub(crate) fn images_of(batch: &RecordBatch, row: usize) -> Result<Vec<ImageRef>, String> {
    let Some(list) = batch
        .column_by_name("images")
        .and_then(|c| list_at(c.as_ref(), row))
    else {
        return Ok(Vec::new());
    };
    if is_string(list.as_ref()) {
        return (0..list.len())
            .map(|k| {
                str_at(list.as_ref(), k)
                    .map(|p| ImageRef::Path(p.to_string()))
                    .ok_or_else(|| format!("image {k} is null"))
            })
            .collect();
    }
    let Some(entries) = list.as_struct_opt() else {
        return Err("images is neither a list of {bytes, path} nor of paths".into());
    };
    let bytes = field(entries, "bytes");
    let paths = field(entries, "path");
    (0..entries.len())
        .map(|k| {
            let path = paths.and_then(|p| str_at(p.as_ref(), k));
            if entries.is_null(k) {
                return Err(format!("image {k} is null"));
            }
            match (bytes.and_then(|b| bytes_at(b.as_ref(), k)), path) {
                (Some(b), _) => Ok(ImageRef::Embedded {
                    bytes: b.to_vec(),
                    name: path
                        .filter(|p| !p.is_empty())
                        .map_or_else(|| format!("image {k}"), str::to_string),
                }),
                (None, Some(p)) if !p.is_empty() => Ok(ImageRef::Path(p.to_string())),
                _ => Err(format!("image {k} has neither bytes nor a path")),
            }
        })
        .collect()
}
