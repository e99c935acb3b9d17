//! Checkpoint format 4: the trained state sharded as FSDP holds it. Every rank writes its own
//! flat shards and AdamW moments (`rank-R/shards.safetensors`: `{buffer}.param`,
//! `{buffer}.exp_avg`, `{buffer}.exp_avg_sq`, `optimizer.step`), in parallel and without any
//! gather, and rank 0 writes `layout.json`, which maps every trainable parameter to its slice
//! of a flat buffer and every buffer to the writers' shards. No rank ever holds more than its
//! own 1/W of the model and optimizer state, at save or at load.
//!
//! A reader at any world size W' re-slices from the layout: a parameter's offset in its buffer
//! does not depend on W (only the padding after the last parameter does), so element `i` of a
//! buffer is element `i % shard_len` of writer `i / shard_len`'s tensor. Reads are positioned
//! reads of just those bytes ([`ShardFiles`]). The same reader hands export one full parameter
//! at a time ([`ShardedState::get`]). Under NO_SHARD (or at W=1) every rank holds the whole
//! state, so rank 0 alone writes it (`writers` = 1); under HYBRID_SHARD the first node's ranks
//! write (the other nodes hold copies).
//!
//! Expert parallelism: each expert's parameters sit in buffers of their own
//! (`layers.3.expert.5.trainable`) that only the ranks holding that expert have, so every rank
//! writes a shards file and a `layout.json` of its own buffers, each expert buffer naming the
//! ranks that hold its shards (`holders`); the reader merges the ranks' layouts. A reader whose
//! buffers are laid out otherwise (another expert-parallel size, or none) loads parameter by
//! parameter from wherever the checkpoint keeps each one, so a run resumes at any EP and W.
use crate::checkpoint::format::{Checkpoint, CheckpointError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};
use tessera_fsdp::{BufferLayout, Fsdp, ParamSlice};
use tessera_model::{read_exact_into, VlmCtx};

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A writing rank's file of its shards.
pub(crate) const SHARDS_FILE: &str = "shards.safetensors";
/// Rank 0's description of the buffers (in its rank folder, so its manifest covers it).
pub(crate) const LAYOUT_FILE: &str = "layout.json";
const STEP_KEY: &str = "optimizer.step";
/// The tensors each buffer has in a shards file, by suffix.
const SUFFIXES: [&str; 3] = ["param", "exp_avg", "exp_avg_sq"];
/// Most elements [`ShardedState::read_range`] reads at once (64 MiB of f32).
const READ_PIECE: i64 = 16 << 20;

/// `layout.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Layout {
    /// World size of the run that wrote it.
    pub world_size: usize,
    /// Ranks `0..writers` wrote a shards file: W, or 1 when every rank held the whole state.
    pub writers: usize,
    pub buffers: Vec<BufferLayout>,
}

/// What one rank writes into its checkpoint folder: on rank 0 the layout, on a writing rank its
/// shards, moments and AdamW's step. Taken at a step boundary; [`StateSnapshot::write`] may
/// run later, on another thread, while training goes on (`--checkpoint-write async`), which is
/// why a snapshot can own copies of the tensors instead of sharing the live ones.
pub(crate) struct StateSnapshot {
    layout: Option<Layout>,
    tensors: Vec<(String, Tensor)>,
}

/// Takes this rank's snapshot. No collective: every rank holds what it writes. With `copy`
/// the tensors are copies in host memory (the rank's 1/W of the trained state, once more),
/// which later optimizer steps leave untouched; without it they share the live shards, and
/// the snapshot must be written before the next step.
pub(crate) fn snapshot(
    fsdp: &Fsdp<'_, VlmCtx>,
    rank: usize,
    world_size: usize,
    copy: bool,
) -> StateSnapshot {
    let layout = (rank == 0 || fsdp.has_expert_buffers()).then(|| Layout {
        world_size,
        writers: fsdp.shard_writers(),
        buffers: fsdp.trainable_layout(),
    });
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    if fsdp.writes_shards() {
        for view in fsdp.shard_views().into_iter().filter(|v| v.written) {
            for (suffix, t) in view.tensors {
                let host = match (t.device(), copy) {
                    (tch::Device::Cpu, true) => t.copy(),
                    (tch::Device::Cpu, false) => t.contiguous(),
                    _ => t.to_device(tch::Device::Cpu).contiguous(),
                };
                tensors.push((format!("{}.{suffix}", view.key), host));
            }
        }
        tensors.push((STEP_KEY.into(), Tensor::from(fsdp.optimizer_step())));
    }
    StateSnapshot { layout, tensors }
}

