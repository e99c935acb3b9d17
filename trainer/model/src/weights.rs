//! Hugging Face safetensors checkpoints: `model.safetensors` or a sharded
//! `model.safetensors.index.json`, read tensor by tensor. Opening maps each file to parse its
//! header; tensors are then read with positioned reads into tensors of the stored dtype (BF16,
//! F16 or F32), never through the mapping, so a file's pages never count in the process's
//! resident memory next to the tensors read from them. [`HfCheckpoint::read_range_into`]
//! copies one slice of one tensor (what FSDP's per-rank loading uses: a rank touches only
//! the bytes of its shards). Writing (F32, or BF16 for exports) goes through the same format
//! with `{"format": "pt"}` metadata, as `save_pretrained` writes it (`hub_files.rs` streams one
//! tensor at a time).
use super::error::{ModelError, Result};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tch::{Device, Kind, Tensor};
use tessera_fsdp::{ParamMap, ParamSpec};

pub(super) const SINGLE_FILE: &str = "model.safetensors";
pub(super) const INDEX_FILE: &str = "model.safetensors.index.json";

/// Largest slice [`HfCheckpoint::read_range_into`] reads at once (bytes): bounds its buffer.
const READ_CHUNK_BYTES: usize = 64 << 20;

/// Where one tensor's bytes lie in its file.
#[derive(Clone, Debug)]
struct TensorLocation {
    file: usize,
    /// Byte offset of the tensor's first element in the file.
    offset: u64,
    dtype: Dtype,
    shape: Vec<i64>,
}

