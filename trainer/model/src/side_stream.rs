//! A micro-batch's host-to-device uploads on a CUDA side stream (`csrc/stream_shim.cpp`; tch has
//! no stream API), so the trainer can upload micro-batch k+1 while micro-batch k computes:
//! [`SideUpload::begin`] makes a pool stream current, the uploads go out (pinned, non-blocking),
//! [`SideUpload::end`] marks them with an event and restores the compute stream, and
//! [`SideUpload::wait`], right before the first kernel that reads them, makes the compute stream
//! wait on that event and records the tensors as used there. On the CPU, or with
//! `TESSERA_SIDE_STREAM=0`, there is no side upload and copies go on the current stream.
use super::error::Result;
use std::ffi::c_char;
use tch::{Device, Tensor};
use tessera_switches::Switches;
use tessera_sys::stream::{
    tc_pin_memory, tc_side_upload_begin, tc_side_upload_end, tc_side_upload_free,
    tc_side_upload_wait, RawSideUpload,
};
use tessera_sys::C_tensor;

fn shim_result(err: *mut c_char, op: &'static str) -> Result<()> {
    // SAFETY: `err` is what a stream shim function just returned.
    Ok(unsafe { tessera_sys::take_error(err, op) }?)
}

/// A host tensor on `device`. On CUDA the bytes go through pinned (page-locked) host memory
/// with a non-blocking copy on the current stream: the host goes on enqueuing the step's
/// kernels while the DMA runs, and the stream orders the copy before the kernels that read it
/// (PyTorch's pinned allocator keeps the host block until the copy is done). Elsewhere a plain
/// copy (a no-op on the CPU).
pub(crate) fn upload(host: Tensor, device: Device) -> Result<Tensor> {
    if device.is_cuda() {
        let kind = host.kind();
        Ok(pinned(&host)?.to_device_(device, kind, true, false))
    } else {
        Ok(host.to_device(device))
    }
}

/// `host` copied into page-locked memory, so that a non-blocking copy to the GPU can overlap
/// the host's work (PyTorch's pinned allocator keeps the block until the copy is done).
fn pinned(host: &Tensor) -> Result<Tensor> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `host` is a live tch tensor, only read; `out` is a valid out-pointer that the
    // shim sets (to a tensor allocated as tch allocates its own) only on success.
    shim_result(
        unsafe { tc_pin_memory(host.as_ptr(), &mut out) },
        "pin memory",
    )?;
    // SAFETY: on success `out` is a new tensor that nothing else owns.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Uploads in flight on a side stream.
pub(super) struct SideUpload {
    raw: *mut RawSideUpload,
    ended: bool,
}

// SAFETY: the handle holds CUDA stream and event objects, which any host thread may use; tessera
// moves it with its micro-batch context and calls it from one thread at a time (`&mut self`).
unsafe impl Send for SideUpload {}

impl SideUpload {
    /// On CUDA (unless `TESSERA_SIDE_STREAM=0`): a pool stream of `device` becomes current until
    /// [`Self::end`]. Elsewhere `None`: uploads go on the current stream.
    pub(super) fn begin(device: Device) -> Result<Option<Self>> {
        let Device::Cuda(index) = device else {
            return Ok(None);
        };
        if !Switches::get().side_stream {
            return Ok(None);
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the shim sets it only on success.
        shim_result(
            unsafe { tc_side_upload_begin(index as i8, &mut raw) },
            "side-stream upload begin",
        )?;
        Ok(Some(SideUpload { raw, ended: false }))
    }

    /// Marks the end of the uploads and makes the compute stream current again.
    pub(super) fn end(&mut self) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        // SAFETY: `raw` is live until drop.
        shim_result(
            unsafe { tc_side_upload_end(self.raw) },
            "side-stream upload end",
        )
    }

    /// Before the first kernel that reads `tensors`: the current stream waits for the uploads,
    /// and the tensors are recorded as used on it.
    pub(super) fn wait(mut self, tensors: &[&Tensor]) -> Result<()> {
        self.end()?;
        let ptrs: Vec<*mut C_tensor> = tensors.iter().map(|t| t.as_ptr() as *mut _).collect();
        // SAFETY: `raw` is live; the pointers are tch tensors alive for the call, only read.
        let err = unsafe { tc_side_upload_wait(self.raw, ptrs.as_ptr(), ptrs.len() as i64) };
        shim_result(err, "side-stream upload wait")
    }
}

impl Drop for SideUpload {
    fn drop(&mut self) {
        // An upload abandoned before `end` (an error while building the micro-batch) still
        // restores the compute stream.
        if !self.ended {
            let _ = self.end();
        }
        // SAFETY: `raw` came from tc_side_upload_begin and is freed once, here.
        unsafe { tc_side_upload_free(self.raw) };
    }
}
