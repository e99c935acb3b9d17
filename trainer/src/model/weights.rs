//! Hugging Face safetensors checkpoints: `model.safetensors` or a sharded
//! `model.safetensors.index.json`, memory-mapped and read tensor by tensor into f32 tch
//! tensors (BF16 and F16 are converted). Writing (F32, or BF16 for exports) goes through the same
//! format with `{"format": "pt"}` metadata, as `save_pretrained` writes it.
use super::{ModelError, Result};
use crate::unit::{ParamMap, ParamSpec};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

pub(super) const SINGLE_FILE: &str = "model.safetensors";
pub(super) const INDEX_FILE: &str = "model.safetensors.index.json";

/// An opened checkpoint directory: every file memory-mapped, every key located.
pub struct HfCheckpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    /// Key -> index into `files`.
    location: HashMap<String, usize>,
}

impl HfCheckpoint {
    /// Opens `dir/model.safetensors`, or the shards listed by `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        let paths: Vec<PathBuf> = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            let value = super::config::read_json(&index)?;
            let map = value
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Safetensors {
                    path: index.clone(),
                    reason: "no `weight_map` object".into(),
                })?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            return Err(ModelError::NoWeights { dir: dir.into() });
        };
        let mut files = Vec::new();
        let mut location = HashMap::new();
        for path in paths {
            let file = std::fs::File::open(&path).map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            // SAFETY: the checkpoint is read-only input; nothing in tessera writes to it while mapped.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            let tensors = SafeTensors::deserialize(&mmap).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            for name in tensors.names() {
                location.insert(name.to_string(), files.len());
            }
            files.push((path, mmap));
        }
        Ok(Self {
            dir: dir.into(),
            files,
            location,
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(String::as_str)
    }

    /// Reads `name` as an f32 tensor on the CPU, checking its shape against `expected`.
    pub fn tensor(&self, name: &str, expected: &[i64]) -> Result<Tensor> {
        Ok(self.tensor_as_stored(name, expected)?.to_kind(Kind::Float))
    }

    /// Reads `name` in the dtype the file stores it in (BF16, F16 or F32), on the CPU.
    pub fn tensor_as_stored(&self, name: &str, expected: &[i64]) -> Result<Tensor> {
        let &file = self
            .location
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                dir: self.dir.clone(),
                name: name.into(),
            })?;
        let (path, mmap) = &self.files[file];
        let st = SafeTensors::deserialize(mmap).map_err(|e| ModelError::Safetensors {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let view = st.tensor(name).map_err(|e| ModelError::Safetensors {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let found: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        if found != expected {
            return Err(ModelError::ShapeMismatch {
                path: path.clone(),
                name: name.into(),
                expected: expected.to_vec(),
                found,
            });
        }
        let kind = float_kind(view.dtype(), path, name)?;
        Ok(Tensor::f_from_data_size(view.data(), &found, kind)?)
    }

    /// Loads every spec: the specs are what the model reads, so each must be present with its
    /// exact shape. Keys the model does not read (a SigLIP text tower, the pooling head) are
    /// ignored. With `optional_prefix`, a key may also be stored without it: transformers 5
    /// saves `SiglipVisionModel` without the `vision_model.` prefix that `SiglipModel` and
    /// older checkpoints carry.
    pub fn load_specs<'a>(
        &self,
        specs: impl IntoIterator<Item = &'a ParamSpec>,
        optional_prefix: Option<&str>,
        device: Device,
    ) -> Result<ParamMap> {
        let mut out = self.load_specs_as_stored(specs, optional_prefix)?;
        for t in out.values_mut() {
            *t = t.to_kind(Kind::Float).to_device(device);
        }
        Ok(out)
    }

    /// [`Self::load_specs`] on the CPU in the stored dtypes: a bf16 checkpoint stays bf16 (half
    /// the bytes of an f32 copy) until the caller converts it where it keeps it.
    pub fn load_specs_as_stored<'a>(
        &self,
        specs: impl IntoIterator<Item = &'a ParamSpec>,
        optional_prefix: Option<&str>,
    ) -> Result<ParamMap> {
        let mut out = BTreeMap::new();
        for spec in specs {
            let stored = match optional_prefix.and_then(|p| spec.name.strip_prefix(p)) {
                Some(short) if !self.contains(&spec.name) && self.contains(short) => short,
                _ => spec.name.as_str(),
            };
            out.insert(
                spec.name.clone(),
                self.tensor_as_stored(stored, &spec.shape)?,
            );
        }
        Ok(out)
    }
}

