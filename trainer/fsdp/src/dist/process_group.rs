//! A c10d process group (gloo on CPU, NCCL on CUDA with feature `cuda`) and its collectives.
//! Every collective is asynchronous: it returns a `Work` that the caller waits on, so FSDP can
//! issue the next unit's all-gather before computing the current one. Each `Work` carries a
//! label (the FSDP unit) so a failure or timeout says which rank, unit and collective.
//! NCCL moves CUDA tensors only: a CPU tensor given to an NCCL group (step metrics, schedule
//! checks) travels through a copy on the rank's GPU, copied back when its `Work` is waited on.
use super::ffi::{self, RawProcessGroup, RawWork};
use super::store::{millis, Store};
use super::{Collective, DistError};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tch::Tensor;

/// Which c10d backend a group runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Gloo,
    Nccl,
}

/// One c10d process group of `world_size` ranks.
pub struct ProcessGroup {
    raw: *mut RawProcessGroup,
    // The group talks to its peers through the store; keep it alive as long as the group.
    _store: Store,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    backend: Backend,
    /// Where the group's collectives run: CPU for gloo, the rank's GPU for NCCL.
    device: tch::Device,
    bytes_sent: AtomicU64,
}

// SAFETY: c10d backends enqueue collectives under their own locks (PyTorch calls them from any
// thread). Ranks must still issue collectives in the same order, which callers guarantee.
unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

impl ProcessGroup {
    /// Creates a group over `store`. `gloo_host` picks the address gloo binds (None: the
    /// machine's hostname, falling back to loopback); every collective times out after `timeout`.
    pub fn new(
        store: Store,
        rank: usize,
        world_size: usize,
        backend: Backend,
        gloo_host: Option<&str>,
        timeout: Duration,
    ) -> Result<ProcessGroup, DistError> {
        let pg_err = |message: String| DistError::ProcessGroup {
            rank,
            backend,
            message,
        };
        let (r, w) = match (i32::try_from(rank), i32::try_from(world_size)) {
            (Ok(r), Ok(w)) if rank < world_size => (r, w),
            _ => {
                return Err(pg_err(format!(
                    "rank {rank} / world size {world_size} is invalid"
                )))
            }
        };
        let mut raw = std::ptr::null_mut();
        let err = match backend {
            Backend::Gloo => {
                let host = CString::new(gloo_host.unwrap_or(""))
                    .map_err(|_| pg_err("gloo host contains a NUL byte".into()))?;
                // SAFETY: live store, valid string, out pointer; exceptions are caught in C++.
                unsafe {
                    ffi::tc_pg_gloo_new(store.raw, r, w, host.as_ptr(), millis(timeout), &mut raw)
                }
            }
            // SAFETY: as above.
            Backend::Nccl => unsafe {
                ffi::tc_pg_nccl_new(store.raw, r, w, millis(timeout), &mut raw)
            },
        };
        // SAFETY: `err` is what the shim just returned.
        unsafe { tessera_sys::take_error(err, "process group") }.map_err(|e| pg_err(e.message))?;
        let device = match backend {
            Backend::Gloo => tch::Device::Cpu,
            Backend::Nccl => cuda_device_for(rank),
        };
        Ok(ProcessGroup {
            raw,
            _store: store,
            rank,
            world_size,
            timeout,
            backend,
            device,
            bytes_sent: AtomicU64::new(0),
        })
    }

    /// A one-rank gloo group on loopback (single-process runs use the same code path as W > 1).
    pub fn single(timeout: Duration) -> Result<ProcessGroup, DistError> {
        ProcessGroup::single_on(Backend::Gloo, timeout)
    }

    /// A one-rank group on `backend` over a loopback store (NCCL for a one-GPU CUDA run).
    pub fn single_on(backend: Backend, timeout: Duration) -> Result<ProcessGroup, DistError> {
        let store = Store::connect("127.0.0.1", 0, true, 1, timeout, "tessera")?;
        ProcessGroup::new(store, 0, 1, backend, Some("127.0.0.1"), timeout)
    }