impl StateSnapshot {
    /// Bytes the snapshot's shards file takes: its tensors plus a generous allowance for the
    /// safetensors header.
    pub(crate) fn bytes(&self) -> u64 {
        let data: u64 = self.tensors.iter().map(|(_, t)| tensor_bytes(t)).sum();
        data + 8 + 160 * self.tensors.len() as u64
    }

    /// Writes the snapshot's files into the rank's checkpoint folder `dir`. A full disk is
    /// reported with the file, its size and the bytes free once the partial file is removed.
    pub(crate) fn write(&self, dir: &Path) -> Result<(), CheckpointError> {
        if let Some(layout) = &self.layout {
            let path = dir.join(LAYOUT_FILE);
            let text = serde_json::to_vec_pretty(layout).map_err(|e| CheckpointError::Corrupt {
                dir: dir.to_path_buf(),
                reason: format!("{LAYOUT_FILE} could not be serialised: {e}"),
            })?;
            std::fs::write(&path, &text).map_err(|e| {
                let _ = std::fs::remove_file(&path);
                write_error(&path, e, text.len() as u64)
            })?;
        }
        if self.tensors.is_empty() {
            return Ok(());
        }
        let path = dir.join(SHARDS_FILE);
        let views = self
            .tensors
            .iter()
            .map(|(name, t)| (name.as_str(), HostView::new(t)));
        match safetensors::serialize_to_file(views, &None, &path) {
            Ok(()) => Ok(()),
            Err(safetensors::SafeTensorError::IoError(e)) => {
                let _ = std::fs::remove_file(&path);
                Err(write_error(&path, e, self.bytes()))
            }
            Err(source) => {
                let _ = std::fs::remove_file(&path);
                Err(CheckpointError::Tensors { path, source })
            }
        }
    }
}

/// A write of `needed` bytes to `path` failed: a full disk says so plainly.
fn write_error(path: &Path, e: std::io::Error, needed: u64) -> CheckpointError {
    match tessera_shards::NoSpace::from_io(path, &e, needed) {
        Some(full) => full.into(),
        None => CheckpointError::Io {
            path: path.to_path_buf(),
            source: e,
        },
    }
}

fn tensor_bytes(t: &Tensor) -> u64 {
    (t.numel() * t.kind().elt_size_in_bytes()) as u64
}

/// A contiguous CPU tensor of the snapshot as safetensors sees it: its bytes, borrowed.
struct HostView<'a> {
    tensor: &'a Tensor,
    shape: Vec<usize>,
}

impl<'a> HostView<'a> {
    fn new(tensor: &'a Tensor) -> Self {
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        HostView { tensor, shape }
    }
}

impl safetensors::View for HostView<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        match self.tensor.kind() {
            Kind::Int64 => safetensors::Dtype::I64,
            Kind::BFloat16 => safetensors::Dtype::BF16,
            Kind::Half => safetensors::Dtype::F16,
            _ => safetensors::Dtype::F32,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let len = self.data_len();
        if len == 0 {
            return std::borrow::Cow::Borrowed(&[]);
        }
        if !self.tensor.is_contiguous() || self.tensor.device() != tch::Device::Cpu {
            let mut bytes = vec![0u8; len];
            let host = self.tensor.to_device(tch::Device::Cpu).contiguous();
            host.copy_data_u8(&mut bytes, host.numel());
            return std::borrow::Cow::Owned(bytes);
        }
        // SAFETY: a contiguous CPU tensor (checked above) of one of the kinds `dtype` names, so its data pointer addresses `len` bytes its storage owns; nothing
        // writes them while the snapshot is written (a sync write runs between steps, an
        // async one owns copies).
        let bytes = unsafe { std::slice::from_raw_parts(self.tensor.data_ptr().cast::<u8>(), len) };
        std::borrow::Cow::Borrowed(bytes)
    }

    fn data_len(&self) -> usize {
        self.tensor.numel() * self.tensor.kind().elt_size_in_bytes()
    }
}

/// Bytes a checkpoint of this model takes on disk, all ranks together: every writing rank's
/// shards of every trainable buffer, with their two AdamW moments, in f32 (the layout and the
/// small JSON files are left out).
pub(crate) fn checkpoint_bytes(fsdp: &Fsdp<'_, VlmCtx>) -> u64 {
    let writers = fsdp.shard_writers() as u64;
    fsdp.trainable_layout()
        .iter()
        .map(|b| {
            let holders = b.holders.as_ref().map_or(writers, |h| h.len() as u64);
            b.shard_len.max(0) as u64 * holders * SUFFIXES.len() as u64 * 4
        })
        .sum()
}

