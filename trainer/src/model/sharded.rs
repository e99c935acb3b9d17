//! Writing a checkpoint as `save_pretrained` does: one `model.safetensors`, or past
//! `max_shard_bytes` shards `model-00001-of-0000N.safetensors` plus
//! `model.safetensors.index.json` (`{"metadata": {"total_size": bytes}, "weight_map": {key:
//! file}}`), in a chosen float dtype (BF16 by default for exports).
use super::weights::{INDEX_FILE, SINGLE_FILE};
use super::{ModelError, Result};
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// The Hub's shard size (`save_pretrained`'s default `max_shard_size="5GB"`).
pub const HUB_SHARD_BYTES: u64 = 5_000_000_000;

/// A tensor written in `kind` (converted when written, one tensor at a time).
struct KindView<'a> {
    tensor: &'a Tensor,
    shape: Vec<usize>,
    kind: Kind,
}

fn dtype_of(kind: Kind) -> (Dtype, usize) {
    match kind {
        Kind::BFloat16 => (Dtype::BF16, 2),
        Kind::Half => (Dtype::F16, 2),
        _ => (Dtype::F32, 4),
    }
}

impl View for KindView<'_> {
    fn dtype(&self) -> Dtype {
        dtype_of(self.kind).0
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let t = self
            .tensor
            .to_device(Device::Cpu)
            .to_kind(self.kind)
            .contiguous();
        let mut bytes = vec![0u8; self.data_len()];
        t.copy_data_u8(&mut bytes, t.numel());
        Cow::Owned(bytes)
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * dtype_of(self.kind).1
    }
}

/// Writes `tensors` into `dir` in `kind` (BFloat16, Half or Float), split into shards of at
/// most `max_shard_bytes` (a tensor larger than that gets a shard of its own); returns the
/// files written.
pub fn save_sharded(
    dir: &Path,
    tensors: &BTreeMap<String, Tensor>,
    kind: Kind,
    max_shard_bytes: u64,
) -> Result<Vec<PathBuf>> {
    let bytes_of = |t: &Tensor| t.numel() as u64 * dtype_of(kind).1 as u64;
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
        let views = names.iter().map(|name| {
            let t = &tensors[*name];
            let shape = t.size().iter().map(|&d| d as usize).collect();
            (
                name.as_str(),
                KindView {
                    tensor: t,
                    shape,
                    kind,
                },
            )
        });
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
