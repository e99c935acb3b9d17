//! Writing a Hugging Face checkpoint as `save_pretrained` does (the Hub's "sharded"
//! checkpoints; elsewhere in tessera a shard is a parquet data file or a rank's slice): one
//! `model.safetensors`, or past `max_shard_bytes` files `model-00001-of-0000N.safetensors` plus
//! `model.safetensors.index.json` (`{"metadata": {"total_size": bytes}, "weight_map": {key:
//! file}}`), in a chosen float dtype (BF16 by default for exports).
//!
//! [`write_hub_files`] streams: the shard plan and every file's header come from the tensors'
//! names and shapes alone, then each tensor is asked for, written in 16 MiB pieces converted
//! to the file's dtype, and dropped before the next one is asked for. Writing a model never
//! holds more than one of its tensors (plus one piece). Each file is written through shards'
//! atomic write ([`tessera_shards::write_atomically_with`]: a temporary sibling, fsync, rename, fsync of
//! the folder), so a crash leaves no truncated file under a final name; weight files
//! of an earlier export into the same folder that this one did not write are removed (a
//! leftover `model.safetensors` beside a new index would be loaded instead of it).
use super::error::{ModelError, Result};
use super::weights::{INDEX_FILE, SINGLE_FILE};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// The Hub's shard size (`save_pretrained`'s default `max_shard_size="5GB"`).
pub const HUB_SHARD_BYTES: u64 = 5_000_000_000;

/// Largest piece of a tensor converted and written at once (bytes as written).
const PIECE_BYTES: i64 = 16 << 20;

/// What a file stores for `kind`: BFloat16 and Half as asked, anything else as F32.
fn stored_kind(kind: Kind) -> (Kind, &'static str) {
    match kind {
        Kind::BFloat16 => (Kind::BFloat16, "BF16"),
        Kind::Half => (Kind::Half, "F16"),
        _ => (Kind::Float, "F32"),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes the tensors `entries` names (key, shape; in this order) into `dir` in `kind` (BFloat16,
/// Half or Float), split into shards of at most `max_shard_bytes` (a tensor larger than that
/// gets a shard of its own), asking `tensor(key)` for each one only when its bytes are
/// due (any float dtype, any device; its shape must be the entry's). Returns the files
/// written: the weight files, then the index when there are several.
pub fn write_hub_files<E: From<ModelError>>(
    dir: &Path,
    entries: &[(String, Vec<i64>)],
    kind: Kind,
    max_shard_bytes: u64,
    mut tensor: impl FnMut(&str) -> std::result::Result<Tensor, E>,
) -> std::result::Result<Vec<PathBuf>, E> {
    let (kind, dtype) = stored_kind(kind);
    let bytes_of =
        |shape: &[i64]| shape.iter().product::<i64>() as u64 * kind.elt_size_in_bytes() as u64;
    let mut shards: Vec<Vec<&(String, Vec<i64>)>> = vec![Vec::new()];
    let mut current = 0u64;
    for entry in entries {
        let size = bytes_of(&entry.1);
        let last = shards.last_mut().expect("at least one shard");
        if !last.is_empty() && current + size > max_shard_bytes {
            shards.push(vec![entry]);
            current = size;
        } else {
            last.push(entry);
            current += size;
        }
    }
    let count = shards.len();
    let mut files = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = if count == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let path = dir.join(&file);
        write_file(&path, shard, kind, dtype, &mut tensor)?;
        for (name, _) in shard {
            weight_map.insert(name.clone(), file.clone());
        }
        files.push(path);
    }
    if count > 1 {
        let total: u64 = entries.iter().map(|(_, shape)| bytes_of(shape)).sum();
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        let path = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(&index).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        tessera_shards::write_atomically(&path, (text + "\n").as_bytes())
            .map_err(ModelError::from)?;
        files.push(path);
    }
    remove_stale_weights(dir, &files)?;
    Ok(files)
}

/// One safetensors file: the header (offsets from the shapes), then each tensor's bytes.
fn write_file<E: From<ModelError>>(
    path: &Path,
    entries: &[&(String, Vec<i64>)],
    kind: Kind,
    dtype: &str,
    tensor: &mut impl FnMut(&str) -> std::result::Result<Tensor, E>,
) -> std::result::Result<(), E> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for (name, shape) in entries {
        let end = offset + shape.iter().product::<i64>() as u64 * kind.elt_size_in_bytes() as u64;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&header).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    // The data starts 8-byte aligned, padded with spaces as the safetensors writers do.
    header.resize(header.len().next_multiple_of(8), b' ');
    let written = tessera_shards::write_atomically_with(path, |out, tmp| {
        fill_file(out, tmp, &header, entries, kind, tensor, path)
    });
    written.map_err(|failed| match failed {
        Failed::Write(e) => E::from(e),
        Failed::Tensor(e) => e,
    })
}

/// Why writing one file stopped: the write itself, or the caller's `tensor` (whose error is
/// returned as it is).
enum Failed<E> {
    Write(ModelError),
    Tensor(E),
}

impl<E> From<tessera_shards::ShardError> for Failed<E> {
    fn from(e: tessera_shards::ShardError) -> Self {
        Failed::Write(ModelError::from(e))
    }
}

impl<E> From<ModelError> for Failed<E> {
    fn from(e: ModelError) -> Self {
        Failed::Write(e)
    }
}

/// Writes into `out` (the temporary file `tmp`): the header's length and `header`, then each
/// entry's bytes (see [`write_file`]; `path` is the file's final name, which errors give).
fn fill_file<E>(
    out: &mut BufWriter<File>,
    tmp: &Path,
    header: &[u8],
    entries: &[&(String, Vec<i64>)],
    kind: Kind,
    tensor: &mut impl FnMut(&str) -> std::result::Result<Tensor, E>,
    path: &Path,
) -> std::result::Result<(), Failed<E>> {
    let write = |out: &mut BufWriter<File>, bytes: &[u8]| out.write_all(bytes).map_err(io_err(tmp));
    write(out, &(header.len() as u64).to_le_bytes())?;
    write(out, header)?;
    let mut buf = Vec::new();
    for (name, shape) in entries {
        let t = tensor(name).map_err(Failed::Tensor)?;
        if &t.size() != shape {
            return Err(ModelError::ShapeMismatch {
                path: path.to_path_buf(),
                name: name.clone(),
                expected: shape.clone(),
                found: t.size(),
            }
            .into());
        }
        let flat = t.detach().reshape([-1]);
        let numel = flat.numel() as i64;
        let step = (PIECE_BYTES / kind.elt_size_in_bytes() as i64).max(1);
        let mut at = 0;
        while at < numel {
            let take = step.min(numel - at);
            let piece = flat
                .narrow(0, at, take)
                .to_device(tch::Device::Cpu)
                .to_kind(kind)
                .contiguous();
            buf.resize(take as usize * kind.elt_size_in_bytes(), 0u8);
            piece
                .f_copy_data_u8(&mut buf, take as usize)
                .map_err(ModelError::from)?;
            write(out, &buf)?;
            at += take;
        }
    }
    Ok(())
}

/// Removes the weight files (`model.safetensors`, `model-*-of-*.safetensors`, the index) of
/// `dir` that are not in `written`.
fn remove_stale_weights(dir: &Path, written: &[PathBuf]) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let shard = name.starts_with("model-") && name.contains("-of-");
        let weights =
            name == SINGLE_FILE || name == INDEX_FILE || (shard && name.ends_with(".safetensors"));
        if weights && !written.contains(&path) {
            std::fs::remove_file(&path).map_err(io_err(&path))?;
        }
    }
    Ok(())
}