/// Restores this rank's shards and moments from a format-4 checkpoint written at any world
/// size: each rank reads only the byte ranges that fall in its own shards.
pub(crate) fn load(
    fsdp: &mut Fsdp<'_, VlmCtx>,
    state: &ShardedState,
) -> Result<(), CheckpointError> {
    let mine = fsdp.trainable_layout();
    // Expert buffers on either side: the layouts differ by design, so parameters are matched
    // by name instead of buffers by key.
    let regrouped = mine.iter().any(|b| b.holders.is_some())
        || state.layout.buffers.iter().any(|b| b.holders.is_some());
    for (want, view) in mine.iter().zip(fsdp.shard_views()) {
        let same = state
            .buffer(&want.key)
            .ok()
            .filter(|found| found.params == want.params && found.numel == want.numel);
        match same {
            Some(found) => {
                for (suffix, dst) in &view.tensors {
                    state.read_range(found, suffix, view.start, dst)?;
                }
            }
            None if regrouped => state.load_by_parameter(want, &view)?,
            None => {
                state.buffer(&want.key)?;
                return Err(state.corrupt(format!(
                    "buffer `{}` holds other parameters than this run's model",
                    want.key
                )));
            }
        }
    }
    if !regrouped && mine.len() != state.layout.buffers.len() {
        return Err(state.corrupt(format!(
            "it holds {} trainable buffers, this run's model {}",
            state.layout.buffers.len(),
            mine.len()
        )));
    }
    fsdp.set_optimizer_step(state.optimizer_step()?);
    Ok(())
}

/// A format-4 checkpoint opened for reading: its layout and the writers' shard files.
pub struct ShardedState {
    dir: PathBuf,
    layout: Layout,
    files: Vec<ShardFile>,
    /// Parameter name -> (buffer index, its slice).
    params: BTreeMap<String, (usize, ParamSlice)>,
}

impl ShardedState {
    /// Opens `ckpt` (format 4), verifying each writer's folder against its manifest.
    pub fn open(ckpt: &Checkpoint) -> Result<Self, CheckpointError> {
        let checkpoint = ckpt.dir.as_path();
        let corrupt = |reason: String| CheckpointError::Corrupt {
            dir: checkpoint.to_path_buf(),
            reason,
        };
        let first = ckpt.rank_dir(0)?;
        let layout_path = first.join(LAYOUT_FILE);
        let text = std::fs::read(&layout_path).map_err(io_err(&layout_path))?;
        let layout: Layout = serde_json::from_slice(&text)
            .map_err(|e| corrupt(format!("rank 0: {LAYOUT_FILE} is unreadable: {e}")))?;
        if layout.writers == 0 || layout.writers > ckpt.meta.world_size {
            return Err(corrupt(format!(
                "{LAYOUT_FILE} names {} writing ranks of {}",
                layout.writers, ckpt.meta.world_size
            )));
        }
        let mut layout = layout;
        let mut rank_dirs = vec![first];
        for rank in 1..layout.writers {
            let dir = ckpt.rank_dir(rank)?;
            // Under expert parallelism every writer describes its own buffers too.
            let own = dir.join(LAYOUT_FILE);
            if own.is_file() {
                let text = std::fs::read(&own).map_err(io_err(&own))?;
                let theirs: Layout = serde_json::from_slice(&text).map_err(|e| {
                    corrupt(format!("rank {rank}: {LAYOUT_FILE} is unreadable: {e}"))
                })?;
                for buffer in theirs.buffers {
                    if !layout.buffers.iter().any(|b| b.key == buffer.key) {
                        layout.buffers.push(buffer);
                    }
                }
            }
            rank_dirs.push(dir);
        }
        let files = rank_dirs
            .iter()
            .enumerate()
            .map(|(rank, dir)| ShardFile::open(&dir.join(SHARDS_FILE), rank, checkpoint))
            .collect::<Result<Vec<_>, _>>()?;
        let mut params = BTreeMap::new();
        for (b, buffer) in layout.buffers.iter().enumerate() {
            for p in &buffer.params {
                params.insert(p.name.clone(), (b, p.clone()));
            }
        }
        Ok(ShardedState {
            dir: checkpoint.to_path_buf(),
            layout,
            files,
            params,
        })
    }