/// Borrowed tensor written as little-endian F32 or BF16 (converted one tensor at a time, so
/// writing a large checkpoint holds one extra tensor in memory, not a copy of all of them).
struct TensorView<'a> {
    tensor: &'a Tensor,
    shape: Vec<usize>,
    kind: Kind,
}

impl View for TensorView<'_> {
    fn dtype(&self) -> Dtype {
        match self.kind {
            Kind::BFloat16 => Dtype::BF16,
            _ => Dtype::F32,
        }
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
        let n = t.numel();
        let mut bytes = vec![0u8; self.data_len()];
        t.copy_data_u8(&mut bytes, n);
        Cow::Owned(bytes)
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.kind.elt_size_in_bytes()
    }
}

/// Writes `tensors` (any float dtype, any device) as one F32 safetensors file.
pub fn save_safetensors(path: &Path, tensors: &ParamMap) -> Result<()> {
    save_safetensors_as(path, tensors, Kind::Float)
}

/// Writes `tensors` (any float dtype, any device) as one safetensors file of `kind`: `Float`
/// (F32) or `BFloat16` (BF16, as the Hub ships weights); any other kind writes F32.
pub fn save_safetensors_as(path: &Path, tensors: &ParamMap, kind: Kind) -> Result<()> {
    let kind = match kind {
        Kind::BFloat16 => Kind::BFloat16,
        _ => Kind::Float,
    };
    let views = tensors.iter().map(|(name, t)| {
        let shape = t.size().iter().map(|&d| d as usize).collect();
        (
            name.as_str(),
            TensorView {
                tensor: t,
                shape,
                kind,
            },
        )
    });
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    safetensors::serialize_to_file(views, &metadata, path).map_err(|e| ModelError::Safetensors {
        path: path.into(),
        reason: e.to_string(),
    })
}

/// Reads every tensor of one safetensors file as f32 (I64 kept as is): adapters, projectors,
/// fixtures.
pub fn load_safetensors(path: &Path) -> Result<ParamMap> {
    let file = std::fs::File::open(path).map_err(|source| ModelError::Io {
        path: path.into(),
        source,
    })?;
    // SAFETY: read-only input file, not modified while mapped.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|source| ModelError::Io {
        path: path.into(),
        source,
    })?;
    let st = SafeTensors::deserialize(&mmap).map_err(|e| ModelError::Safetensors {
        path: path.into(),
        reason: e.to_string(),
    })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = if view.dtype() == Dtype::I64 {
            Tensor::f_from_data_size(view.data(), &shape, Kind::Int64)?
        } else {
            let kind = float_kind(view.dtype(), path, &name)?;
            Tensor::f_from_data_size(view.data(), &shape, kind)?.to_kind(Kind::Float)
        };
        out.insert(name, t);
    }
    Ok(out)
}

fn float_kind(dtype: Dtype, path: &Path, name: &str) -> Result<Kind> {
    match dtype {
        Dtype::F32 => Ok(Kind::Float),
        Dtype::BF16 => Ok(Kind::BFloat16),
        Dtype::F16 => Ok(Kind::Half),
        other => Err(ModelError::UnsupportedDtype {
            path: path.into(),
            name: name.into(),
            dtype: format!("{other:?}"),
        }),
    }
}