    /// Whether this build has ProcessGroupNCCL (cargo feature `cuda`).
    pub fn nccl_available() -> bool {
        // SAFETY: pure query.
        unsafe { ffi::tc_nccl_available() != 0 }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Where this group's collectives run: CPU (gloo) or this rank's GPU (NCCL).
    pub fn device(&self) -> tch::Device {
        self.device
    }

    /// Bytes this rank has sent so far, counted with the ring algorithms' cost: all-gather and
    /// reduce-scatter send (W-1) shards, all-reduce 2(W-1)/W of the tensor, broadcast the
    /// tensor from the root.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.load(Ordering::Relaxed)
    }

    /// `out` (W x the shard's size) receives every rank's `shard`, in rank order.
    pub fn all_gather_into(
        &self,
        out: &mut Tensor,
        shard: &Tensor,
        unit: &str,
    ) -> Result<Work, DistError> {
        self.count(shard, (self.world_size - 1) as f64);
        let op = Collective::AllGather;
        let mut staged = self.stage(out, Some(shard));
        let (out, shard) = staged.tensors(out, shard);
        // SAFETY: tch tensors wrap `torch::Tensor*`; c10d keeps its own references while working.
        let work = self.issue(op, unit, |w| unsafe {
            ffi::tc_all_gather_base(self.raw, out.as_mut_ptr(), shard.as_ptr() as *mut _, w)
        })?;
        Ok(work.with(staged))
    }

    /// `out` (the shard) receives the sum over ranks of the `full` tensors' rank-th slices.
    pub fn reduce_scatter_into(
        &self,
        out: &mut Tensor,
        full: &Tensor,
        unit: &str,
    ) -> Result<Work, DistError> {
        self.count(out, (self.world_size - 1) as f64);
        let op = Collective::ReduceScatter;
        let mut staged = self.stage(out, Some(full));
        let (out, full) = staged.tensors(out, full);
        // SAFETY: as in all_gather_into.
        let work = self.issue(op, unit, |w| unsafe {
            ffi::tc_reduce_scatter_base(self.raw, out.as_mut_ptr(), full.as_ptr() as *mut _, w)
        })?;
        Ok(work.with(staged))
    }

    /// In-place sum of `tensor` over ranks.
    pub fn all_reduce_sum(&self, tensor: &mut Tensor, what: &str) -> Result<Work, DistError> {
        let w = self.world_size as f64;
        self.count(tensor, 2.0 * (w - 1.0) / w);
        let mut staged = self.stage(tensor, None);
        let tensor = staged.target(tensor);
        // SAFETY: as in all_gather_into.
        let work = self.issue(Collective::AllReduce, what, |work| unsafe {
            ffi::tc_all_reduce_sum(self.raw, tensor.as_mut_ptr(), work)
        })?;
        Ok(work.with(staged))
    }

    /// Copies `tensor` from rank `root` to every rank, in place.
    pub fn broadcast(
        &self,
        tensor: &mut Tensor,
        root: usize,
        what: &str,
    ) -> Result<Work, DistError> {
        if self.rank == root {
            self.count(tensor, if self.world_size > 1 { 1.0 } else { 0.0 });
        }
        let root_c = i32::try_from(root).unwrap_or(i32::MAX);
        let mut staged = self.stage(tensor, None);
        let tensor = staged.target(tensor);
        // SAFETY: as in all_gather_into.
        let work = self.issue(Collective::Broadcast, what, |work| unsafe {
            ffi::tc_broadcast(self.raw, tensor.as_mut_ptr(), root_c, work)
        })?;
        Ok(work.with(staged))
    }

    /// Returns when every rank has reached the barrier (or fails after the timeout).
    pub fn barrier(&self, what: &str) -> Result<(), DistError> {
        // SAFETY: live group.
        self.issue(Collective::Barrier, what, |work| unsafe {
            ffi::tc_barrier(self.raw, work)
        })?
        .wait()
    }