    fn corrupt(&self, reason: String) -> CheckpointError {
        CheckpointError::Corrupt {
            dir: self.dir.clone(),
            reason,
        }
    }

    fn buffer(&self, key: &str) -> Result<&BufferLayout, CheckpointError> {
        self.layout
            .buffers
            .iter()
            .find(|b| b.key == key)
            .ok_or_else(|| self.corrupt(format!("it has no trainable buffer `{key}`")))
    }

    /// Names of every trained parameter it holds.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.params.keys().map(String::as_str)
    }

    /// One trained parameter, whole, in f32 (read from the writers' shards that hold it).
    pub fn get(&self, name: &str) -> Result<Option<Tensor>, CheckpointError> {
        self.get_as(name, Kind::Float)
    }

    /// [`Self::get`] in `kind`: the f32 masters are converted piece by piece as they are read,
    /// so a bf16 copy never has an f32 one beside it.
    pub fn get_as(&self, name: &str, kind: Kind) -> Result<Option<Tensor>, CheckpointError> {
        let Some((b, slice)) = self.params.get(name) else {
            return Ok(None);
        };
        let numel: i64 = slice.shape.iter().product();
        let out = Tensor::zeros([numel], (kind, tch::Device::Cpu));
        self.read_range(&self.layout.buffers[*b], "param", slice.offset, &out)?;
        Ok(Some(out.view(slice.shape.as_slice())))
    }

    /// Fills this rank's shard `view` of buffer `want` parameter by parameter from wherever the
    /// checkpoint keeps each one (its buffers are laid out otherwise: another expert-parallel
    /// size, or none). A parameter it lacks, or holds in another shape, fails naming it.
    fn load_by_parameter(
        &self,
        want: &BufferLayout,
        view: &tessera_fsdp::ShardView,
    ) -> Result<(), CheckpointError> {
        let shard_len = view.tensors.first().map_or(0, |(_, t)| t.numel() as i64);
        let (lo, hi) = (view.start, view.start + shard_len);
        for p in &want.params {
            let numel: i64 = p.shape.iter().product();
            let (a, b) = (p.offset.max(lo), (p.offset + numel).min(hi));
            if a >= b {
                continue;
            }
            let Some((index, slice)) = self.params.get(&p.name) else {
                return Err(self.corrupt(format!(
                    "it does not hold `{}`, which this run's model trains",
                    p.name
                )));
            };
            if slice.shape != p.shape {
                return Err(self.corrupt(format!(
                    "`{}` is {:?} in it, {:?} in this run's model",
                    p.name, slice.shape, p.shape
                )));
            }
            let found = &self.layout.buffers[*index];
            for (suffix, dst) in &view.tensors {
                let dst = dst.narrow(0, a - lo, b - a);
                self.read_range(found, suffix, slice.offset + (a - p.offset), &dst)?;
            }
        }
        Ok(())
    }

    fn optimizer_step(&self) -> Result<i64, CheckpointError> {
        let t = Tensor::zeros([1], (Kind::Int64, tch::Device::Cpu));
        self.files[0].read_into(STEP_KEY, 0, &t)?;
        Ok(t.int64_value(&[0]))
    }

    /// Fills `dst` with elements `[start, start + len)` of buffer `buffer`'s `suffix` tensor;
    /// elements past the buffer's end (padding) become zero. Reads at most [`READ_PIECE`]
    /// elements at once, so the read buffer stays small whatever the parameter's size.
    fn read_range(
        &self,
        buffer: &BufferLayout,
        suffix: &str,
        start: i64,
        dst: &Tensor,
    ) -> Result<(), CheckpointError> {
        debug_assert!(SUFFIXES.contains(&suffix));
        let len = dst.numel() as i64;
        let (lo, hi) = (start, (start + len).min(buffer.numel));
        let name = format!("{}.{suffix}", buffer.key);
        let _ = tch::no_grad(|| dst.shallow_clone().zero_());
        let per = buffer.shard_len.max(1);
        let mut a = lo;
        while a < hi {
            let shard = (a / per) as usize;
            let writer = match &buffer.holders {
                Some(holders) => *holders.get(shard).ok_or_else(|| {
                    self.corrupt(format!(
                        "`{name}` element {a} is in shard {shard}, past its holders"
                    ))
                })?,
                None => shard,
            };
            let end = hi.min((shard as i64 + 1) * per).min(a + READ_PIECE);
            let file = self.files.get(writer).ok_or_else(|| {
                self.corrupt(format!(
                    "`{name}` element {a} belongs to rank {writer}, which wrote no shards"
                ))
            })?;
            file.read_into(
                &name,
                a - shard as i64 * per,
                &dst.narrow(0, a - lo, end - a),
            )?;
            a = end;
        }
        Ok(())
    }
}