/// An opened checkpoint directory: every file open (its header parsed), every key located.
pub struct HfCheckpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, File)>,
    /// Key -> index into `files`.
    location: HashMap<String, usize>,
    /// Key -> file, byte offset, dtype and shape (from the headers).
    tensors: HashMap<String, TensorLocation>,
    /// Bytes copied by [`Self::read_range_into`] so far.
    bytes_read: AtomicU64,
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
                .ok_or_else(|| ModelError::SafetensorsLayout {
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
        let mut tensor_locations = HashMap::new();
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
            let tensors =
                SafeTensors::deserialize(&mmap).map_err(|source| ModelError::Safetensors {
                    path: path.clone(),
                    source,
                })?;
            for (name, view) in tensors.tensors() {
                // The view's data is a slice of the mapping: its distance from the mapping's
                // start is its offset in the file (nothing is read to compute it).
                let offset = (view.data().as_ptr() as usize - mmap.as_ptr() as usize) as u64;
                tensor_locations.insert(
                    name.clone(),
                    TensorLocation {
                        file: files.len(),
                        offset,
                        dtype: view.dtype(),
                        shape: view.shape().iter().map(|&d| d as i64).collect(),
                    },
                );
                location.insert(name, files.len());
            }
            // The mapping served the header only: tensors are read with positioned reads.
            drop(tensors);
            drop(mmap);
            files.push((path, file));
        }
        Ok(Self {
            dir: dir.into(),
            files,
            location,
            tensors: tensor_locations,
            bytes_read: AtomicU64::new(0),
        })
    }

    /// The stored shape of `name`, if the checkpoint has it.
    pub fn shape(&self, name: &str) -> Option<&[i64]> {
        self.tensors.get(name).map(|t| t.shape.as_slice())
    }

    /// The dtype `name` is stored in, if the checkpoint has it (BFloat16, Half or Float; other
    /// dtypes are reported when the tensor is read).
    pub fn stored_kind(&self, name: &str) -> Option<Kind> {
        self.tensors.get(name).map(|t| match t.dtype {
            Dtype::BF16 => Kind::BFloat16,
            Dtype::F16 => Kind::Half,
            _ => Kind::Float,
        })
    }

    /// The dtype to hold the checkpoint of `dir` in: `dtype` when given, else the widest it
    /// stores (bf16 only when every tensor is bf16, f32 otherwise).
    pub fn load_kind(dir: &Path, dtype: Option<super::Dtype>) -> Result<Kind> {
        if let Some(dtype) = dtype {
            return Ok(dtype.kind());
        }
        let ckpt = HfCheckpoint::open(dir)?;
        let narrow = ckpt
            .names()
            .all(|n| ckpt.stored_kind(n) == Some(Kind::BFloat16));
        Ok(if narrow { Kind::BFloat16 } else { Kind::Float })
    }

    /// Bytes [`Self::read_range_into`] has copied out of the files so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Copies elements `[start, start + dst.numel())` of tensor `name` (flattened; its stored
    /// shape must be `expected`) into `dst` (1-D, any float dtype, any device), converting from
    /// the stored dtype. Only those bytes are read, with positioned reads of at most 64 MiB, so
    /// the rest of the file is never paged into this process and no full-tensor copy exists.
    pub fn read_range_into(
        &self,
        name: &str,
        expected: &[i64],
        start: i64,
        dst: &Tensor,
    ) -> Result<()> {
        let loc = self.locate(name, expected)?;
        let bytes = self.copy_range(loc, name, start, dst)?;
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Where `name` lies, checking its stored shape against `expected`.
    fn locate(&self, name: &str, expected: &[i64]) -> Result<&TensorLocation> {
        let loc = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                dir: self.dir.clone(),
                name: name.into(),
            })?;
        if loc.shape != expected {
            return Err(ModelError::ShapeMismatch {
                path: self.files[loc.file].0.clone(),
                name: name.into(),
                expected: expected.to_vec(),
                found: loc.shape.clone(),
            });
        }
        Ok(loc)
    }

    /// Copies elements `[start, start + dst.numel())` of the tensor at `loc` into `dst` in
    /// reads of at most 64 MiB; returns the bytes read. A contiguous CPU `dst` of the stored
    /// dtype is read into directly; any other goes through one 64 MiB buffer and a conversion.
    fn copy_range(
        &self,
        loc: &TensorLocation,
        name: &str,
        start: i64,
        dst: &Tensor,
    ) -> Result<u64> {
        let (path, file) = &self.files[loc.file];
        let kind = float_kind(loc.dtype, path, name)?;
        let numel: i64 = loc.shape.iter().product();
        let len = dst.numel() as i64;
        if start < 0 || start + len > numel {
            return Err(ModelError::SafetensorsLayout {
                path: path.clone(),
                reason: format!(
                    "elements [{start}, {}) of `{name}` asked for; it has {numel}",
                    start + len
                ),
            });
        }
        let size = kind.elt_size_in_bytes();
        let read_err = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        if len == 0 {
            return Ok(0);
        }
        if dst.kind() == kind && dst.device() == Device::Cpu && dst.is_contiguous() {
            read_exact_into(file, loc.offset + start as u64 * size as u64, dst)
                .map_err(read_err)?;
            return Ok(len as u64 * size as u64);
        }
        let chunk = (READ_CHUNK_BYTES / size) as i64;
        let mut buf = Vec::new();
        let mut done = 0i64;
        while done < len {
            let take = chunk.min(len - done);
            buf.resize(take as usize * size, 0u8);
            let at = loc.offset + ((start + done) as usize * size) as u64;
            file.read_exact_at(&mut buf, at).map_err(read_err)?;
            let src = Tensor::f_from_data_size(&buf, &[take], kind)?;
            tch::no_grad(|| dst.narrow(0, done, take).f_copy_(&src))?;
            done += take;
        }
        Ok(len as u64 * size as u64)
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

    /// Reads `name` in the dtype the file stores it in (BF16, F16 or F32), on the CPU: one
    /// tensor of that size, filled with positioned reads.
    pub fn tensor_as_stored(&self, name: &str, expected: &[i64]) -> Result<Tensor> {
        let loc = self.locate(name, expected)?;
        let kind = float_kind(loc.dtype, &self.files[loc.file].0, name)?;
        let numel: i64 = expected.iter().product();
        let out = Tensor::empty([numel], (kind, Device::Cpu));
        self.copy_range(loc, name, 0, &out)?;
        Ok(out.view(expected))
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

/// Fills `dst` (a contiguous CPU tensor) with the `dst.nbytes()` bytes of `file` from `offset`,
/// read straight into the tensor's memory in reads of at most 64 MiB: no buffer, no copy (so
/// loading a model allocates nothing but its tensors). The bytes are taken as they are: the
/// file must store `dst`'s dtype, little-endian (safetensors' byte order, and this host's).
pub fn read_exact_into(file: &File, offset: u64, dst: &Tensor) -> std::io::Result<()> {
    if dst.device() != Device::Cpu || !dst.is_contiguous() {
        return Err(std::io::Error::other(
            "read_exact_into needs a contiguous CPU tensor",
        ));
    }
    let len = dst.numel() * dst.kind().elt_size_in_bytes();
    if len == 0 {
        return Ok(());
    }
    // SAFETY: `dst` is a contiguous CPU tensor of `len` bytes, so its data pointer (storage
    // offset included) addresses `len` bytes that its storage owns; no tensor operation runs
    // while this slice lives, so nothing else reads or writes them meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts_mut(dst.data_ptr().cast::<u8>(), len) };
    for (i, piece) in bytes.chunks_mut(READ_CHUNK_BYTES).enumerate() {
        file.read_exact_at(piece, offset + (i * READ_CHUNK_BYTES) as u64)?;
    }
    Ok(())
}

/// Borrowed tensor written as little-endian F32, BF16 or F16 (converted one tensor at a time,
/// so writing a large checkpoint holds one extra tensor in memory, not a copy of all of them).
struct TensorView<'a> {
    tensor: &'a Tensor,
    shape: Vec<usize>,
    kind: Kind,
}

impl<'a> TensorView<'a> {
    /// `tensor` to be written as `kind`: BFloat16 or Half as asked, any other kind as F32.
    fn new(tensor: &'a Tensor, kind: Kind) -> Self {
        let kind = match kind {
            Kind::BFloat16 | Kind::Half => kind,
            _ => Kind::Float,
        };
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        TensorView {
            tensor,
            shape,
            kind,
        }
    }
}

impl View for TensorView<'_> {
    fn dtype(&self) -> Dtype {
        match self.kind {
            Kind::BFloat16 => Dtype::BF16,
            Kind::Half => Dtype::F16,
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
    let views = tensors
        .iter()
        .map(|(name, t)| (name.as_str(), TensorView::new(t, kind)));
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    safetensors::serialize_to_file(views, &metadata, path).map_err(|source| {
        ModelError::Safetensors {
            path: path.into(),
            source,
        }
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
    let st = SafeTensors::deserialize(&mmap).map_err(|source| ModelError::Safetensors {
        path: path.into(),
        source,
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