    /// Rows of `input` to the group's ranks, `send[j]` of them (in order) to rank j; returns
    /// the rows received, `recv[j]` from rank j, in rank order. Every rank must call it with
    /// matching counts (rank i's `send[j]` is rank j's `recv[i]`). Synchronous, and
    /// differentiable: backward sends each row's gradient back to the rank the row came from,
    /// so it runs inside a unit's forward and again, reversed, inside its backward. A CPU
    /// tensor on an NCCL group travels through the rank's GPU.
    pub fn all_to_all(
        &self,
        input: &Tensor,
        send: &[i64],
        recv: &[i64],
        what: &str,
    ) -> Result<Tensor, DistError> {
        let fail = |message: String| DistError::Collective {
            rank: self.rank,
            op: Collective::AllToAll,
            unit: what.to_string(),
            timed_out: reports_timeout(&message),
            timeout: self.timeout,
            message,
        };
        if send.len() != self.world_size || recv.len() != self.world_size {
            return Err(fail(format!(
                "{} send and {} receive counts for {} ranks",
                send.len(),
                recv.len(),
                self.world_size
            )));
        }
        let row_elems: i64 = input.size().iter().skip(1).product();
        let row_bytes = row_elems as f64 * input.kind().elt_size_in_bytes() as f64;
        let others: i64 = send
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != self.rank)
            .map(|(_, &n)| n)
            .sum();
        self.bytes_sent.fetch_add(
            (others as f64 * row_bytes).round() as u64,
            Ordering::Relaxed,
        );
        let staged = self.backend == Backend::Nccl && input.device() == tch::Device::Cpu;
        let on_group = if staged {
            input.to_device(self.device)
        } else {
            input.shallow_clone()
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: live group and tensor; the counts outlive the call (the shim copies them).
        let err = unsafe {
            ffi::tc_all_to_all(
                self.raw,
                on_group.as_ptr(),
                recv.as_ptr(),
                send.as_ptr(),
                send.len() as i64,
                &mut raw,
            )
        };
        // SAFETY: err is null or a fresh shim error string.
        unsafe { tessera_sys::take_error(err, "all-to-all") }.map_err(|e| fail(e.message))?;
        // SAFETY: on success the shim wrote a fresh tensor that the Rust side now owns.
        let out = unsafe { Tensor::from_ptr(raw) };
        Ok(if staged {
            out.to_device(tch::Device::Cpu)
        } else {
            out
        })
    }

    /// Copies of `out` (and `input`) on the group's GPU when NCCL is given CPU tensors; none
    /// otherwise. Both are copied in so an in-place collective starts from `out`'s contents.
    fn stage(&self, out: &Tensor, input: Option<&Tensor>) -> Staged {
        let on_gpu = |t: &Tensor| {
            (self.backend == Backend::Nccl && t.device() == tch::Device::Cpu)
                .then(|| t.to_device(self.device))
        };
        let out_copy = on_gpu(out);
        Staged {
            host_out: out_copy.as_ref().map(|_| out.shallow_clone()),
            out: out_copy,
            input: input.and_then(on_gpu),
        }
    }

    fn count(&self, tensor: &Tensor, factor: f64) {
        let bytes = tensor.numel() as f64 * tensor.kind().elt_size_in_bytes() as f64 * factor;
        self.bytes_sent
            .fetch_add(bytes.round() as u64, Ordering::Relaxed);
    }

    fn issue(
        &self,
        op: Collective,
        unit: &str,
        call: impl FnOnce(*mut *mut RawWork) -> *mut std::ffi::c_char,
    ) -> Result<Work, DistError> {
        let mut raw = std::ptr::null_mut();
        let err = call(&mut raw);
        // SAFETY: err is null or a fresh shim error string.
        match unsafe { tessera_sys::take_error(err, "collective") }.map_err(|e| e.message) {
            Ok(()) => Ok(Work {
                raw,
                op,
                unit: unit.to_string(),
                rank: self.rank,
                timeout: self.timeout,
                staged: Staged::default(),
            }),
            Err(message) => Err(DistError::Collective {
                rank: self.rank,
                op,
                unit: unit.to_string(),
                timed_out: false,
                timeout: self.timeout,
                message,
            }),
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: raw came from tc_pg_*_new and is freed once.
        unsafe { ffi::tc_pg_free(self.raw) };
    }
}

/// The GPU copies of a CPU collective's tensors on an NCCL group (all None otherwise).
#[derive(Default)]
struct Staged {
    /// The caller's output tensor (a shallow clone sharing its storage), written on `wait`.
    host_out: Option<Tensor>,
    out: Option<Tensor>,
    input: Option<Tensor>,
}

impl Staged {
    /// The tensor a one-tensor collective runs on: the GPU copy when there is one.
    fn target<'a>(&'a mut self, caller: &'a mut Tensor) -> &'a mut Tensor {
        self.out.as_mut().unwrap_or(caller)
    }