/// One writer's `shards.safetensors`: its header, read once; tensors read by element ranges.
struct ShardFile {
    path: PathBuf,
    rank: usize,
    checkpoint: PathBuf,
    file: File,
    /// Name -> (dtype, first byte in the file, elements).
    tensors: BTreeMap<String, (Kind, u64, i64)>,
}

#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<i64>,
    data_offsets: [u64; 2],
}

impl ShardFile {
    fn open(path: &Path, rank: usize, checkpoint: &Path) -> Result<Self, CheckpointError> {
        let file = File::open(path).map_err(io_err(path))?;
        let mut this = ShardFile {
            path: path.to_path_buf(),
            rank,
            checkpoint: checkpoint.to_path_buf(),
            file,
            tensors: BTreeMap::new(),
        };
        let mut len = [0u8; 8];
        this.file
            .read_exact_at(&mut len, 0)
            .map_err(|e| this.bad(format!("no safetensors header: {e}")))?;
        let n = u64::from_le_bytes(len);
        let file_len = this.file.metadata().map_err(io_err(path))?.len();
        if n > file_len.saturating_sub(8) {
            return Err(this.bad(format!("header of {n} bytes in a file of {file_len}")));
        }
        let mut header = vec![0u8; n as usize];
        this.file
            .read_exact_at(&mut header, 8)
            .map_err(|e| this.bad(format!("header unreadable: {e}")))?;
        let entries: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .map_err(|e| this.bad(format!("header is not JSON: {e}")))?;
        for (name, value) in entries.into_iter().filter(|(k, _)| k != "__metadata__") {
            let e: HeaderEntry = serde_json::from_value(value)
                .map_err(|err| this.bad(format!("`{name}`: {err}")))?;
            let kind = match e.dtype.as_str() {
                "F32" => Kind::Float,
                "I64" => Kind::Int64,
                "BF16" => Kind::BFloat16,
                other => return Err(this.bad(format!("`{name}` has dtype {other}"))),
            };
            let numel: i64 = e.shape.iter().product();
            if e.shape.iter().any(|&d| d < 0) {
                return Err(this.bad(format!("`{name}` has shape {:?}", e.shape)));
            }
            let bytes = numel as u64 * kind.elt_size_in_bytes() as u64;
            let [start, end] = e.data_offsets;
            let begin = 8 + n + start;
            if end.checked_sub(start) != Some(bytes) || begin.saturating_add(bytes) > file_len {
                return Err(this.bad(format!("`{name}` runs past the end of the file")));
            }
            this.tensors.insert(name, (kind, begin, numel));
        }
        Ok(this)
    }

    fn bad(&self, reason: String) -> CheckpointError {
        CheckpointError::Corrupt {
            dir: self.checkpoint.clone(),
            reason: format!("rank {}: {}: {reason}", self.rank, self.path.display()),
        }
    }

    /// Copies elements `[start, start + dst.numel())` of tensor `name` into `dst` (1-D, any
    /// kind, any device): read straight into `dst` when it is a contiguous CPU tensor of the
    /// stored dtype, else into one tensor of the stored dtype that the copy converts.
    fn read_into(&self, name: &str, start: i64, dst: &Tensor) -> Result<(), CheckpointError> {
        let &(stored, begin, numel) = self
            .tensors
            .get(name)
            .ok_or_else(|| self.bad(format!("it has no tensor `{name}`")))?;
        let len = dst.numel() as i64;
        if start < 0 || start + len > numel {
            return Err(self.bad(format!(
                "`{name}` has {numel} elements; elements {start}..{} were asked for",
                start + len
            )));
        }
        let at = begin + start as u64 * stored.elt_size_in_bytes() as u64;
        let read_err = |e: std::io::Error| self.bad(format!("reading `{name}`: {e}"));
        if dst.kind() == stored && dst.device() == tch::Device::Cpu && dst.is_contiguous() {
            return read_exact_into(&self.file, at, dst).map_err(read_err);
        }
        let piece = Tensor::empty([len], (stored, tch::Device::Cpu));
        read_exact_into(&self.file, at, &piece).map_err(read_err)?;
        tch::no_grad(|| dst.shallow_clone().f_copy_(&piece))
            .map_err(|e| self.bad(format!("`{name}`: {e}")))?;
        Ok(())
    }
}
