//! Writing a checkpoint as `save_pretrained` does: one `model.safetensors`, or past
//! `max_shard_bytes` shards `model-00001-of-0000N.safetensors` plus
//! `model.safetensors.index.json` (`{"metadata": {"total_size": bytes}, "weight_map": {key:
//! file}}`), in a chosen float dtype (BF16 by default for exports).
use super::weights::{TensorView, INDEX_FILE, SINGLE_FILE};
use super::{ModelError, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// The Hub's shard size (`save_pretrained`'s default `max_shard_size="5GB"`).
pub const HUB_SHARD_BYTES: u64 = 5_000_000_000;

/// Writes `tensors` into `dir` in `kind` (BFloat16, Half or Float), split into shards of at
/// most `max_shard_bytes` (a tensor larger than that gets a shard of its own); returns the
/// files written.
pub fn save_sharded(
    dir: &Path,
    tensors: &BTreeMap<String, Tensor>,
    kind: Kind,
    max_shard_bytes: u64,
) -> Result<Vec<PathBuf>> {
    let bytes_of = |t: &Tensor| t.numel() as u64 * TensorView::new(t, kind).bytes_per_element();
    let mut shards: Vec<Vec<&String>> = vec![Vec::new()];
    let mut current = 0u64;
    for (name, t) in tensors {
        let size = bytes_of(t);
        let last = shards.last_mut().expect("at least one shard");
        if !last.is_empty() && current + size > max_shard_bytes {
            shards.push(vec![name]);
            current = size;
        } else {
            last.push(name);
            current += size;
        }
    }
    let count = shards.len();
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let mut files = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (i, names) in shards.iter().enumerate() {
        let file = if count == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let path = dir.join(&file);
        let views = names
            .iter()
            .map(|name| (name.as_str(), TensorView::new(&tensors[*name], kind)));
        safetensors::serialize_to_file(views, &metadata, &path).map_err(|e| {
            ModelError::Safetensors {
                path: path.clone(),
                reason: e.to_string(),
            }
        })?;
        for name in names {
            weight_map.insert((*name).clone(), file.clone());
        }
        files.push(path);
    }
    if count > 1 {
        let total: u64 = tensors.values().map(bytes_of).sum();
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        let path = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(&index).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&path, text + "\n").map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        files.push(path);
    }
    Ok(files)
}