    /// Writes the GPU result into the caller's CPU tensor. The wait made the current stream
    /// wait for NCCL's, so the copy (on the current stream) sees the finished result.
    fn copy_back(&self) -> Result<(), String> {
        if let (Some(host), Some(gpu)) = (&self.host_out, &self.out) {
            host.shallow_clone()
                .f_copy_(gpu)
                .map_err(|e| format!("copying the result back to the CPU failed: {e}"))?;
        }
        Ok(())
    }

    /// The (output, input) pair a two-tensor collective runs on.
    fn tensors<'a>(
        &'a mut self,
        out: &'a mut Tensor,
        input: &'a Tensor,
    ) -> (&'a mut Tensor, &'a Tensor) {
        (
            self.out.as_mut().unwrap_or(out),
            self.input.as_ref().unwrap_or(input),
        )
    }
}

/// The rank's GPU on a machine with `tch::Cuda::device_count()` of them (rank modulo count).
pub fn cuda_device_for(rank: usize) -> tch::Device {
    tch::Device::Cuda(rank % tch::Cuda::device_count().max(1) as usize)
}

/// An issued collective. Its output must not be read before `wait` returns Ok. Dropping it
/// without waiting is allowed (the collective still completes in the background).
pub struct Work {
    raw: *mut RawWork,
    op: Collective,
    unit: String,
    rank: usize,
    timeout: Duration,
    /// GPU copies of CPU tensors (NCCL), kept alive until the collective is done.
    staged: Staged,
}

// SAFETY: a c10d Work is waited on from whichever thread holds it.
unsafe impl Send for Work {}

impl Work {
    fn with(mut self, staged: Staged) -> Work {
        self.staged = staged;
        self
    }

    /// Blocks until the collective completes; a peer that never joins fails it after the
    /// group's timeout with an error naming the rank, the unit and the collective.
    pub fn wait(self) -> Result<(), DistError> {
        // SAFETY: raw is a live work handle.
        let err = unsafe { ffi::tc_work_wait(self.raw, millis(self.timeout)) };
        let result = unsafe { tessera_sys::take_error(err, "collective wait") }
            .map_err(|e| e.message)
            .and_then(|()| self.staged.copy_back());
        result.map_err(|message| DistError::Collective {
            rank: self.rank,
            op: self.op,
            unit: self.unit.clone(),
            timed_out: reports_timeout(&message),
            timeout: self.timeout,
            message,
        })
    }
}

/// Whether a failed wait's message says the collective timed out. c10d gives no typed
/// timeout: `Work::wait` raises a plain `c10::Error` ("Operation timed out!"), gloo a
/// `gloo::IoException` ("Timed out waiting ... for recv operation"), NCCL's watchdog a
/// `DistBackendError` whose text names the timeout; connection failures share those exception
/// types. So the text is all there is to tell a peer that never joined from one that died.
fn reports_timeout(message: &str) -> bool {
    let lower = message.to_lowercase();
    lower.contains("timed out") || lower.contains("timeout")
}

impl Drop for Work {
    fn drop(&mut self) {
        // SAFETY: raw came from the shim and is freed once.
        unsafe { ffi::tc_work_free(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::reports_timeout;

    #[test]
    fn timeouts_are_told_from_dead_peers_by_the_backends_texts() {
        assert!(reports_timeout("Operation timed out!"));
        assert!(reports_timeout(
            "[gloo/transport/tcp/pair.cc:534] Timed out waiting 2000ms for recv operation to \
             complete"
        ));
        assert!(!reports_timeout(
            "[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:36143"
        ));
    }
}
